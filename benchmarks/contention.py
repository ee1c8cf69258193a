"""Concurrent appends through ``s3+ddb://`` on a legacy S3: throughput, latency, retries, correctness.

One embedded moto server whose S3 silently ignores ``If-None-Match`` (the kind
of store lancetx exists for) serves every run. For each system and each writer
count N, a fresh table is created by pylance (one batch, version 1); then N
writers — one process each by default (``--mode threads``: one thread each) —
set up (connect, warm caches), are released together, and each append K batches:

* ``lancetx``       — ``lancetx_append`` from the demo (pylance writes the data
  files, lancetx commits); each writer keeps its last ``Committed`` as the
  parent of its next append (no read before committing);
* ``lancetx-fresh`` — the same, but each append re-resolves the latest version
  first (``parent=None``: one Query + one GET), as pylance does;
* ``pylance``       — ``lance.write_dataset(mode="append")`` on ``s3+ddb://``.

Workloads: ``appends`` (every operation an append) and ``mixed`` (every third
operation of a writer deletes the fragment of its previous append: lancetx
commits a Delete of that fragment, pylance runs ``ds.delete(predicate)``).

Per run: commits/s (acknowledged operations / wall time), p50/p99 latency,
retries per commit (every system: conditional PutItems the server saw, minus
commits, per commit — lost claims of failed appends included; lancetx also
from ``Committed.attempts - 1``), requests per commit (by operation),
and correctness checked with pylance: versions 1..N+1 with no gap, every
acknowledged (writer, seq) batch present exactly once (and each acknowledged
delete's batch gone); CPU seconds per acknowledged commit (the writer processes'
``time.process_time``, pylance's Rust threads included; processes mode only)
and the server's (this process's ``time.process_time`` while the writers run:
it only serves meanwhile; moto answers one request at a time);
and claimants per round: how many conditional PutItems the server saw per
version (1 = nobody lost that round).

Then the data-loss anchor: pylance plain ``s3://`` writers on the same legacy
store (conditional PUT ignored), acknowledged vs present appends.

Run: ``python benchmarks/contention.py [--writers 1,4,8,16,32] [--appends 10]
[--workload appends|mixed] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

import lance
from _harness import (
    Bench,
    Request,
    ServerCounter,
    Stopwatch,
    counting,
    environment,
    fmt,
    install_data_phase_timer,
    last_data_seconds,
    markdown_table,
    operations_in,
    percentile,
    start_bench,
    unique_name,
    write_json,
)

from lancetx.commit.engine.committer import Committed, Parent, commit_transaction, load_parent
from lancetx.commit.engine.operations import Append as AppendOp
from lancetx.commit.engine.operations import Delete, Transaction
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws
from lancetx.demo.race import batch, data_writer, lancetx_append
from lancetx.externalstore.connect import TableConnection, connect

SYSTEMS: tuple[str, ...] = ("lancetx", "lancetx-fresh", "pylance")


@dataclass
class Append:
    """One append attempt as a writer saw it."""

    writer: str
    seq: int
    seconds: float
    ok: bool
    error: str = ""
    #: lancetx only.
    attempts: int | None = None
    data_seconds: float | None = None
    #: ``append`` or ``delete`` (of the batch ``(writer, target)``).
    kind: str = "append"
    target: int | None = None


@dataclass
class Run:
    """One (system, writers) run."""

    system: str
    writers: int
    appends_per_writer: int
    rows: int
    wall_seconds: float = 0.0
    appends: list[Append] = field(default_factory=list)
    claims: int = 0
    requests: int = 0
    #: Requests the server saw during the run, by operation.
    operations: Counter[str] = field(default_factory=Counter)
    versions: list[int] = field(default_factory=list)
    present: Counter[tuple[str, int]] = field(default_factory=Counter)
    row_count: int = 0
    expected_rows: int = 0
    workload: str = "appends"
    cpu_seconds: float = 0.0
    #: The server's CPU seconds while the writers ran (this process: it only
    #: serves meanwhile; processes mode only).
    server_cpu_seconds: float = 0.0
    #: Conditional PutItems per claimed version, for this run's table.
    claimants: list[int] = field(default_factory=list)
    #: Which of the paired runs (``--repeats``) this one belongs to.
    repeat: int = 0

    @property
    def commits_per_second(self) -> float:
        return len(self.committed) / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def committed(self) -> list[Append]:
        return [a for a in self.appends if a.ok]

    @property
    def failed(self) -> list[Append]:
        return [a for a in self.appends if not a.ok]

    def latencies_ms(self) -> list[float]:
        return [a.seconds * 1000 for a in self.committed]

    def retries_per_commit(self) -> float:
        """From the server: conditional PutItems (claims) minus commits, per commit."""
        commits = len(self.committed)
        return (self.claims - commits) / commits if commits else float("nan")

    def client_retries(self) -> list[int]:
        return [a.attempts - 1 for a in self.committed if a.attempts is not None]

    def linear(self) -> bool:
        return self.versions == list(range(1, len(self.committed) + 2))

    def complete(self) -> bool:
        """Every acknowledged batch present exactly once (minus the acknowledged
        deletes), nothing else (besides setup)."""
        deleted = {(a.writer, a.target) for a in self.committed if a.kind == "delete"}
        wanted = {(a.writer, a.seq) for a in self.committed if a.kind == "append"} - deleted
        got = {key for key in self.present if key[0] != "setup"}
        exact = all(self.present[key] == self.rows for key in wanted)
        return exact and got == wanted and self.row_count == self.expected_rows

    def cpu_per_commit(self) -> float:
        commits = len(self.committed)
        return self.cpu_seconds / commits if commits else float("nan")

    def server_cpu_per_commit(self) -> float:
        commits = len(self.committed)
        return self.server_cpu_seconds / commits if commits else float("nan")

    def claimant_histogram(self) -> dict[int, int]:
        """claimants per round → rounds."""
        return dict(sorted(Counter(self.claimants).items()))

    def as_json(self) -> dict[str, Any]:
        lat = self.latencies_ms()
        data = [a.data_seconds * 1000 for a in self.committed if a.data_seconds is not None]
        return {
            "system": self.system,
            "repeat": self.repeat,
            "workload": self.workload,
            "writers": self.writers,
            "appends_per_writer": self.appends_per_writer,
            "rows_per_append": self.rows,
            "commits": len(self.committed),
            "failed": len(self.failed),
            "errors": sorted({a.error for a in self.failed}),
            "wall_seconds": self.wall_seconds,
            "commits_per_second": len(self.committed) / self.wall_seconds,
            "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99),
            "p50_data_ms": percentile(data, 50) if data else None,
            "server_claims": self.claims,
            "retries_per_commit": self.retries_per_commit(),
            "client_retries": self.client_retries(),
            "requests_per_commit": self.requests / max(1, len(self.committed)),
            "requests_by_operation": dict(self.operations),
            "versions_linear": self.linear(),
            "all_rows_present": self.complete(),
            "row_count": self.row_count,
            "expected_rows": self.expected_rows,
            "latencies_ms": lat,
            "cpu_seconds": self.cpu_seconds,
            "cpu_ms_per_commit": 1000 * self.cpu_per_commit(),
            "server_cpu_seconds": self.server_cpu_seconds,
            "server_cpu_ms_per_commit": 1000 * self.server_cpu_per_commit(),
            "claimants_per_round": self.claimant_histogram(),
            "claimants_mean": statistics.fmean(self.claimants) if self.claimants else None,
        }


# ------------------------------------------------------------------------ writers


@dataclass(frozen=True)
class WriterTask:
    """What one writer does (picklable: it travels to a spawned process)."""

    system: str
    uri: str
    options: dict[str, str]
    name: str
    appends: int
    rows: int
    workload: str = "appends"
    #: Data files written before the release; only commits are timed.
    commit_only: bool = False
    #: Record every request of a lancetx writer (``--trace``): a folder for its JSON.
    trace: str | None = None


AppendFn = Callable[[str, int, int], Append]


def deletes_now(task: WriterTask, seq: int) -> bool:
    """In the mixed workload every third operation deletes the writer's previous append."""
    return task.workload == "mixed" and seq % 3 == 2


