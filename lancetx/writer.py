"""The streaming writer: push batches, commit once.

    with table.writer(commit_message="load") as w:
        for batch in batches:
            w.write(batch)
        w.commit()

One pass: batches flow through a bounded queue into pylance's ``write_fragments``,
running in a worker thread, which writes data files at new paths under ``data/``.
Nothing is visible before :meth:`TableWriter.commit` (no manifest exists until then).
:meth:`TableWriter.abort` — and :meth:`TableWriter.close`, leaving the ``with`` block
without committing or with an exception, or dropping the writer uncommitted (it is
aborted when garbage-collected) — ends the stream *cleanly*, so pylance finishes the
files it started and reports every path, and then deletes them all: no version, no
file, no thread left. Only if pylance itself fails mid-file is the cleanup best effort
(its partial upload is not reported back).

A commit that fails deletes the files only when its claim provably did not land; an
unknown outcome, a ``KeyboardInterrupt`` or a cancellation keeps them and the error
says which files and what settles the outcome (see
:mod:`lancetx.commit.engine.unreferenced`). A commit whose idempotency key an earlier
commit already holds returns that version (``deduplicated``) and deletes the files
this writer wrote: nothing references them.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from lancetx.commit.engine.committer import load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.engine.unreferenced import may_delete
from lancetx.commit.errors import LancetxError
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.committing import (
    CommitArgs,
    CommitResult,
    Plan,
    PlanContext,
    VerbFlags,
    claim_of,
    discard,
    objects_of,
)
from lancetx.convert import to_fragment
from lancetx.data import check_append_schema
from lancetx.errors import SchemaMismatchError, WriterClosedError
from lancetx.protos import table_pb2
from lancetx.state import TableState
from lancetx.verbs.writing import (
    check_stable_row_ids,
    check_write_params,
    fragment_files,
    take_stable_row_ids,
)

if TYPE_CHECKING:
    from lance import LanceDataset


class WrittenTable(Protocol):
    """What a writer needs of the table it writes to (a :class:`lancetx.Table`, which
    makes writers: the table depends on this module, never the other way round)."""

    _state: TableState

    @property
    def uri(self) -> str: ...

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def dataset(self) -> LanceDataset: ...

    def _run_result(
        self, plan: Plan, args: CommitArgs, flags: VerbFlags | None = None
    ) -> CommitResult: ...


log = logging.getLogger(__name__)

_END = object()
#: Batches buffered between the caller and pylance (memory stays bounded).
QUEUE_DEPTH = 4


class _Stream:
    """pylance's ``write_fragments`` in a worker thread, fed through a bounded queue.

    It holds no reference to its writer, so a writer dropped without commit or abort
    is garbage-collected (its finalizer then ends the stream): a thread blocked on
    the queue would otherwise keep the writer alive, and itself parked, forever."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_DEPTH)
        self.thread: threading.Thread | None = None
        self.fragments: tuple[table_pb2.DataFragment, ...] = ()
        self.error: BaseException | None = None

    def start(
        self,
        uri: str,
        schema: pa.Schema,
        dataset: Any,
        storage_options: dict[str, str] | None,
        params: dict[str, Any],
    ) -> None:
        reader = pa.RecordBatchReader.from_batches(schema, self._drain())

        def run() -> None:
            from lance.fragment import write_fragments

            try:
                written = write_fragments(
                    reader, dataset, mode="append", storage_options=storage_options, **params
                )
                self.fragments = tuple(to_fragment(uri, f) for f in written)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, name="lancetx-writer", daemon=True)
        self.thread.start()

    def _drain(self) -> Iterator[pa.RecordBatch]:
        while True:
            item = self.queue.get()
            if item is _END:
                return
            yield item

    def put(self, batch: pa.RecordBatch) -> None:
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.queue.put(batch, timeout=0.1)
                return
            except queue.Full:
                continue

    def finish(self) -> None:
        """End the stream cleanly: pylance finishes its files and reports them."""
        thread = self.thread
        if thread is None:
            return
        while thread.is_alive():
            try:
                self.queue.put(_END, timeout=0.1)
                break
            except queue.Full:
                continue
        thread.join()
        self.thread = None
        if self.error is not None:
            raise self.error


