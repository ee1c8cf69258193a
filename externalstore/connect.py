"""From a table URI and storage options to the commit handler that serves it: the scheme table.

Every door opens its tables here (``lancetx.open`` and ``lancetx.aio``, the streaming
writer, ``commit_many``, Spark, the operator tools), so a URI means the same handler
and the same checks everywhere. :data:`SCHEMES` lists one :class:`Scheme` per kind of
URI, and :func:`scheme_of` is the only code that tells them apart:

* ``s3+ddb://bucket/path?ddbTableName=T`` — versions are claimed in DynamoDB
  (:class:`ExternalStoreCommitHandler`); the S3 store is declared legacy, so no
  request ever carries a conditional header. A sync connection and an asyncio one
  make the same checks (the table's key layout, the store's layout stamp, the
  table's moved record).
* ``s3://bucket/path`` — S3 with a real conditional PUT
  (:class:`ConditionalPutCommitHandler`); refused if declared legacy, and
  probed once per process and bucket for a store that ignores ``If-None-Match``
  (``lancetx_probe_conditional_put=false`` turns the probe off).
* a local path or ``file://`` URI — rename/link-if-not-exists on disk.

``storage_options`` use pylance's names (``aws_endpoint``, ``aws_region``,
``dynamodb_endpoint``, ``aws_access_key_id``, …), so one dict serves pylance and
lancetx alike.

A new external store is a subpackage of ``externalstore/`` (as ``dynamodb/`` is) and one
more :class:`Scheme` here; nothing else in the library names its modules.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, nullcontext
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler

# Each scheme imports what only it uses when it opens a table: opening a local table
# loads neither botocore nor the DynamoDB store, and an ``s3+ddb://`` table none of
# the asyncio stores (``tests/test_import_cost.py``).
if TYPE_CHECKING:
    from lancetx.commit.storage.objectstore import ObjectStore
    from lancetx.externalstore.base import ExternalManifestStore
    from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore

__all__ = [
    "SCHEMES",
    "Scheme",
    "TableConnection",
    "TableStores",
    "connect",
    "open_async_handler",
    "open_stores",
    "scheme_of",
]


@dataclass(frozen=True)
class TableConnection:
    """Everything needed to read and commit one table.

    ``base`` is the table's key in ``handler.store``; ``data_uri`` is the URI
    pylance should write data files to (``s3://…`` for an ``s3+ddb://`` table);
    ``storage_options`` are the options to hand pylance.
    """

    uri: str
    handler: CommitHandler
    base: str
    data_uri: str
    #: Not in the repr: it holds credentials.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class TableStores:
    """A table's stores as the operator tools open them: no commit handler, and no check
    beyond the layout ``validate`` asks for (the tools report what they find).

    ``entries`` is the external manifest store (None for a table without one);
    ``data_uri`` is the table's URI for pylance; ``bucket`` and ``external_table`` (the
    DynamoDB table's name) are None where they do not apply."""

    uri: str
    store: ObjectStore
    base: str
    entries: ExternalManifestStore | None
    data_uri: str
    bucket: str | None = None
    external_table: str | None = None


class Scheme(abc.ABC):
    """How the tables of one kind of URI are opened (one row of :data:`SCHEMES`)."""

    #: Whether the table's versions are claimed in an external store, keyed by the
    #: table's ``base`` (what settles a claim's outcome names that key).
    external: bool = False

    @abc.abstractmethod
    def connect(self, uri: str, options: dict[str, str]) -> TableConnection:
        """The table's connection (sync handler); see :func:`connect`."""

    def open_async(
        self, conn: TableConnection
    ) -> AbstractAsyncContextManager[AsyncCommitHandler | None]:
        """An asyncio handler for ``conn``'s table, closed on exit, making the checks the
        sync handler makes; None where there is none (the commit loop then runs the sync
        handler in a worker thread)."""
        del conn
        return nullcontext(None)

    @abc.abstractmethod
    def open_stores(self, uri: str, options: dict[str, str], *, validate: bool) -> TableStores:
        """The table's stores for the operator tools; see :func:`open_stores`."""


class DynamoDBScheme(Scheme):
    """``s3+ddb://bucket/path?ddbTableName=T``: Lance's DynamoDB commit handler's tables."""

    external = True

    def connect(self, uri: str, options: dict[str, str]) -> TableConnection:
        from lancetx.commit.storage.s3store import S3ObjectStore
        from lancetx.commit.storage.stores import open_object_store
        from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
        from lancetx.externalstore.dynamodb.config import DynamoDBConfig
        from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
        from lancetx.externalstore.dynamodb.uri import parse_ddb_uri
        from lancetx.externalstore.errors import (
            DynamoDBTableNotFoundError,
            DynamoDBTableSchemaError,
            StoreSchemaTooNewError,
            TableMovedError,
        )
        from lancetx.externalstore.preflight import Preflight

        parsed = parse_ddb_uri(uri)
        store, _ = open_object_store(parsed.s3_uri, options, legacy=True)
        if isinstance(store, S3ObjectStore):
            # Messages about the table name it as the user did, not by its s3:// form.
            store.name_table(parsed.base_key, uri)
        # Nothing is sent yet: the table's checks run beside its first request.
        entries = DynamoDBManifestStore.from_config(
            parsed.table_name,
            DynamoDBConfig.from_options(options),
            validate=False,
            validate_on_write=True,
        )
        handler = ExternalStoreCommitHandler(
            store,
            entries,
            preflight=Preflight(
                _table_checks(entries, parsed.base_key),
                # Beside a claim, a check that could not be made is retried at the
                # next use: the claim may have landed, and must not be reported lost.
                write_verdicts=(
                    DynamoDBTableNotFoundError,
                    DynamoDBTableSchemaError,
                    StoreSchemaTooNewError,
                    TableMovedError,
                ),
            ),
        )
        return TableConnection(uri, handler, parsed.base_key, parsed.s3_uri, options)

    def open_async(
        self, conn: TableConnection
    ) -> AbstractAsyncContextManager[AsyncCommitHandler | None]:
        return _AsyncDynamoDBHandler(conn.uri, conn.storage_options)

    def open_stores(self, uri: str, options: dict[str, str], *, validate: bool) -> TableStores:
        from lancetx.commit.storage.stores import open_object_store
        from lancetx.externalstore.dynamodb.config import DynamoDBConfig
        from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
        from lancetx.externalstore.dynamodb.uri import parse_ddb_uri

        parsed = parse_ddb_uri(uri)
        store, _ = open_object_store(parsed.s3_uri, options, legacy=True)
        entries = DynamoDBManifestStore.from_config(
            parsed.table_name, DynamoDBConfig.from_options(options), validate=validate
        )
        return TableStores(
            uri=uri,
            store=store,
            base=parsed.base_key,
            entries=entries,
            data_uri=parsed.s3_uri,
            bucket=parsed.bucket,
            external_table=parsed.table_name,
        )


def _table_checks(entries: DynamoDBManifestStore, base: str) -> list[Callable[[], object]]:
    """What an ``s3+ddb://`` connection checks beside its first request: a store of a
    newer lancetx's layout (once per table per process) and a table migrated to
    conditional PUT (once per connection: a migration may happen while a process
    runs), in one BatchGetItem; a table of another key layout rejects that read (see
    :mod:`lancetx.externalstore.dynamodb.table_checks`). The layout itself is checked
    (DescribeTable) beside the first write."""
    from lancetx.externalstore.dynamodb.table_checks import check_stamp_and_moved

    return [lambda: check_stamp_and_moved(entries, base)]


class _AsyncDynamoDBHandler:
    """An asyncio ``s3+ddb://`` handler (aioboto3), its clients closed on exit. A class,
    not an async generator: an event loop closes every async generator still open when
    it shuts down, all at once, and one whose cleanup awaits another's then fails
    ("aclose(): asynchronous generator is already running")."""

    def __init__(self, uri: str, options: Mapping[str, str]) -> None:
        self._uri = uri
        self._options = dict(options)
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> AsyncCommitHandler:
        # The asyncio stores need the [async] extra: imported only when one is opened,
        # so the sync API never loads aioboto3.
        from lancetx.commit.storage.limits import ReadLimits
        from lancetx.commit.storage.s3store import S3Config
        from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
        from lancetx.externalstore.commit_handler import AsyncExternalStoreCommitHandler
        from lancetx.externalstore.dynamodb.config import DynamoDBConfig
        from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore
        from lancetx.externalstore.dynamodb.table_checks import check_stamp_and_moved_async
        from lancetx.externalstore.dynamodb.uri import parse_ddb_uri

        parsed, options = parse_ddb_uri(self._uri), self._options
        try:
            store = await self._stack.enter_async_context(
                AsyncS3ObjectStore(
                    parsed.bucket, config=S3Config.from_options(options), legacy=True
                )
            )
            entries = await self._stack.enter_async_context(
                AsyncDynamoDBManifestStore.open(
                    parsed.table_name, DynamoDBConfig.from_options(options), validate=False
                )
            )
            # The sync connection's checks, made before the first request instead of
            # beside it: the key layout (DescribeTable, once per table per process),
            # then the layout stamp and the moved record (see table_checks).
            await entries.validate_layout()
            await check_stamp_and_moved_async(entries, parsed.base_key)
        except BaseException:
            await self._stack.aclose()
            raise
        store.name_table(parsed.base_key, self._uri)
        store.read_limits = ReadLimits.from_options(options)
        return AsyncExternalStoreCommitHandler(store, entries)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)


