"""The asyncio twin of the Table API: the same verbs, awaited.

    table = await lancetx.aio.write_table(uri, data)
    version = await table.delete("id < 3", commit_message="cleanup")
    rows = await table.to_table()

The verbs are the very same code as :class:`lancetx.Table`'s
(:class:`~lancetx.table.TableVerbs`) and so are the verb steps
(:func:`lancetx.committing.verb_steps`); only the driver differs. pylance's data
plane is synchronous, so plans and reads run in worker threads
(``asyncio.to_thread``); the commit goes through the commit loop's async entry
point when this lancetx has one (``commit_transaction_async`` with an async handler),
else the synchronous loop runs in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.commit.errors import DatasetNotFoundError
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
    verb_steps,
)
from lancetx.errors import ReadOnlyTableError, TableExistsError
from lancetx.history import VersionInfo, find_idempotency_key, load_history
from lancetx.state import TableState
from lancetx.table import Table, TableVerbs, _args
from lancetx.verbs.writing import FragmentsPlan, WritePlan

if TYPE_CHECKING:
    from lance import LanceDataset


async def _commit(state: TableState, effect: Commit) -> Any:
    conn = state.conn
    return await asyncio.to_thread(
        commit_transaction,
        conn.handler,
        conn.base,
        effect.txn,
        parent=effect.parent,
        options=effect.options,
    )


async def run_verb_async(
    state: TableState, plan: Plan, args: CommitArgs, flags: VerbFlags
) -> CommitResult:
    """Plan and commit one verb: :func:`~lancetx.committing.verb_steps`, driven with await."""
    conn = state.conn
    steps = verb_steps(state, plan, args, flags)
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = steps.throw(error) if error is not None else steps.send(send)
        except StopIteration as done:
            result: CommitResult = done.value
            return result
        send, error = None, None
        try:
            if isinstance(effect, FindKey):
                send = await asyncio.to_thread(
                    find_idempotency_key, conn.handler, conn.base, effect.key
                )
            elif isinstance(effect, LoadLatest):
                send = await asyncio.to_thread(load_parent, conn.handler, conn.base)
            elif isinstance(effect, RunPlan):
                send = await asyncio.to_thread(effect.plan, effect.ctx)
            elif isinstance(effect, Commit):
                send = await _commit(state, effect)
            elif isinstance(effect, Discard):
                await asyncio.to_thread(discard, conn.handler.store, effect.keys)
        except BaseException as exc:  # thrown into the steps, which decide
            error = exc


class AsyncTable(TableVerbs[Awaitable[int]]):
    """:class:`lancetx.Table` for asyncio: every verb returns an awaitable of the
    committed version; reads are coroutines too. Obtain one with :func:`open` or
    :func:`write_table` of this module."""

    def __init__(self, state: TableState, *, pinned: int | None = None) -> None:
        self._sync = Table(state, pinned=pinned)
        self._state = state
        self._pinned = pinned
        self.last_commit: CommitResult | None = None

    @property
    def uri(self) -> str:
        return self._sync.uri

    @property
    def data_uri(self) -> str:
        return self._sync.data_uri

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
    def sync(self) -> Table:
        """The synchronous Table over the same state (for code that is not async)."""
        return self._sync

    def _run(self, plan: Plan, args: CommitArgs, flags: VerbFlags | None = None) -> Awaitable[int]:
        if self._pinned is not None:
            raise ReadOnlyTableError(self.uri, self._pinned)
        return self._drive(plan, args, flags or VerbFlags())

    async def _drive(self, plan: Plan, args: CommitArgs, flags: VerbFlags) -> int:
        result = await run_verb_async(self._state, plan, args, flags)
        self.last_commit = result
        return result.version

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

    async def scanner(self, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._sync.scanner, **kwargs)

    async def checkout(self, version: int) -> AsyncTable:
        await asyncio.to_thread(self._state.parent_at, version)
        return AsyncTable(self._state, pinned=version)

    async def history(self) -> list[VersionInfo]:
        return await asyncio.to_thread(
            load_history, self._state.conn.handler, self._state.conn.base, until=self.version
        )

    async def versions(self) -> list[VersionInfo]:
        return await self.history()

    async def find_idempotency_key(self, key: str) -> int | None:
        return await asyncio.to_thread(self._sync.find_idempotency_key, key)


async def open(
    uri: str, storage_options: Mapping[str, str] | None = None, *, version: int | None = None
) -> AsyncTable:
    """The async :func:`lancetx.open`."""
    state = await asyncio.to_thread(TableState.connect, uri, storage_options)
    if await asyncio.to_thread(state.refresh) is None:
        raise DatasetNotFoundError(uri)
    table = AsyncTable(state)
    return await table.checkout(version) if version is not None else table


connect = open


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
    result = await run_verb_async(
        state,
        plan,
        _args(commit_message, properties, idempotency_key, expected_version),
        VerbFlags(
            replannable=mode == "overwrite",
            reusable=True,
            needs_table=False,
            on_exists="fail" if mode == "create" else "append",
        ),
    )
    table = AsyncTable(state)
    table.last_commit = result
    return table


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
) -> CommitResult:
    """The async :func:`lancetx.commit_fragments`."""
    if mode not in ("append", "overwrite"):
        raise ValueError(f'mode must be "append" or "overwrite", not {mode!r}')
    state = await asyncio.to_thread(TableState.connect, uri, storage_options)
    plan = FragmentsPlan(uri, list(fragments), schema, overwrite=mode == "overwrite")
    return await run_verb_async(
        state,
        plan,
        _args(commit_message, properties, idempotency_key, expected_version),
        VerbFlags(
            replannable=mode == "overwrite", reusable=True, needs_table=False, owns_data=False
        ),
    )


__all__ = ["AsyncTable", "commit_fragments", "connect", "open", "run_verb_async", "write_table"]