def make_append(task: WriterTask) -> AppendFn:
    """Set the writer up (outside the timed window) and return its append function."""
    if task.commit_only:
        return commit_only_writer(task)
    if task.system.startswith("lancetx"):
        # Each writer has its own connection, as separate processes or hosts would.
        conn = connect(task.uri, task.options)
        install_data_phase_timer()
        return lancetx_writer(conn, task, fresh=task.system == "lancetx-fresh")
    # Warm pylance's per-process DescribeTable cache, as connect() warms lancetx's.
    lance.dataset(task.uri, storage_options=task.options)
    return pylance_writer(task)


def lancetx_writer(conn: TableConnection, task: WriterTask, fresh: bool) -> AppendFn:
    parent: list[Parent | Committed | None] = [None]
    #: (seq, data file paths) of this writer's acknowledged appends not deleted yet.
    mine: list[tuple[int, set[str]]] = []

    def delete(writer: str, seq: int) -> Append:
        target, paths = mine.pop()
        started = time.perf_counter()
        try:
            current = parent[0] if parent[0] is not None and not fresh else None
            if current is None:
                current = load_parent(conn.handler, conn.base)
                assert current is not None
            ids = tuple(
                f.id
                for f in current.manifest.manifest.fragments
                if {d.path for d in f.files} & paths
            )
            txn = Transaction(
                read_version=current.version,
                operation=Delete(
                    deleted_fragment_ids=ids, predicate=f"writer = '{writer}' AND seq = {target}"
                ),
            )
            done = commit_transaction(conn.handler, conn.base, txn, parent=current)
        except Exception as exc:
            return Append(
                writer, seq, time.perf_counter() - started, False, _short(exc), kind="delete"
            )
        parent[0] = done
        return Append(
            writer,
            seq,
            time.perf_counter() - started,
            True,
            attempts=done.attempts,
            kind="delete",
            target=target,
        )

    def append(writer: str, seq: int, rows: int) -> Append:
        if deletes_now(task, seq) and mine:
            return delete(writer, seq)
        started = time.perf_counter()
        try:
            done = lancetx_append(conn, batch(writer, seq, rows), None if fresh else parent[0])
        except Exception as exc:  # a failed append is a result, not a crash
            return Append(writer, seq, time.perf_counter() - started, False, _short(exc))
        seconds = time.perf_counter() - started
        parent[0] = done
        added = getattr(done.transaction.operation, "fragments", ())
        mine.append((seq, {d.path for f in added for d in f.files}))
        return Append(
            writer, seq, seconds, True, attempts=done.attempts, data_seconds=last_data_seconds()
        )

    return append