class ObjectStoreScheme(Scheme):
    """``s3://`` (conditional PUT), ``file://`` and local paths: the object store itself
    decides who claims a version."""

    def connect(self, uri: str, options: dict[str, str]) -> TableConnection:
        from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
        from lancetx.commit.handlers.probe import PROBE_OPTION
        from lancetx.commit.storage.stores import open_object_store

        store, base = open_object_store(uri, options)
        raw = next((v for k, v in options.items() if k.lower() == PROBE_OPTION), None)
        if raw is None:
            probe = True
        else:
            from lancetx.commit.storage.s3store import parse_bool_option

            probe = parse_bool_option(PROBE_OPTION, raw)
        handler = ConditionalPutCommitHandler(store, probe=probe)
        return TableConnection(uri, handler, base, uri, options)

    def open_stores(self, uri: str, options: dict[str, str], *, validate: bool) -> TableStores:
        from lancetx.commit.storage.stores import open_object_store

        del validate  # nothing to validate without an external store
        store, base = open_object_store(uri, options)
        bucket = None
        if uri.lower().startswith("s3://"):  # a local store has none (and needs no botocore)
            from lancetx.commit.storage.s3store import S3ObjectStore

            bucket = store.bucket if isinstance(store, S3ObjectStore) else None
        return TableStores(
            uri=uri, store=store, base=base, entries=None, data_uri=uri, bucket=bucket
        )


