"""DynamoDB external manifest store, compatible with Lance's ``s3+ddb://`` tables.

Table layout (Lance's, ``rust/lance-table/src/io/commit/dynamodb.rs``): HASH key
``base_uri`` (S), RANGE key ``version`` (N); attributes ``path`` (S), ``size``
(N), ``committer`` (S), optional ``e_tag`` (S), plus lancetx's optional
``commit_token`` (S), ``bucket`` (S, the bucket of the manifests: Lance's key
omits it) and the transaction in brief — ``txn_operation``, ``txn_uuid``,
``txn_idempotency_key`` (S) — with ``claimed_at`` (N, epoch milliseconds) and, for a
claim made from the commit queue, its ``queue_ticket`` (N); pylance ignores them all.

Key items (lancetx only; see :mod:`lancetx.externalstore.base`): ``base_uri`` (S) =
the table's ``base_uri`` + ``#lancetx-keys``, ``version`` (N) = the key's slot (63
bits of its SHA-256), ``idempotency_key`` (S, the key itself: a reader checks it,
two keys may share a slot), ``claimed_version`` (N), ``txn_uuid`` (S),
``commit_token`` (S) and ``committer`` (S). pylance queries only its table's own
``base_uri`` and never sees them. A commit with an idempotency key claims its
version item and its key item in one ``TransactWriteItems`` (two Puts, each with
Lance's ``attribute_not_exists`` condition; IAM: ``dynamodb:PutItem``, which a
writer has already): the same request count as the plain ``PutItem`` it replaces.

Structure (sans-IO): every operation is a *plan*, a generator that yields
:class:`ApiCall` (perform this DynamoDB request and send me the response, or
throw the botocore exception into me) and :class:`Sleep` steps, and returns
the result. Plans hold all request building, response parsing, pagination,
retries and ambiguity resolution. :func:`run_plan` here and
``dynamodb_async.run_plan_async`` are the only code that performs I/O, so the
sync and async stores share everything else.

Differences from Lance, on purpose:

* DescribeTable also checks the key attribute *types* (Lance checks names only;
  a ``version`` of type S passes there and fails at the first write).
* ``put_if_not_exists`` asks for ``ReturnValuesOnConditionCheckFailure=ALL_OLD``
  and tells "the existing item is mine" (an earlier attempt landed) from
  "another writer's", via the commit token; Lance reports any error as a
  conflict.
* ``put_if_exists`` can require ``path = :expected``, so a pointer flip never
  overwrites a different commit.
* ``delete_all`` paginates.
* Our own bounded, jittered retries (see :mod:`lancetx.externalstore.retry`).
* Endpoint, region and credentials of DynamoDB are configured separately from
  S3 (:class:`DynamoDBConfig`).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from lancetx.commit.errors import IdempotencyKeyCollisionError
from lancetx.commit.format.location import TransactionSummary
from lancetx.commit.handlers.interface import Turns
from lancetx.commit.storage.aws_clients import NOT_A_REGION, is_region_name, session_region
from lancetx.commit.storage.aws_clients import make_client as make_shared_client
from lancetx.commit.storage.secrets import remember_secrets
from lancetx.externalstore import base as _base
from lancetx.externalstore.base import (
    ExternalManifestStore,
    KeyRecord,
    ManifestEntry,
    Ownership,
    keys_base_uri,
    ownership_of,
    pointer_flip_done,
)
from lancetx.externalstore.errors import (
    AccessDeniedError,
    AmbiguousWriteError,
    BatchEntryExistsError,
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
    DynamoDBTarget,
    EntryExistsError,
    EntryMismatchError,
    EntryNotFoundError,
    ExternalStoreError,
    InvalidConfigError,
    InvalidRequestError,
    KeyExistsError,
    MalformedEntryError,
    ThrottledError,
    error_code,
    translate_error,
)
from lancetx.externalstore.preflight import Preflight
from lancetx.externalstore.retry import (
    BOTOCORE_RETRIES,
    DYNAMODB_RETRY,
    Attempts,
    ErrorKind,
    RetryPolicy,
    classify,
)

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_COMMITTER",
    "DEFAULT_REGION",
    "DEFAULT_REGION_NOTE",
    "MAX_TRANSACT_ITEMS",
    "ApiCall",
    "DynamoDBConfig",
    "DynamoDBManifestStore",
    "Plan",
    "Sleep",
    "TableInfo",
    "clear_validation_cache",
    "create_table",
    "create_table_plan",
    "entry_from_item",
    "get_key_plan",
    "item_from_entry",
    "item_from_key",
    "key_from_item",
    "make_client",
    "put_all_if_not_exists_plan",
    "put_with_key_if_not_exists_plan",
    "run_plan",
]

T = TypeVar("T")

#: ``committer`` written by lancetx (Lance writes ``"lancedb"``).
DEFAULT_COMMITTER = "lancetx"
#: Lance's fallback when no region is configured anywhere.
DEFAULT_REGION = "us-west-2"

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
#: Key items' own attributes.
IDEMPOTENCY_KEY = "idempotency_key"
CLAIMED_VERSION = "claimed_version"
#: Lance versions are u64; DynamoDB numbers go to 38 digits.
MAX_VERSION = 2**64 - 1

#: Lance's condition string, so Lance and lancetx writers exclude each other.
PUT_IF_NOT_EXISTS_CONDITION = "attribute_not_exists(base_uri) AND attribute_not_exists(version)"
PUT_IF_EXISTS_CONDITION = "attribute_exists(base_uri) AND attribute_exists(version)"


# ============================================================================ config


def _first(sources: list[tuple[Mapping[str, str], tuple[str, ...]]]) -> tuple[str, str] | None:
    for mapping, keys in sources:
        for key in keys:
            value = mapping.get(key)
            if value not in (None, ""):
                return key, str(value)
    return None


def _number(key: str, raw: str, kind: Callable[[str], float]) -> float:
    try:
        value = kind(raw)
    except ValueError:
        raise InvalidConfigError(key, raw, "expected a number") from None
    if value <= 0:
        raise InvalidConfigError(key, raw, "must be > 0")
    return value


@dataclass(frozen=True)
class DynamoDBConfig:
    """How to reach DynamoDB, independently of S3.

    ``None`` fields fall back to boto3's defaults (credential chain, profile
    region); a missing region finally falls back to Lance's ``us-west-2``.
    The generic ``AWS_ENDPOINT_URL`` (often an S3-compatible store's endpoint)
    is never used for DynamoDB, as in Lance.
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    retry: RetryPolicy = field(default=DYNAMODB_RETRY)
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    max_pool_connections: int = 32
    committer: str = DEFAULT_COMMITTER

    def __post_init__(self) -> None:
        # Messages and logs scrub what they were given (lancetx.commit.storage.secrets).
        remember_secrets(self.secret_access_key, self.session_token)

    @classmethod
    def from_options(
        cls, options: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None
    ) -> DynamoDBConfig:
        """Build from pylance-style storage options and the environment.

        Option keys are case-insensitive. Precedence, first found wins:

        * endpoint: ``dynamodb_endpoint`` (Lance), ``aws_endpoint_url_dynamodb``;
          env ``DYNAMODB_ENDPOINT`` (Lance), ``AWS_ENDPOINT_URL_DYNAMODB`` (boto3, delta-rs).
        * region: ``dynamodb_region``, ``aws_region_dynamodb``; env
          ``AWS_REGION_DYNAMODB``; then S3's ``aws_region`` / ``region``; env
          ``AWS_REGION``, ``AWS_DEFAULT_REGION``.
        * credentials: the ``_dynamodb`` set (``aws_access_key_id_dynamodb``,
          ``aws_secret_access_key_dynamodb``, ``aws_session_token_dynamodb``,
          as options or upper-case env vars) if any of it is given, else S3's
          (``aws_access_key_id`` / ``access_key_id``, ``aws_secret_access_key`` /
          ``secret_access_key``, ``aws_session_token`` / ``session_token`` /
          ``token``), else boto3's default chain.
        * ``dynamodb_profile``; ``dynamodb_max_attempts``,
          ``dynamodb_connect_timeout``, ``dynamodb_read_timeout`` (seconds),
          ``dynamodb_committer``.
        """
        opts = {k.lower(): v for k, v in (options or {}).items() if v is not None}
        environ = os.environ if env is None else env

        endpoint = _first(
            [
                (opts, ("dynamodb_endpoint", "aws_endpoint_url_dynamodb")),
                (environ, ("DYNAMODB_ENDPOINT", "AWS_ENDPOINT_URL_DYNAMODB")),
            ]
        )
        region = _first(
            [
                (opts, ("dynamodb_region", "aws_region_dynamodb")),
                (environ, ("AWS_REGION_DYNAMODB",)),
                (opts, ("aws_region", "region")),
                (environ, ("AWS_REGION", "AWS_DEFAULT_REGION")),
            ]
        )
        if region is not None and not is_region_name(region[1]):
            raise InvalidConfigError(region[0], region[1], NOT_A_REGION)
        ddb_creds = {
            name: _first([(opts, (f"{name}_dynamodb",)), (environ, (f"{name.upper()}_DYNAMODB",))])
            for name in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
        }
        if any(ddb_creds.values()):
            key_id, secret, token = (
                ddb_creds["aws_access_key_id"],
                ddb_creds["aws_secret_access_key"],
                ddb_creds["aws_session_token"],
            )
            origin = "aws_access_key_id_dynamodb / aws_secret_access_key_dynamodb"
        else:
            key_id = _first([(opts, ("aws_access_key_id", "access_key_id"))])
            secret = _first([(opts, ("aws_secret_access_key", "secret_access_key"))])
            token = _first([(opts, ("aws_session_token", "session_token", "token"))])
            origin = "aws_access_key_id / aws_secret_access_key"
        if (key_id is None) != (secret is None):
            raise InvalidConfigError(
                origin, "(one of the pair)", "give both the key id and the secret, or neither"
            )

        retry = DYNAMODB_RETRY
        if (raw := opts.get("dynamodb_max_attempts")) is not None:
            retry = replace(retry, max_attempts=int(_number("dynamodb_max_attempts", raw, int)))
        kwargs: dict[str, Any] = {}
        if (raw := opts.get("dynamodb_connect_timeout")) is not None:
            kwargs["connect_timeout"] = _number("dynamodb_connect_timeout", raw, float)
        if (raw := opts.get("dynamodb_read_timeout")) is not None:
            kwargs["read_timeout"] = _number("dynamodb_read_timeout", raw, float)
        if (raw := opts.get("dynamodb_committer")) is not None:
            kwargs["committer"] = raw
        return cls(
            endpoint_url=endpoint[1] if endpoint else None,
            region=region[1] if region else None,
            access_key_id=key_id[1] if key_id else None,
            secret_access_key=secret[1] if secret else None,
            session_token=token[1] if token else None,
            profile=opts.get("dynamodb_profile"),
            retry=retry,
            **kwargs,
        )

    def client_kwargs(
        self, session_region: str | None = None, config_class: type[BotoConfig] = BotoConfig
    ) -> dict[str, Any]:
        """Keyword arguments for ``session.client("dynamodb", **kwargs)``.

        botocore's own retries are off (``total_max_attempts=1``): our loop owns
        them, see :mod:`lancetx.externalstore.retry`.
        """
        botocore_options: dict[str, Any] = {
            "retries": BOTOCORE_RETRIES,
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "max_pool_connections": self.max_pool_connections,
            # Never send DynamoDB requests to AWS_ENDPOINT_URL (usually S3's).
            "ignore_configured_endpoint_urls": True,
        }
        kwargs: dict[str, Any] = {
            "region_name": self.region or session_region or DEFAULT_REGION,
            "config": config_class(**botocore_options),
        }
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.access_key_id:
            kwargs["aws_access_key_id"] = self.access_key_id
            kwargs["aws_secret_access_key"] = self.secret_access_key
            if self.session_token:
                kwargs["aws_session_token"] = self.session_token
        return kwargs


def warn_if_sdk_retries(client: Any) -> None:
    """Warn when ``client`` retries inside botocore: our retry loop must see every
    attempt to tell a landed claim from a lost one (see :mod:`.retry`)."""
    retries = getattr(getattr(getattr(client, "meta", None), "config", None), "retries", None)
    if isinstance(retries, dict) and retries.get("total_max_attempts") == 1:
        return
    log.warning(
        "DynamoDB client %r retries inside botocore (retries=%r): a claim whose first attempt "
        "landed and whose retries were then throttled would be reported as not applied. Build "
        "clients with lancetx.externalstore.dynamodb.make_client, or pass "
        "botocore Config(retries=%r)",
        client,
        retries,
        BOTOCORE_RETRIES,
    )


def make_client(config: DynamoDBConfig | None = None) -> Any:
    """The process's boto3 DynamoDB client for ``config`` (built on first use, then
    shared by every store configured the same way; thread-safe).

    With the AWS model cache on (the default) the client has only the operations
    lancetx needs (see :mod:`lancetx.commit.storage.aws_service_models`); use your own
    boto3 client for others (Scan, ListTables…)."""
    config = config or DynamoDBConfig.from_options()
    configured = config.region or session_region(config.profile)
    return make_shared_client(
        "dynamodb",
        profile=config.profile,
        # A client on the fallback region says so in every error naming its target.
        variant="" if configured else "default-region",
        setup=None if configured else mark_default_region,
        **config.client_kwargs(configured),
    )


#: Attribute of a DynamoDB client whose region nobody configured (see :func:`target_of`).
REGION_NOTE_ATTRIBUTE = "_lancetx_region_note"
#: What errors say about such a region.
DEFAULT_REGION_NOTE = (
    "not configured, Lance's default: set the storage option dynamodb_region or "
    "aws_region, or AWS_REGION"
)


def mark_default_region(client: Any) -> None:
    """Note on ``client`` that its region is the fallback, not one anybody configured."""
    setattr(client, REGION_NOTE_ATTRIBUTE, DEFAULT_REGION_NOTE)


# ============================================================================ sans-IO core


@dataclass(frozen=True)
class ApiCall:
    """A plan step: perform DynamoDB ``operation`` with ``params``."""

    operation: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Sleep:
    """A plan step: wait ``seconds`` before the next step."""

    seconds: float


Step = ApiCall | Sleep
Plan = Generator[Step, Any, T]

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
class PlanContext:
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
    ctx: PlanContext, call: ApiCall, *, write: bool = False, entry: ManifestEntry | None = None
) -> Plan[Any]:
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