def pylance_writer(task: WriterTask) -> AppendFn:
    uri, options = task.uri, task.options
    mine: list[int] = []

    def append(writer: str, seq: int, rows: int) -> Append:
        started = time.perf_counter()
        if deletes_now(task, seq) and mine:
            target = mine.pop()
            try:
                lance.dataset(uri, storage_options=options).delete(
                    f"writer = '{writer}' AND seq = {target}"
                )
            except Exception as exc:
                return Append(
                    writer, seq, time.perf_counter() - started, False, _short(exc), kind="delete"
                )
            return Append(
                writer, seq, time.perf_counter() - started, True, kind="delete", target=target
            )
        try:
            lance.write_dataset(
                batch(writer, seq, rows), uri, mode="append", storage_options=options
            )
        except Exception as exc:
            return Append(writer, seq, time.perf_counter() - started, False, _short(exc))
        mine.append(seq)
        return Append(writer, seq, time.perf_counter() - started, True)

    return append


def commit_only_writer(task: WriterTask) -> AppendFn:
    """The commit path only: every data file of the writer's appends is written
    during setup (pylance's ``write_fragments``, both systems), and each timed
    operation commits one prepared Append. lancetx keeps its last ``Committed`` as
    the next parent; pylance commits with the version its last commit returned as
    the read version (``LanceDataset.commit``), so neither reads before committing."""
    batches = [batch(task.name, seq, task.rows) for seq in range(task.appends)]
    if task.system.startswith("lancetx"):
        conn = connect(task.uri, task.options)
        if task.trace:
            trace_requests(conn, os.path.join(task.trace, f"{task.name}.json"))
        first = load_parent(conn.handler, conn.base)
        assert first is not None
        writer = data_writer(conn, first)
        prepared = [
            tuple(
                fragment_from_pylance(f)
                for f in lance.fragment.write_fragments(
                    b, writer, storage_options=conn.storage_options
                )
            )
            for b in batches
        ]
        parent: list[Parent | Committed] = [first]
        fresh = task.system == "lancetx-fresh"

        def commit_lancetx(writer_name: str, seq: int, rows: int) -> Append:
            started = time.perf_counter()
            try:
                current = parent[0]
                if fresh:
                    loaded = load_parent(conn.handler, conn.base)
                    assert loaded is not None
                    current = loaded
                txn = Transaction(
                    read_version=current.version,
                    operation=AppendOp(fragments=prepared[seq]),
                    properties={"writer": "lancetx-bench"},
                )
                done = commit_transaction(conn.handler, conn.base, txn, parent=current)
            except Exception as exc:
                return Append(writer_name, seq, time.perf_counter() - started, False, _short(exc))
            parent[0] = done
            return Append(
                writer_name, seq, time.perf_counter() - started, True, attempts=done.attempts
            )

        return commit_lancetx
    ds = lance.dataset(task.uri, storage_options=task.options)
    frags = [lance.fragment.write_fragments(b, ds) for b in batches]
    read_version = [ds.version]

    def commit_pylance(writer_name: str, seq: int, rows: int) -> Append:
        started = time.perf_counter()
        try:
            done = lance.LanceDataset.commit(
                task.uri,
                lance.LanceOperation.Append(frags[seq]),
                read_version=read_version[0],
                storage_options=task.options,
            )
        except Exception as exc:
            return Append(writer_name, seq, time.perf_counter() - started, False, _short(exc))
        read_version[0] = done.version
        return Append(writer_name, seq, time.perf_counter() - started, True)

    return commit_pylance


#: What ``--trace`` records: (object, method) of the handler's stores.
TRACED = {
    "store": ("get", "get_tail", "get_tail_bulk", "head", "put", "copy", "delete", "list"),
    "entries": (
        "get",
        "get_entries",
        "latest",
        "put_if_not_exists",
        "put_with_key_if_not_exists",
        "put_if_exists",
        "list_entries",
        "take_ticket",
        "read_turns",
        "end_turn",
    ),
}


