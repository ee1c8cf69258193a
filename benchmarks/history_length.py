"""Uncontended append latency and requests as the history grows: lancetx vs pylance.

One embedded moto server (S3 + DynamoDB over HTTP), one ``s3+ddb://`` table per
system, created by pylance with one batch. Each system then appends 100-row
batches one at a time, as a writer that keeps what it committed (lancetx: the last
``Committed`` as the next parent, ``lancetx_append`` from the demo; pylance: the
dataset it holds, ``ds.insert``). When the table reaches each history length in
``--lengths`` (versions), ``--samples`` appends are measured: latency and every
request the server sees (pylance's data-file PUT included). The slope is the least
squares fit of the median latency over the history length, in ms per 100 versions:
≈ 0 means a commit does not cost more as the table ages.

Run: ``python benchmarks/history_length.py [--lengths 10,100,300] [--samples 10]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
from _harness import (
    Request,
    ServerCounter,
    Stopwatch,
    by_operation,
    counting,
    environment,
    fmt,
    markdown_table,
    start_bench,
    unique_name,
    write_json,
)

from lancetx.commit.engine.committer import Committed
from lancetx.demo.embedded import EmbeddedAws
from lancetx.demo.race import batch, lancetx_append
from lancetx.externalstore.connect import connect

SYSTEMS: tuple[str, ...] = ("lancetx", "pylance-ddb")


@dataclass
class Point:
    """The measured appends of one system at one history length."""

    system: str
    length: int
    seconds: list[float] = field(default_factory=list)
    runs: list[list[Request]] = field(default_factory=list)

    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1000

    def requests(self, select: Callable[[Request], bool] = lambda r: True) -> float:
        return statistics.fmean(sum(1 for r in run if select(r)) for run in self.runs)

    def as_json(self) -> dict[str, Any]:
        ops: dict[str, float] = {}
        for run in self.runs:
            for op, n in by_operation(run).items():
                ops[op] = ops.get(op, 0.0) + n / len(self.runs)
        return {
            "system": self.system,
            "history_length": self.length,
            "median_ms": self.median_ms(),
            "seconds": self.seconds,
            "mean_requests": self.requests(),
            "mean_by_operation": ops,
        }


def slope_per_100(points: Sequence[Point]) -> float:
    """Least-squares slope of the median latency over the history length (ms/100 versions)."""
    xs = [float(p.length) for p in points]
    ys = [p.median_ms() for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


class Writer:
    """One system's table and its held state."""

    def __init__(self, system: str, uri: str, options: dict[str, str]) -> None:
        self.system = system
        self.seq = 0
        lance.write_dataset(self._data(), uri, storage_options=options)
        self.version = 1
        if system == "lancetx":
            self.conn = connect(uri, options)
            self.held: Committed | None = lancetx_append(self.conn, self._data(), None)
            self.version = self.held.version
        else:
            self.ds = lance.dataset(uri, storage_options=options)

    def _data(self) -> Any:
        self.seq += 1
        return batch(self.system, self.seq, 100)

    def append(self) -> None:
        if self.system == "lancetx":
            self.held = lancetx_append(self.conn, self._data(), self.held)
            self.version = self.held.version
        else:
            self.ds.insert(self._data())
            self.version = self.ds.version


def run(systems: Sequence[str], lengths: Sequence[int], samples: int) -> list[Point]:
    points: list[Point] = []
    with EmbeddedAws() as aws:
        bench = start_bench(aws)
        writers = [Writer(s, bench.ddb_uri(unique_name(s)), bench.options) for s in systems]
        with counting(aws) as counter:
            for length in lengths:
                # Grow every table to the length first (uncounted), then measure them
                # one after the other, so machine load drifts hit both alike.
                for writer in writers:
                    while writer.version < length:
                        writer.append()
                for writer in writers:
                    points.append(measure(writer, length, samples, counter))
    return points


def measure(writer: Writer, length: int, samples: int, counter: ServerCounter) -> Point:
    point = Point(writer.system, length)
    for _ in range(samples):
        counter.take()
        with Stopwatch() as watch:
            writer.append()
        point.runs.append(counter.take())
        point.seconds.append(watch.seconds)
    return point


def report(points: Sequence[Point], systems: Sequence[str]) -> str:
    rows = [
        [
            p.system,
            str(p.length),
            fmt(p.median_ms()),
            fmt(p.requests()),
            fmt(p.requests(lambda r: r.operation == "ListObjectsV2")),
            fmt(p.requests(lambda r: r.operation == "HeadObject")),
            fmt(p.requests(lambda r: r.operation == "GetObject")),
        ]
        for p in points
    ]
    out = [
        "### Sequential uncontended appends (writer holds its last version)",
        "",
        markdown_table(
            ["system", "history (versions)", "median ms", "requests", "LIST", "HEAD", "GET"], rows
        ),
        "",
    ]
    by_system = {s: [p for p in points if p.system == s] for s in systems}
    summary = [
        [s, fmt(slope_per_100(pts), 2), fmt(pts[-1].median_ms()), fmt(pts[-1].requests())]
        for s, pts in by_system.items()
        if pts
    ]
    longest = max(p.length for p in points)
    out += [
        markdown_table(
            ["system", "slope ms / 100 versions", f"median ms at {longest}", "requests"], summary
        ),
        "",
    ]
    if all(by_system.get(s) for s in SYSTEMS):
        ours, theirs = by_system["lancetx"][-1], by_system["pylance-ddb"][-1]
        out.append(
            f"At {longest} versions lancetx / pylance: time "
            f"{ours.median_ms() / theirs.median_ms():.2f}, requests "
            f"{fmt(ours.requests())} / {fmt(theirs.requests())}."
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Append latency and requests vs history length: lancetx vs pylance.",
        epilog="Relative numbers on an in-process emulator, not AWS.",
    )
    parser.add_argument("--lengths", default="10,100,300", help="history lengths (versions)")
    parser.add_argument("--samples", type=int, default=10, help="appends measured per length")
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="subset of lancetx,pylance-ddb"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    lengths = sorted(int(x) for x in args.lengths.split(",") if x)
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - set(SYSTEMS) or not systems:
        parser.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    if not lengths or lengths[0] < 2 or args.samples < 1:
        parser.error("--lengths must be at least 2 versions and --samples at least 1")
    with Stopwatch() as total:
        points = run(systems, lengths, args.samples)
    print(report(points, systems))
    print(f"({total.seconds:.1f} s; moto in-process on 127.0.0.1 — relative numbers, not AWS)")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "history_length",
                "environment": environment(),
                "points": [p.as_json() for p in points],
                "slope_ms_per_100_versions": {
                    s: slope_per_100([p for p in points if p.system == s]) for s in systems
                },
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