def describe_plan(ctx: PlanContext) -> Plan[dict[str, Any]]:
    """DescribeTable → the ``Table`` description. Raises DynamoDBTableNotFoundError."""
    response = yield from call_plan(ctx, ApiCall("DescribeTable", {"TableName": ctx.table}))
    table = response.get("Table")
    if not table:
        raise DynamoDBTableNotFoundError("dynamodb:DescribeTable", ctx.target.resource, ctx.target)
    return cast("dict[str, Any]", table)


def validate_plan(ctx: PlanContext) -> Plan[TableInfo]:
    """DescribeTable and check the layout. Raises DynamoDBTableNotFoundError / DynamoDBTableSchemaError."""
    description = yield from describe_plan(ctx)
    return check_table_description(description, ctx.target)


def _get_optional_plan(
    ctx: PlanContext, base_uri: str, version: int, operation: str
) -> Plan[ManifestEntry | None]:
    response = yield from call_plan(
        ctx,
        ApiCall(
            "GetItem",
            {"TableName": ctx.table, "Key": key_of(base_uri, version), "ConsistentRead": True},
        ),
    )
    item = response.get("Item")
    return entry_from_item(item, ctx.target, operation) if item else None


def get_plan(ctx: PlanContext, base_uri: str, version: int) -> Plan[ManifestEntry]:
    """Consistent GetItem. Raises EntryNotFoundError."""
    entry = yield from _get_optional_plan(ctx, base_uri, version, "GetItem")
    if entry is None:
        raise EntryNotFoundError("dynamodb:GetItem", ctx.target.resource, base_uri, version)
    return entry