def trace_requests(conn: TableConnection, path: str) -> None:
    """Record every call of the handler's object store and external store (start,
    end, what it touched, how it ended) and write them to ``path`` at exit: the
    raw material of :func:`critical_sections`."""
    import json

    events: list[dict[str, Any]] = []
    lock = threading.Lock()

    def detail(name: str, args: tuple[Any, ...]) -> Any:
        first = args[0] if args else None
        if name in ("put_if_not_exists", "put_with_key_if_not_exists", "put_if_exists"):
            return first.version if first is not None else None
        if name == "get_entries":
            return list(args[1])
        if name == "get" and len(args) == 2 and isinstance(args[1], int):
            return args[1]
        return first if isinstance(first, str) else None

    def result_of(name: str, value: Any) -> Any:
        if name == "get_entries":
            return [e.version for e in value]
        if name == "get" and hasattr(value, "version"):
            return value.version
        return None

    def wrap(target: Any, kind: str, name: str) -> None:
        original = getattr(target, name)

        def traced(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            outcome, result = "ok", None
            try:
                value = original(*args, **kwargs)
                result = result_of(name, value)
                return value
            except BaseException as exc:
                outcome = type(exc).__name__
                raise
            finally:
                with lock:
                    events.append(
                        {
                            "call": f"{kind}.{name}",
                            "start": started,
                            "end": time.time(),
                            "arg": detail(name, args),
                            "outcome": outcome,
                            "result": result,
                        }
                    )

        setattr(target, name, traced)

    for kind, names in TRACED.items():
        target = getattr(conn.handler, kind)
        for name in names:
            if hasattr(target, name):
                wrap(target, kind, name)

    def dump() -> None:
        with open(path, "w") as out:
            json.dump(events, out)

    _TRACE_DUMPS.append(dump)


#: Writes the traces of this process (a writer runs them once it is done).
_TRACE_DUMPS: list[Callable[[], None]] = []


def critical_sections(folder: str) -> str:
    """From the writers' traces: for each version claimed right after another by a
    different writer, where the time between the two won claims went (the next
    writer's requests in between, by kind; the rest is its CPU and its sleeps)."""
    import glob
    import json

    traces = {}
    for path in glob.glob(os.path.join(folder, "*.json")):
        with open(path) as f:
            traces[os.path.basename(path)[:-5]] = json.load(f)
    claims: dict[int, tuple[str, dict[str, Any]]] = {}
    for writer, events in traces.items():
        for e in events:
            claimed = e["call"].startswith("entries.put_") and "if_not_exists" in e["call"]
            if claimed and e["outcome"] == "ok":
                claims[e["arg"]] = (writer, e)
    gaps: list[float] = []
    parts: dict[str, list[float]] = {}
    detect: list[float] = []
    for version in sorted(claims):
        if version - 1 not in claims:
            continue
        prev_writer, prev = claims[version - 1]
        writer, claim = claims[version]
        if writer == prev_writer:
            continue
        t0, t1 = prev["end"], claim["end"]
        gaps.append(t1 - t0)
        spent: dict[str, float] = {}
        seen_at = None
        for e in traces[writer]:
            if e["end"] <= t0 or e["start"] >= t1:
                continue
            kind = _request_kind(e, version)
            share = min(e["end"], t1) - max(e["start"], t0)
            spent[kind] = spent.get(kind, 0.0) + share
            if seen_at is None and e["call"] in ("entries.get_entries", "entries.get"):
                found = e["result"] if isinstance(e["result"], list) else [e["result"]]
                if version - 1 in found:
                    seen_at = e["end"]
        spent["other (CPU, sleeps)"] = (t1 - t0) - sum(spent.values())
        for kind, seconds in spent.items():
            parts.setdefault(kind, []).append(seconds)
        if seen_at is not None:
            detect.append(seen_at - t0)
    if not gaps:
        return "No handoffs between writers in the traces."
    n = len(gaps)
    rows = [
        [kind, fmt(1000 * sum(v) / n, 1), fmt(100 * sum(v) / sum(gaps), 0) + "%"]
        for kind, v in sorted(parts.items(), key=lambda kv: -sum(kv[1]))
    ]
    return "\n".join(
        [
            f"Between two writers' won claims ({n} handoffs; mean {1000 * sum(gaps) / n:.1f} ms, "
            f"median {1000 * statistics.median(gaps):.1f} ms; the next writer saw the claim "
            f"{1000 * statistics.median(detect) if detect else float('nan'):.1f} ms after it "
            "landed, median): what the next writer spent the time on (mean per handoff)",
            "",
            markdown_table(["the next writer's", "ms", "share"], rows),
            "",
        ]
    )


def _request_kind(event: dict[str, Any], version: int) -> str:
    call, arg = event["call"], event["arg"]
    if call.startswith("entries.put_") and "if_not_exists" in call:
        return "claim (conditional PutItem)"
    if call in ("entries.get_entries", "entries.get"):
        return "looks and entry reads (GetItem/BatchGetItem)"
    if call == "store.put" and isinstance(arg, str) and "/_versions/" in arg:
        return "stage (manifest PUT)"
    if call == "store.put":
        return "transaction file PUT"
    if call in ("store.get", "store.get_tail", "store.get_tail_bulk"):
        return "manifest/transaction GET"
    if call in ("store.copy", "entries.put_if_exists", "store.delete", "store.head"):
        return "finishing a version (copy, flip, delete, HEAD)"
    return call


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:160]}"


