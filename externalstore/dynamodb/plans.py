"""The DynamoDB requests of the manifest store as sans-IO plans.

Every operation is a *plan*, a generator that yields :class:`ApiCall` (perform this
DynamoDB request and send me the response, or throw the botocore exception into me)
and :class:`~lancetx.commit.engine.effects.Sleep` steps, and returns the result (the
type of such steps: :data:`Requests`; the settings every plan reads: :class:`RequestContext`). Plans hold all request building,
response parsing, pagination, retries and ambiguity resolution;
:mod:`.drivers` performs their I/O, so the sync and async stores share everything
else. The item layout and where it differs from Lance: :mod:`lancetx.externalstore.dynamodb`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from botocore.exceptions import BotoCoreError, ClientError

from lancetx.commit import sansio
from lancetx.commit.engine.effects import Sleep
from lancetx.commit.errors import IdempotencyKeyCollisionError
from lancetx.commit.format.location import TransactionSummary
from lancetx.externalstore import base as _base
from lancetx.externalstore.base import (
    KeyRecord,
    ManifestEntry,
    Ownership,
    keys_base_uri,
    ownership_of,
    pointer_flip_done,
)
from lancetx.externalstore.dynamodb.botocore_errors import error_code, translate_error
from lancetx.externalstore.dynamodb.config import DEFAULT_COMMITTER
from lancetx.externalstore.dynamodb.retry import (
    DYNAMODB_RETRY,
    Attempts,
    ErrorKind,
    RetryPolicy,
    classify,
)
from lancetx.externalstore.errors import (
    AmbiguousWriteError,
    BatchEntryExistsError,
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
    DynamoDBTarget,
    EntryExistsError,
    EntryMismatchError,
    EntryNotFoundError,
    ExternalStoreError,
    KeyExistsError,
    MalformedEntryError,
    ThrottledError,
)

__all__ = [
    "MAX_TRANSACT_ITEMS",
    "METHODS",
    "ApiCall",
    "RequestContext",
    "Requests",
    "Sleep",
    "TableInfo",
    "call_plan",
    "create_table_plan",
    "create_table_request",
    "entry_from_item",
    "get_key_plan",
    "item_from_entry",
    "item_from_key",
    "key_from_item",
    "key_of",
    "put_all_if_not_exists_plan",
    "put_with_key_if_not_exists_plan",
]

T = TypeVar("T")

BASE_URI = "base_uri"
VERSION = "version"
PATH = "path"
SIZE = "size"
E_TAG = "e_tag"
COMMITTER = "committer"
COMMIT_TOKEN = "commit_token"
BUCKET = "bucket"
TXN_OPERATION = "txn_operation"
TXN_UUID = "txn_uuid"
TXN_IDEMPOTENCY_KEY = "txn_idempotency_key"
QUEUE_TICKET = "queue_ticket"
CLAIMED_AT = "claimed_at"
#: A staged entry's manifest, packed for the next writer in the commit queue.
HANDOVER = "lancetx_manifest"
#: Set by a cleanup on the item of a version whose manifest it removed (epoch ms).
REMOVED_AT = "removed_at"
#: Key items' own attributes.
IDEMPOTENCY_KEY = "idempotency_key"
CLAIMED_VERSION = "claimed_version"
#: Lance versions are u64; DynamoDB numbers go to 38 digits.
MAX_VERSION = 2**64 - 1

#: Lance's condition string, so Lance and lancetx writers exclude each other.
PUT_IF_NOT_EXISTS_CONDITION = "attribute_not_exists(base_uri) AND attribute_not_exists(version)"
PUT_IF_EXISTS_CONDITION = "attribute_exists(base_uri) AND attribute_exists(version)"


@dataclass(frozen=True)
class ApiCall:
    """A plan step: perform DynamoDB ``operation`` with ``params``."""

    operation: str
    params: dict[str, Any]


# A plan's wait is the engine's Sleep: one effect for "wait", whoever waits.
Step = ApiCall | Sleep
#: A request plan: steps yielding DynamoDB requests (and waits), returning ``T``.
Requests = sansio.Steps[Step, T]

#: API operation → client method name (boto3 and aiobotocore).
METHODS = {
    "DescribeTable": "describe_table",
    "CreateTable": "create_table",
    "GetItem": "get_item",
    "BatchGetItem": "batch_get_item",
    "PutItem": "put_item",
    "Query": "query",
    "DeleteItem": "delete_item",
    "UpdateItem": "update_item",
    "TransactWriteItems": "transact_write_items",
}


@dataclass(frozen=True)
class TableInfo:
    """What validation learned about a table."""

    name: str
    arn: str | None
    status: str


def _check_base_uri(base_uri: str) -> None:
    if not isinstance(base_uri, str) or not base_uri:
        raise ValueError("base_uri must be a non-empty string (DynamoDB rejects empty keys)")


def key_of(base_uri: str, version: int) -> dict[str, Any]:
    """The primary key of ``(base_uri, version)``."""
    _check_base_uri(base_uri)
    return {BASE_URI: {"S": base_uri}, VERSION: {"N": str(int(version))}}


def item_from_entry(entry: ManifestEntry, committer: str) -> dict[str, Any]:
    """The DynamoDB item of ``entry``; ``committer`` is used when the entry has none."""
    item: dict[str, Any] = {
        **key_of(entry.base_uri, entry.version),
        PATH: {"S": entry.path},
        COMMITTER: {"S": entry.committer or committer},
    }
    if entry.size is not None:
        item[SIZE] = {"N": str(entry.size)}
    if entry.e_tag is not None:
        item[E_TAG] = {"S": entry.e_tag}
    if entry.commit_token is not None:
        item[COMMIT_TOKEN] = {"S": entry.commit_token}
    if entry.bucket is not None:
        item[BUCKET] = {"S": entry.bucket}
    if entry.summary is not None:
        item[TXN_OPERATION] = {"S": entry.summary.operation}
        item[TXN_UUID] = {"S": entry.summary.uuid}
        if entry.summary.idempotency_key:
            item[TXN_IDEMPOTENCY_KEY] = {"S": entry.summary.idempotency_key}
        if entry.summary.ticket is not None:
            item[QUEUE_TICKET] = {"N": str(int(entry.summary.ticket))}
        if entry.summary.claimed_at is not None:
            item[CLAIMED_AT] = {"N": str(int(entry.summary.claimed_at * 1000))}
    if entry.removed_at is not None:
        item[REMOVED_AT] = {"N": str(entry.removed_at)}
    if entry.handover is not None and entry.is_staged:
        item[HANDOVER] = {"B": entry.handover}
    return item


def _summary(
    operation: str | None,
    uuid: str | None,
    key: str | None,
    ticket: str | None = None,
    claimed_at: str | None = None,
) -> TransactionSummary | None:
    # Half a summary (an item edited by hand, or by another tool) is no summary:
    # the reader then loads the transaction from the manifest. A queue mark that
    # is not a whole number is dropped: it only times waits, it decides nothing.
    if not operation or not uuid:
        return None
    turn = int(ticket) if ticket and ticket.isascii() and ticket.isdigit() else None
    at = (
        int(claimed_at) / 1000.0
        if claimed_at and claimed_at.isascii() and claimed_at.isdigit()
        else None
    )
    return TransactionSummary(operation, uuid, key or None, ticket=turn, claimed_at=at)


def _removed_at(raw: str | None) -> int | None:
    # Any number counts as the mark (its value only dates the removal): an item a
    # tool rewrote with a fraction is still a removed version's.
    if raw is None:
        return None
    try:
        return max(0, int(float(raw)))
    except (ValueError, OverflowError):
        return 0


def _binary(value: Any) -> bytes | None:
    # Only a hint (a reader checks it against the item's size and else reads the
    # object): anything but bytes is ignored, never an error.
    raw = value.get("B") if isinstance(value, Mapping) else None
    return bytes(raw) if isinstance(raw, (bytes, bytearray)) else None


def entry_from_item(
    item: Mapping[str, Any], target: DynamoDBTarget, operation: str
) -> ManifestEntry:
    """Parse an item (as Lance or lancetx wrote it). Raises ExternalStoreError on a malformed item."""

    def text(name: str) -> str | None:
        value = item.get(name)
        return str(value["S"]) if isinstance(value, Mapping) and "S" in value else None

    def number(name: str) -> int | None:
        value = item.get(name)
        if not isinstance(value, Mapping) or "N" not in value:
            return None
        raw = str(value["N"])
        if not raw.isdigit() or not raw.isascii() or int(raw) > MAX_VERSION:
            raise ValueError(f"{name} {raw!r} is not a whole number in 0..2**64-1")
        return int(raw)

    def raw_number(name: str) -> str | None:
        value = item.get(name)
        return str(value["N"]) if isinstance(value, Mapping) and "N" in value else None

    try:
        base_uri, version, path = text(BASE_URI), number(VERSION), text(PATH)
        if base_uri is None or version is None or path is None:
            raise ValueError("base_uri (S), version (N) and path (S) are required")
        return ManifestEntry(
            base_uri=base_uri,
            version=version,
            path=path,
            size=number(SIZE),
            e_tag=text(E_TAG),
            committer=text(COMMITTER),
            commit_token=text(COMMIT_TOKEN),
            bucket=text(BUCKET),
            summary=_summary(
                text(TXN_OPERATION),
                text(TXN_UUID),
                text(TXN_IDEMPOTENCY_KEY),
                raw_number(QUEUE_TICKET),
                raw_number(CLAIMED_AT),
            ),
            removed_at=_removed_at(raw_number(REMOVED_AT)),
            handover=_binary(item.get(HANDOVER)),
        )
    except ValueError as exc:
        raise MalformedEntryError(
            f"dynamodb:{operation}",
            target.resource,
            f"malformed manifest item {dict(item)!r}: {exc}; the table holds items not written by "
            "Lance or lancetx: fix or delete that item",
        ) from None


def item_from_key(record: KeyRecord, committer: str) -> dict[str, Any]:
    """The DynamoDB key item of ``record`` (see the module docstring)."""
    item: dict[str, Any] = {
        **key_of(keys_base_uri(record.base_uri), _base.key_slot(record.key)),
        IDEMPOTENCY_KEY: {"S": record.key},
        CLAIMED_VERSION: {"N": str(int(record.version))},
        COMMITTER: {"S": committer},
    }
    if record.transaction_uuid is not None:
        item[TXN_UUID] = {"S": record.transaction_uuid}
    if record.commit_token is not None:
        item[COMMIT_TOKEN] = {"S": record.commit_token}
    return item


def key_from_item(
    item: Mapping[str, Any], base_uri: str, target: DynamoDBTarget, operation: str
) -> KeyRecord:
    """Parse a key item of the table at ``base_uri``. Raises MalformedEntryError."""

    def text(name: str) -> str | None:
        value = item.get(name)
        return str(value["S"]) if isinstance(value, Mapping) and "S" in value else None

    raw = item.get(CLAIMED_VERSION)
    number = str(raw["N"]) if isinstance(raw, Mapping) and "N" in raw else ""
    key = text(IDEMPOTENCY_KEY)
    if not key or not number.isascii() or not number.isdigit() or int(number) > MAX_VERSION:
        raise MalformedEntryError(
            f"dynamodb:{operation}",
            target.resource,
            f"malformed key item {dict(item)!r}: idempotency_key (S) and claimed_version (N, "
            "a whole number) are required; it was not written by lancetx: delete that item",
        )
    return KeyRecord(
        base_uri=base_uri,
        key=key,
        version=int(number),
        transaction_uuid=text(TXN_UUID),
        commit_token=text(COMMIT_TOKEN),
    )


def check_table_description(description: Mapping[str, Any], target: DynamoDBTarget) -> TableInfo:
    """Validate a DescribeTable ``Table`` against the Lance layout. Raises DynamoDBTableSchemaError."""
    keys = {k["KeyType"]: k["AttributeName"] for k in description.get("KeySchema", [])}
    types = {
        a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])
    }
    found = (
        ", ".join(f"{kind} {name} ({types.get(name, '?')})" for kind, name in sorted(keys.items()))
        or "no key schema"
    )
    arn = description.get("TableArn")
    resource = arn or target.resource
    action = "dynamodb:DescribeTable"
    if keys.get("HASH") != BASE_URI or keys.get("RANGE") != VERSION or len(keys) != 2:
        raise DynamoDBTableSchemaError(action, resource, target.table, found, "wrong key schema")
    if types.get(BASE_URI) != "S" or types.get(VERSION) != "N":
        raise DynamoDBTableSchemaError(
            action, resource, target.table, found, "wrong key attribute types"
        )
    return TableInfo(
        name=target.table, arn=arn, status=str(description.get("TableStatus", "UNKNOWN"))
    )


class _ConditionFailed(Exception):
    """Internal: a conditional write's ConditionalCheckFailed, with the attempts so far."""

    def __init__(self, error: ClientError, attempts: Attempts) -> None:
        super().__init__(str(error))
        self.error = error
        self.attempts = attempts

    @property
    def old_item(self) -> Mapping[str, Any] | None:
        item = self.error.response.get("Item")  # type: ignore[typeddict-item]
        return cast("Mapping[str, Any] | None", item) if item else None