def batch_get_plan(
    ctx: PlanContext, keys: Sequence[Mapping[str, Any]]
) -> Plan[list[dict[str, Any] | None]]:
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


def latest_plan(ctx: PlanContext, base_uri: str) -> Plan[ManifestEntry | None]:
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


def _query_pages_plan(ctx: PlanContext, params: dict[str, Any]) -> Plan[list[dict[str, Any]]]:
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


def list_plan(ctx: PlanContext, base_uri: str, since: int = 0) -> Plan[list[ManifestEntry]]:
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


def put_if_not_exists_plan(ctx: PlanContext, entry: ManifestEntry) -> Plan[None]:
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
    ctx: PlanContext, entries: list[ManifestEntry], request_token: str
) -> Plan[None]:
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
    ctx: PlanContext, base_uri: str, key: str, operation: str
) -> Plan[KeyRecord | None]:
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


def get_key_plan(ctx: PlanContext, base_uri: str, key: str) -> Plan[KeyRecord | None]:
    """Consistent GetItem of ``key``'s item; see ExternalManifestStore.get_key."""
    found = yield from _get_key_item_plan(ctx, base_uri, key, "GetItem")
    if found is not None and found.key != key:
        raise IdempotencyKeyCollisionError(
            base_uri, key, found.key, found.version, _base.key_slot(key)
        )
    return found