#: Seconds any party waits at a start barrier before the run is declared broken
#: (32 writer processes importing pylance and writing their data files on a
#: loaded 2-core machine took more than 3 minutes).
BARRIER_TIMEOUT = 900.0


def writer_main(task: WriterTask, ready: Any, go: Any, out: Any) -> None:
    """One writer: set up, wait for everyone, append, report (thread or process)."""
    try:
        append: AppendFn | None = make_append(task)
        setup_error = ""
    except Exception as exc:
        append, setup_error = None, _short(exc)
    ready.wait(BARRIER_TIMEOUT)
    go.wait(BARRIER_TIMEOUT)
    results: list[dict[str, Any]] = []
    cpu = time.process_time()
    for seq in range(task.appends):
        if append is None:
            results.append(asdict(Append(task.name, seq, 0.0, False, f"setup: {setup_error}")))
        else:
            results.append(asdict(append(task.name, seq, task.rows)))
    for dump in _TRACE_DUMPS:
        dump()
    out.put((results, time.time(), time.process_time() - cpu))


def race(
    mode: str, tasks: Sequence[WriterTask], counter: ServerCounter
) -> tuple[list[Append], float, list[Request], float, float]:
    """Run the writers, released together; their appends, the wall time, the
    requests the server saw between the release and the last writer's end, the
    writers' CPU seconds and this process's (the server's) over the same span
    (both meaningful in processes mode only)."""
    n = len(tasks)
    workers: list[threading.Thread | BaseProcess]
    if mode == "threads":
        ready: Any = threading.Barrier(n + 1)
        go: Any = threading.Barrier(n + 1)
        out: Any = queue.Queue()
        workers = [threading.Thread(target=writer_main, args=(t, ready, go, out)) for t in tasks]
    else:
        # spawn, not fork: the parent runs the moto server's threads.
        ctx = multiprocessing.get_context("spawn")
        ready, go, out = ctx.Barrier(n + 1), ctx.Barrier(n + 1), ctx.Queue()
        workers = [ctx.Process(target=writer_main, args=(t, ready, go, out)) for t in tasks]
    for worker in workers:
        worker.start()
    ready.wait(BARRIER_TIMEOUT)
    counter.take()  # setup requests (connect, DescribeTable, warm-up reads) are not counted
    go.wait(BARRIER_TIMEOUT)
    started = time.time()
    server_cpu = time.process_time()
    appends: list[Append] = []
    ended = started
    cpu_total = 0.0
    for _ in tasks:  # drain before joining: a process cannot exit with queued data
        results, finished, cpu = out.get(timeout=BARRIER_TIMEOUT * 5)
        appends += [Append(**r) for r in results]
        ended = max(ended, finished)
        cpu_total += cpu
    server_cpu = time.process_time() - server_cpu
    seen = counter.take()
    for worker in workers:
        worker.join()
    return appends, ended - started, seen, cpu_total, server_cpu


def inspect_table(
    uri: str, options: dict[str, str]
) -> tuple[list[int], Counter[tuple[str, int]], int]:
    """Versions, rows per (writer, seq), and the row count, as pylance sees them."""
    ds = lance.dataset(uri, storage_options=options)
    versions = sorted(int(v["version"]) for v in ds.versions())
    table = ds.to_table(columns=["writer", "seq"])
    present: Counter[tuple[str, int]] = Counter(
        zip(table.column("writer").to_pylist(), table.column("seq").to_pylist(), strict=True)
    )
    return versions, present, ds.count_rows()


def run_one(
    bench: Bench,
    counter: ServerCounter,
    mode: str,
    system: str,
    writers: int,
    appends: int,
    rows: int,
    workload: str = "appends",
    commit_only: bool = False,
    trace: str | None = None,
) -> Run:
    # Its own DynamoDB table: see Bench.fresh_ddb_table (moto's Query scans them whole).
    uri = bench.ddb_uri(unique_name(f"{system}-{writers}w"), bench.fresh_ddb_table())
    options = bench.options
    lance.write_dataset(batch("setup", 0, rows), uri, storage_options=options)
    run = Run(system, writers, appends, rows, workload=workload)
    tasks = [
        WriterTask(
            system, uri, options, f"{system}-{i}", appends, rows, workload, commit_only, trace
        )
        for i in range(writers)
    ]
    run.appends, run.wall_seconds, seen, run.cpu_seconds, run.server_cpu_seconds = race(
        mode, tasks, counter
    )
    run.claims = sum(1 for r in seen if r.claim)
    run.requests = len(seen)
    run.operations = Counter(r.operation for r in seen)
    per_version = Counter(r.claim_of[1] for r in seen if r.claim and r.claim_of is not None)
    run.claimants = [per_version[v] for v in sorted(per_version)]
    run.versions, run.present, run.row_count = inspect_table(uri, options)
    kept = [a for a in run.committed if a.kind == "append"]
    gone = [a for a in run.committed if a.kind == "delete"]
    run.expected_rows = rows * (1 + len(kept) - len(gone))
    return run