@dataclass
class RequestContext:
    """What every plan needs: the table, where it is (for messages), the retry
    policy, a jitter source and how many items per Query page."""

    target: DynamoDBTarget
    retry: RetryPolicy = field(default=DYNAMODB_RETRY)
    committer: str = DEFAULT_COMMITTER
    page_size: int | None = None
    rng: random.Random = field(default_factory=random.Random)

    @property
    def table(self) -> str:
        return self.target.table


def call_plan(
    ctx: RequestContext, call: ApiCall, *, write: bool = False, entry: ManifestEntry | None = None
) -> Requests[Any]:
    """Perform ``call`` with retries. Raises our errors on failure, or
    :class:`_ConditionFailed` (with the attempt history) on a condition failure.
    ``entry`` is what a write writes, for AmbiguousWriteError."""
    attempts = Attempts(ctx.retry, ctx.rng)
    while True:
        try:
            response = yield call
        except (ClientError, BotoCoreError) as exc:
            kind = classify(exc)
            if kind is ErrorKind.CONDITION_FAILED:
                attempts.succeeded()
                raise _ConditionFailed(cast(ClientError, exc), attempts) from exc
            delay = attempts.record(kind, write=write)
            if delay is None:
                ambiguous = entry if (write and attempts.ambiguous and entry is not None) else None
                raise translate_error(
                    exc,
                    ctx.target,
                    call.operation,
                    attempts=attempts.count,
                    ambiguous_entry=ambiguous,
                ) from exc
            yield Sleep(delay)
            continue
        return response


