"""A small IAM policy evaluator, and the IAM requests behind HTTP requests to S3 and DynamoDB.

The embedded server does not enforce IAM. To prove a generated policy, the tests
record every request a workload sends (server side, so pylance's Rust requests are
seen too), turn each into the IAM authorization requests AWS would make for it
(:func:`iam_requests`), and evaluate the policy (:func:`allowed`). The same
evaluator can enforce a policy on the server (:class:`Enforcer`): a denied request
is answered 403 as AWS would.

Evaluation follows AWS's documented logic for identity policies, for the subset
lancetx emits:

* default deny; an explicit ``Deny`` wins over any ``Allow``;
* ``Action``: case-insensitive, ``*``/``?`` wildcards; ``Resource``: case-sensitive,
  ``*`` (any run of characters, ``/`` and ``:`` included) and ``?`` (one character);
* policy variables in ``Resource`` and string condition values: ``${*}``, ``${?}``,
  ``${$}`` are the literal characters; any other ``${key}`` is the request's value of
  that key, and an element naming a key the request lacks matches nothing;
* ``Condition``: operators AND-ed, keys within one operator AND-ed, values of one
  key OR-ed. ``StringEquals``/``StringLike`` (and ``StringNotEquals``/``StringNotLike``)
  on a single-valued key are false when the request lacks the key;
  ``ForAllValues:`` is true when every value of the (multi-valued) key matches —
  including when the request has no value at all; ``ForAnyValue:`` needs one match;
  ``Null`` tests absence (``"true"``) or presence (``"false"``).

Translation (:func:`iam_requests`) follows the service authorization references:
a CopyObject needs ``s3:PutObject`` on the destination and ``s3:GetObject`` on the
source; HEAD is ``s3:GetObject``; DeleteObjects is ``s3:DeleteObject`` per key; a
TransactWriteItems is authorized item by item (``PutItem``/``UpdateItem``/
``DeleteItem``/``ConditionCheckItem``, each with its own partition key) and has no
action of its own; BatchGetItem is one ``BatchGetItem`` per table with that table's
partition keys as ``dynamodb:LeadingKeys``.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse

ACCOUNT = "123456789012"  # moto's account
Context = Mapping[str, str | Sequence[str]]


@dataclass(frozen=True)
class IamRequest:
    """One authorization AWS makes: ``action`` on ``resource`` with condition keys."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)
    #: What was sent, for messages.
    origin: str = ""

    def __str__(self) -> str:
        keys = {k: v for k, v in self.context.items() if k != "aws:username"}
        return f"{self.action} {self.resource} {keys} ({self.origin})"


# --------------------------------------------------------------------------- evaluation

_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LITERALS = {"*": "*", "?": "?", "$": "$"}


def _expand(pattern: str, context: Context, *, wildcards: bool) -> str | None:
    """``pattern`` as a regex (``wildcards``) or a literal string, variables resolved;
    None when it names a variable the request lacks."""
    out: list[str] = []
    pos = 0
    for match in _VARIABLE.finditer(pattern):
        out.append(_plain(pattern[pos : match.start()], wildcards))
        name = match.group(1)
        if name in _LITERALS:
            value = _LITERALS[name]
        else:
            found = context.get(name)
            if not isinstance(found, str):
                return None
            value = found
        out.append(re.escape(value) if wildcards else value)
        pos = match.end()
    out.append(_plain(pattern[pos:], wildcards))
    return "".join(out)


def _plain(text: str, wildcards: bool) -> str:
    if not wildcards:
        return text
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)