# ------------------------------------------------------------------ plain s3 anchor


@dataclass
class Anchor:
    writers: int
    appends_per_writer: int
    acknowledged: int = 0
    present: int = 0
    errors: list[str] = field(default_factory=list)
    versions: int = 0
    wall_seconds: float = 0.0

    @property
    def lost(self) -> int:
        return self.acknowledged - self.present

    def as_json(self) -> dict[str, Any]:
        return {
            "writers": self.writers,
            "appends_per_writer": self.appends_per_writer,
            "acknowledged": self.acknowledged,
            "present": self.present,
            "lost": self.lost,
            "lost_fraction": self.lost / self.acknowledged if self.acknowledged else None,
            "errors": self.errors,
            "latest_version": self.versions,
            "wall_seconds": self.wall_seconds,
        }


def run_anchor(
    bench: Bench, counter: ServerCounter, mode: str, writers: int, appends: int, rows: int
) -> Anchor:
    """pylance plain ``s3://`` on the legacy store: how many acknowledged appends survive."""
    uri = bench.s3_uri(unique_name("plain"))
    options = bench.options
    lance.write_dataset(batch("setup", 0, rows), uri, storage_options=options)
    tasks = [
        WriterTask("pylance-s3", uri, options, f"plain-{i}", appends, rows) for i in range(writers)
    ]
    appends_done, wall, _, _, _ = race(mode, tasks, counter)
    acked = {(a.writer, a.seq) for a in appends_done if a.ok}
    _, present, _ = inspect_table(uri, options)
    ds = lance.dataset(uri, storage_options=options)
    return Anchor(
        writers,
        appends,
        acknowledged=len(acked),
        present=sum(1 for key in acked if present.get(key)),
        errors=sorted({a.error for a in appends_done if not a.ok}),
        versions=ds.version,
        wall_seconds=wall,
    )


# ------------------------------------------------------------------------ report