#: The scheme table: each kind of URI and how its tables are opened.
SCHEMES: Mapping[str, Scheme] = {"s3+ddb": DynamoDBScheme(), "object store": ObjectStoreScheme()}


def scheme_of(uri: str) -> Scheme:
    """The row of :data:`SCHEMES` that opens ``uri`` (the one place a URI's scheme decides
    how a table is reached; a malformed URI is refused when it is opened)."""
    if uri.lower().startswith("s3+ddb://"):
        return SCHEMES["s3+ddb"]
    return SCHEMES["object store"]


def connect(uri: str, storage_options: Mapping[str, str] | None = None) -> TableConnection:
    """The handler, base key and data URI for ``uri``. Raises InvalidUriError, or
    UnsupportedOperationError for a legacy ``s3://`` store.

    An ``s3+ddb://`` connection sends nothing until it is first used; its DynamoDB
    table's checks (the layout stamp once per table per process, the moved record
    once per connection: one BatchGetItem) then run beside that first request (see
    :mod:`lancetx.externalstore.preflight`) and raise instead of its result:
    DynamoDBTableNotFoundError (no such table), DynamoDBTableSchemaError (another key layout),
    StoreSchemaTooNewError (a newer lancetx's store) or TableMovedError (the table
    was migrated to conditional PUT). The key layout is also checked (DescribeTable,
    once per table per process) beside the first write. Clients are the process's
    shared ones (see :mod:`lancetx.commit.storage.aws_clients`), so connecting again
    is cheap."""
    return scheme_of(uri).connect(uri, dict(storage_options or {}))


def open_async_handler(
    conn: TableConnection,
) -> AbstractAsyncContextManager[AsyncCommitHandler | None]:
    """``async with open_async_handler(conn) as handler``: an asyncio commit handler
    (aioboto3, the ``async`` extra) for ``conn``'s table, its clients closed on exit;
    None for a table without one (``s3://``, local: its commit loop runs the sync
    handler in a worker thread).

    An ``s3+ddb://`` handler makes the sync connection's checks when it is opened:
    the key layout (DescribeTable, once per table per process), the layout stamp (once
    per table per process) and the moved record (each time), the last two in one
    BatchGetItem; it raises DynamoDBTableNotFoundError, DynamoDBTableSchemaError,
    StoreSchemaTooNewError or TableMovedError as the sync connection does."""
    return scheme_of(conn.uri).open_async(conn)


def open_stores(
    uri: str, storage_options: Mapping[str, str] | None = None, *, validate: bool = True
) -> TableStores:
    """``uri``'s object store and external manifest store, for the operator tools:
    opening writes nothing and finalizes nothing; with ``validate`` an ``s3+ddb://``
    table's layout and stamp are checked now (see :class:`DynamoDBManifestStore`)."""
    return scheme_of(uri).open_stores(uri, dict(storage_options or {}), validate=validate)