def describe_plan(ctx: RequestContext) -> Requests[dict[str, Any]]:
    """DescribeTable → the ``Table`` description. Raises DynamoDBTableNotFoundError."""
    response = yield from call_plan(ctx, ApiCall("DescribeTable", {"TableName": ctx.table}))
    table = response.get("Table")
    if not table:
        raise DynamoDBTableNotFoundError("dynamodb:DescribeTable", ctx.target.resource, ctx.target)
    return cast("dict[str, Any]", table)


def validate_plan(ctx: RequestContext) -> Requests[TableInfo]:
    """DescribeTable and check the layout. Raises DynamoDBTableNotFoundError / DynamoDBTableSchemaError."""
    description = yield from describe_plan(ctx)
    return check_table_description(description, ctx.target)


def _get_optional_plan(
    ctx: RequestContext, base_uri: str, version: int, operation: str
) -> Requests[ManifestEntry | None]:
    response = yield from call_plan(
        ctx,
        ApiCall(
            "GetItem",
            {"TableName": ctx.table, "Key": key_of(base_uri, version), "ConsistentRead": True},
        ),
    )
    item = response.get("Item")
    return entry_from_item(item, ctx.target, operation) if item else None


def get_plan(ctx: RequestContext, base_uri: str, version: int) -> Requests[ManifestEntry]:
    """Consistent GetItem. Raises EntryNotFoundError."""
    entry = yield from _get_optional_plan(ctx, base_uri, version, "GetItem")
    if entry is None:
        raise EntryNotFoundError("dynamodb:GetItem", ctx.target.resource, base_uri, version)
    return entry