def put_with_key_if_not_exists_plan(
    ctx: PlanContext, entry: ManifestEntry, key: KeyRecord
) -> Plan[None]:
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
    ctx: PlanContext,
    entry: ManifestEntry,
    key: KeyRecord,
    reasons: Sequence[Mapping[str, Any]],
    ambiguous: bool,
) -> Plan[ExternalStoreError | None]:
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
    ctx: PlanContext, entry: ManifestEntry, expected_path: str | None
) -> Plan[ManifestEntry | None]:
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


def delete_all_plan(ctx: PlanContext, base_uri: str) -> Plan[None]:
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
    ctx: PlanContext, *, wait: bool = True, timeout: float = 120.0
) -> Plan[TableInfo]:
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


# ============================================================================ sync driver


def run_plan(client: Any, plan: Plan[T], sleep: Callable[[float], None] = time.sleep) -> T:
    """Drive ``plan`` with a boto3 client: the only blocking I/O of the sync store."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = plan.throw(error) if error is not None else plan.send(value)
        except StopIteration as stop:
            return cast(T, stop.value)
        value, error = None, None
        if isinstance(step, Sleep):
            sleep(step.seconds)
            continue
        try:
            value = getattr(client, METHODS[step.operation])(**step.params)
        except (ClientError, BotoCoreError) as exc:
            error = exc


# ============================================================================ validation cache

_VALIDATED: dict[tuple[str | None, str | None, str], TableInfo] = {}
_VALIDATED_LOCK = threading.Lock()


_WARNED: set[tuple[str | None, ...]] = set()


def _warn_once(key: tuple[str | None, ...]) -> bool:
    """Whether this is the process's first warning about ``key``."""
    with _VALIDATED_LOCK:
        first = key not in _WARNED
        _WARNED.add(key)
        return first


