"""Shared helpers for the engine tests (commit loop, rebase, interop, concurrency).

Everything here drives real parts: pylance writes tables and data files, our
commit loop (:func:`lancetx.commit.engine.committer.commit_transaction`) commits
through the handler :func:`lancetx.externalstore.connect.connect` picks for the
URI (local disk, or S3 with conditional PUT on the embedded moto server).

* :class:`EngineTable` -- a table made by pylance, with its lancetx connection;
* :func:`append_transaction` / :func:`lancetx_append` -- pylance
  ``write_fragments`` then our Append;
* :func:`delete_transaction` -- our Delete: the fragment's deletion vector at the
  parent version plus the rows to delete, written as a new deletion file;
* :class:`LosingHandler` -- a handler wrapper that loses the race on demand, or
  lets another writer commit just before ours (deterministic interleavings);
* :class:`S3RequestLog` -- the S3 requests a store's boto3 client makes;
* :func:`append_worker` -- one writer of the concurrency tests (threads and
  ``spawn`` processes; module-level so a child process can import it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa
from pyroaring import BitMap

from lancetx.commit.engine.committer import (
    CommitOptions,
    Committed,
    Parent,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import Append, Delete, Transaction
from lancetx.commit.errors import RetriesExhaustedError, VersionAlreadyExistsError
from lancetx.commit.format import naming
from lancetx.commit.format.deletion import write_deletion_vector
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.format.snapshot import Snapshot
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.protos import table_pb2

__all__ = [
    "EngineTable",
    "LosingHandler",
    "S3RequestLog",
    "append_transaction",
    "append_worker",
    "delete_transaction",
    "lancetx_append",
    "make_table",
    "rows",
    "s3_requests",
    "snapshot_of",
]


def rows(start: int, n: int, *, writer: str = "setup", seq: int = 0) -> pa.Table:
    """``n`` rows: ``a`` = start.. (unique across a test), ``b`` = 0.., and who wrote them."""
    return pa.table(
        {
            "a": pa.array(range(start, start + n), pa.int64()),
            "b": pa.array(range(n), pa.int64()),
            "writer": pa.array([writer] * n, pa.string()),
            "seq": pa.array([seq] * n, pa.int64()),
        }
    )


@dataclass
class EngineTable:
    """A table pylance created, and lancetx's connection to it."""

    uri: str
    storage_options: dict[str, str] | None
    conn: TableConnection

    @property
    def handler(self) -> CommitHandler:
        return self.conn.handler

    @property
    def base(self) -> str:
        return self.conn.base

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The table as pylance opens it (a fresh open: no cached state)."""
        return lance.dataset(self.uri, version=version, storage_options=self.storage_options)

    def versions(self) -> list[int]:
        """Every version pylance lists."""
        return [int(v["version"]) for v in self.dataset().versions()]

    def values(self, column: str = "a", version: int | None = None) -> list[Any]:
        """Every live value of ``column`` as pylance reads it, sorted."""
        return sorted(self.dataset(version).to_table(columns=[column])[column].to_pylist())

    def latest(self) -> Parent:
        """The latest version, resolved through our handler."""
        parent = load_parent(self.handler, self.base)
        assert parent is not None, f"{self.uri} has no versions"
        return parent

    def listing(self, folder: str) -> list[tuple[str, int]]:
        """``(key, size)`` of every object under ``folder`` (``_versions``,
        ``_transactions``, ``_deletions``): compare before and after a call."""
        prefix = naming.join(self.base, folder) + "/"
        return sorted((meta.key, meta.size) for meta in self.handler.store.list(prefix))

    def commit(
        self,
        txn: Transaction,
        *,
        parent: Parent | Committed | None = None,
        options: CommitOptions | None = None,
    ) -> Committed:
        return commit_transaction(self.handler, self.base, txn, parent=parent, options=options)


def make_table(
    uri: str, sizes: Sequence[int] = (10, 10), storage_options: dict[str, str] | None = None
) -> EngineTable:
    """Create a table with pylance: one fragment per entry of ``sizes`` (a
    create then appends, so version = len(sizes)); ``a`` runs 0.. across them."""
    start = 0
    for i, size in enumerate(sizes):
        lance.write_dataset(
            rows(start, size, seq=i),
            uri,
            mode="create" if i == 0 else "append",
            storage_options=storage_options,
        )
        start += size
    return EngineTable(uri, storage_options, connect(uri, storage_options))


def snapshot_of(table: EngineTable, parent: Parent | Committed) -> Snapshot:
    """A Snapshot of ``parent`` without reading its manifest again."""
    return Snapshot(
        store=table.handler.store,
        base=table.base,
        location=parent.location,
        manifest_file=parent.manifest,
    )


def append_transaction(
    table: EngineTable, data: pa.Table, parent: Parent | Committed
) -> Transaction:
    """pylance writes the data files; ours is the Append planned at ``parent``."""
    fragments = lance.fragment.write_fragments(
        data, table.conn.data_uri, storage_options=table.storage_options
    )
    return Transaction(
        read_version=parent.version,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
    )


def lancetx_append(
    table: EngineTable,
    data: pa.Table,
    parent: Parent | Committed | None = None,
    options: CommitOptions | None = None,
) -> Committed:
    """Append ``data`` with lancetx, planned at ``parent`` (default: the latest)."""
    planned = parent if parent is not None else table.latest()
    txn = append_transaction(table, data, planned)
    return table.commit(txn, parent=parent, options=options)


def delete_transaction(
    table: EngineTable,
    parent: Parent | Committed,
    offsets: Mapping[int, Iterable[int]],
    predicate: str = "lancetx test delete",
) -> Transaction:
    """Our Delete planned at ``parent``: for each fragment id, the row offsets to
    delete are added to its deletion vector at ``parent`` and written as a new
    deletion file (``read_version`` = the parent's version)."""
    snap = snapshot_of(table, parent)
    updated = []
    for fragment_id, rows_to_delete in offsets.items():
        vector = BitMap(snap.deletion_vector(fragment_id)) | BitMap(list(rows_to_delete))
        fragment = table_pb2.DataFragment()
        fragment.CopyFrom(snap.fragment(fragment_id))
        fragment.deletion_file.CopyFrom(
            write_deletion_vector(
                table.handler.store, table.base, fragment_id, parent.version, vector
            )
        )
        updated.append(fragment)
    return Transaction(
        read_version=parent.version,
        operation=Delete(updated_fragments=tuple(updated), predicate=predicate),
    )


class LosingHandler(CommitHandler):
    """Wraps a handler. ``losses``: the next N ``commit`` calls raise
    VersionAlreadyExistsError without writing (a writer that always loses, or a
    winner that is not visible yet). ``before_commit``: called with the version
    about to be claimed, before each real ``commit`` -- e.g. to let another
    writer commit first. ``attempts`` records every version asked for."""

    def __init__(
        self,
        inner: CommitHandler,
        *,
        losses: int = 0,
        before_commit: Callable[[int], None] | None = None,
    ) -> None:
        self.inner = inner
        self.store = inner.store
        self.losses = losses
        self.before_commit = before_commit
        self.attempts: list[int] = []

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        return self.inner.resolve_latest(base)

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        return self.inner.resolve_version(base, version)

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        return self.inner.list_versions(base, since)

    def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        self.attempts.append(version)
        if self.losses > 0:
            self.losses -= 1
            raise VersionAlreadyExistsError(self.store.uri(base), version)
        if self.before_commit is not None:
            hook, self.before_commit = self.before_commit, None  # once
            hook(version)
        return self.inner.commit(base, version, manifest, scheme, summary)


@dataclass
class S3RequestLog:
    """S3 requests (``PutObject``, ``ListObjectsV2``, ...) sent through one boto3
    client, recorded by a ``before-send.s3`` event hook: every request on the wire,
    the lean ones (:mod:`lancetx.commit.storage.s3_lean`) included, never a lean
    request's probe (learned, never sent)."""

    operations: list[str] = field(default_factory=list)

    def __call__(self, event_name: str = "", **_: Any) -> None:
        self.operations.append(event_name.rsplit(".", 1)[-1])

    def count(self, operation: str) -> int:
        return self.operations.count(operation)


@contextmanager
def s3_requests(client: Any) -> Iterator[S3RequestLog]:
    """Record the S3 requests ``client`` sends inside the block."""
    log = S3RequestLog()
    unique = f"lancetx-test-{id(log)}"
    client.meta.events.register("before-send.s3", log, unique_id=unique)
    try:
        yield log
    finally:
        client.meta.events.unregister("before-send.s3", unique_id=unique)


def append_worker(
    uri: str,
    storage_options: dict[str, str] | None,
    writer: str,
    appends: int,
    rows_per_append: int,
    conn: TableConnection | None = None,
    start: Any = None,
) -> dict[str, Any]:
    """One concurrent writer: ``appends`` appends of ``rows_per_append`` rows,
    each planned on the version it committed last. Opens its own connection
    (its own handler and S3 client) unless given ``conn``. Returns its process
    id, per acknowledged append ``(seq, version, transaction uuid, attempts)``,
    and the uuids of transactions that exhausted their retries (then planned
    again). ``start``: a barrier to wait on once connected, so writers really race."""
    if conn is None:
        conn = connect(uri, storage_options)
    table = EngineTable(uri, storage_options, conn)
    parent: Parent | Committed = table.latest()
    if start is not None:
        start.wait()
    acknowledged = []
    exhausted = []
    for seq in range(appends):
        data = rows(seq * rows_per_append, rows_per_append, writer=writer, seq=seq)
        while True:
            try:
                committed = lancetx_append(table, data, parent)
            except RetriesExhaustedError as exc:
                # Lost every race (bounded retries): not acknowledged. Plan it
                # again, as an application would; the test checks it left no trace.
                exhausted.append(exc.transaction_uuid)
                parent = table.latest()
                continue
            break
        acknowledged.append(
            (seq, committed.version, committed.transaction.uuid, committed.attempts)
        )
        parent = committed
    return {"writer": writer, "pid": os.getpid(), "acks": acknowledged, "exhausted": exhausted}