def report(runs: Sequence[Run], anchors: Sequence[Anchor]) -> str:
    out: list[str] = []
    if runs:
        rows = []
        for r in runs:
            lat = r.latencies_ms()
            client = r.client_retries()
            rows.append(
                [
                    r.system,
                    str(r.writers),
                    f"{len(r.committed)}/{len(r.appends)}",
                    fmt(r.wall_seconds, 2),
                    fmt(len(r.committed) / r.wall_seconds),
                    fmt(percentile(lat, 50)),
                    fmt(percentile(lat, 99)),
                    fmt(r.retries_per_commit(), 2),
                    fmt(max(client)) if client else "-",
                    fmt(r.requests / max(1, len(r.committed))),
                    fmt(1000 * r.cpu_per_commit()),
                    fmt(1000 * r.server_cpu_per_commit()),
                    fmt(statistics.fmean(r.claimants), 2) if r.claimants else "-",
                    fmt(max(r.claimants)) if r.claimants else "-",
                    "yes" if r.linear() else "NO",
                    "yes" if r.complete() else "NO",
                ]
            )
        out += [
            f"### Concurrent writers through s3+ddb:// on a legacy S3 ({runs[0].workload})",
            "",
            markdown_table(
                [
                    "system",
                    "writers",
                    "committed",
                    "wall s",
                    "commits/s",
                    "p50 ms",
                    "p99 ms",
                    "retries/commit",
                    "max retries",
                    "requests/commit",
                    "CPU ms/commit",
                    "server CPU ms/commit",
                    "claimants/round",
                    "max claimants",
                    "versions 1..n, no gap",
                    "all rows, once",
                ],
                rows,
            ),
            "",
        ]
        split = [
            [
                r.system,
                str(r.writers),
                fmt(percentile(r.latencies_ms(), 50)),
                fmt(percentile([a.data_seconds * 1000 for a in r.committed if a.data_seconds], 50)),
                fmt(
                    percentile(
                        [
                            (a.seconds - a.data_seconds) * 1000
                            for a in r.committed
                            if a.data_seconds is not None
                        ],
                        50,
                    )
                ),
                fmt(statistics.fmean(r.client_retries()), 2) if r.client_retries() else "-",
            ]
            for r in runs
            if r.system.startswith("lancetx")
        ]
        if split:
            out += [
                "lancetx appends split into pylance's data-file write and lancetx's commit "
                "(retries from `Committed.attempts`):",
                "",
                markdown_table(
                    [
                        "system",
                        "writers",
                        "p50 append ms",
                        "p50 data files ms",
                        "p50 commit ms",
                        "retries/commit",
                    ],
                    split,
                ),
                "",
            ]
        ops = [
            op
            for op in operations_in(*(r.operations for r in runs))
            if any(r.operations[op] for r in runs)
        ]
        per_op = [
            [
                r.system,
                str(r.writers),
                *(fmt(r.operations[op] / max(1, len(r.committed))) for op in ops),
                fmt(r.requests / max(1, len(r.committed))),
            ]
            for r in runs
        ]
        out += [
            "Requests per committed append, by operation (server side, all clients):",
            "",
            markdown_table(["system", "writers", *ops, "total"], per_op),
            "",
        ]
        ratios = []
        for lx in (r for r in runs if r.system == "lancetx"):
            py = next((r for r in runs if r.system == "pylance" and r.writers == lx.writers), None)
            if py is None or not lx.committed or not py.committed:
                continue
            ratios.append(
                [
                    str(lx.writers),
                    fmt(
                        (len(lx.committed) / lx.wall_seconds)
                        / (len(py.committed) / py.wall_seconds),
                        2,
                    ),
                    fmt(percentile(lx.latencies_ms(), 99) / percentile(py.latencies_ms(), 99), 2),
                    fmt((lx.requests / len(lx.committed)) / (py.requests / len(py.committed)), 2),
                    fmt(lx.cpu_per_commit() / py.cpu_per_commit(), 2),
                    f"{len(lx.failed)} / {len(py.failed)}",
                ]
            )
        if ratios:
            out += [
                "lancetx / pylance in the same run:",
                "",
                markdown_table(
                    [
                        "writers",
                        "commits/s",
                        "p99",
                        "requests/commit",
                        "CPU/commit",
                        "failed lancetx / pylance",
                    ],
                    ratios,
                ),
                "",
            ]
        errors = sorted(
            {f"{r.system}/{r.writers}: {e}" for r in runs for e in {a.error for a in r.failed}}
        )
        if errors:
            out += ["Failed appends:", "", *(f"* {e}" for e in errors), ""]
    if anchors:
        rows = [
            [
                f"{a.writers} x {a.appends_per_writer}",
                str(a.acknowledged),
                str(a.present),
                str(a.lost),
                fmt(100 * a.lost / a.acknowledged if a.acknowledged else float("nan"), 0) + "%",
                str(len(a.errors)),
                str(a.versions),
            ]
            for a in anchors
        ]
        out += [
            "### Anchor: pylance plain s3:// on the same legacy S3 (If-None-Match ignored)",
            "",
            markdown_table(
                [
                    "writers x appends",
                    "acknowledged",
                    "present",
                    "lost",
                    "lost %",
                    "distinct errors",
                    "latest version",
                ],
                rows,
            ),
            "",
        ]
        errors = sorted({e for a in anchors for e in a.errors})
        if errors:
            out += ["Errors seen by plain s3:// writers:", "", *(f"* {e}" for e in errors), ""]
    return "\n".join(out)