def batch_get_plan(
    ctx: RequestContext, keys: Sequence[Mapping[str, Any]]
) -> Requests[list[dict[str, Any] | None]]:
    """The items at ``keys`` (None where there is none), read consistently in one
    BatchGetItem (up to 100 keys); keys DynamoDB leaves unprocessed (throttling) are
    asked for again after our backoff. Raises ThrottledError when they stay unprocessed."""
    if len(keys) > 100:
        raise ValueError(f"{len(keys)} keys in one BatchGetItem; DynamoDB allows 100")
    found: list[dict[str, Any]] = []
    pending = [dict(key) for key in keys]
    attempts = Attempts(ctx.retry, ctx.rng)
    while pending:
        request = {ctx.table: {"Keys": pending, "ConsistentRead": True}}
        response = yield from call_plan(ctx, ApiCall("BatchGetItem", {"RequestItems": request}))
        found.extend(response.get("Responses", {}).get(ctx.table) or [])
        pending = list((response.get("UnprocessedKeys") or {}).get(ctx.table, {}).get("Keys") or [])
        if pending:
            delay = attempts.record(ErrorKind.THROTTLED, write=False)
            if delay is None:
                raise ThrottledError(
                    "dynamodb:BatchGetItem",
                    ctx.target.resource,
                    "UnprocessedKeys",
                    attempts.count,
                )
            yield Sleep(delay)

    def key_values(item: Mapping[str, Any]) -> tuple[Any, Any]:
        return (item.get(BASE_URI, {}).get("S"), item.get(VERSION, {}).get("N"))

    by_key = {key_values(item): item for item in found}
    return [by_key.get(key_values(key)) for key in keys]


