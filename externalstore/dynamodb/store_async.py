"""The asyncio DynamoDB manifest store, over aioboto3.

A thin driver: every request is built, parsed, retried and resolved by the
plans in :mod:`.plans`; :func:`~.drivers.run_plan_async` only
awaits the client calls and the sleeps those plans ask for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import replace
from types import TracebackType
from typing import Any, Generic, TypeVar

from lancetx.commit.errors import MissingExtraError

try:
    import aioboto3
    from aiobotocore.config import AioConfig
except ImportError as exc:  # the sync API never imports this module
    raise MissingExtraError("the asyncio DynamoDB store", "async", exc.name) from exc

from lancetx.commit.handlers.queue import Turns
from lancetx.externalstore.base import AsyncExternalManifestStore, KeyRecord, ManifestEntry
from lancetx.externalstore.dynamodb.commit_queue import (
    end_turn_plan,
    read_turns_plan,
    take_ticket_plan,
)
from lancetx.externalstore.dynamodb.config import (
    DEFAULT_COMMITTER,
    DynamoDBConfig,
    mark_default_region,
    target_of,
    warn_if_sdk_retries,
)
from lancetx.externalstore.dynamodb.drivers import run_plan_async
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
from lancetx.externalstore.dynamodb.store import cached_validation, remember_validation
from lancetx.externalstore.dynamodb.store_schema import (
    CURRENT_SCHEMA_VERSION,
    check_stamp_async,
    remember_stamp,
    stamp_new_table_plan,
)
from lancetx.externalstore.dynamodb.uri import parse_ddb_uri
from lancetx.externalstore.errors import DynamoDBTarget

__all__ = ["AsyncDynamoDBManifestStore", "create_table_async", "open_client"]

T = TypeVar("T")


def open_client(config: DynamoDBConfig | None = None) -> AbstractAsyncContextManager[Any]:
    """An aiobotocore DynamoDB client for ``config`` (botocore retries off):
    ``async with open_client(config) as client``."""
    config = config or DynamoDBConfig.from_options()
    session = aioboto3.Session(profile_name=config.profile)
    kwargs = config.client_kwargs(session.region_name, config_class=AioConfig)
    # A class, not an async generator: an event loop closes every async generator
    # still open when it shuts down, all at once, and one nested in another's cleanup
    # then fails ("aclose(): asynchronous generator is already running"; lancetx.aio).
    return _ClientContext(
        session.client("dynamodb", **kwargs), not (config.region or session.region_name)
    )


class _ClientContext:
    """aiobotocore's client context, noting on the client a region nobody configured."""

    def __init__(self, inner: AbstractAsyncContextManager[Any], default_region: bool) -> None:
        self._inner = inner
        self._default_region = default_region

    async def __aenter__(self) -> Any:
        client = await self._inner.__aenter__()
        if self._default_region:
            mark_default_region(client)
        return client

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc, tb)


S = TypeVar("S", bound="AsyncDynamoDBManifestStore")


class _OpenStore(Generic[S]):
    """``async with``: a store with its own client, validated, closed on exit (a
    class rather than an async generator, for the reason given in :func:`open_client`)."""

    def __init__(self, make: Callable[[Any], S], config: DynamoDBConfig) -> None:
        self._make = make
        self._config = config
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> S:
        try:
            client = await self._stack.enter_async_context(open_client(self._config))
            store = self._make(client)
            if store._validate:
                await store.validate()
        except BaseException:
            await self._stack.aclose()
            raise
        return store

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)


async def create_table_async(
    client: Any,
    name: str,
    *,
    wait: bool = True,
    timeout: float = 120.0,
    retry: RetryPolicy | None = None,
) -> TableInfo:
    """Async :func:`lancetx.externalstore.dynamodb.store.create_table` (stamps the
    store's layout alike)."""
    ctx = RequestContext(target_of(client, name), retry=retry or DYNAMODB_RETRY)
    info = await run_plan_async(client, create_table_plan(ctx, wait=wait, timeout=timeout))
    if info.status in ("ACTIVE", "UPDATING"):
        found = await run_plan_async(client, stamp_new_table_plan(ctx))
        remember_stamp(client, name, found if found is not None else CURRENT_SCHEMA_VERSION)
    remember_validation(ctx.target, info)
    return info


