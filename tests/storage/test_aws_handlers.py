"""lancetx's lean botocore session (``aws_handlers``, ``aws_clients.new_session``).

It registers only the built-in handlers that can fire for its clients, and builds
them from trimmed models; every request those clients can send must still be the
one botocore's own session sends, byte for byte (bar the signature's date and the
User-Agent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore import handlers, xform_name
from botocore.awsrequest import AWSResponse
from botocore.hooks import EVENT_ALIASES, EventAliaser, HierarchicalEmitter

from lancetx.commit.storage import aws_clients, aws_handlers
from lancetx.commit.storage.aws_handlers import is_kept
from lancetx.commit.storage.aws_model_cache import CACHE_ENV
from lancetx.commit.storage.aws_service_models import CLIENT_OPERATIONS
from lancetx.externalstore.dynamodb.plans import create_table_request

KEY = {"base_uri": {"S": "s3://b/t.lance"}, "version": {"N": "7"}}
#: One call of each operation lancetx's clients keep, with the parameters lancetx uses.
CALLS: dict[str, dict[str, dict[str, Any]]] = {
    "s3": {
        "GetObject": {"Bucket": "b", "Key": "t/_versions/7.manifest", "Range": "bytes=-65536"},
        "PutObject": {"Bucket": "b", "Key": "t/x.txn", "Body": b"\x00payload", "IfNoneMatch": "*"},
        "HeadObject": {"Bucket": "b", "Key": "t/data/a b+c.lance"},
        "DeleteObject": {"Bucket": "b", "Key": "t/_versions/7.manifest-staged"},
        "ListObjectsV2": {
            "Bucket": "b",
            "Prefix": "t/_versions/",
            "StartAfter": "t/x",
            "MaxKeys": 5,
        },
        "CopyObject": {"Bucket": "b", "Key": "t/y", "CopySource": "b/t/a b+c"},
        "HeadBucket": {"Bucket": "b"},
        "CreateSession": {"Bucket": "b--usw2-az1--x-s3"},
    },
    "dynamodb": {
        "BatchGetItem": {"RequestItems": {"m": {"Keys": [KEY], "ConsistentRead": True}}},
        "CreateTable": create_table_request("m"),
        "DeleteItem": {"TableName": "m", "Key": KEY},
        "DescribeTable": {"TableName": "m"},
        "DescribeEndpoints": {},
        "GetItem": {"TableName": "m", "Key": KEY, "ConsistentRead": True},
        "PutItem": {
            "TableName": "m",
            "Item": {**KEY, "manifest_path": {"S": "p"}},
            "ConditionExpression": "attribute_not_exists(version)",
        },
        "Query": {
            "TableName": "m",
            "KeyConditionExpression": "base_uri = :b AND version >= :v",
            "ExpressionAttributeValues": {":b": KEY["base_uri"], ":v": {"N": "3"}},
            "ScanIndexForward": False,
            "Limit": 1,
        },
        "TransactWriteItems": {
            "TransactItems": [{"Put": {"TableName": "m", "Item": KEY}}],
            "ClientRequestToken": "token",
        },
        "UpdateContinuousBackups": {
            "TableName": "m",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        },
        "UpdateItem": {
            "TableName": "m",
            "Key": KEY,
            "UpdateExpression": "SET served = :s",
            "ExpressionAttributeValues": {":s": {"N": "3"}},
        },
    },
}
#: Headers that differ between any two requests (time, ids) or name the SDK.
VARYING = {"authorization", "x-amz-date", "user-agent", "amz-sdk-invocation-id", "amz-sdk-request"}


class Sent(Exception):
    def __init__(self, request: Any) -> None:
        super().__init__(request.url)
        self.request = request


def _stop(request: Any, **kwargs: Any) -> None:
    raise Sent(request)


def sent(
    session: Any,
    service: str,
    operation: str,
    params: dict[str, Any] | None = None,
    *,
    region: str = "eu-west-1",
) -> tuple[Any, ...]:
    client = session.create_client(
        service,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.meta.events.register("before-send", _stop)
    with pytest.raises(Sent) as stopped:
        getattr(client, xform_name(operation))(**(params or CALLS[service][operation]))
    request = stopped.value.request
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in VARYING}
    body = (
        request.body if isinstance(request.body, (bytes, str, type(None))) else request.body.read()
    )
    return request.method, request.url, sorted(headers.items()), body


def test_every_kept_operation_sends_what_botocore_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert {s: set(calls) for s, calls in CALLS.items()} == CLIENT_OPERATIONS
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    aws_clients.new_session().create_client("s3", region_name="us-east-1")  # writes copies
    lean = aws_clients.new_session()
    plain = botocore.session.Session()
    for service, calls in CALLS.items():
        for operation in calls:
            assert sent(lean, service, operation) == sent(plain, service, operation), operation


def test_an_s3_express_bucket_is_signed_for_as_botocore_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore first asks the bucket for a session (CreateSession) on the same client."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    lean, plain = aws_clients.new_session(), botocore.session.Session()
    express = {"Bucket": "b--usw2-az1--x-s3", "Key": "k"}
    first = [
        sent(session, "s3", "HeadObject", express, region="us-west-2") for session in (lean, plain)
    ]
    assert first[0] == first[1]
    assert first[0][1].endswith("?session")  # the session request went first


def test_the_lean_session_registers_only_handlers_that_can_fire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    registered = aws_handlers.register(
        botocore.session.Session(include_builtin_handlers=False), trimmed=True
    )
    assert 0 < registered < len(handlers.BUILTIN_HANDLERS) / 2
    everything = aws_handlers.register(
        botocore.session.Session(include_builtin_handlers=False), trimmed=False
    )
    assert everything == len(handlers.BUILTIN_HANDLERS)


@pytest.mark.parametrize(
    ("event_name", "kept"),
    [
        ("choose-service-name", True),  # every service
        ("before-call", True),
        ("needs-retry.s3.*", True),  # every S3 operation
        ("before-parameter-build.s3.PutObject", True),
        ("before-parameter-build.s3.UploadPart", False),  # an S3 operation lancetx never calls
        ("choose-signer.sts.AssumeRoleWithWebIdentity", True),  # credentials of a role
        ("before-call.ec2.CopySnapshot", False),  # another service
        ("before-call.s3-control", False),  # not S3
        ("docs.*.s3.CopyObject.complete-section", False),  # writes docstrings
    ],
)
def test_which_handlers_are_kept(event_name: str, kept: bool) -> None:
    assert is_kept(event_name) is kept


def test_other_services_get_botocores_own_session() -> None:
    """A client of a service outside the lean session's gets botocore's handlers for it
    (SQS has one) and its whole model."""
    other = aws_clients.make_client("sqs", region_name="us-east-1")
    assert list(other.meta.events._emitter._handlers.prefix_search("after-call.sqs.X")) != []
    assert callable(other.list_queues)


def test_a_handler_list_of_another_form_gets_botocores_own_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert aws_handlers.list_understood()
    changed = [*handlers.BUILTIN_HANDLERS, ("before-call.s3", lambda **kw: None, "middle")]
    monkeypatch.setattr(handlers, "BUILTIN_HANDLERS", changed)
    assert not aws_handlers.list_understood()
    session = aws_clients.new_session()
    plain = botocore.session.Session()
    for event in ("before-parameter-build.s3.UploadPart", "before-call.ec2.CopySnapshot"):
        assert (
            list(session._original_handler._handlers.prefix_search(event))
            == list(plain._original_handler._handlers.prefix_search(event))
            != []
        )


def test_the_lean_session_rewrites_event_names_only_for_its_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore's alias table renames other services' events; the lean session (whose
    clients are all of its own services) keeps only entries naming those services,
    and its clients' copies inherit the narrowed table."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    session = aws_clients.new_session()
    aliases = session.get_component("event_emitter")._event_aliases
    assert len(aliases) < len(EVENT_ALIASES) / 10
    assert all(old in EVENT_ALIASES for old in aliases)
    client = session.create_client("s3", region_name="us-east-1")
    assert client.meta.events._event_aliases == aliases
    # None of the dropped entries rewrites an event of lancetx's clients.
    plain = EventAliaser(HierarchicalEmitter())
    for service, calls in CALLS.items():
        for operation in calls:
            for event in ("before-parameter-build", "before-call", "needs-retry", "after-call"):
                name = f"{event}.{service}.{operation}"
                assert plain._alias_event_name(name) == name


def test_with_the_cache_off_the_lean_session_is_botocores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "off")
    session = aws_clients.new_session()
    assert session.get_component("event_emitter")._event_aliases == EVENT_ALIASES
    for event in ("before-parameter-build.s3.UploadPart", "before-call.ec2.CopySnapshot"):
        assert (
            list(session._original_handler._handlers.prefix_search(event))
            == list(botocore.session.Session()._original_handler._handlers.prefix_search(event))
            != []
        )


class _Raw:
    """A response body botocore can stream (empty)."""

    def stream(self, **kwargs: Any) -> Any:
        yield b""


def test_a_redirect_without_a_region_is_followed_as_botocore_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3 error naming no region makes botocore's redirector ask HeadBucket (S3-compatible
    stores and proxies answer so): the lean client must send it too, and raise the same
    ClientError, not an AttributeError."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))

    def outcome(session: Any) -> tuple[list[str], str]:
        client = session.create_client(
            "s3",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        seen: list[str] = []

        def answer(request: Any, **kwargs: Any) -> AWSResponse:
            seen.append(f"{request.method} {request.url}")
            return AWSResponse(request.url, 400, {}, _Raw())

        client.meta.events.register("before-send", answer)
        with pytest.raises(Exception) as raised:
            client.head_object(Bucket="mybucket", Key="k")
        return seen, type(raised.value).__name__

    lean = outcome(aws_clients.new_session())
    assert lean == outcome(botocore.session.Session())
    assert lean[1] == "ClientError" and any("HEAD" in s and s.endswith(".com/") for s in lean[0])