def get_entries_plan(
    ctx: RequestContext, base_uri: str, versions: Sequence[int]
) -> Requests[list[ManifestEntry]]:
    """The entries of ``versions`` that exist, ascending: one consistent GetItem for one
    version, one consistent BatchGetItem per 100 for more. Unlike a Query, what they
    cost does not depend on how many versions the table has."""
    wanted = sorted(set(versions))
    if len(wanted) == 1:
        entry = yield from _get_optional_plan(ctx, base_uri, wanted[0], "GetItem")
        return [entry] if entry is not None else []
    found: list[ManifestEntry] = []
    for start in range(0, len(wanted), 100):
        chunk = wanted[start : start + 100]
        items = yield from batch_get_plan(ctx, [key_of(base_uri, v) for v in chunk])
        found.extend(
            entry_from_item(item, ctx.target, "BatchGetItem") for item in items if item is not None
        )
    return found


def latest_plan(ctx: RequestContext, base_uri: str) -> Requests[ManifestEntry | None]:
    """Consistent Query, newest first, Limit 1 (Lance's read of the latest version)."""
    _check_base_uri(base_uri)
    params = {
        "TableName": ctx.table,
        "KeyConditionExpression": "base_uri = :base_uri",
        "ExpressionAttributeValues": {":base_uri": {"S": base_uri}},
        "ScanIndexForward": False,
        "Limit": 1,
        "ConsistentRead": True,
    }
    response = yield from call_plan(ctx, ApiCall("Query", params))
    items = response.get("Items") or []
    return entry_from_item(items[0], ctx.target, "Query") if items else None


def _query_pages_plan(
    ctx: RequestContext, params: dict[str, Any]
) -> Requests[list[dict[str, Any]]]:
    items: list[dict[str, Any]] = []
    start_key: dict[str, Any] | None = None
    while True:
        page = dict(params)
        if ctx.page_size is not None:
            page["Limit"] = ctx.page_size
        if start_key is not None:
            page["ExclusiveStartKey"] = start_key
        response = yield from call_plan(ctx, ApiCall("Query", page))
        items.extend(response.get("Items") or [])
        start_key = response.get("LastEvaluatedKey")
        if not start_key:
            return items


def list_plan(ctx: RequestContext, base_uri: str, since: int = 0) -> Requests[list[ManifestEntry]]:
    """Entries with version > ``since``, ascending (paginated consistent Query)."""
    _check_base_uri(base_uri)
    params = {
        "TableName": ctx.table,
        "KeyConditionExpression": "base_uri = :base_uri AND version > :since",
        "ExpressionAttributeValues": {
            ":base_uri": {"S": base_uri},
            ":since": {"N": str(int(since))},
        },
        "ScanIndexForward": True,
        "ConsistentRead": True,
    }
    items = yield from _query_pages_plan(ctx, params)
    return [entry_from_item(item, ctx.target, "Query") for item in items]