def _abandoned(stream: _Stream, store: ObjectStore, base: str, uri: str) -> None:
    """Finalizer of a writer dropped without commit, abort or close: end its stream
    and delete its files (nothing was claimed: no version can reference them)."""
    if stream.thread is threading.current_thread():
        # Collected on the writer's own thread (pylance pulling a batch): it cannot
        # wait for itself, so another thread does the cleanup.
        helper = threading.Thread(
            target=_abandoned, args=(stream, store, base, uri), name="lancetx-writer-abort"
        )
        helper.start()
        return
    try:
        stream.finish()
    except BaseException as exc:
        log.warning("%s: dropped streaming writer failed while ending (%s)", uri, exc)
    keys = fragment_files(base, stream.fragments)
    discard(store, keys)
    log.warning(
        "%s: a streaming writer was dropped without commit(), abort() or close(): "
        "aborted it and removed the %d data file(s) it wrote",
        uri,
        len(keys),
    )


class TableWriter:
    """A single-pass writer committing one Append (see the module docstring)."""

    def __init__(
        self, table: WrittenTable, args: CommitArgs, write_params: Mapping[str, Any]
    ) -> None:
        check_write_params(write_params)
        self._table = table
        self._args = args
        self._params = dict(write_params)
        # Appends to an existing table: it must have what is asked for.
        self._stable_row_ids = take_stable_row_ids(self._params)
        known = table._state.parent
        if known is not None:  # refused before anything is written
            check_stable_row_ids(table.uri, self._stable_row_ids, known.manifest.manifest)
        self._state = "open"
        self._schema: pa.Schema | None = None
        self._stream = _Stream()
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._result: CommitResult | None = None
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
        self.close()

    @property
    def version(self) -> int | None:
        """The committed version (after :meth:`commit`)."""
        return self._result.version if self._result is not None else None

    @property
    def result(self) -> CommitResult | None:
        """The commit's result (after :meth:`commit`): version, ``deduplicated``, attempts."""
        return self._result

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
            self._stream.put(batch)
            self.rows += batch.num_rows

    def commit(self) -> int:
        """Finish the files and commit them as one Append; returns the version.

        If the commit raises, the files are deleted only when its claim provably did
        not land; otherwise (CommitStateUnknownError, KeyboardInterrupt…) they are kept
        and the error names them and what settles the outcome. With an idempotency key
        an earlier commit already holds, that version is returned (``result.deduplicated``)
        and this writer's files are deleted."""
        plan = self.prepare_commit()
        try:
            result = self._table._run_result(plan, self._args, VerbFlags(reusable=True))
        except BaseException as error:
            self.commit_failed(error)
            raise
        return self.committed(result)

    def close(self) -> None:
        """Abort unless committed (see :meth:`abort`); does nothing after a commit, an
        abort or a failed commit. Safe to call any number of times."""
        if self._state == "open":
            self.abort()

    def abort(self) -> None:
        """Discard everything written; no version is created. Safe to call twice."""
        if self._state != "open":
            return
        self._state = "aborted"
        try:
            self._stream.finish()
        except BaseException as exc:
            log.warning("%s: writer failed while aborting (%s)", self._table.uri, exc)
        self._cleanup(None)

    # ------------------------------------------------- the two halves of commit()

    def prepare_commit(self) -> Callable[[PlanContext], Transaction]:
        """Finish the files (the first half of :meth:`commit`); the plan to commit."""
        self._require_open()
        self._state = "committing"
        try:
            self._stream.finish()
        except BaseException:
            self._state = "aborted"
            self._cleanup(None)  # pylance failed: nothing was committed
            raise
        # From here on the files are the commit's: only the rule decides their fate
        # (a claim may land), never the finalizer of a dropped writer.
        self._detach()
        fragments = self._stream.fragments

        stable_row_ids = self._stable_row_ids

        def plan(ctx: PlanContext) -> Transaction:
            if ctx.parent is not None:
                check_stable_row_ids(ctx.uri, stable_row_ids, ctx.manifest)
            return Transaction(read_version=ctx.read_version, operation=Append(fragments=fragments))

        return plan

    def commit_failed(self, error: BaseException) -> None:
        """The commit raised ``error``: delete the files if it proves the claim did not
        land, else keep them (the error then names them)."""
        self._state = "aborted" if may_delete(error) else "failed"
        self._cleanup(error)

    def committed(self, result: CommitResult) -> int:
        """The commit returned ``result``; a deduplicated one leaves our files unreferenced."""
        self._result = result
        self._state = "committed"
        self._detach()
        if result.deduplicated:
            self._drop_unreferenced(result.version)
        self._stream.fragments = ()
        return result.version

    @property
    def args(self) -> CommitArgs:
        return self._args

    # -------------------------------------------------------------- internals

    def _require_open(self) -> None:
        if self._state != "open":
            raise WriterClosedError(self._table.uri, self._state)

    def _start(self) -> None:
        assert self._schema is not None
        state = self._table._state
        self._stream.start(
            self._table.uri,
            self._schema,
            self._table.dataset,
            state.pylance_storage_options(),
            self._params,
        )
        # Dropped without commit/abort/close: abort when collected (or at exit).
        self._finalizer = weakref.finalize(
            self, _abandoned, self._stream, state.conn.handler.store, state.conn.base, self.uri
        )

    @property
    def uri(self) -> str:
        return self._table.uri

    def _detach(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def _keys(self) -> list[str]:
        return fragment_files(self._table._state.conn.base, self._stream.fragments)

    def _cleanup(self, error: BaseException | None) -> None:
        """Delete this writer's files, or keep them if ``error`` leaves the claim open."""
        self._detach()
        conn = self._table._state.conn
        if discard(
            conn.handler.store,
            self._keys(),
            error,
            claim=claim_of(self._table._state, None, self._args),
        ):
            self._stream.fragments = ()

    def _drop_unreferenced(self, version: int) -> None:
        """Delete our files that ``version`` (the one holding our key) does not refer to."""
        conn = self._table._state.conn
        ours = set(self._keys())
        if not ours:
            return
        try:
            found = load_parent(conn.handler, conn.base, version)
        except LancetxError as exc:
            # The version holding the key cannot be read (cleanup removed it): which of
            # our files it refers to cannot be told, so none is deleted (gc collects).
            log.warning(
                "%s: idempotency key %r is committed as version %d, which cannot be read "
                "(%s); the %d data file(s) this writer wrote are kept",
                self.uri,
                self._args.idempotency_key,
                version,
                exc,
                len(ours),
            )
            return
        referenced: set[str] = set()
        if found is not None:
            for fragment in found.manifest.manifest.fragments:
                referenced |= objects_of(conn.base, _append_of(fragment))
        unreferenced = ours - referenced
        log.info(
            "%s: idempotency key %r is already committed as version %d; removing the %d "
            "data file(s) this writer wrote",
            self.uri,
            self._args.idempotency_key,
            version,
            len(unreferenced),
        )
        discard(conn.handler.store, unreferenced)


def _append_of(fragment: table_pb2.DataFragment) -> Transaction:
    return Transaction(read_version=0, operation=Append(fragments=(fragment,)))


class AsyncTableWriter:
    """:class:`TableWriter` for asyncio (``async with table.writer() as w``):
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
        await self.close()

    @property
    def version(self) -> int | None:
        return self._writer.version

    @property
    def result(self) -> CommitResult | None:
        """The commit's result (after :meth:`commit`)."""
        return self._writer.result

    async def write(self, data: pa.RecordBatch | pa.Table) -> None:
        await asyncio.to_thread(self._writer.write, data)

    async def commit(self) -> int:
        """:meth:`TableWriter.commit`, awaited (a cancellation keeps the files, as an
        unknown outcome does)."""
        plan = await asyncio.to_thread(self._writer.prepare_commit)
        try:
            result: CommitResult = await self._run(
                plan, self._writer.args, VerbFlags(reusable=True)
            )
        except BaseException as error:
            if may_delete(error):
                await asyncio.to_thread(self._writer.commit_failed, error)
            else:
                self._writer.commit_failed(error)  # keeps: no I/O while unwinding
            raise
        if result.deduplicated:
            return await asyncio.to_thread(self._writer.committed, result)
        return self._writer.committed(result)

    async def close(self) -> None:
        """:meth:`TableWriter.close`, awaited."""
        await asyncio.to_thread(self._writer.close)

    async def abort(self) -> None:
        await asyncio.to_thread(self._writer.abort)


__all__ = ["AsyncTableWriter", "TableWriter"]
