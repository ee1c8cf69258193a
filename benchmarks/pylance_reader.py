"""lancetx writers beside a polling pylance reader: does the reader cost them their queue?

A pylance reader that opens an ``s3+ddb://`` table finalizes the newest version
if it is still staged, and rewrites its DynamoDB item with a full PutItem that
keeps only Lance's attributes. Before lancetx recognised its own versions in
such items, it took them for versions of a writer outside its commit queue
(pylance) and stopped queueing for 10 s each time, and the waiters never saw
the tickets those versions served.

One embedded legacy-S3 + DynamoDB server serves both runs of one invocation:

* ``without reader`` — N lancetx writer processes x K appends (each keeps its
  last ``Committed`` as the next parent), released together;
* ``with reader``    — the same on a fresh table, while one more process opens
  the table with pylance (``lance.dataset(uri)``) every ``--poll`` seconds.

Per run: the slowest and p50/p99 append, attempts (max, mean), failures (by
error type: ``RetriesExhaustedError`` is the one that matters), how often the
writers' processes marked the table as written by an outsider (which turns the
queue off), how many versions the reader saw, and whether every acknowledged
append is present exactly once (pylance's count). The ratio of the slowest
appends (with / without) is the figure the acceptance asks for (<= 2).

Run: ``python benchmarks/pylance_reader.py [--writers 4] [--appends 40]
[--poll 0.05] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import boto3
import lance
from _harness import Bench, environment, fmt, markdown_table, percentile, start_bench, write_json

from lancetx.commit.engine import contention
from lancetx.commit.engine.committer import Committed
from lancetx.demo.embedded import EmbeddedAws
from lancetx.demo.race import batch, lancetx_append
from lancetx.externalstore.connect import connect

#: Seconds any party waits at a start barrier before the run is declared broken.
BARRIER_TIMEOUT = 180.0


@dataclass
class Append:
    writer: str
    seq: int
    seconds: float
    ok: bool
    error: str = ""
    attempts: int = 0


@dataclass
class Run:
    label: str
    writers: int
    appends_per_writer: int
    wall_seconds: float = 0.0
    appends: list[Append] = field(default_factory=list)
    outsider_marks: int = 0
    queue_stalls: int = 0
    stripped_items: int = 0
    stall_details: list[str] = field(default_factory=list)
    reader_opens: int = 0
    reader_errors: list[str] = field(default_factory=list)
    versions_seen_by_reader: int = 0
    complete: bool = False

    @property
    def committed(self) -> list[Append]:
        return [a for a in self.appends if a.ok]

    def seconds(self) -> list[float]:
        return [a.seconds for a in self.committed]

    def errors(self) -> Counter[str]:
        return Counter(a.error.split(":", 1)[0] for a in self.appends if not a.ok)

    def as_json(self) -> dict[str, Any]:
        secs = self.seconds()
        attempts = [a.attempts for a in self.committed]
        return {
            "label": self.label,
            "writers": self.writers,
            "appends_per_writer": self.appends_per_writer,
            "wall_seconds": self.wall_seconds,
            "committed": len(self.committed),
            "failed": len(self.appends) - len(self.committed),
            "errors": dict(self.errors()),
            "max_seconds": max(secs) if secs else None,
            "p50_seconds": percentile(secs, 50),
            "p99_seconds": percentile(secs, 99),
            "max_attempts": max(attempts) if attempts else None,
            "mean_attempts": statistics.fmean(attempts) if attempts else None,
            "outsider_marks": self.outsider_marks,
            "queue_stalls": self.queue_stalls,
            "stripped_items": self.stripped_items,
            "stall_details": self.stall_details,
            "reader_opens": self.reader_opens,
            "reader_errors": self.reader_errors,
            "versions_seen_by_reader": self.versions_seen_by_reader,
            "all_rows_once": self.complete,
            "appends": [asdict(a) for a in self.appends],
        }


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:160]}"


class _StallCounter(logging.Handler):
    """Counts the commit loop's "the queue stood still, going ahead anyway" messages:
    a waiter that never saw the ticket before its own served."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.details: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("commit queue of") and "goes ahead" in record.msg:
            self.count += 1
            self.details.append(record.getMessage())


def writer_main(
    uri: str, options: dict[str, str], name: str, appends: int, ready: Any, go: Any, out: Any
) -> None:
    """One lancetx writer process: append ``appends`` batches, report each."""
    marks = [0]
    original = contention.TableContention.outsider

    def counted(self: contention.TableContention, now: float) -> None:
        marks[0] += 1
        original(self, now)

    contention.TableContention.outsider = counted  # type: ignore[method-assign]
    stalls = _StallCounter()
    engine_log = logging.getLogger("lancetx.commit.engine.committer")
    engine_log.addHandler(stalls)
    engine_log.setLevel(logging.DEBUG)
    conn = connect(uri, options)
    parent: Committed | None = None
    ready.wait(BARRIER_TIMEOUT)
    go.wait(BARRIER_TIMEOUT)
    results: list[dict[str, Any]] = []
    for seq in range(appends):
        started = time.perf_counter()
        try:
            parent = lancetx_append(conn, batch(name, seq, 10), parent)
        except Exception as exc:  # a failed append is a result
            results.append(
                asdict(Append(name, seq, time.perf_counter() - started, False, _short(exc)))
            )
            parent = None
            continue
        results.append(
            asdict(Append(name, seq, time.perf_counter() - started, True, attempts=parent.attempts))
        )
    out.put((results, marks[0], stalls.count, stalls.details))


