"""The asyncio twin of the Table API: the same verbs, awaited.

    table = await lancetx.aio.write_table(uri, data)
    version = await table.delete("id < 3", commit_message="cleanup")
    rows = await table.to_table()

The verbs are the very same code as :class:`lancetx.Table`'s
(:class:`~lancetx.table.TableVerbs`) and so are the verb steps
(:func:`lancetx.committing.verb_steps`); only the driver differs. pylance's data
plane is synchronous, so plans and reads run in worker threads
(``asyncio.to_thread``). Commits of ``s3+ddb://`` tables go through the commit
loop's async entry point (``commit_transaction_async``, aioboto3); other tables
(``s3://``, local paths) have no async handler, so their commit loop runs in a
worker thread. An AsyncTable opens its aioboto3 clients on its first verb and keeps
them; ``async with table:`` (or ``await table.aclose()``) closes them, and a table
left open has them closed when its event loop shuts down (``asyncio.run`` does that),
without a warning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import pyarrow as pa

from lancetx.arguments import checked, checked_methods
from lancetx.commit.engine.committer import (
    commit_transaction,
    commit_transaction_async,
    load_parent,
    load_parent_async,
)
from lancetx.commit.engine.unreferenced import may_delete
from lancetx.commit.errors import DatasetNotFoundError
from lancetx.commit.handlers.interface import AsyncCommitHandler
from lancetx.commit.sansio import drive_async
from lancetx.committing import (
    Commit,
    CommitArgs,
    CommitResult,
    Discard,
    FindKey,
    LoadLatest,
    Plan,
    RunPlan,
    VerbFlags,
    discard,
    run_plan,
    verb_steps,
)
from lancetx.committing import Effect as VerbEffect
from lancetx.errors import ReadOnlyTableError, TableExistsError
from lancetx.externalstore.connect import open_async_handler
from lancetx.multi_table import commit_many as commit_many_sync
from lancetx.state import TableState
from lancetx.table import Table, TableVerbs, _args, clone_flags, prepare_clone
from lancetx.table import history as _sync_history
from lancetx.tags import AsyncTags
from lancetx.verbs.writing import WritePlan, fragments_verb
from lancetx.version_history import VersionInfo
from lancetx.writer import AsyncTableWriter, TableWriter

if TYPE_CHECKING:
    from lance import LanceDataset

    from lancetx.changes import FragmentRows, VersionChange
    from lancetx.scanning import Scanner

P = ParamSpec("P")
R = TypeVar("R")


log = logging.getLogger(__name__)


class _LeftOpen:
    """The clients of the AsyncTables of one event loop that are still open.

    A table that is never closed (``await lancetx.aio.open(...)`` without ``async
    with``) must not leave aiohttp sessions for the garbage collector, which closes
    them from no loop at all, with warnings. Event loops already close what is left
    when they shut down, through their async-generator hooks (``asyncio.run`` calls
    ``loop.shutdown_asyncgens()``): one generator per loop, started when the loop's
    first table opens its clients, closes them all from its ``finally``.
    """

    def __init__(self) -> None:
        self.stacks: dict[int, AsyncExitStack] = {}
        self.closer: Any = None

    async def close_all(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            while self.stacks:
                _, stack = self.stacks.popitem()
                try:
                    await stack.aclose()
                except Exception:  # the loop is shutting down: nothing to hand it to
                    log.debug("closing an AsyncTable's clients at loop shutdown", exc_info=True)


_LEFT_OPEN: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LeftOpen] = (
    weakref.WeakKeyDictionary()
)


async def _close_at_loop_shutdown(key: int, stack: AsyncExitStack) -> None:
    loop = asyncio.get_running_loop()
    left = _LEFT_OPEN.get(loop)
    if left is None:
        left = _LEFT_OPEN[loop] = _LeftOpen()
        closer = left.close_all()
        await closer.asend(None)  # the loop's first-iteration hook now tracks it
        left.closer = closer
    left.stacks[key] = stack


def _closed_by_owner(loop: asyncio.AbstractEventLoop | None, key: int) -> None:
    left = _LEFT_OPEN.get(loop) if loop is not None else None
    if left is not None:
        left.stacks.pop(key, None)


async def _commit(state: TableState, handler: AsyncCommitHandler | None, effect: Commit) -> Any:
    conn = state.conn
    if handler is not None:
        return await commit_transaction_async(
            handler, conn.base, effect.txn, parent=effect.parent, options=effect.options
        )
    return await asyncio.to_thread(
        commit_transaction,
        conn.handler,
        conn.base,
        effect.txn,
        parent=effect.parent,
        options=effect.options,
    )


async def _load_latest(state: TableState, handler: AsyncCommitHandler | None) -> Any:
    if handler is not None:
        return await load_parent_async(handler, state.conn.base)
    return await asyncio.to_thread(load_parent, state.conn.handler, state.conn.base)


async def run_verb_async(
    state: TableState,
    plan: Plan,
    args: CommitArgs,
    flags: VerbFlags,
    handler: AsyncCommitHandler | None = None,
) -> CommitResult:
    """Plan and commit one verb: :func:`~lancetx.committing.verb_steps`, driven with await.

    ``handler``: an open async commit handler to use; when None, one is opened for
    this verb (tables that have one: ``s3+ddb://``) and closed after it."""
    if handler is None:
        async with open_async_handler(state.conn) as opened:
            return await _drive(state, plan, args, flags, opened)
    return await _drive(state, plan, args, flags, handler)


async def _drive(
    state: TableState,
    plan: Plan,
    args: CommitArgs,
    flags: VerbFlags,
    handler: AsyncCommitHandler | None,
) -> CommitResult:
    conn = state.conn

    async def perform(effect: VerbEffect) -> Any:
        if isinstance(effect, FindKey):
            return await asyncio.to_thread(
                state.find_idempotency_key, effect.key, since=effect.since
            )
        if isinstance(effect, LoadLatest):
            return await _load_latest(state, handler)
        if isinstance(effect, RunPlan):
            return await asyncio.to_thread(run_plan, effect)
        if isinstance(effect, Commit):
            return await _commit(state, handler, effect)
        if isinstance(effect, Discard):
            await _discard(conn.handler.store, effect)
        return None

    # BaseException: thrown into the steps, which decide (an interrupt keeps the files).
    steps = verb_steps(state, plan, args, flags)
    result: CommitResult = await drive_async(steps, perform, passes=BaseException)
    return result


async def _discard(store: Any, effect: Discard) -> None:
    def run() -> None:
        discard(store, effect.keys, effect.error, claim=effect.claim, callers=effect.callers)

    if may_delete(effect.error):
        await asyncio.to_thread(run)
    else:
        run()  # keeping does no I/O: no await while a cancellation unwinds


@checked_methods
class AsyncTable(TableVerbs[Awaitable[int]]):
    """:class:`lancetx.Table` for asyncio: every verb returns an awaitable of the
    committed version; reads are coroutines too. Obtain one with :func:`open` or
    :func:`write_table` of this module."""

    def __init__(self, state: TableState, *, pinned: int | None = None) -> None:
        self._sync = Table(state, pinned=pinned)
        self._state = state
        self._pinned = pinned
        self.last_commit: CommitResult | None = None
        self._handler: AsyncCommitHandler | None = None
        self._stack: AsyncExitStack | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> AsyncTable:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the aioboto3 clients this table opened (``async with table:`` does it;
        a table left open has them closed when its event loop shuts down)."""
        stack, loop = self._stack, self._loop
        self._stack, self._handler, self._loop = None, None, None
        if stack is not None:
            _closed_by_owner(loop, id(stack))
            await stack.aclose()

    async def _commit_handler(self) -> AsyncCommitHandler | None:
        # aioboto3 clients belong to the event loop that opened them: one set per
        # table and loop, opened on the first verb (opening costs far more than a commit).
        loop = asyncio.get_running_loop()
        if self._stack is not None and self._loop is loop:
            return self._handler
        stack = AsyncExitStack()
        try:
            handler = await stack.enter_async_context(open_async_handler(self._state.conn))
            await _close_at_loop_shutdown(id(stack), stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._handler, self._loop = stack, handler, loop
        return handler

    @property
    def uri(self) -> str:
        return self._sync.uri

    @property
    def data_uri(self) -> str:
        return self._sync.data_uri

    @property
    def storage_options(self) -> dict[str, str]:
        return self._sync.storage_options

    @property
    def read_only(self) -> bool:
        return self._pinned is not None

    @property
    def version(self) -> int:
        """The version this table reads (the one it opened or last committed)."""
        return self._sync.version

    @property
    def schema(self) -> pa.Schema:
        return self._sync.schema

    @property
    def exists(self) -> bool:
        """See :attr:`lancetx.Table.exists` (False for a table opened with
        ``missing_ok=True`` where nothing is yet)."""
        return self._sync.exists

    @property
    def data_storage_version(self) -> str | None:
        """See :attr:`lancetx.Table.data_storage_version`."""
        return self._sync.data_storage_version

    @property
    def pylance_storage_options(self) -> dict[str, str]:
        """See :attr:`lancetx.Table.pylance_storage_options`."""
        return self._sync.pylance_storage_options

    def check_fragment_schema(self, schema: pa.Schema, *, merge_schema: bool = False) -> None:
        """See :meth:`lancetx.Table.check_fragment_schema` (no request: the manifest is
        already read)."""
        self._sync.check_fragment_schema(schema, merge_schema=merge_schema)

    @property
    def sync(self) -> Table:
        """The synchronous Table over the same state (for code that is not async)."""
        return self._sync

    def _run(self, plan: Plan, args: CommitArgs, flags: VerbFlags | None = None) -> Awaitable[int]:
        if self._pinned is not None:
            raise ReadOnlyTableError(self.uri, self._pinned)
        return self._drive(plan, args, flags or VerbFlags())

    async def _drive(self, plan: Plan, args: CommitArgs, flags: VerbFlags) -> int:
        return (await self._run_result(plan, args, flags)).version

    async def _run_result(self, plan: Plan, args: CommitArgs, flags: VerbFlags) -> CommitResult:
        if self._pinned is not None:
            raise ReadOnlyTableError(self.uri, self._pinned)
        handler = await self._commit_handler()
        result = await run_verb_async(self._state, plan, args, flags, handler)
        self.last_commit = result
        return result

    def writer(
        self,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        **write_params: Any,
    ) -> AsyncTableWriter:
        """The async streaming writer: ``async with table.writer() as w: await w.write(b);
        await w.commit()``."""
        if self._pinned is not None:
            raise ReadOnlyTableError(self.uri, self._pinned)
        sync_writer = TableWriter(
            self._sync,
            _args(commit_message, properties, idempotency_key, expected_version),
            write_params,
        )
        return AsyncTableWriter(sync_writer, self._run_result)

    async def latest_version(self) -> int:
        """The table's latest version, resolved now."""
        return await asyncio.to_thread(lambda: self._sync.latest_version)

    async def refresh(self) -> AsyncTable:
        await asyncio.to_thread(self._state.refresh)
        return self

    async def dataset(self) -> LanceDataset:
        return await asyncio.to_thread(lambda: self._sync.dataset)

    async def to_table(self, **kwargs: Any) -> pa.Table:
        return await asyncio.to_thread(self._sync.to_table, **kwargs)

    async def count_rows(self, filter: str | None = None, **kwargs: Any) -> int:
        return await asyncio.to_thread(self._sync.count_rows, filter, **kwargs)

    async def scanner(self, **kwargs: Any) -> Scanner:
        """:meth:`Table.scanner` (its reads are blocking: run them in a thread)."""
        return await asyncio.to_thread(self._sync.scanner, **kwargs)

    @property
    def tags(self) -> AsyncTags:
        """The table's tags (see :attr:`lancetx.Table.tags`), awaited."""
        return AsyncTags(self._sync.tags)

    async def checkout(self, version: int | str) -> AsyncTable:
        """A read-only view of ``version`` (a number or a tag's name)."""
        pinned = await asyncio.to_thread(lambda: self._sync.checkout(version).version)
        return AsyncTable(self._state, pinned=pinned)

    async def history(self) -> list[VersionInfo]:
        return await asyncio.to_thread(self._state.history, self.version)

    async def versions(self) -> list[VersionInfo]:
        return await self.history()

    async def find_idempotency_key(self, key: str) -> int | None:
        return await asyncio.to_thread(self._sync.find_idempotency_key, key)

    async def walk_history(self, *, since: int = 0) -> AsyncIterator[VersionInfo]:
        """:meth:`lancetx.Table.walk_history` (newest first, read as the iteration goes
        on), each step on a worker thread so the event loop stays free."""
        versions = self._sync.walk_history(since=since)
        done = object()
        while (info := await asyncio.to_thread(next, versions, done)) is not done:
            yield info  # type: ignore[misc]

    async def commit_fragments(
        self,
        fragments: Iterable[Any],
        *,
        schema: pa.Schema | None,
        mode: str = "append",
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        fresh_field_ids: bool = False,
        merge_schema: bool = False,
        null_counts: Mapping[str, int] | None = None,
        idempotency_since: int = 0,
        commit_timeout: float | None = None,
        enable_stable_row_ids: bool | None = None,
    ) -> CommitResult:
        """:meth:`lancetx.Table.commit_fragments` through this table's own clients
        (creates the table if :func:`open` was given ``missing_ok=True`` and it has no
        version yet). Returns the CommitResult."""
        verb = fragments_verb(
            self.uri,
            fragments,
            schema=schema,
            mode=mode,
            commit_message=commit_message,
            properties=properties,
            idempotency_key=idempotency_key,
            expected_version=expected_version,
            fresh_field_ids=fresh_field_ids,
            merge_schema=merge_schema,
            null_counts=null_counts,
            idempotency_since=idempotency_since,
            commit_timeout=commit_timeout,
            enable_stable_row_ids=enable_stable_row_ids,
        )
        return await self._run_result(*verb)

    async def changes(self, since: int, until: int | None = None) -> list[VersionChange]:
        """What each version ``since+1 .. until`` did to the rows (see
        :meth:`lancetx.Table.changes`)."""
        return await asyncio.to_thread(self._sync.changes, since, until)

    async def fragment_rows(self) -> list[FragmentRows]:
        """The fragments of :attr:`version` with their live rows."""
        return await asyncio.to_thread(self._sync.fragment_rows)


@checked
async def open(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    version: int | str | None = None,
    missing_ok: bool = False,
) -> AsyncTable:
    """The async :func:`lancetx.open` (``missing_ok`` as there: the table of a path
    with no version yet, which :meth:`AsyncTable.commit_fragments` creates; with
    ``version``, also while the latest version cannot be read: see there)."""
    state = await asyncio.to_thread(TableState.connect, uri, storage_options)
    if version is not None:
        if not await asyncio.to_thread(state.refresh_to_read_older):
            raise DatasetNotFoundError(uri)
        return await AsyncTable(state).checkout(version)
    if await asyncio.to_thread(state.refresh) is None and not missing_ok:
        raise DatasetNotFoundError(uri)
    return AsyncTable(state)


connect = open


@checked
async def history(uri: str, storage_options: Mapping[str, str] | None = None) -> list[VersionInfo]:
    """The async :func:`lancetx.history`."""
    return await asyncio.to_thread(_sync_history, uri, storage_options)


@checked
async def write_table(
    uri: str,
    data: Any,
    *,
    mode: str = "create",
    storage_options: Mapping[str, str] | None = None,
    schema: pa.Schema | None = None,
    commit_message: str | None = None,
    properties: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    expected_version: int | None = None,
    **write_params: Any,
) -> AsyncTable:
    """The async :func:`lancetx.write_table`."""
    if mode not in ("create", "append", "overwrite"):
        raise ValueError(f'mode must be "create", "append" or "overwrite", not {mode!r}')
    state = await asyncio.to_thread(TableState.connect, uri, storage_options)
    latest = await asyncio.to_thread(state.refresh)
    if mode == "create" and latest is not None:
        raise TableExistsError(uri, latest.version)
    plan = WritePlan(data, overwrite=mode == "overwrite", schema=schema, params=write_params)
    # Stable row ids are chosen by the commit that creates the table.
    args = dataclasses.replace(
        _args(commit_message, properties, idempotency_key, expected_version),
        stable_row_ids=bool(plan.stable_row_ids),
    )
    table = AsyncTable(state)
    # The table's own clients commit the write, and stay open for its next verbs.
    result = await run_verb_async(
        state,
        plan,
        args,
        VerbFlags(
            replannable=mode == "overwrite",
            reusable=True,
            needs_table=False,
            on_exists="fail" if mode == "create" else "append",
        ),
        await table._commit_handler(),
    )
    table.last_commit = result
    return table


@checked
async def clone(
    source: str,
    target: str,
    *,
    version: int | str | None = None,
    storage_options: Mapping[str, str] | None = None,
    target_storage_options: Mapping[str, str] | None = None,
    commit_message: str | None = None,
    properties: Mapping[str, str] | None = None,
) -> AsyncTable:
    """The async :func:`lancetx.clone`: the source version is read on a worker thread,
    the clone's first version committed through the new table's own clients."""
    state, plan = await asyncio.to_thread(
        prepare_clone, source, target, version, storage_options, target_storage_options
    )
    table = AsyncTable(state)
    result = await run_verb_async(
        state,
        plan,
        _args(commit_message, properties, None, None),
        clone_flags(),
        await table._commit_handler(),
    )
    table.last_commit = result
    return table


@checked
async def commit_fragments(
    uri: str,
    fragments: Iterable[Any],
    *,
    schema: pa.Schema | None,
    mode: str = "append",
    storage_options: Mapping[str, str] | None = None,
    commit_message: str | None = None,
    properties: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    expected_version: int | None = None,
    fresh_field_ids: bool = False,
    merge_schema: bool = False,
    null_counts: Mapping[str, int] | None = None,
    idempotency_since: int = 0,
    commit_timeout: float | None = None,
    enable_stable_row_ids: bool | None = None,
) -> CommitResult:
    """The async :func:`lancetx.commit_fragments`."""
    verb = fragments_verb(
        uri,
        fragments,
        schema=schema,
        mode=mode,
        commit_message=commit_message,
        properties=properties,
        idempotency_key=idempotency_key,
        expected_version=expected_version,
        fresh_field_ids=fresh_field_ids,
        merge_schema=merge_schema,
        null_counts=null_counts,
        idempotency_since=idempotency_since,
        commit_timeout=commit_timeout,
        enable_stable_row_ids=enable_stable_row_ids,
    )
    state = await asyncio.to_thread(TableState.connect, uri, storage_options)
    return await run_verb_async(state, *verb)


def _on_a_thread(blocking: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    async def on_a_thread(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(blocking, *args, **kwargs)

    return on_a_thread


commit_many = _on_a_thread(commit_many_sync)
commit_many.__doc__ = """The async :func:`lancetx.commit_many` (same arguments): one transaction
per table, all or nothing.

Keys are table URIs or tables (:class:`AsyncTable` as well as :class:`lancetx.Table`). The
commit is the synchronous one, run on a worker thread so the event loop stays free:
preparing each table is pylance's synchronous work anyway, and the claim is one DynamoDB
``TransactWriteItems``. Raises what :func:`lancetx.commit_many` raises.
"""


__all__ = [
    "AsyncTable",
    "clone",
    "commit_fragments",
    "commit_many",
    "connect",
    "history",
    "open",
    "run_verb_async",
    "write_table",
]