def validation_key(target: DynamoDBTarget) -> tuple[str | None, str | None, str]:
    """Cache key of a validated table: (endpoint, region, table)."""
    return (target.endpoint, target.region, target.table)


def cached_validation(target: DynamoDBTarget) -> TableInfo | None:
    """The cached TableInfo of ``target``, if validated in this process."""
    with _VALIDATED_LOCK:
        return _VALIDATED.get(validation_key(target))


def remember_validation(target: DynamoDBTarget, info: TableInfo) -> None:
    """Cache a successful validation (only ACTIVE tables, so a CREATING one is re-checked)."""
    if info.status == "ACTIVE":
        with _VALIDATED_LOCK:
            _VALIDATED[validation_key(target)] = info


def clear_validation_cache() -> None:
    """Forget every validated table (tests; after re-creating a table)."""
    with _VALIDATED_LOCK:
        _VALIDATED.clear()


def target_of(client: Any, table_name: str) -> DynamoDBTarget:
    """The target of ``table_name`` as reached through ``client``."""
    meta = getattr(client, "meta", None)
    return DynamoDBTarget(
        table=table_name,
        region=getattr(meta, "region_name", None),
        endpoint=getattr(meta, "endpoint_url", None),
        region_note=getattr(client, REGION_NOTE_ATTRIBUTE, None),
    )