def reader_main(uri: str, options: dict[str, str], poll: float, stop: Any, out: Any) -> None:
    """A pylance reader opening the table every ``poll`` seconds until ``stop``."""
    opens, errors, newest = 0, [], 0
    while not stop.is_set():
        try:
            ds = lance.dataset(uri, storage_options=options)
            newest = max(newest, ds.version)
            opens += 1
        except Exception as exc:
            errors.append(_short(exc))
        time.sleep(poll)
    out.put((opens, errors[:5], newest))


def run_one(bench: Bench, label: str, writers: int, appends: int, poll: float | None) -> Run:
    uri = bench.ddb_uri(
        f"reader-{label.replace(' ', '-')}-{time.time_ns()}", bench.fresh_ddb_table()
    )
    options = bench.options
    lance.write_dataset(batch("setup", 0, 10), uri, storage_options=options)
    ctx = multiprocessing.get_context("spawn")
    ready, go, out = ctx.Barrier(writers + 1), ctx.Barrier(writers + 1), ctx.Queue()
    procs = [
        ctx.Process(target=writer_main, args=(uri, options, f"w{i}", appends, ready, go, out))
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    stop, reader_out = ctx.Event(), ctx.Queue()
    reader = None
    ready.wait(BARRIER_TIMEOUT)
    if poll is not None:
        reader = ctx.Process(target=reader_main, args=(uri, options, poll, stop, reader_out))
        reader.start()
        time.sleep(1.0)  # the reader is polling before the writers start
    go.wait(BARRIER_TIMEOUT)
    started = time.perf_counter()
    run = Run(label, writers, appends)
    for _ in procs:
        results, marks, stalls, details = out.get(timeout=BARRIER_TIMEOUT * 5)
        run.stall_details += details
        run.appends += [Append(**r) for r in results]
        run.outsider_marks += marks
        run.queue_stalls += stalls
    run.wall_seconds = time.perf_counter() - started
    for p in procs:
        p.join()
    if reader is not None:
        stop.set()
        run.reader_opens, run.reader_errors, run.versions_seen_by_reader = reader_out.get(
            timeout=BARRIER_TIMEOUT
        )
        reader.join()
    run.stripped_items = _stripped_items(bench, uri)
    ds = lance.dataset(uri, storage_options=options)
    table = ds.to_table(columns=["writer", "seq"])
    present = Counter(
        zip(table.column("writer").to_pylist(), table.column("seq").to_pylist(), strict=True)
    )
    wanted = {(a.writer, a.seq) for a in run.committed}
    run.complete = all(present[k] == 10 for k in wanted) and set(present) - {("setup", 0)} == wanted
    return run


def _stripped_items(bench: Bench, uri: str) -> int:
    """Items of the run's table left without lancetx's attributes (a pylance reader's
    finalization that nobody could undo)."""
    ddb_table = uri.rsplit("ddbTableName=", 1)[-1]
    base = uri.split("://", 1)[1].split("/", 1)[1].split("?", 1)[0]
    client = boto3.client("dynamodb", **bench.aws.client_kwargs("dynamodb"))
    pages = client.get_paginator("query").paginate(
        TableName=ddb_table,
        KeyConditionExpression="base_uri = :b",
        ExpressionAttributeValues={":b": {"S": base}},
        ConsistentRead=True,
    )
    items = [i for page in pages for i in page["Items"]]
    return sum(1 for i in items if int(i["version"]["N"]) > 1 and "txn_uuid" not in i)


def report(runs: Sequence[Run]) -> str:
    rows = []
    for r in runs:
        secs = r.seconds()
        attempts = [a.attempts for a in r.committed]
        rows.append(
            [
                r.label,
                f"{len(r.committed)}/{len(r.appends)}",
                fmt(r.wall_seconds, 1),
                fmt(max(secs), 2) if secs else "-",
                fmt(percentile(secs, 50), 2),
                fmt(percentile(secs, 99), 2),
                fmt(max(attempts)) if attempts else "-",
                fmt(statistics.fmean(attempts), 2) if attempts else "-",
                ", ".join(f"{k} x{v}" for k, v in r.errors().items()) or "-",
                str(r.outsider_marks),
                str(r.queue_stalls),
                str(r.stripped_items),
                str(r.reader_opens) if r.reader_opens else "-",
                "yes" if r.complete else "NO",
            ]
        )
    table = markdown_table(
        [
            "run",
            "committed",
            "wall s",
            "slowest s",
            "p50 s",
            "p99 s",
            "max attempts",
            "mean attempts",
            "errors",
            "outsider marks",
            "queue stalls",
            "items left stripped",
            "reader opens",
            "all rows once",
        ],
        rows,
    )
    base, other = runs[0].seconds(), runs[-1].seconds()
    ratio = max(other) / max(base) if base and other else float("nan")
    return f"{table}\n\nslowest append with reader / without: {ratio:.2f}\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--appends", type=int, default=40)
    parser.add_argument("--poll", type=float, default=0.05, help="reader's poll interval (s)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    with EmbeddedAws(legacy_s3=True) as aws:
        bench = start_bench(aws)
        runs = [
            run_one(bench, "without reader", args.writers, args.appends, None),
            run_one(bench, "with reader", args.writers, args.appends, args.poll),
        ]
    print(report(runs))
    if args.json:
        write_json(args.json, {"environment": environment(), "runs": [r.as_json() for r in runs]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
