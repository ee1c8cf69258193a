"""What lancetx's AWS clients keep of botocore's service models.

Building a botocore client costs in proportion to its service model: the model is
loaded, and the client class gets one method per operation (S3 has ~110, DynamoDB
~60). lancetx's clients call a handful of each, so in a fresh process (a Spark task,
a CLI run) most of the ~15 ms it took to build the S3 and DynamoDB clients went to
operations and documentation nothing reads. :func:`trim_service_model` keeps:

* of S3 and DynamoDB (:data:`CLIENT_OPERATIONS`), only the operations lancetx calls and
  those botocore calls on its behalf (:data:`BOTOCORE_OPERATIONS`), every shape those
  operations reach, and every error shape (so ``client.exceptions`` still names each
  of the service's errors);
* of every service, nothing of the documentation (botocore reads it only to write
  docstrings: ``help(client.get_object)``);
* of an operation's input, no ``contextParam`` mark that names an endpoint-rule
  parameter the service's endpoint rule set never reads (:func:`without_unread_context_params`).
  botocore resolves a request's endpoint by evaluating the rule set with those
  parameters, and caches the answer by all of them: S3 declares ``Key``, ``Prefix``
  and ``CopySource`` without any rule reading them, so every object key missed the
  cache and re-ran the rule set (about a quarter of botocore's CPU for a GET of a
  new key, measured in ``benchmarks/conflict_check.py``). The endpoint is the same
  either way, since no rule reads them.

The request each kept operation sends and the answer it parses are exactly
botocore's: its shapes are unchanged. A call of an operation that was left out
raises :class:`AttributeError` saying so (see :func:`explain_missing_operation`).
The trimmed models are served by :mod:`.aws_model_cache`, so turning that cache off
(``LANCETX_AWS_MODEL_CACHE=off``) gives clients with botocore's whole models.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

#: The operations lancetx's own code calls on its shared clients, by service
#: (botocore's service and operation names).
LANCETX_OPERATIONS: Mapping[str, frozenset[str]] = {
    "s3": frozenset(
        {"CopyObject", "DeleteObject", "GetObject", "HeadObject", "ListObjectsV2", "PutObject"}
    ),
    "dynamodb": frozenset(
        {
            "BatchGetItem",
            "CreateTable",
            "DeleteItem",
            "DescribeTable",
            "GetItem",
            "PutItem",
            "Query",
            "TransactWriteItems",
            "UpdateContinuousBackups",
            "UpdateItem",
        }
    ),
}
#: The operations botocore itself calls on a client, on the caller's behalf: S3's
#: region redirector asks HeadBucket where a bucket lives when an error does not say;
#: an S3 Express One Zone bucket is signed for with a CreateSession; DynamoDB's
#: endpoint discovery (``endpoint_discovery_enabled``) calls DescribeEndpoints.
BOTOCORE_OPERATIONS: Mapping[str, frozenset[str]] = {
    "s3": frozenset({"CreateSession", "HeadBucket"}),
    "dynamodb": frozenset({"DescribeEndpoints"}),
}
#: What a trimmed client of a listed service has: both of the above.
CLIENT_OPERATIONS: Mapping[str, frozenset[str]] = {
    service: LANCETX_OPERATIONS[service] | BOTOCORE_OPERATIONS.get(service, frozenset())
    for service in LANCETX_OPERATIONS
}
#: Bump when what :func:`trim_service_model` keeps changes in any way the lists above
#: do not show: copies made by an older trim are then not read.
TRIM_FORMAT = 3

#: Where a service model keeps documentation: in the service, each operation and shape,
#: and each reference to a shape (an operation's input, output and errors; a
#: structure's members; a list's member; a map's key and value).
_DOC_KEYS = ("documentation", "documentationUrl")
#: A list's and a map's references to their element shapes.
_ELEMENT_REFS = ("member", "key", "value")


def _operation_refs(operation: Mapping[str, Any]) -> list[Any]:
    return [operation.get("input"), operation.get("output"), *operation.get("errors", ())]


def _shape_refs(shape: Mapping[str, Any]) -> list[Any]:
    return [*shape.get("members", {}).values(), *(shape.get(k) for k in _ELEMENT_REFS)]


def _drop_docs(node: Any) -> None:
    if isinstance(node, dict):
        for key in _DOC_KEYS:
            node.pop(key, None)


def without_documentation(model: dict[str, Any]) -> dict[str, Any]:
    """``model`` (a service model, changed in place) without its documentation.

    Documentation is ~85% of the S3 model (1 MB of 1.2 MB as marshal). Only the places
    the model format puts documentation are cleared, so a member that happens to be
    *named* ``documentation`` stays.
    """
    _drop_docs(model)
    for operation in model.get("operations", {}).values():
        _drop_docs(operation)
        for ref in _operation_refs(operation):
            _drop_docs(ref)
    for shape in model.get("shapes", {}).values():
        _drop_docs(shape)
        for ref in _shape_refs(shape):
            _drop_docs(ref)
    return model


def only_operations(model: dict[str, Any], operations: Iterable[str]) -> dict[str, Any]:
    """``model`` (changed in place) with only ``operations``, the shapes they reach and
    every error shape. Raises KeyError naming an operation the model does not have."""
    wanted = set(operations)
    missing = wanted - set(model.get("operations", {}))
    if missing:
        raise KeyError(f"the service model has no operation(s) {sorted(missing)}")
    model["operations"] = {
        # botocore finds its endpoint-discovery operation by this mark, not by name.
        k: v
        for k, v in model["operations"].items()
        if k in wanted or v.get("endpointoperation")
    }
    shapes: dict[str, Any] = model.get("shapes", {})
    pending = [
        ref["shape"]
        for operation in model["operations"].values()
        for ref in _operation_refs(operation)
        if isinstance(ref, dict)
    ]
    pending += [name for name, shape in shapes.items() if shape.get("exception")]
    reached: set[str] = set()
    while pending:
        name = pending.pop()
        if name in reached or name not in shapes:
            continue
        reached.add(name)
        pending += [ref["shape"] for ref in _shape_refs(shapes[name]) if isinstance(ref, dict)]
    model["shapes"] = {k: v for k, v in shapes.items() if k in reached}
    return model


def rule_set_references(rule_set: Any) -> frozenset[str]:
    """The parameters an endpoint rule set reads anywhere (its ``{"ref": name}`` nodes)."""
    found: set[str] = set()
    pending = [rule_set]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("ref")
            if isinstance(ref, str):
                found.add(ref)
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return frozenset(found)


def without_unread_context_params(model: dict[str, Any], rule_set: Any) -> dict[str, Any]:
    """``model`` (changed in place) without the ``contextParam`` marks of input members
    whose parameter ``rule_set`` (the service's endpoint rule set) never reads.

    Such a parameter cannot change an endpoint, only the key of botocore's cache of
    resolved endpoints. A rule set that is not a dict (missing, unreadable) changes
    nothing; neither do static or operation-level context parameters.
    """
    if not isinstance(rule_set, dict) or not isinstance(rule_set.get("parameters"), dict):
        return model
    read = rule_set_references(rule_set)
    shapes: dict[str, Any] = model.get("shapes", {})
    for operation in model.get("operations", {}).values():
        shape = shapes.get(str((operation.get("input") or {}).get("shape")), {})
        for member in shape.get("members", {}).values():
            param = member.get("contextParam")
            if isinstance(param, dict) and param.get("name") not in read:
                del member["contextParam"]
    return model


def trim_service_model(service: str, model: dict[str, Any], rule_set: Any = None) -> dict[str, Any]:
    """What lancetx's clients of ``service`` are built from (``model`` is changed);
    ``rule_set``: the service's endpoint rule set, if it has one."""
    model = without_unread_context_params(without_documentation(model), rule_set)
    operations = CLIENT_OPERATIONS.get(service)
    if operations is None:
        return model
    # A model from another data path (AWS_DATA_PATH) may lack one: calling it then
    # raises the AttributeError of explain_missing_operation, not building the client.
    return only_operations(model, operations & set(model.get("operations", {})))


def trim_digest() -> str:
    """A digest of what :func:`trim_service_model` keeps, for the cache's keys: copies
    made for another list of operations or by another :data:`TRIM_FORMAT` are never read."""
    listed = sorted((s, sorted(ops)) for s, ops in CLIENT_OPERATIONS.items())
    return hashlib.sha256(repr((TRIM_FORMAT, listed)).encode()).hexdigest()[:16]


def explain_missing_operation(client: Any, name: str) -> None:
    """Raise the AttributeError for ``client.<name>``, saying the client was trimmed.

    Registered for ``getattr.<service>`` on a session whose models are trimmed:
    botocore emits that event when an attribute is not found on a client.
    """
    if name.startswith("_"):
        return  # Python's own probes (copy, pickle…): botocore's plain AttributeError
    service = client.meta.service_model.service_name
    raise AttributeError(
        f"lancetx's {service} client has no method {name!r}: lancetx builds its clients "
        f"with only the operations it needs ({', '.join(sorted(CLIENT_OPERATIONS[service]))}). "
        "Use your own boto3 client for other operations, or set LANCETX_AWS_MODEL_CACHE=off "
        "for clients with every operation"
    )


__all__ = [
    "BOTOCORE_OPERATIONS",
    "CLIENT_OPERATIONS",
    "LANCETX_OPERATIONS",
    "TRIM_FORMAT",
    "explain_missing_operation",
    "only_operations",
    "rule_set_references",
    "trim_digest",
    "trim_service_model",
    "without_documentation",
    "without_unread_context_params",
]
