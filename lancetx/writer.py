"""The streaming writer: push batches, commit once.

    with table.writer(commit_message="load") as w:
        for batch in batches:
            w.write(batch)
        w.commit()

One pass: batches flow through a bounded queue into pylance's ``write_fragments``,
running in a worker thread, which writes data files at new paths under ``data/``.
Nothing is visible before :meth:`TableWriter.commit` (no manifest exists until then).
:meth:`TableWriter.abort` — and leaving the ``with`` block without committing, or with
an exception — ends the stream *cleanly*, so pylance finishes the files it started
and reports every path, and then deletes them all: no version, no file left. Only if
pylance itself fails mid-file is the cleanup best effort (its partial upload is not
reported back).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lancetx.commit.engine.operations import Append, Transaction
from lancetx.committing import CommitArgs, PlanContext, VerbFlags, discard
from lancetx.convert import to_fragment
from lancetx.data import check_append_schema
from lancetx.errors import SchemaMismatchError, WriterClosedError
from lancetx.protos import table_pb2
from lancetx.verbs.writing import fragment_files

if TYPE_CHECKING:
    from lancetx.table import Table

log = logging.getLogger(__name__)

_END = object()
#: Batches buffered between the caller and pylance (memory stays bounded).
QUEUE_DEPTH = 4


class TableWriter:
    """A single-pass writer committing one Append (see the module docstring)."""

    def __init__(self, table: Table, args: CommitArgs, write_params: Mapping[str, Any]) -> None:
        self._table = table
        self._args = args
        self._params = dict(write_params)
        self._state = "open"
        self._schema: pa.Schema | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_DEPTH)
        self._thread: threading.Thread | None = None
        self._fragments: tuple[table_pb2.DataFragment, ...] = ()
        self._error: BaseException | None = None
        self._version: int | None = None
        self.rows = 0

    # -------------------------------------------------------------- user API

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state == "open":
            self.abort()

    @property
    def version(self) -> int | None:
        """The committed version (after :meth:`commit`)."""
        return self._version

    def write(self, data: pa.RecordBatch | pa.Table) -> None:
        """Queue a batch (or table) for writing; blocks while pylance catches up."""
        self._require_open()
        if not isinstance(data, pa.RecordBatch | pa.Table):
            raise SchemaMismatchError(
                self._table.uri,
                f"write() takes pa.RecordBatch or pa.Table, not {type(data).__name__}",
            )
        batches = data.to_batches() if isinstance(data, pa.Table) else [data]
        if self._schema is None:
            check_append_schema(self._table.uri, data.schema, self._table.schema)
            self._schema = data.schema
            self._start()
        elif not data.schema.equals(self._schema):
            raise SchemaMismatchError(
                self._table.uri,
                f"batch schema {data.schema} differs from the first batch's {self._schema}",
            )
        for batch in batches:
            self._put(batch)
            self.rows += batch.num_rows

    def commit(self) -> int:
        """Finish the files and commit them as one Append; returns the version."""
        plan = self.prepare_commit()
        try:
            version = self._table._run(plan, self._args, VerbFlags(reusable=True))
        except BaseException:
            self.commit_failed()
            raise
        return self.committed(version)

    def prepare_commit(self) -> Callable[[PlanContext], Transaction]:
        """Finish the files (the first half of :meth:`commit`); the plan to commit."""
        self._require_open()
        self._state = "committing"
        try:
            self._finish()
        except BaseException:
            self._state = "aborted"
            self._cleanup()
            raise
        fragments = self._fragments

        def plan(ctx: PlanContext) -> Transaction:
            return Transaction(read_version=ctx.read_version, operation=Append(fragments=fragments))

        return plan

    def commit_failed(self) -> None:
        """The commit raised: nothing of ours is referenced, so remove every file."""
        self._state = "aborted"
        self._cleanup()

    def committed(self, version: int) -> int:
        self._version = version
        self._state = "committed"
        return version

    @property
    def args(self) -> CommitArgs:
        return self._args

    def abort(self) -> None:
        """Discard everything written; no version is created. Safe to call twice."""
        if self._state in ("aborted", "committed"):
            return
        self._state = "aborted"
        try:
            self._finish()
        except BaseException as exc:
            log.warning("%s: writer failed while aborting (%s)", self._table.uri, exc)
        self._cleanup()

    # -------------------------------------------------------------- internals

    def _require_open(self) -> None:
        if self._state != "open":
            raise WriterClosedError(self._table.uri, self._state)

    def _start(self) -> None:
        assert self._schema is not None
        reader = pa.RecordBatchReader.from_batches(self._schema, self._drain())
        dataset = self._table.dataset
        options = self._table._state.pylance_storage_options()

        def run() -> None:
            from lance.fragment import write_fragments

            try:
                written = write_fragments(
                    reader, dataset, mode="append", storage_options=options, **self._params
                )
                self._fragments = tuple(to_fragment(self._table.uri, f) for f in written)
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=run, name="lancetx-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> Iterator[pa.RecordBatch]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            yield item

    def _put(self, batch: pa.RecordBatch) -> None:
        while True:
            if self._error is not None:
                raise self._error
            try:
                self._queue.put(batch, timeout=0.1)
                return
            except queue.Full:
                continue

    def _finish(self) -> None:
        if self._thread is None:
            return
        while self._thread.is_alive():
            try:
                self._queue.put(_END, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error

    def _cleanup(self) -> None:
        keys = fragment_files(self._table._state.conn.base, self._fragments)
        discard(self._table._state.conn.handler.store, keys)
        self._fragments = ()


class AsyncTableWriter:
    """:class:`TableWriter` for asyncio (``async with await table.writer() as w``):
    batches go to pylance from a worker thread, the commit goes through the async
    commit loop. Leaving the block without commit aborts, as in the sync writer."""

    def __init__(self, writer: TableWriter, run: Callable[..., Any]) -> None:
        self._writer = writer
        self._run = run

    async def __aenter__(self) -> AsyncTableWriter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._writer.__exit__, exc_type, exc, tb)

    @property
    def version(self) -> int | None:
        return self._writer.version

    async def write(self, data: pa.RecordBatch | pa.Table) -> None:
        await asyncio.to_thread(self._writer.write, data)

    async def commit(self) -> int:
        plan = await asyncio.to_thread(self._writer.prepare_commit)
        try:
            version: int = await self._run(plan, self._writer.args, VerbFlags(reusable=True))
        except BaseException:
            await asyncio.to_thread(self._writer.commit_failed)
            raise
        return self._writer.committed(version)

    async def abort(self) -> None:
        await asyncio.to_thread(self._writer.abort)


__all__ = ["AsyncTableWriter", "TableWriter"]