# ============================================================================ sync store


def create_table(
    client: Any,
    name: str,
    *,
    wait: bool = True,
    timeout: float = 120.0,
    retry: RetryPolicy | None = None,
) -> TableInfo:
    """Create a Lance-layout manifest table (PAY_PER_REQUEST) if it does not exist.

    Waits for ACTIVE and validates the layout; safe when several processes
    race (the losers wait for the winner's table). Raises DynamoDBTableSchemaError if
    a table of that name exists with another layout.
    """
    ctx = PlanContext(target_of(client, name), retry=retry or DYNAMODB_RETRY)
    info = run_plan(client, create_table_plan(ctx, wait=wait, timeout=timeout))
    if info.status == "ACTIVE":  # it may be another lancetx's table: same check as opening
        from lancetx.externalstore.store_schema import check_stamp

        check_stamp(client, name)
    remember_validation(ctx.target, info)
    return info


class DynamoDBManifestStore(ExternalManifestStore):
    """The external manifest store on a DynamoDB table (blocking, thread-safe).

    ``client`` is a boto3 DynamoDB client (prefer :func:`make_client`, which
    turns botocore's retries off so ours see every attempt). With ``validate``
    the table's layout is checked now, once per (endpoint, region, table) per
    process (DescribeTable; needs ``dynamodb:DescribeTable``). Without it
    nothing is sent until the first operation: a missing table then raises
    DynamoDBTableNotFoundError, and a request DynamoDB rejects on a table not yet
    validated in this process is checked against the layout (one DescribeTable,
    on that error only) and raises DynamoDBTableSchemaError when the layout is why; with
    ``validate_on_write`` as well, the layout is checked beside the store's first
    write (DescribeTable once per table per process, see :mod:`.preflight`), so reads
    need no DescribeTable and a writer still learns of another layout from its first
    write. ``page_size`` bounds the items per Query page (None: DynamoDB's 1 MB pages).
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        committer: str = DEFAULT_COMMITTER,
        retry: RetryPolicy | None = None,
        page_size: int | None = None,
        validate: bool = True,
        validate_on_write: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        warn_if_sdk_retries(client)
        self.table_name = table_name
        self._ctx = PlanContext(
            target_of(client, table_name),
            retry=retry or DYNAMODB_RETRY,
            committer=committer,
            page_size=page_size,
        )
        self._sleep = sleep
        self.table_info: TableInfo | None = None
        #: The layout check beside the first write (None: not asked for).
        self._write_check = (
            Preflight(
                [self._check_layout_for_writes],
                verdicts=(DynamoDBTableSchemaError, DynamoDBTableNotFoundError),
            )
            if validate_on_write
            else None
        )
        if validate:
            self.validate()

    @classmethod
    def from_config(
        cls, table_name: str, config: DynamoDBConfig | None = None, **kwargs: Any
    ) -> DynamoDBManifestStore:
        """A store with its own client built from ``config`` (default: options from the environment)."""
        config = config or DynamoDBConfig.from_options()
        kwargs.setdefault("retry", config.retry)
        kwargs.setdefault("committer", config.committer)
        return cls(make_client(config), table_name, **kwargs)

    @classmethod
    def from_uri(
        cls, uri: str, storage_options: Mapping[str, str] | None = None, **kwargs: Any
    ) -> DynamoDBManifestStore:
        """The store named by ``s3+ddb://bucket/path?ddbTableName=T``, configured from
        pylance-style ``storage_options`` (see :meth:`DynamoDBConfig.from_options`)."""
        from lancetx.externalstore.uri import parse_ddb_uri

        parsed = parse_ddb_uri(uri)
        return cls.from_config(
            parsed.table_name, DynamoDBConfig.from_options(storage_options), **kwargs
        )

    @property
    def target(self) -> DynamoDBTarget:
        """Table, region, endpoint and (after validation) ARN."""
        return self._ctx.target

    def _run(self, plan: Plan[T]) -> T:
        try:
            return run_plan(self.client, plan, self._sleep)
        except InvalidRequestError as exc:
            # A table of another key layout rejects our keys; say so plainly instead.
            self._explain_rejection(exc)
            raise
        except DynamoDBTableNotFoundError as exc:
            # Some DynamoDB implementations (dynalite) answer a BatchGetItem whose keys
            # do not fit the table's layout with "resource not found": ask the table.
            self._explain_rejection(exc)
            raise

    def _write(self, plan: Plan[T]) -> T:
        check = self._write_check
        if check is None or check.passed:
            return self._run(plan)
        if cached_validation(self._ctx.target) is not None:
            self.validate_layout()  # from the process's cache: nothing sent
            return self._run(plan)
        return check.beside(lambda: self._run(plan))

    def _check_layout_for_writes(self) -> None:
        try:
            self.validate_layout()
        except AccessDeniedError as exc:
            if exc.code != "AccessDeniedException":
                raise  # the credentials, not the policy: check again at the next write
            # The policy lacks DescribeTable. A wrong layout still makes DynamoDB reject
            # our keys, which is explained when it happens; do not ask at every write.
            if _warn_once(("describe-denied", *validation_key(self._ctx.target))):
                log.warning(
                    "cannot check the key layout of DynamoDB table %s before writing: %s",
                    self._ctx.target.resource,
                    exc,
                )

    def _explain_rejection(self, exc: InvalidRequestError | DynamoDBTableNotFoundError) -> None:
        """Raise DynamoDBTableSchemaError (from ``exc``) when the table's layout is the reason
        DynamoDB rejected a request; return when the layout is fine (or the table is
        indeed missing): the caller raises ``exc`` then."""
        if cached_validation(self._ctx.target) is not None:
            return
        try:
            info = run_plan(self.client, validate_plan(self._ctx), self._sleep)
        except DynamoDBTableSchemaError as schema:
            raise schema from exc
        except DynamoDBTableNotFoundError:
            return
        remember_validation(self._ctx.target, info)

    def check_stamp(self) -> int | None:
        """Refuse a store stamped by a newer lancetx (one GetItem per table per process).
        Raises StoreSchemaTooNewError, or what reading the table raises (e.g.
        DynamoDBTableNotFoundError, DynamoDBTableSchemaError)."""
        from lancetx.externalstore.store_schema import check_stamp_with

        return check_stamp_with(self.client, self.table_name, self._run)

    def validate(self) -> TableInfo:
        """Check the table's layout and the store's layout stamp (each once per table per
        process). Raises DynamoDBTableNotFoundError / DynamoDBTableSchemaError / StoreSchemaTooNewError."""
        info = self.validate_layout()
        self.check_stamp()  # a newer lancetx's layout: refuse
        return info

    def validate_layout(self) -> TableInfo:
        """Check the table's key layout (DescribeTable, cached per process). Raises
        DynamoDBTableNotFoundError / DynamoDBTableSchemaError."""
        info = cached_validation(self._ctx.target)
        if info is None:
            info = self._run(validate_plan(self._ctx))
            remember_validation(self._ctx.target, info)
        self.table_info = info
        if info.arn:
            self._ctx.target = replace(self._ctx.target, arn=info.arn)
        return info

    def get(self, base_uri: str, version: int) -> ManifestEntry:
        return self._run(get_plan(self._ctx, base_uri, version))

    def get_items(self, keys: Sequence[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
        """The raw items at ``keys`` (None where there is none), in one consistent
        BatchGetItem (``dynamodb:BatchGetItem``)."""
        return self._run(batch_get_plan(self._ctx, keys))

    def latest(self, base_uri: str) -> ManifestEntry | None:
        entry = self._run(latest_plan(self._ctx, base_uri))
        if entry is None and self._write_check is not None:
            # Nothing found may be a table of another layout answering our Query (a
            # hash-only table does); check the layout before anyone concludes from the
            # absence (e.g. onboards the table). Found items are parsed strictly.
            self.validate_layout()
        return entry

    def put_if_not_exists(self, entry: ManifestEntry) -> None:
        self._write(put_if_not_exists_plan(self._ctx, entry))

    keeps_keys = True

    def put_with_key_if_not_exists(self, entry: ManifestEntry, key: KeyRecord) -> None:
        """The version and its idempotency key in one TransactWriteItems (two Puts)."""
        self._write(put_with_key_if_not_exists_plan(self._ctx, entry, key))

    def get_key(self, base_uri: str, key: str) -> KeyRecord | None:
        return self._run(get_key_plan(self._ctx, base_uri, key))

    def put_if_exists(
        self, entry: ManifestEntry, *, expected_path: str | None = None
    ) -> ManifestEntry | None:
        return self._write(put_if_exists_plan(self._ctx, entry, expected_path))

    def put_all_if_not_exists(
        self, entries: Sequence[ManifestEntry], *, request_token: str
    ) -> None:
        """All versions claimed in one TransactWriteItems, or none (it has no IAM
        action of its own: each Put needs ``dynamodb:PutItem`` on its item's key)."""
        self._write(put_all_if_not_exists_plan(self._ctx, list(entries), request_token))

    def list_entries(self, base_uri: str, since: int = 0) -> list[ManifestEntry]:
        return self._run(list_plan(self._ctx, base_uri, since))

    def delete_all(self, base_uri: str) -> None:
        self._write(delete_all_plan(self._ctx, base_uri))

    def take_ticket(self, base_uri: str) -> Turns:
        """Join ``base_uri``'s commit queue (see :mod:`lancetx.externalstore.commit_queue`)."""
        from lancetx.externalstore.commit_queue import take_ticket_plan

        return self._write(take_ticket_plan(self._ctx, base_uri))

    def read_turns(self, base_uri: str) -> Turns:
        from lancetx.externalstore.commit_queue import read_turns_plan

        return self._run(read_turns_plan(self._ctx, base_uri))

    def end_turn(self, base_uri: str, ticket: int, version: int | None = None) -> None:
        from lancetx.externalstore.commit_queue import end_turn_plan

        self._write(end_turn_plan(self._ctx, base_uri, ticket, version))