class AsyncDynamoDBManifestStore(AsyncExternalManifestStore):
    """The external manifest store on a DynamoDB table, for asyncio.

    ``client`` is an entered aiobotocore DynamoDB client; the store does not
    close it. Use :meth:`open` to get a store owning its client. The table's
    layout is validated (once per process per table) by :meth:`validate`,
    which :meth:`open` calls, or lazily before the first operation.
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
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
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
        self._validate = validate
        self.table_info: TableInfo | None = None

    @classmethod
    def open(
        cls: type[S], table_name: str, config: DynamoDBConfig | None = None, **kwargs: Any
    ) -> AbstractAsyncContextManager[S]:
        """``async with AsyncDynamoDBManifestStore.open("T", config) as store``: a
        validated store with its own client, closed on exit."""
        config = config or DynamoDBConfig.from_options()
        kwargs.setdefault("retry", config.retry)
        kwargs.setdefault("committer", config.committer)
        return _OpenStore(lambda client: cls(client, table_name, **kwargs), config)

    @classmethod
    def open_uri(
        cls: type[S], uri: str, storage_options: Mapping[str, str] | None = None, **kwargs: Any
    ) -> AbstractAsyncContextManager[S]:
        """The store named by ``s3+ddb://bucket/path?ddbTableName=T``."""
        parsed = parse_ddb_uri(uri)
        return cls.open(parsed.table_name, DynamoDBConfig.from_options(storage_options), **kwargs)

    @property
    def target(self) -> DynamoDBTarget:
        """Table, region, endpoint and (after validation) ARN."""
        return self._ctx.target

    async def _run(self, plan: Requests[T]) -> T:
        if self._validate and self.table_info is None:
            await self.validate()
        return await run_plan_async(self.client, plan, self._sleep)

    async def validate(self) -> TableInfo:
        """Check the table's layout and the store's layout stamp (each cached per
        process). Raises DynamoDBTableNotFoundError / DynamoDBTableSchemaError / StoreSchemaTooNewError."""
        info = await self.validate_layout()
        # Cached per process too; checked even when the layout was (a sync connection's
        # checks cache the layout and the stamp separately).
        await self.check_stamp()  # a newer layout: refuse
        return info

    async def validate_layout(self) -> TableInfo:
        """Check the table's key layout (DescribeTable, cached per process). Raises
        DynamoDBTableNotFoundError / DynamoDBTableSchemaError."""
        info = cached_validation(self._ctx.target)
        if info is None:
            info = await run_plan_async(self.client, validate_plan(self._ctx), self._sleep)
            remember_validation(self._ctx.target, info)
        self.table_info = info
        if info.arn:
            self._ctx.target = replace(self._ctx.target, arn=info.arn)
        return info

    async def check_stamp(self) -> int | None:
        """Refuse a store stamped by a newer lancetx (one GetItem per table per process).
        Raises StoreSchemaTooNewError."""
        return await check_stamp_async(self.client, self._ctx.table)

    async def get_items(self, keys: Sequence[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
        """See :meth:`DynamoDBManifestStore.get_items`."""
        return await self._run(batch_get_plan(self._ctx, keys))

    async def get(self, base_uri: str, version: int) -> ManifestEntry:
        return await self._run(get_plan(self._ctx, base_uri, version))

    async def get_entries(self, base_uri: str, versions: Sequence[int]) -> list[ManifestEntry]:
        """See :meth:`DynamoDBManifestStore.get_entries`."""
        return await self._run(get_entries_plan(self._ctx, base_uri, versions))

    async def latest(self, base_uri: str) -> ManifestEntry | None:
        return await self._run(latest_plan(self._ctx, base_uri))

    async def put_if_not_exists(self, entry: ManifestEntry) -> None:
        await self._run(put_if_not_exists_plan(self._ctx, entry))

    keeps_keys = True
    #: DynamoDB's limit on the items of one TransactWriteItems.
    max_claim_entries = MAX_TRANSACT_ITEMS

    async def put_with_key_if_not_exists(self, entry: ManifestEntry, key: KeyRecord) -> None:
        """See :meth:`DynamoDBManifestStore.put_with_key_if_not_exists`."""
        await self._run(put_with_key_if_not_exists_plan(self._ctx, entry, key))

    async def get_key(self, base_uri: str, key: str) -> KeyRecord | None:
        return await self._run(get_key_plan(self._ctx, base_uri, key))

    async def put_if_exists(
        self, entry: ManifestEntry, *, expected_path: str | None = None
    ) -> ManifestEntry | None:
        return await self._run(put_if_exists_plan(self._ctx, entry, expected_path))

    async def put_all_if_not_exists(
        self, entries: Sequence[ManifestEntry], *, request_token: str
    ) -> None:
        await self._run(put_all_if_not_exists_plan(self._ctx, list(entries), request_token))

    async def list_entries(self, base_uri: str, since: int = 0) -> list[ManifestEntry]:
        return await self._run(list_plan(self._ctx, base_uri, since))

    async def delete_all(self, base_uri: str) -> None:
        await self._run(delete_all_plan(self._ctx, base_uri))

    async def take_ticket(self, base_uri: str) -> Turns:
        """See :meth:`DynamoDBManifestStore.take_ticket`."""
        return await self._run(take_ticket_plan(self._ctx, base_uri))

    async def read_turns(self, base_uri: str) -> Turns:
        return await self._run(read_turns_plan(self._ctx, base_uri))

    async def end_turn(self, base_uri: str, ticket: int, version: int | None = None) -> None:
        await self._run(end_turn_plan(self._ctx, base_uri, ticket, version))
