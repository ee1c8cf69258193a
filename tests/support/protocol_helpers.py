"""Shared machinery for the external-store protocol tests.

* Crashes: :func:`crash_after` wraps a protocol generator and "kills the
  process" (raises :class:`Crash`, which the protocol cannot catch) once ``k``
  effects have been performed; :class:`CrashingHandler` does that inside a real
  commit, so ``commit_transaction`` dies mid-protocol.
* Single effects: :func:`perform` / :func:`perform_async` run one effect
  through the real drivers (``protocol.run`` / ``run_async``), so interleaving
  schedulers use exactly the production effect mapping.
* Requests: :class:`RequestLog` records every HTTP request botocore sends on a
  client (``before-send``), with its operation and headers.
* Tables: appends through lancetx (pylance writes the data files, lancetx
  commits) and through pylance, and :func:`verify_history`, which checks a
  table's history from both sides.
* :func:`process_writer` runs in a spawned process: it builds its own
  ``connect(uri, options)``, watches its S3 client for conditional headers and
  appends.
"""

from __future__ import annotations

import collections
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa

from lancetx.commit.engine.committer import (
    CommitOptions,
    Committed,
    Parent,
    RetryPolicy,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import Append, Overwrite, Transaction
from lancetx.commit.errors import LancetxError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.location import TransactionSummary
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.format.schema import arrow_schema_to_fields
from lancetx.commit.format.snapshot import load_snapshot
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.sansio import relay
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore
from lancetx.commit.storage.s3store import conditional_headers
from lancetx.commit.storage.s3store_async import AsyncObjectStore
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest
from lancetx.externalstore.base import AsyncExternalManifestStore, ExternalManifestStore
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.externalstore.dynamodb.store_schema import remember_stamp, stamp_key
from lancetx.externalstore.memory import MemoryManifestStore
from lancetx.externalstore.protocol import (
    CommitOutcome,
    Effect,
    Steps,
    run,
    run_async,
)

# ------------------------------------------------------------------------ crashes


def _production_commit_effects() -> tuple[str, ...]:
    """The effects of one uncontended commit through the handler's own commit steps
    (those ``commit`` drives, sync and async), in order: recorded, not listed by hand,
    so that a step production adds is a crash point at once."""
    with tempfile.TemporaryDirectory() as tmp:
        store, entries = LocalObjectStore(tmp), MemoryManifestStore()
        handler = ExternalStoreCommitHandler(store, entries)
        performed: list[Effect] = []
        steps = handler.commit_steps("t", 1, b"manifest", NamingScheme.V2)
        run(recording(steps, performed), store, entries)
    return tuple(type(e).__name__ for e in performed)


def recording(steps: Steps[Any], log: list[Effect]) -> Steps[Any]:
    """``steps``, appending every effect to ``log`` before it is performed."""

    def record(effect: Effect) -> Effect:
        log.append(effect)
        return effect

    return relay(steps, record, passes=LancetxError)


#: Effects of an uncontended commit as production runs it, in order: the crash points.
COMMIT_EFFECTS = _production_commit_effects()
#: ``crash_after`` counts for the step boundaries of the four-step commit that
#: tests name: after the effect that ends each step.
BOUNDARIES = {
    name: COMMIT_EFFECTS.index(effect) + 1
    for name, effect in (
        ("after_stage", "PutObject"),  # staged manifest written, nothing claimed
        ("after_claim", "ClaimEntry"),  # the version is committed, not finalized
        ("after_copy", "CopyObject"),  # final object exists, entry still staged
        ("after_flip", "FlipEntry"),  # entry final, staged object left behind
    )
}
#: Every point where a writer can die between two effects of its commit (after the
#: first, before the last), named after the effect performed last.
CRASH_POINTS = {f"after_{k}_{COMMIT_EFFECTS[k - 1]}": k for k in range(1, len(COMMIT_EFFECTS))}


class Crash(BaseException):
    """The writer process died. A BaseException: the protocol never catches it."""

    def __init__(self, performed: int, next_effect: Effect | None) -> None:
        self.performed = performed
        self.next_effect = next_effect
        super().__init__(f"crashed after {performed} effect(s), before {next_effect!r}")


def crash_after(steps: Steps[Any], k: int) -> Steps[Any]:
    """``steps``, killed after ``k`` effects were performed (results fed back as usual)."""
    performed = 0

    def count(effect: Effect) -> Effect:
        nonlocal performed
        if performed >= k:
            steps.close()
            raise Crash(performed, effect)
        performed += 1
        return effect

    return relay(steps, count, passes=LancetxError)


class CrashingHandler(ExternalStoreCommitHandler):
    """A handler whose next commit dies after ``crash_after`` effects of the steps
    its ``commit`` drives (production's ``commit``, its steps wrapped)."""

    def __init__(
        self, store: ObjectStore, entries: ExternalManifestStore, crash_after: int
    ) -> None:
        super().__init__(store, entries)
        self.crash_after = crash_after
        self.effects: list[Effect] = []

    def commit_steps(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> Steps[CommitOutcome]:
        steps = super().commit_steps(base, version, manifest, scheme, summary)
        return recording(crash_after(steps, self.crash_after), self.effects)


class FaultyObjectStore(ObjectStore):
    """Wraps a store; ``fail_next(op, error, landed=...)`` makes the next call of
    ``op`` (``put``, ``copy``, ``delete``, ``get``, ``head``, …) raise ``error``,
    after performing it when ``landed``. ``calls`` counts calls by op."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.calls: collections.Counter[str] = collections.Counter()
        self._faults: dict[str, list[tuple[BaseException, bool]]] = collections.defaultdict(list)
        self._lock = threading.Lock()

    def fail_next(
        self, op: str, error: BaseException, *, landed: bool = False, times: int = 1
    ) -> None:
        with self._lock:
            self._faults[op].extend([(error, landed)] * times)

    def _call(self, op: str, action: Callable[[], Any]) -> Any:
        with self._lock:
            self.calls[op] += 1
            fault = self._faults[op].pop(0) if self._faults.get(op) else None
        if fault is None:
            return action()
        error, landed = fault
        if landed:
            action()
        raise error

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def get(self, key: str) -> bytes:
        return self._call("get", lambda: self.inner.get(key))  # type: ignore[no-any-return]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._call("get_range", lambda: self.inner.get_range(key, start, end))  # type: ignore[no-any-return]

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        return self._call("get_tail", lambda: self.inner.get_tail(key, length))  # type: ignore[no-any-return]

    def head(self, key: str) -> ObjectMeta:
        return self._call("head", lambda: self.inner.head(key))  # type: ignore[no-any-return]

    def put(self, key: str, data: bytes) -> ObjectMeta:
        return self._call("put", lambda: self.inner.put(key, data))  # type: ignore[no-any-return]

    def put_if_not_exists(self, key: str, data: bytes) -> ObjectMeta:
        return self._call("put_if_not_exists", lambda: self.inner.put_if_not_exists(key, data))  # type: ignore[no-any-return]

    def copy(self, src: str, dst: str) -> ObjectMeta:
        return self._call("copy", lambda: self.inner.copy(src, dst))  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        self._call("delete", lambda: self.inner.delete(key))

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        return self._call("list", lambda: iter(list(self.inner.list(prefix))))  # type: ignore[no-any-return]


def perform(effect: Effect, store: ObjectStore, entries: ExternalManifestStore) -> Any:
    """Perform one effect with the production driver; raises its error."""

    def one() -> Steps[Any]:
        return (yield effect)

    return run(one(), store, entries)


async def perform_async(
    effect: Effect, store: AsyncObjectStore, entries: AsyncExternalManifestStore
) -> Any:
    """Perform one effect with the production asyncio driver."""

    def one() -> Steps[Any]:
        return (yield effect)

    return await run_async(one(), store, entries)


# ----------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    """One HTTP request botocore sent."""

    service: str
    operation: str
    method: str
    url: str
    headers: dict[str, str]

    @property
    def conditional(self) -> list[str]:
        return conditional_headers(self.headers)


class RequestLog:
    """Records the requests of one or more botocore (or aiobotocore) clients."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self.enabled = True

    def attach(self, client: Any, service: str) -> RequestLog:
        def record(request: Any, event_name: str = "", **_: Any) -> None:
            if not self.enabled:
                return
            operation = event_name.rsplit(".", 1)[-1]
            headers = {str(k).lower(): _text(v) for k, v in request.headers.items()}
            with self._lock:
                self.requests.append(
                    Request(service, operation, request.method, str(request.url), headers)
                )

        # Registered first, so it sees a request even if a later handler refuses it.
        client.meta.events.register_first(f"before-send.{_service_id(service)}", record)
        return self

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def operations(self, service: str | None = None) -> list[str]:
        with self._lock:
            return [r.operation for r in self.requests if service in (None, r.service)]

    def counts(self) -> collections.Counter[str]:
        return collections.Counter(self.operations())

    def with_conditional_headers(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.conditional]


class ServerLog:
    """Every request the embedded server receives, whoever sent it (pylance's Rust
    clients included, which a botocore hook never sees), by AWS operation name.
    Installed as the server's interceptor while the ``with`` block runs."""

    def __init__(self, aws: EmbeddedAws) -> None:
        self.aws = aws
        self._lock = threading.Lock()
        self._operations: list[str] = []

    def __enter__(self) -> ServerLog:
        self.aws.set_interceptor(self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        self.aws.set_interceptor(None)

    def _record(self, request: InterceptedRequest) -> None:
        with self._lock:
            self._operations.append(server_operation(request))

    def operations(self) -> list[str]:
        with self._lock:
            return list(self._operations)

    def clear(self) -> None:
        with self._lock:
            self._operations.clear()


def server_operation(request: InterceptedRequest) -> str:
    """The AWS operation of a request as the server saw it."""
    if request.service == "dynamodb":
        return request.target
    query = urllib.parse.parse_qs(request.query, keep_blank_values=True)
    headers = {k.lower() for k in request.headers}
    match request.method:
        case "HEAD":
            return "HeadObject"
        case "DELETE":
            return "DeleteObject"
        case "POST":
            return "DeleteObjects" if "delete" in query else "MultipartUpload"
        case "PUT":
            if "x-amz-copy-source" in headers:
                return "CopyObject"
            return "UploadPart" if "uploadId" in query else "PutObject"
        case "GET":
            return "ListObjectsV2" if "list-type" in query else "GetObject"
    return request.method


def _service_id(service: str) -> str:
    return {"s3": "s3", "dynamodb": "dynamodb"}[service]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------ tables


def ensure_ddb_table(endpoint_options: Mapping[str, str], name: str) -> None:
    """Create (and validate) the Lance-layout DynamoDB table ``name``, without the
    layout stamp: a store as pylance users make it (the AWS CLI, Terraform), which
    lancetx must work with as is. (``create_table`` stamps the stores it makes:
    ``tests/externalstore/test_create_table_stamp.py``.)"""
    client = make_client(DynamoDBConfig.from_options(endpoint_options))
    create_table(client, name)
    client.delete_item(TableName=name, Key=stamp_key())
    remember_stamp(client, name, None)


def ddb_uri(bucket: str, path: str, table: str) -> str:
    return f"s3+ddb://{bucket}/{path}?ddbTableName={table}"


def batch(writer: str, seq: int, rows: int) -> pa.Table:
    """``rows`` rows tagged with their writer and the writer's append number."""
    return pa.table(
        {
            "writer": pa.array([writer] * rows, pa.string()),
            "seq": pa.array([seq] * rows, pa.int64()),
            "i": pa.array(range(rows), pa.int64()),
        }
    )


@dataclass
class Tally:
    """Acknowledged appends: (writer, seq) → rows."""

    rows: dict[tuple[str, int], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, writer: str, seq: int, rows: int) -> None:
        with self.lock:
            key = (writer, seq)
            assert key not in self.rows, f"append {key} acknowledged twice"
            self.rows[key] = rows

    @property
    def commits(self) -> int:
        return len(self.rows)

    @property
    def total(self) -> int:
        return sum(self.rows.values())


FAST_COMMIT = CommitOptions(retry=RetryPolicy(max_attempts=60, base_delay=0.002, max_delay=0.05))


def lancetx_append(
    handler: CommitHandler,
    base: str,
    data_uri: str,
    storage_options: Mapping[str, str] | None,
    data: pa.Table,
    parent: Parent | Committed | None = None,
    options: CommitOptions | None = None,
) -> Committed:
    """pylance writes the data files; lancetx commits the Append."""
    if parent is None:
        parent = load_parent(handler, base)
        if parent is None:
            raise AssertionError(f"no table at {data_uri}")
    fragments = lance.fragment.write_fragments(
        data, data_uri, storage_options=dict(storage_options) if storage_options else None
    )
    txn = Transaction(
        read_version=parent.version,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        properties={"writer": "lancetx-tests"},
    )
    return commit_transaction(handler, base, txn, parent=parent, options=options or FAST_COMMIT)


def create_transaction(
    data_uri: str, storage_options: Mapping[str, str] | None, data: pa.Table
) -> Transaction:
    """An Overwrite at read version 0 creating a table of ``data`` (files written by pylance)."""
    fragments = lance.fragment.write_fragments(
        data, data_uri, storage_options=dict(storage_options) if storage_options else None
    )
    fields, metadata = arrow_schema_to_fields(data.schema)
    return Transaction(
        read_version=0,
        operation=Overwrite(
            fragments=tuple(fragment_from_pylance(f) for f in fragments),
            schema=tuple(fields),
            schema_metadata=metadata,
        ),
    )


def pylance_append(uri: str, options: Mapping[str, str] | None, data: pa.Table) -> int:
    ds = lance.write_dataset(
        data, uri, mode="append", storage_options=dict(options) if options else None
    )
    return int(ds.version)


#: pylance's messages when every attempt of its own commit budget lost the claim race
#: (each claim refused by DynamoDB's condition: nothing landed) — its count of
#: attempts, or its 30 s ``retry_timeout``, checked between attempts.
PYLANCE_LOST_EVERY_RACE = "Failed to commit the transaction after"
PYLANCE_OUT_OF_TIME = "Too many concurrent writers"
#: How long :func:`pylance_append_landing` keeps committing again (generous: a loaded
#: machine must not turn contention into a failure).
PYLANCE_LANDING_BUDGET = 600.0


def pylance_append_landing(
    uri: str,
    options: Mapping[str, str] | None,
    data: pa.Table,
    *,
    max_retries: int = 20,
    budget: float = PYLANCE_LANDING_BUDGET,
) -> int:
    """A pylance append that lands exactly once beside any number of writers, whatever
    pylance's own commit budget (``max_retries``): pylance writes the files once and
    commits them with ``LanceDataset.commit``; a commit that lost every race of its
    budget provably did not land, so it is committed again on the latest version (any
    other error is raised). A test's verdict then never depends on pylance's budget
    running out under load."""
    opts = dict(options) if options else None
    fragments = lance.fragment.write_fragments(
        data, lance.dataset(uri, storage_options=opts), mode="append", storage_options=opts
    )
    operation = lance.LanceOperation.Append(fragments)
    deadline = time.monotonic() + budget
    while True:
        read_version = lance.dataset(uri, storage_options=opts).version
        try:
            committed = lance.LanceDataset.commit(
                uri,
                operation,
                read_version=read_version,
                storage_options=opts,
                max_retries=max_retries,
            )
        except Exception as exc:
            lost = PYLANCE_LOST_EVERY_RACE in str(exc) or PYLANCE_OUT_OF_TIME in str(exc)
            if not lost or time.monotonic() > deadline:
                raise
            continue
        return int(committed.version)


def pylance_create(uri: str, options: Mapping[str, str] | None, data: pa.Table) -> int:
    ds = lance.write_dataset(data, uri, storage_options=dict(options) if options else None)
    return int(ds.version)


def rows_by_append(table: pa.Table) -> dict[tuple[str, int], int]:
    """(writer, seq) → row count of a table read back."""
    if table.num_rows == 0:
        return {}
    grouped = table.group_by(["writer", "seq"]).aggregate([("i", "count")])
    return {
        (w, int(s)): int(n)
        for w, s, n in zip(
            grouped["writer"].to_pylist(),
            grouped["seq"].to_pylist(),
            grouped["i_count"].to_pylist(),
            strict=True,
        )
    }


def verify_history(
    uri: str,
    storage_options: Mapping[str, str] | None,
    handler: CommitHandler,
    base: str,
    expected: Mapping[tuple[str, int], int],
    *,
    versions: int | None = None,
    each_version: bool = True,
) -> int:
    """Check a table's history from both sides; returns the latest version.

    pylance: versions 1..N listed without a gap, every acknowledged append
    present exactly once (no loss, no duplicate). lancetx: the same versions
    from the external store, each loadable, row counts equal to pylance's at
    every version (``each_version``), and pylance opens every version too.
    """
    opts = dict(storage_options) if storage_options else None
    ds = lance.dataset(uri, storage_options=opts)
    listed = sorted(int(v["version"]) for v in ds.versions())
    latest = int(ds.version)
    assert listed == list(range(1, latest + 1)), f"pylance lists versions {listed}"
    if versions is not None:
        assert latest == versions, f"latest version {latest}, expected {versions}"
    got = rows_by_append(ds.to_table(columns=["writer", "seq", "i"]))
    assert got == dict(expected), _diff(expected, got)

    ours = handler.list_versions(base, 0)
    assert [loc.version for loc in ours] == list(range(1, latest + 1))
    resolved = handler.resolve_latest(base)
    assert resolved is not None and resolved.version == latest
    if each_version:
        for location in ours:
            snap = load_snapshot(handler.store, base, location)
            theirs = lance.dataset(uri, version=location.version, storage_options=opts)
            assert snap.num_rows == theirs.count_rows(), f"version {location.version}"
            assert snap.version == int(theirs.version)
    return latest


def _diff(expected: Mapping[tuple[str, int], int], got: Mapping[tuple[str, int], int]) -> str:
    missing = {k: v for k, v in expected.items() if got.get(k) != v}
    extra = {k: v for k, v in got.items() if expected.get(k) != v}
    return f"appends lost or wrong: {missing}; unexpected or duplicated: {extra}"


# ---------------------------------------------------------------- process writers


def process_writer(
    uri: str, options: dict[str, str], name: str, appends: int, rows: int, threads: int
) -> dict[str, Any]:
    """Entry point of a spawned writer process: ``threads`` writers appending
    ``appends`` times each through its own ``connect``; reports what it saw."""
    from lancetx.externalstore.connect import connect

    conn = connect(uri, options)
    log = RequestLog().attach(conn.handler.store.client, "s3")  # type: ignore[attr-defined]
    log.attach(conn.handler.entries.client, "dynamodb")  # type: ignore[attr-defined]
    acknowledged: list[tuple[str, int, int]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def writer(index: int) -> None:
        writer_name = f"{name}-t{index}"
        parent: Committed | None = None
        try:
            for seq in range(appends):
                parent = lancetx_append(
                    conn.handler,
                    conn.base,
                    conn.data_uri,
                    conn.storage_options,
                    batch(writer_name, seq, rows),
                    parent,
                )
                with lock:
                    acknowledged.append((writer_name, seq, rows))
        except BaseException as exc:  # reported to the parent
            with lock:
                errors.append(f"{writer_name}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {
        "acknowledged": acknowledged,
        "errors": errors,
        "s3_requests": len(log.operations("s3")),
        "conditional": [
            f"{r.operation} {r.url} {r.conditional}" for r in log.with_conditional_headers()
        ],
        "s3_operations": sorted(set(log.operations("s3"))),
    }


# ---------------------------------------------------------------------- threads


#: How long :func:`run_threads` waits: it detects a hang, it does not time anything, so
#: it is generous (a whole-suite run at load 40 once took over 120 s for sixteen writers)
#: and stays under pytest-timeout's 600 s per test.
THREADS_HANG_TIMEOUT = 480.0


def run_threads(
    targets: list[Callable[[], None]], timeout: float = THREADS_HANG_TIMEOUT
) -> list[BaseException]:
    """Start every target at once (barrier), join, return the exceptions raised."""
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(targets))

    def guarded(target: Callable[[], None]) -> None:
        barrier.wait()
        try:
            target()
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threads if t.is_alive()]
    if stuck:
        errors.append(TimeoutError(f"{len(stuck)} writer thread(s) still running after {timeout}s"))
    return errors


__all__ = [
    "BOUNDARIES",
    "COMMIT_EFFECTS",
    "FAST_COMMIT",
    "Crash",
    "CrashingHandler",
    "FaultyObjectStore",
    "RequestLog",
    "Tally",
    "batch",
    "crash_after",
    "ddb_uri",
    "ensure_ddb_table",
    "lancetx_append",
    "perform",
    "perform_async",
    "process_writer",
    "pylance_append",
    "pylance_create",
    "recording",
    "rows_by_append",
    "run_threads",
    "verify_history",
]