def put_if_not_exists_plan(ctx: RequestContext, entry: ManifestEntry) -> Requests[None]:
    """Conditional PutItem claiming ``entry.version``; see ExternalManifestStore.put_if_not_exists."""
    params = {
        "TableName": ctx.table,
        "Item": item_from_entry(entry, ctx.committer),
        "ConditionExpression": PUT_IF_NOT_EXISTS_CONDITION,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    try:
        yield from call_plan(ctx, ApiCall("PutItem", params), write=True, entry=entry)
        return None
    except _ConditionFailed as failed:
        ambiguous = failed.attempts.ambiguous
        old = failed.old_item
        existing = entry_from_item(old, ctx.target, "PutItem") if old else None
        if existing is None:
            # A service without ALL_OLD support (older DynamoDB Local): read it.
            try:
                existing = yield from _get_optional_plan(
                    ctx, entry.base_uri, entry.version, "PutItem"
                )
            except ExternalStoreError as exc:
                if not ambiguous:
                    raise
                # An attempt may have landed and we cannot look: any other error
                # would tell the caller "not committed".
                raise AmbiguousWriteError(
                    "dynamodb:PutItem",
                    ctx.target.resource,
                    entry,
                    f"the condition failed after an attempt that may have landed, and reading "
                    f"the item failed ({exc})",
                ) from exc
    action, resource = "dynamodb:PutItem", ctx.target.resource
    if existing is None:
        if ambiguous:
            raise AmbiguousWriteError(
                action, resource, entry, "the condition failed but the item vanished"
            )
        raise EntryExistsError(action, resource, entry.base_uri, entry.version, None)
    ownership = ownership_of(existing, entry)
    if ownership is Ownership.MINE:
        return None
    if ownership is Ownership.UNKNOWN and ambiguous:
        raise AmbiguousWriteError(
            action,
            resource,
            entry,
            "an attempt may have landed and the item was finalized since",
            existing,
        )
    raise EntryExistsError(action, resource, entry.base_uri, entry.version, existing)


#: DynamoDB's limit on the items of one TransactWriteItems.
MAX_TRANSACT_ITEMS = 100

#: Cancellation reasons that mean "rejected, not applied, try again" (another
#: transaction held an item, or throttling).
_TRANSIENT_CANCELLATIONS = frozenset(
    {
        "TransactionConflict",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
    }
)


def put_all_if_not_exists_plan(
    ctx: RequestContext, entries: list[ManifestEntry], request_token: str
) -> Requests[None]:
    """One TransactWriteItems of conditional Puts (Lance's claim condition on
    every item): all versions claimed or none; see
    ExternalManifestStore.put_all_if_not_exists.

    ``ClientRequestToken`` makes a retry of a request that landed succeed on
    DynamoDB (for ten minutes); a service that ignores it (older emulators)
    answers the retry with condition failures whose items carry our commit
    tokens, which the caller recognises.
    """
    if not entries:
        return None
    if len(entries) > MAX_TRANSACT_ITEMS:
        raise ValueError(
            f"{len(entries)} versions in one claim; DynamoDB allows {MAX_TRANSACT_ITEMS} items "
            "per TransactWriteItems"
        )
    params = {
        "TransactItems": [
            {
                "Put": {
                    "TableName": ctx.table,
                    "Item": item_from_entry(entry, ctx.committer),
                    "ConditionExpression": PUT_IF_NOT_EXISTS_CONDITION,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
            for entry in entries
        ],
        "ClientRequestToken": request_token,
    }
    action, resource = "dynamodb:TransactWriteItems", ctx.target.resource
    attempts = Attempts(ctx.retry, ctx.rng)
    while True:
        try:
            yield ApiCall("TransactWriteItems", params)
            return None
        except (ClientError, BotoCoreError) as exc:
            kind = classify(exc)
            if isinstance(exc, ClientError) and error_code(exc) == "TransactionCanceledException":
                reasons = list(exc.response.get("CancellationReasons") or [])  # type: ignore[typeddict-item]
                codes = [str(r.get("Code") or "") for r in reasons]
                failed = [i for i, code in enumerate(codes) if code == "ConditionalCheckFailed"]
                if failed:
                    attempts.succeeded()
                    existing = [
                        entry_from_item(r["Item"], ctx.target, "TransactWriteItems")
                        if i in failed and r.get("Item")
                        else None
                        for i, r in enumerate(reasons)
                    ]
                    existing += [None] * (len(entries) - len(existing))
                    raise BatchEntryExistsError(
                        action,
                        resource,
                        list(entries),
                        failed,
                        existing,
                        ambiguous=attempts.ambiguous,
                    ) from exc
                transient = any(code in _TRANSIENT_CANCELLATIONS for code in codes)
                kind = ErrorKind.THROTTLED if transient else ErrorKind.FATAL
            delay = attempts.record(kind, write=True)
            if delay is None:
                if attempts.ambiguous:
                    raise AmbiguousWriteError(
                        action,
                        resource,
                        entries[0],
                        f"the TransactWriteItems claiming {len(entries)} versions (request token "
                        f"{request_token}) may have landed: {attempts.count} attempt(s), last "
                        f"{exc}",
                    ) from exc
                raise translate_error(
                    exc, ctx.target, "TransactWriteItems", attempts=attempts.count
                ) from exc
            yield Sleep(delay)


def _get_key_item_plan(
    ctx: RequestContext, base_uri: str, key: str, operation: str
) -> Requests[KeyRecord | None]:
    slot = _base.key_slot(key)
    response = yield from call_plan(
        ctx,
        ApiCall(
            "GetItem",
            {
                "TableName": ctx.table,
                "Key": key_of(keys_base_uri(base_uri), slot),
                "ConsistentRead": True,
            },
        ),
    )
    item = response.get("Item")
    return key_from_item(item, base_uri, ctx.target, operation) if item else None


def get_key_plan(ctx: RequestContext, base_uri: str, key: str) -> Requests[KeyRecord | None]:
    """Consistent GetItem of ``key``'s item; see ExternalManifestStore.get_key."""
    found = yield from _get_key_item_plan(ctx, base_uri, key, "GetItem")
    if found is not None and found.key != key:
        raise IdempotencyKeyCollisionError(
            base_uri, key, found.key, found.version, _base.key_slot(key)
        )
    return found


def put_with_key_if_not_exists_plan(
    ctx: RequestContext, entry: ManifestEntry, key: KeyRecord
) -> Requests[None]:
    """One TransactWriteItems claiming ``entry.version`` and ``key`` (both Puts with
    Lance's claim condition); see ExternalManifestStore.put_with_key_if_not_exists.

    No ClientRequestToken: a retry of an attempt that landed meets both items with
    our commit token (ALL_OLD in the cancellation reasons), which settles it as a
    PutItem's retry is settled, without DynamoDB's ten-minute token window.
    """
    params = {
        "TransactItems": [
            {
                "Put": {
                    "TableName": ctx.table,
                    "Item": item_from_entry(entry, ctx.committer),
                    "ConditionExpression": PUT_IF_NOT_EXISTS_CONDITION,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            {
                "Put": {
                    "TableName": ctx.table,
                    "Item": item_from_key(key, ctx.committer),
                    "ConditionExpression": PUT_IF_NOT_EXISTS_CONDITION,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
        ],
    }
    action, resource = "dynamodb:TransactWriteItems", ctx.target.resource
    attempts = Attempts(ctx.retry, ctx.rng)
    while True:
        try:
            yield ApiCall("TransactWriteItems", params)
            return None
        except (ClientError, BotoCoreError) as exc:
            kind = classify(exc)
            if isinstance(exc, ClientError) and error_code(exc) == "TransactionCanceledException":
                reasons = list(exc.response.get("CancellationReasons") or [])  # type: ignore[typeddict-item]
                reasons += [{}] * (2 - len(reasons))
                codes = [str(r.get("Code") or "") for r in reasons]
                if "ConditionalCheckFailed" in codes[:2]:
                    attempts.succeeded()
                    refused = yield from _key_claim_refused(
                        ctx, entry, key, reasons[:2], attempts.ambiguous
                    )
                    if refused is None:
                        return None  # an earlier attempt of ours landed
                    raise refused from exc
                transient = any(code in _TRANSIENT_CANCELLATIONS for code in codes)
                kind = ErrorKind.THROTTLED if transient else ErrorKind.FATAL
            delay = attempts.record(kind, write=True)
            if delay is None:
                if attempts.ambiguous:
                    raise AmbiguousWriteError(
                        action,
                        resource,
                        entry,
                        f"the TransactWriteItems claiming version {entry.version} with idempotency "
                        f"key {key.key!r} may have landed: {attempts.count} attempt(s), last {exc}",
                    ) from exc
                raise translate_error(
                    exc, ctx.target, "TransactWriteItems", attempts=attempts.count
                ) from exc
            yield Sleep(delay)


def _key_claim_refused(
    ctx: RequestContext,
    entry: ManifestEntry,
    key: KeyRecord,
    reasons: Sequence[Mapping[str, Any]],
    ambiguous: bool,
) -> Requests[ExternalStoreError | None]:
    """What a cancelled keyed claim means: None if it is our own landed write, else
    the error to raise (KeyExistsError when the key is taken, EntryExistsError when
    only the version is; AmbiguousWriteError when the items cannot be read back)."""
    action, resource = "dynamodb:TransactWriteItems", ctx.target.resource
    version_failed, key_failed = (r.get("Code") == "ConditionalCheckFailed" for r in reasons)
    old_entry, old_key = (r.get("Item") for r in reasons)
    try:
        existing = (
            entry_from_item(old_entry, ctx.target, "TransactWriteItems") if old_entry else None
        )
        taken = (
            key_from_item(old_key, key.base_uri, ctx.target, "TransactWriteItems")
            if old_key
            else None
        )
        # A service that returns no old items (older DynamoDB Local): read them.
        if version_failed and existing is None:
            existing = yield from _get_optional_plan(
                ctx, entry.base_uri, entry.version, "TransactWriteItems"
            )
        if key_failed and taken is None:
            taken = yield from _get_key_item_plan(ctx, key.base_uri, key.key, "TransactWriteItems")
    except ExternalStoreError as exc:
        if not ambiguous:
            raise
        return AmbiguousWriteError(
            action,
            resource,
            entry,
            f"the condition failed after an attempt that may have landed, and reading the items "
            f"failed ({exc})",
        )
    if (
        taken is not None
        and taken.commit_token is not None
        and taken.commit_token == entry.commit_token
    ):
        return None  # the key item is ours: the write landed (both items, atomically)
    if existing is not None and ownership_of(existing, entry) is Ownership.MINE:
        return None
    if key_failed:
        if taken is None and ambiguous:
            return AmbiguousWriteError(
                action, resource, entry, "the key's condition failed but its item vanished"
            )
        return KeyExistsError(action, resource, key, taken, ambiguous=ambiguous)
    # Only the version is taken: our key item does not exist, so no attempt of ours landed.
    return EntryExistsError(action, resource, entry.base_uri, entry.version, existing)


def put_if_exists_plan(
    ctx: RequestContext, entry: ManifestEntry, expected_path: str | None
) -> Requests[ManifestEntry | None]:
    """Conditional PutItem replacing an existing entry; see ExternalManifestStore.put_if_exists."""
    params: dict[str, Any] = {
        "TableName": ctx.table,
        "Item": item_from_entry(entry, ctx.committer),
        "ConditionExpression": PUT_IF_EXISTS_CONDITION,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    if expected_path is not None:
        params["ConditionExpression"] += " AND #path = :expected_path"
        params["ExpressionAttributeNames"] = {"#path": PATH}
        params["ExpressionAttributeValues"] = {":expected_path": {"S": expected_path}}
    try:
        yield from call_plan(ctx, ApiCall("PutItem", params), write=True, entry=entry)
        return None
    except _ConditionFailed as failed:
        old = failed.old_item
        existing = entry_from_item(old, ctx.target, "PutItem") if old else None
        if existing is None:
            existing = yield from _get_optional_plan(ctx, entry.base_uri, entry.version, "PutItem")
    action, resource = "dynamodb:PutItem", ctx.target.resource
    if existing is None:
        raise EntryNotFoundError(action, resource, entry.base_uri, entry.version)
    if pointer_flip_done(existing, entry):
        return existing
    raise EntryMismatchError(action, resource, entry, expected_path, existing)


def delete_all_plan(ctx: RequestContext, base_uri: str) -> Requests[None]:
    """Delete every entry of ``base_uri`` and its key items: paginated key Queries
    (the table's partition, then its key partition), then DeleteItem per item (the
    IAM actions Lance already needs; BatchWriteItem would add one)."""
    _check_base_uri(base_uri)
    params = {
        "TableName": ctx.table,
        "KeyConditionExpression": "base_uri = :base_uri",
        "ExpressionAttributeValues": {":base_uri": {"S": base_uri}},
        "ProjectionExpression": "base_uri, version",
        "ConsistentRead": True,
    }
    items = yield from _query_pages_plan(ctx, params)
    keys = dict(params)
    keys["ExpressionAttributeValues"] = {":base_uri": {"S": keys_base_uri(base_uri)}}
    items += yield from _query_pages_plan(ctx, keys)
    for item in items:
        key = {BASE_URI: item[BASE_URI], VERSION: item[VERSION]}
        yield from call_plan(ctx, ApiCall("DeleteItem", {"TableName": ctx.table, "Key": key}))
    return None


def create_table_request(table: str) -> dict[str, Any]:
    """CreateTable parameters for the Lance layout, on-demand billing."""
    return {
        "TableName": table,
        "KeySchema": [
            {"AttributeName": BASE_URI, "KeyType": "HASH"},
            {"AttributeName": VERSION, "KeyType": "RANGE"},
        ],
        "AttributeDefinitions": [
            {"AttributeName": BASE_URI, "AttributeType": "S"},
            {"AttributeName": VERSION, "AttributeType": "N"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def create_table_plan(
    ctx: RequestContext, *, wait: bool = True, timeout: float = 120.0
) -> Requests[TableInfo]:
    """Create the table if absent; wait until ACTIVE; validate its layout.

    Safe when processes race: losing (ResourceInUseException) means someone
    else created it, so we wait for ACTIVE and validate what they made. The
    wait is bounded by ``timeout`` seconds of polling sleeps.
    """
    try:
        yield from call_plan(ctx, ApiCall("CreateTable", create_table_request(ctx.table)))
    except ExternalStoreError as exc:
        if exc.code != "ResourceInUseException":
            raise
    slept, delay = 0.0, 0.05
    while True:
        try:
            description = yield from describe_plan(ctx)
        except DynamoDBTableNotFoundError:
            # DescribeTable right after CreateTable can lag behind it.
            description = {"TableStatus": "CREATING"}
        status = str(description.get("TableStatus", "UNKNOWN"))
        if status in ("ACTIVE", "UPDATING"):  # UPDATING tables serve requests
            return check_table_description(description, ctx.target)
        if status != "CREATING":
            raise ExternalStoreError(
                "dynamodb:DescribeTable",
                ctx.target.resource,
                f"table {ctx.table!r} is {status}, not ACTIVE; wait for it or pick another name",
            )
        if not wait:
            if description.get("KeySchema"):
                return check_table_description(description, ctx.target)
            return TableInfo(ctx.table, description.get("TableArn"), status)
        if slept >= timeout:
            raise ExternalStoreError(
                "dynamodb:DescribeTable",
                ctx.target.resource,
                f"table {ctx.table!r} still {status} after {timeout:.0f}s; wait longer (timeout=) and retry",
            )
        yield Sleep(delay)
        slept += delay
        delay = min(delay * 2, 1.0)