def paired_summary(runs: Sequence[Run], loads: Sequence[tuple[float, float, float]]) -> str:
    """Per paired run: lancetx / pylance commits/s at each writer count, and each
    system's contended / one-writer commits/s; then the medians over the runs."""
    repeats = sorted({r.repeat for r in runs})
    writers = sorted({r.writers for r in runs})
    by = {(r.repeat, r.system, r.writers): r for r in runs}
    rows: list[list[str]] = []
    ratios: dict[int, list[float]] = {}
    scaled: dict[tuple[str, int], list[float]] = {}
    for rep in repeats:
        for n in writers:
            lx, py = by.get((rep, "lancetx", n)), by.get((rep, "pylance", n))
            ratio = (
                lx.commits_per_second / py.commits_per_second
                if lx is not None and py is not None and py.commits_per_second
                else float("nan")
            )
            ratios.setdefault(n, []).append(ratio)
            cells = []
            for system, run in (("lancetx", lx), ("pylance", py)):
                one = by.get((rep, system, 1))
                share = (
                    run.commits_per_second / one.commits_per_second
                    if run is not None and one is not None and one.commits_per_second
                    else float("nan")
                )
                scaled.setdefault((system, n), []).append(share)
                cells += [
                    fmt(run.commits_per_second) if run is not None else "-",
                    f"{len(run.failed)}" if run is not None else "-",
                    fmt(share, 2),
                ]
            rows.append([str(rep + 1), str(n), *cells, fmt(ratio, 2)])
    load = " / ".join(f"{a:.1f}" for a, _, _ in loads)
    out = [
        f"Paired runs (load average at each run's start: {load}):",
        "",
        markdown_table(
            [
                "run",
                "writers",
                "lancetx commits/s",
                "lancetx failed",
                "lancetx / its 1 writer",
                "pylance commits/s",
                "pylance failed",
                "pylance / its 1 writer",
                "lancetx / pylance",
            ],
            rows,
        ),
        "",
        "Medians over the runs:",
        "",
        markdown_table(
            ["writers", "lancetx / pylance", "lancetx / its 1 writer", "pylance / its 1 writer"],
            [
                [
                    str(n),
                    fmt(statistics.median(ratios[n]), 2),
                    fmt(statistics.median(scaled[("lancetx", n)]), 2),
                    fmt(statistics.median(scaled[("pylance", n)]), 2),
                ]
                for n in writers
            ],
        ),
        "",
    ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Concurrent appends through s3+ddb:// on a legacy S3 (embedded moto): "
        "lancetx vs pylance, plus pylance plain s3:// as the data-loss anchor.",
        epilog="Relative numbers on an in-process emulator, not AWS.",
    )
    parser.add_argument(
        "--writers",
        default="1,4,8,16,32",
        help="comma-separated writer counts (default 1,4,8,16,32)",
    )
    parser.add_argument(
        "--appends", type=int, default=10, help="operations per writer (default 10)"
    )
    parser.add_argument(
        "--workload",
        choices=("appends", "mixed"),
        default="appends",
        help="appends only, or every third operation a delete of the writer's previous append",
    )
    parser.add_argument("--rows", type=int, default=100, help="rows per append (default 100)")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)}",
    )
    parser.add_argument(
        "--plain-writers",
        type=int,
        default=8,
        help="pylance plain s3:// writers for the data-loss anchor (0 skips it; default 8)",
    )
    parser.add_argument(
        "--plain-appends", type=int, default=5, help="appends per plain s3:// writer (default 5)"
    )
    parser.add_argument(
        "--plain-trials", type=int, default=1, help="repetitions of the anchor (default 1)"
    )
    parser.add_argument(
        "--mode",
        choices=("processes", "threads"),
        default="processes",
        help="one process per writer (default: like independent writers; no GIL shared with "
        "the emulator) or one thread per writer in this process",
    )
    parser.add_argument(
        "--commit-only",
        action="store_true",
        help="write every data file during setup and time the commits only (appends workload)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="paired runs of the whole matrix, one after another (default 1); with more than "
        "one, the report ends with the median of the per-run ratios",
    )
    parser.add_argument(
        "--trace",
        metavar="DIR",
        help="record every request of the lancetx writers (one JSON per writer and run under "
        "DIR) and report where the time between two writers' claims goes",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.commit_only and args.workload != "appends":
        parser.error("--commit-only times prepared appends: use it with --workload appends")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(
            f"unknown systems {', '.join(sorted(unknown))}; choose from {', '.join(SYSTEMS)}"
        )
    try:
        writer_counts = [int(n) for n in args.writers.split(",") if n]
    except ValueError:
        parser.error(f"--writers {args.writers!r} is not a comma-separated list of integers")
    if not writer_counts or min(writer_counts) < 1 or args.appends < 1 or args.rows < 1:
        parser.error("--writers, --appends and --rows must be at least 1")

    runs: list[Run] = []
    anchors: list[Anchor] = []
    loads: list[tuple[float, float, float]] = []
    with Stopwatch() as total, EmbeddedAws(legacy_s3=True) as aws:
        bench = start_bench(aws)
        with counting(aws) as counter:
            for repeat in range(args.repeats):
                loads.append(os.getloadavg())
                # Systems side by side per writer count: adjacent in time, so a change
                # in the machine's load hits both.
                for writers in writer_counts:
                    for system in systems:
                        folder = None
                        if args.trace and system.startswith("lancetx"):
                            folder = os.path.join(args.trace, f"{system}-{writers}w-{repeat + 1}")
                            os.makedirs(folder, exist_ok=True)
                        run = run_one(
                            bench,
                            counter,
                            args.mode,
                            system,
                            writers,
                            args.appends,
                            args.rows,
                            args.workload,
                            args.commit_only,
                            folder,
                        )
                        run.repeat = repeat
                        runs.append(run)
                        if folder is not None:
                            print(f"{system}, {writers} writers, run {repeat + 1}:")
                            print(critical_sections(folder))
            for _ in range(args.plain_trials if args.plain_writers > 0 else 0):
                anchors.append(
                    run_anchor(
                        bench, counter, args.mode, args.plain_writers, args.plain_appends, args.rows
                    )
                )
    print(report(runs, anchors))
    if args.repeats > 1 or args.commit_only:
        print(paired_summary(runs, loads))
    print(
        f"({total.seconds:.1f} s; moto in-process on 127.0.0.1, S3 ignoring If-None-Match — "
        "relative numbers, not AWS)"
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "contention",
                "mode": args.mode,
                "workload": args.workload,
                "commit_only": args.commit_only,
                "repeats": args.repeats,
                "load_average": os.getloadavg(),
                "load_average_per_repeat": loads,
                "environment": environment(),
                "runs": [r.as_json() for r in runs],
                "plain_s3_anchor": [a.as_json() for a in anchors],
            },
        )
    broken = [r for r in runs if not (r.linear() and r.complete())]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
