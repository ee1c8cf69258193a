"""The blocking DynamoDB manifest store, and table creation.

Every request is a plan of :mod:`.plans`, performed by :func:`~.drivers.run_plan`;
the table's layout is checked once per (endpoint, region, table) per process and
remembered here, for the async store too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from lancetx.commit.handlers.queue import Turns
from lancetx.externalstore.base import ExternalManifestStore, KeyRecord, ManifestEntry
from lancetx.externalstore.dynamodb.commit_queue import (
    end_turn_plan,
    read_turns_plan,
    take_ticket_plan,
)
from lancetx.externalstore.dynamodb.config import (
    DEFAULT_COMMITTER,
    DynamoDBConfig,
    make_client,
    target_of,
    warn_if_sdk_retries,
)
from lancetx.externalstore.dynamodb.drivers import run_plan
from lancetx.externalstore.dynamodb.plans import (
    MAX_TRANSACT_ITEMS,
    RequestContext,
    Requests,
    TableInfo,
    batch_get_plan,
    create_table_plan,
    delete_all_plan,
    get_entries_plan,
    get_key_plan,
    get_plan,
    latest_plan,
    list_plan,
    put_all_if_not_exists_plan,
    put_if_exists_plan,
    put_if_not_exists_plan,
    put_with_key_if_not_exists_plan,
    validate_plan,
)
from lancetx.externalstore.dynamodb.retry import DYNAMODB_RETRY, RetryPolicy
from lancetx.externalstore.dynamodb.store_schema import (
    CURRENT_SCHEMA_VERSION,
    check_stamp_with,
    remember_stamp,
    stamp_new_table_plan,
)
from lancetx.externalstore.dynamodb.uri import parse_ddb_uri
from lancetx.externalstore.errors import (
    AccessDeniedError,
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
    DynamoDBTarget,
    InvalidRequestError,
)
from lancetx.externalstore.preflight import Preflight

log = logging.getLogger(__name__)

__all__ = [
    "DynamoDBManifestStore",
    "cached_validation",
    "clear_validation_cache",
    "create_table",
    "remember_validation",
]

T = TypeVar("T")

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

    Stamps the store's layout as ``lancetx-sync create-table`` does (an unstamped
    table, new or found, is brought to this release's layout; one stamped by a newer
    lancetx raises StoreSchemaTooNewError). With ``wait=False`` a table still
    CREATING is not stamped: call again once it is ACTIVE.
    """
    ctx = RequestContext(target_of(client, name), retry=retry or DYNAMODB_RETRY)
    info = run_plan(client, create_table_plan(ctx, wait=wait, timeout=timeout))
    if info.status in ("ACTIVE", "UPDATING"):
        found = run_plan(client, stamp_new_table_plan(ctx))
        remember_stamp(client, name, found if found is not None else CURRENT_SCHEMA_VERSION)
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
        self._ctx = RequestContext(
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
        parsed = parse_ddb_uri(uri)
        return cls.from_config(
            parsed.table_name, DynamoDBConfig.from_options(storage_options), **kwargs
        )

    @property
    def target(self) -> DynamoDBTarget:
        """Table, region, endpoint and (after validation) ARN."""
        return self._ctx.target

    def _run(self, plan: Requests[T]) -> T:
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

    def _write(self, plan: Requests[T]) -> T:
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

    def get_entries(self, base_uri: str, versions: Sequence[int]) -> list[ManifestEntry]:
        """One consistent GetItem (one version) or BatchGetItem (several); see
        :meth:`ExternalManifestStore.get_entries`."""
        return self._run(get_entries_plan(self._ctx, base_uri, versions))

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
    #: DynamoDB's limit on the items of one TransactWriteItems.
    max_claim_entries = MAX_TRANSACT_ITEMS

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
        """Join ``base_uri``'s commit queue (see :mod:`.commit_queue`)."""
        return self._write(take_ticket_plan(self._ctx, base_uri))

    def read_turns(self, base_uri: str) -> Turns:
        return self._run(read_turns_plan(self._ctx, base_uri))

    def end_turn(self, base_uri: str, ticket: int, version: int | None = None) -> None:
        self._write(end_turn_plan(self._ctx, base_uri, ticket, version))