def _like(pattern: str, value: str, context: Context, *, ignore_case: bool = False) -> bool:
    regex = _expand(pattern, context, wildcards=True)
    if regex is None:
        return False
    return re.fullmatch(regex, value, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


def _equals(pattern: str, value: str, context: Context) -> bool:
    literal = _expand(pattern, context, wildcards=False)
    return literal is not None and literal == value


_STRING_OPS = {
    "StringEquals": (_equals, False),
    "StringNotEquals": (_equals, True),
    "StringLike": (_like, False),
    "StringNotLike": (_like, True),
}


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _condition_holds(operator: str, key: str, expected: Any, context: Context) -> bool:
    patterns = [str(p) for p in _listed(expected)]
    present = key in context and context[key] is not None
    if operator == "Null":
        (flag,) = patterns
        values = _listed(context.get(key)) if present else []
        absent = not present or values == []
        return absent if flag == "true" else not absent
    qualifier, _, base = operator.rpartition(":")
    if base.endswith("IfExists"):
        raise ValueError(f"operator {operator!r} is outside the simulator's subset")
    if base not in _STRING_OPS:
        raise ValueError(f"operator {operator!r} is outside the simulator's subset")
    match_fn, negated = _STRING_OPS[base]

    def one(value: str) -> bool:
        hit = any(match_fn(p, value, context) for p in patterns)
        return not hit if negated else hit

    values = [str(v) for v in _listed(context[key])] if present else []
    if qualifier == "ForAllValues":
        return all(one(v) for v in values)  # vacuously true without values
    if qualifier == "ForAnyValue":
        return any(one(v) for v in values)
    if qualifier:
        raise ValueError(f"qualifier {qualifier!r} is outside the simulator's subset")
    if not present:
        return False
    if len(values) != 1:
        raise ValueError(f"single-valued operator {operator} on multi-valued key {key}")
    return one(values[0])


def _statement_applies(statement: Mapping[str, Any], request: IamRequest) -> bool:
    for unsupported in ("NotAction", "NotResource", "Principal", "NotPrincipal"):
        if unsupported in statement:
            raise ValueError(f"{unsupported} is outside the simulator's subset")
    actions = _listed(statement["Action"])
    if not any(_like(a, request.action, {}, ignore_case=True) for a in actions):
        return False
    resources = _listed(statement["Resource"])
    if not any(_like(r, request.resource, request.context) for r in resources):
        return False
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, expected in keys.items():
            if not _condition_holds(operator, key, expected, request.context):
                return False
    return True


def allowed(policy: Mapping[str, Any], request: IamRequest) -> bool:
    """Whether ``policy`` (one identity policy, or several as a list) allows ``request``."""
    statements: list[Mapping[str, Any]] = []
    for document in policy if isinstance(policy, list) else [policy]:
        if document.get("Version") != "2012-10-17":
            raise ValueError("policy variables need Version 2012-10-17")
        statements += _listed(document["Statement"])
    applying = [s for s in statements if _statement_applies(s, request)]
    if any(s["Effect"] == "Deny" for s in applying):
        return False
    return any(s["Effect"] == "Allow" for s in applying)


# --------------------------------------------------------------------------- translation


def _region_of(request: InterceptedRequest) -> str:
    match = re.search(r"Credential=[^/]+/\d+/([^/]+)/", request.headers.get("authorization", ""))
    return match.group(1) if match else "us-east-1"


def _s3_object(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def _s3_requests(request: InterceptedRequest, base: Context) -> list[IamRequest]:
    path = request.path.encode("latin-1").decode("utf-8")
    bucket, _, key = path.lstrip("/").partition("/")
    query = urllib.parse.parse_qs(request.query, keep_blank_values=True)
    method = request.method
    origin = f"{method} {path}{'?' + request.query if request.query else ''}"

    def req(action: str, resource: str, **extra: Any) -> IamRequest:
        return IamRequest(action, resource, {**base, **extra}, origin)

    if not key:
        bucket_arn = f"arn:aws:s3:::{bucket}"
        if method == "GET" and ("list-type" in query or not query or "prefix" in query):
            extra = {"s3:prefix": query["prefix"][0]} if "prefix" in query else {}
            return [req("s3:ListBucket", bucket_arn, **extra)]
        if method == "HEAD":
            return [req("s3:ListBucket", bucket_arn)]
        if method == "GET" and "location" in query:
            return [req("s3:GetBucketLocation", bucket_arn)]
        if method == "PUT" and not query:
            return [req("s3:CreateBucket", bucket_arn)]
        if method == "POST" and "delete" in query:
            keys = [
                el.text or ""
                for el in ET.fromstring(request.body).iter()
                if el.tag.rsplit("}", 1)[-1] == "Key"
            ]
            return [req("s3:DeleteObject", _s3_object(bucket, k)) for k in keys]
        raise ValueError(f"unmapped S3 bucket request {origin}")
    resource = _s3_object(bucket, key)
    if method in ("GET", "HEAD"):
        if "uploadId" in query:
            return [req("s3:ListMultipartUploadParts", resource)]
        if set(query) - {"partNumber", "versionId", "response-content-type"}:
            raise ValueError(f"unmapped S3 object request {origin}")
        return [req("s3:GetObject", resource)]
    if method == "PUT":
        out = [req("s3:PutObject", resource)]
        source = request.headers.get("x-amz-copy-source")
        if source:
            src = urllib.parse.unquote(source.split("?", 1)[0]).lstrip("/")
            src_bucket, _, src_key = src.partition("/")
            out.append(req("s3:GetObject", _s3_object(src_bucket, src_key)))
        if set(query) - {"partNumber", "uploadId"}:
            raise ValueError(f"unmapped S3 object request {origin}")
        return out
    if method == "POST" and ("uploads" in query or "uploadId" in query):
        return [req("s3:PutObject", resource)]
    if method == "DELETE":
        if "uploadId" in query:
            return [req("s3:AbortMultipartUpload", resource)]
        return [req("s3:DeleteObject", resource)]
    raise ValueError(f"unmapped S3 request {origin}")


def _partition_key(key: Mapping[str, Any]) -> str:
    value = key["base_uri"]
    return str(value["S"])


def _query_key(body: Mapping[str, Any]) -> str:
    expression = str(body.get("KeyConditionExpression", ""))
    names = body.get("ExpressionAttributeNames") or {}
    values = body.get("ExpressionAttributeValues") or {}
    for left, right in re.findall(r"([#\w]+)\s*=\s*(:\w+)", expression):
        if names.get(left, left) == "base_uri":
            return str(values[right]["S"])
    raise ValueError(f"no partition key in Query {expression!r}")


def _ddb_requests(request: InterceptedRequest, base: Context) -> list[IamRequest]:
    operation = request.target
    body: dict[str, Any] = json.loads(request.body or b"{}")
    region = _region_of(request)

    def arn(table: str) -> str:
        return f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{table}"

    def req(action: str, table: str, keys: list[str] | None = None) -> IamRequest:
        context: dict[str, Any] = dict(base)
        if keys is not None:
            context["dynamodb:LeadingKeys"] = keys
        return IamRequest(f"dynamodb:{action}", arn(table), context, operation)

    if operation in ("GetItem", "DeleteItem", "UpdateItem"):
        return [req(operation, body["TableName"], [_partition_key(body["Key"])])]
    if operation == "PutItem":
        return [req(operation, body["TableName"], [_partition_key(body["Item"])])]
    if operation == "Query":
        return [req(operation, body["TableName"], [_query_key(body)])]
    if operation == "BatchGetItem":
        return [
            req(operation, table, sorted({_partition_key(k) for k in spec["Keys"]}))
            for table, spec in body["RequestItems"].items()
        ]
    if operation == "BatchWriteItem":
        out = []
        for table, writes in body["RequestItems"].items():
            keys = {
                _partition_key(
                    w["PutRequest"]["Item"] if "PutRequest" in w else w["DeleteRequest"]["Key"]
                )
                for w in writes
            }
            out.append(req(operation, table, sorted(keys)))
        return out
    if operation == "TransactWriteItems":
        actions = {
            "Put": "PutItem",
            "Update": "UpdateItem",
            "Delete": "DeleteItem",
            "ConditionCheck": "ConditionCheckItem",
        }
        out = []
        for item in body["TransactItems"]:
            ((kind, spec),) = item.items()
            key = spec["Item"] if kind == "Put" else spec["Key"]
            out.append(req(actions[kind], spec["TableName"], [_partition_key(key)]))
        return out
    if operation == "TransactGetItems":
        return [
            req("GetItem", item["Get"]["TableName"], [_partition_key(item["Get"]["Key"])])
            for item in body["TransactItems"]
        ]
    if operation in (
        "DescribeTable",
        "CreateTable",
        "DeleteTable",
        "UpdateContinuousBackups",
        "DescribeContinuousBackups",
        "Scan",
        "UpdateTable",
    ):
        return [req(operation, body["TableName"])]
    if operation in ("TagResource", "ListTagsOfResource", "UntagResource"):
        return [IamRequest(f"dynamodb:{operation}", body["ResourceArn"], dict(base), operation)]
    if operation == "ListTables":
        return [IamRequest("dynamodb:ListTables", "*", dict(base), operation)]
    raise ValueError(f"unmapped DynamoDB operation {operation}")


def iam_requests(request: InterceptedRequest, username: str = "alice") -> list[IamRequest]:
    """The authorizations AWS makes for one HTTP request (``aws:username`` set to
    ``username``, for policy variables)."""
    base: Context = {"aws:username": username}
    if request.service == "dynamodb":
        return _ddb_requests(request, base)
    return _s3_requests(request, base)


# --------------------------------------------------------------------------- on the server


@dataclass
class Recorder:
    """Every IAM request behind the HTTP requests the server saw while recording."""

    requests: list[IamRequest] = field(default_factory=list)
    raw: list[InterceptedRequest] = field(default_factory=list)
    policy: Any = None
    denied: list[IamRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        translated = iam_requests(request)
        with self._lock:
            self.raw.append(request)
            self.requests.extend(translated)
        if self.policy is None:
            return None
        refused = [r for r in translated if not allowed(self.policy, r)]
        if not refused:
            return None
        with self._lock:
            self.denied.extend(refused)
        return access_denied(request, refused[0])


def access_denied(request: InterceptedRequest, refused: IamRequest) -> InterceptedResponse:
    """403 as the service sends it for ``refused``."""
    message = f"not authorized to perform: {refused.action} on resource: {refused.resource}"
    if request.service == "dynamodb":
        body = json.dumps(
            {"__type": "com.amazonaws.dynamodb.v20120810#AccessDeniedException", "message": message}
        ).encode()
        return InterceptedResponse(400, body, [("Content-Type", "application/x-amz-json-1.0")])
    xml = (
        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
        f"<Message>{message}</Message></Error>"
    ).encode()
    return InterceptedResponse(
        403, b"" if request.method == "HEAD" else xml, [("Content-Type", "application/xml")]
    )


@contextmanager
def recording(aws: EmbeddedAws, policy: Any = None) -> Iterator[Recorder]:
    """Record (and with ``policy``, enforce) IAM on ``aws`` for the block's duration."""
    recorder = Recorder(policy=policy)
    aws.set_interceptor(recorder)
    try:
        yield recorder
    finally:
        aws.set_interceptor(None)


def refused_by(policy: Any, requests: Iterable[IamRequest]) -> list[IamRequest]:
    """The requests ``policy`` does not allow."""
    return [r for r in requests if not allowed(policy, r)]


__all__ = [
    "ACCOUNT",
    "IamRequest",
    "Recorder",
    "access_denied",
    "allowed",
    "iam_requests",
    "recording",
    "refused_by",
]
