"""Requests per commit and per open: lancetx vs pylance, counted on the server.

One embedded moto server (S3 + DynamoDB over HTTP, conditional PUT honoured)
serves every system; each system gets its own table, created by pylance with
one batch. Then, per scenario and system, ``--repeats`` operations are run one
at a time and every request that reaches the server is classified (operation,
part of the table, sending client). lancetx's own requests are also counted on
its boto3 clients (botocore ``before-send``) and checked against the server.

Scenarios:

* ``append``       — an uncontended append by a writer that knows only the URI
  (lancetx: ``lancetx_append(conn, data, None)`` = load_parent + write data
  files with pylance + commit; pylance: ``lance.write_dataset(mode="append")``);
* ``append-held``  — an append by a writer that holds the previous version
  (lancetx: the last ``Committed`` as parent; pylance: ``ds.insert`` on a held
  dataset);
* ``refresh``      — move a held version to the latest, the table unchanged
  (lancetx: ``load_parent(held=…)`` on an existing connection, as ``Table.refresh``;
  pylance: ``ds.checkout_latest()`` on a held dataset);
* ``open``         — open the table from its URI in a warm process (lancetx:
  ``connect`` + ``load_parent``; pylance: ``lance.dataset``);
* ``open-cold``    — the same in a fresh Python process (no shared clients, no
  cached DescribeTable); the time is measured inside the child, imports excluded
  (the child also reports how long building lancetx's two boto3 clients took).

Systems: ``lancetx`` (``s3+ddb://``), ``pylance-ddb`` (pylance ``s3+ddb://``),
``pylance-s3`` (pylance plain ``s3://``, If-None-Match), and ``lancetx-s3``
(lancetx plain ``s3://``, If-None-Match).

Run: ``python benchmarks/commit_requests.py [--repeats 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
from _harness import (
    AREAS,
    Bench,
    BotocoreCounter,
    Request,
    ServerCounter,
    Stopwatch,
    area_is,
    by_operation,
    client_is,
    counting,
    environment,
    fmt,
    markdown_table,
    operations_in,
    start_bench,
    unique_name,
    write_json,
)

from lancetx.commit.engine.committer import Committed, Parent, load_parent
from lancetx.demo.embedded import EmbeddedAws
from lancetx.demo.race import batch, lancetx_append
from lancetx.externalstore.connect import TableConnection, connect

SYSTEMS: tuple[str, ...] = ("lancetx", "pylance-ddb", "pylance-s3", "lancetx-s3")
SCENARIOS: tuple[str, ...] = ("append", "append-held", "refresh", "open", "open-cold")
#: Which pylance system each lancetx system is compared with.
BASELINE: dict[str, str] = {"lancetx": "pylance-ddb", "lancetx-s3": "pylance-s3"}


@dataclass
class Measurement:
    """Requests and timings of ``repeats`` runs of one scenario on one system."""

    scenario: str
    system: str
    runs: list[list[Request]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    #: lancetx only: what its boto3 clients sent, per run (botocore events).
    client_side: list[Counter[str]] = field(default_factory=list)
    #: Cold opens: seconds the child's connect() took (lancetx: client building)
    #: and CPU seconds of the whole open.
    connect_seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)

    def mean(self, select: Callable[[Request], bool] = lambda r: True) -> float:
        return statistics.fmean(sum(1 for r in run if select(r)) for run in self.runs)

    def mean_ops(self) -> dict[str, float]:
        total: Counter[str] = Counter()
        for run in self.runs:
            total.update(by_operation(run))
        return {op: n / len(self.runs) for op, n in total.items()}

    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1000

    def client_check(self) -> str:
        """``ok`` when botocore's count equals the server's boto3 count in every run."""
        if not self.client_side:
            return "-"
        for run, sent in zip(self.runs, self.client_side, strict=True):
            server = by_operation([r for r in run if r.client == "boto3"])
            if +server != +sent:
                return f"MISMATCH server={dict(server)} botocore={dict(sent)}"
        return "ok"

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "system": self.system,
            "repeats": len(self.runs),
            "mean_requests": self.mean(),
            "mean_by_operation": self.mean_ops(),
            "mean_by_area": {a: self.mean(area_is(a)) for a in AREAS},
            "mean_by_client": {c: self.mean(client_is(c)) for c in ("boto3", "pylance")},
            "median_ms": self.median_ms(),
            "seconds": self.seconds,
            "client_side_check": self.client_check(),
            "connect_seconds": self.connect_seconds,
            "cpu_seconds": self.cpu_seconds,
        }


# ------------------------------------------------------------------------ systems


class System:
    """One way of writing/reading a table, with the scenario operations."""

    def __init__(self, name: str, bench: Bench) -> None:
        self.name = name
        self.bench = bench
        self.lancetx = name.startswith("lancetx")
        table = unique_name(name)
        self.uri = (
            bench.ddb_uri(table) if name in ("lancetx", "pylance-ddb") else bench.s3_uri(table)
        )
        self.options = bench.options
        self.seq = 0
        # Created by pylance, as a table normally would be; this also warms pylance's
        # per-process DescribeTable cache. lancetx's first read warms its own (the
        # table's checks ride along a connection's first request).
        lance.write_dataset(self._data(), self.uri, storage_options=self.options)
        self.conn: TableConnection | None = (
            connect(self.uri, self.options) if self.lancetx else None
        )
        if self.conn is not None:
            load_parent(self.conn.handler, self.conn.base)
        self.botocore = BotocoreCounter()
        if self.conn is not None:
            self.botocore.attach(self.conn.handler)
        self.held: Committed | lance.LanceDataset | None = None
        self.reader: lance.LanceDataset | None = None
        self.held_parent: Parent | None = None
        #: Set by actions whose duration is measured elsewhere (the cold-open child).
        self.reported_seconds: float | None = None
        #: Cold opens: how long the child's connect() (building the clients) took,
        #: and the CPU time of the whole open (less sensitive to machine load).
        self.connect_seconds: list[float] = []
        self.cpu_seconds: list[float] = []

    def _data(self) -> Any:
        self.seq += 1
        return batch(self.name, self.seq, 100)

    def append(self) -> None:
        if self.conn is not None:
            self.held = lancetx_append(self.conn, self._data(), None)
        else:
            lance.write_dataset(self._data(), self.uri, mode="append", storage_options=self.options)

    def prepare_held(self) -> None:
        """Hold the latest version (outside the counted window)."""
        if self.conn is not None:
            if not isinstance(self.held, Committed):
                self.held = lancetx_append(self.conn, self._data(), None)
        else:
            self.held = lance.dataset(self.uri, storage_options=self.options)

    def append_held(self) -> None:
        if self.conn is not None:
            assert isinstance(self.held, Committed)
            self.held = lancetx_append(self.conn, self._data(), self.held)
        else:
            assert isinstance(self.held, lance.LanceDataset)
            self.held.insert(self._data())

    def refresh(self) -> None:
        if self.conn is not None:
            latest = load_parent(self.conn.handler, self.conn.base, held=self.held_parent)
            if latest is None:
                raise RuntimeError(f"{self.uri}: no versions")
            self.held_parent = latest
        else:
            if self.reader is None:
                raise RuntimeError("prepare_reader() first")
            self.reader.checkout_latest()  # type: ignore[no-untyped-call]

    def prepare_reader(self) -> None:
        if self.conn is None:
            self.reader = lance.dataset(self.uri, storage_options=self.options)
        else:
            self.held_parent = load_parent(self.conn.handler, self.conn.base)

    def open(self) -> None:
        if self.lancetx:
            conn = connect(self.uri, self.options)
            self.botocore.attach(conn.handler)
            if load_parent(conn.handler, conn.base) is None:
                raise RuntimeError(f"{self.uri}: no versions")
        else:
            lance.dataset(self.uri, storage_options=self.options)

    def open_cold(self) -> None:
        """Open in a fresh process (see ``--child-open``)."""
        result = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child-open",
                self.name,
                "--child-uri",
                self.uri,
                "--child-options",
                json.dumps(self.options),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"cold open of {self.uri} failed:\n{result.stderr}")
        reported = json.loads(result.stdout)
        self.reported_seconds = float(reported["seconds"])
        self.connect_seconds.append(float(reported["connect_seconds"]))
        self.cpu_seconds.append(float(reported["cpu_seconds"]))


def child_open(system: str, uri: str, options: dict[str, str]) -> int:
    """Run in a fresh process: open the latest version once, print the time as JSON."""
    connecting = 0.0
    cpu = time.process_time()
    with Stopwatch() as watch:
        if system.startswith("lancetx"):
            with Stopwatch() as building:
                conn = connect(uri, options)  # builds the clients, sends nothing
            connecting = building.seconds
            if load_parent(conn.handler, conn.base) is None:
                return 1
        else:
            lance.dataset(uri, storage_options=options)
    cpu = time.process_time() - cpu  # every thread's: pylance's runtime, our checks
    print(json.dumps({"seconds": watch.seconds, "cpu_seconds": cpu, "connect_seconds": connecting}))
    return 0


# ------------------------------------------------------------------------ running


def measure(system: System, scenario: str, repeats: int, counter: ServerCounter) -> Measurement:
    result = Measurement(scenario, system.name)
    action: Callable[[], None] = {
        "append": system.append,
        "append-held": system.append_held,
        "refresh": system.refresh,
        "open": system.open,
        "open-cold": system.open_cold,
    }[scenario]
    if scenario == "append-held":
        system.prepare_held()
    if scenario == "refresh":
        system.prepare_reader()
    for _ in range(repeats):
        counter.take()
        system.botocore.take()
        system.reported_seconds = None
        with Stopwatch() as watch:
            action()
        result.runs.append(counter.take())
        seconds = system.reported_seconds
        result.seconds.append(watch.seconds if seconds is None else seconds)
        if system.lancetx and scenario != "open-cold":
            result.client_side.append(system.botocore.take())
    if scenario == "open-cold":
        result.connect_seconds = system.connect_seconds[-repeats:]
        result.cpu_seconds = system.cpu_seconds[-repeats:]
    return result


def run(
    systems: Sequence[str], scenarios: Sequence[str], repeats: int, cold_repeats: int
) -> list[Measurement]:
    results: list[Measurement] = []
    with EmbeddedAws() as aws:
        bench = start_bench(aws)
        prepared = [System(name, bench) for name in systems]
        with counting(aws) as counter:
            for scenario in scenarios:
                for system in prepared:
                    n = cold_repeats if scenario == "open-cold" else repeats
                    results.append(measure(system, scenario, n, counter))
    return results


# ------------------------------------------------------------------------ report


def report(results: Sequence[Measurement]) -> str:
    ops = operations_in(*(m.mean_ops() for m in results))
    ops = [op for op in ops if any(m.mean_ops().get(op) for m in results)]
    rows = [
        [
            m.scenario,
            m.system,
            *(fmt(m.mean_ops().get(op, 0.0)) for op in ops),
            fmt(m.mean()),
            fmt(m.mean(lambda r: r.conditional)),
            fmt(m.median_ms()),
        ]
        for m in results
    ]
    out = [
        "### Requests per operation (mean per run)",
        "",
        markdown_table(["scenario", "system", *ops, "total", "cond. writes", "median ms"], rows),
        "",
    ]

    index = {(m.scenario, m.system): m for m in results}
    ratio_rows: list[list[str]] = []
    for m in results:
        base = index.get((m.scenario, BASELINE.get(m.system, "")))
        if base is None:
            continue

        def ratio(
            select: Callable[[Request], bool], m: Measurement = m, b: Measurement = base
        ) -> str:
            ours, theirs = m.mean(select), b.mean(select)
            return f"{ours / theirs:.2f}" if theirs else ("-" if not ours else "∞")

        ratio_rows.append(
            [
                m.scenario,
                f"{m.system} / {base.system}",
                f"{fmt(m.mean())} / {fmt(base.mean())}",
                ratio(lambda r: True),
                ratio(lambda r: r.area != "data"),
                ratio(lambda r: r.area == "dynamodb"),
                ratio(lambda r: r.area not in ("dynamodb", "data")),
                f"{m.median_ms() / base.median_ms():.2f}",
            ]
        )
    if ratio_rows:
        out += [
            "### Ratio lancetx / pylance",
            "",
            markdown_table(
                [
                    "scenario",
                    "systems",
                    "requests",
                    "all",
                    "without data files",
                    "DynamoDB",
                    "S3 metadata",
                    "median time",
                ],
                ratio_rows,
            ),
            "",
        ]

    area_rows = [
        [
            m.scenario,
            m.system,
            *(fmt(m.mean(area_is(a))) for a in AREAS),
            fmt(m.mean(lambda r: r.client == "boto3")),
            fmt(m.mean(lambda r: r.client == "pylance")),
        ]
        for m in results
        if m.scenario.startswith("append")
    ]
    if area_rows:
        out += [
            "### Appends by part of the table and by sending client (mean per run)",
            "",
            markdown_table(
                ["scenario", "system", *AREAS, "sent by boto3 (lancetx)", "sent by pylance"],
                area_rows,
            ),
            "",
        ]
    cold = [m for m in results if m.scenario == "open-cold" and m.cpu_seconds]
    if cold:
        rows_cold = [
            [
                m.system,
                fmt(m.median_ms()),
                fmt(statistics.median(m.cpu_seconds) * 1000),
                fmt(statistics.median(m.connect_seconds) * 1000)
                if m.system.startswith("lancetx")
                else "-",
            ]
            for m in cold
        ]
        cpu = {m.system: statistics.median(m.cpu_seconds) for m in cold}
        ratios = [
            f"{ours} / {theirs}: CPU {cpu[ours] / cpu[theirs]:.2f}"
            for ours, theirs in BASELINE.items()
            if ours in cpu and theirs in cpu and cpu[theirs]
        ]
        out += [
            "### Fresh-process opens (median of the runs; time measured inside the child)",
            "",
            markdown_table(
                ["system", "wall ms", "CPU ms (all threads)", "of which connect() (clients) ms"],
                rows_cold,
            ),
            "",
            *([("CPU ratio " + "; ".join(ratios)), ""] if ratios else []),
        ]
    checks = [f"{m.scenario}/{m.system}: {m.client_check()}" for m in results if m.client_side]
    if checks:
        out += ["botocore before-send vs server (lancetx's own requests): " + "; ".join(checks), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Requests per append and per open: lancetx vs pylance on one embedded moto server.",
        epilog="Relative numbers on an in-process emulator, not AWS.",
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs per scenario (default 5)")
    parser.add_argument(
        "--cold-repeats", type=int, default=9, help="fresh-process opens per system (default 9)"
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)}",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)}",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--child-open", help=argparse.SUPPRESS)
    parser.add_argument("--child-uri", help=argparse.SUPPRESS)
    parser.add_argument("--child-options", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_open:
        return child_open(args.child_open, args.child_uri, json.loads(args.child_options))

    systems = [s for s in args.systems.split(",") if s]
    scenarios = [s for s in args.scenarios.split(",") if s]
    for name, allowed in ((systems, SYSTEMS), (scenarios, SCENARIOS)):
        unknown = set(name) - set(allowed)
        if unknown:
            parser.error(f"unknown: {', '.join(sorted(unknown))}; choose from {', '.join(allowed)}")
    if args.repeats < 1 or args.cold_repeats < 1:
        parser.error("--repeats and --cold-repeats must be at least 1")

    with Stopwatch() as total:
        results = run(systems, scenarios, args.repeats, args.cold_repeats)
    print(report(results))
    print(f"({total.seconds:.1f} s; moto in-process on 127.0.0.1 — relative numbers, not AWS)")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "commit_requests",
                "environment": environment(),
                "results": [m.as_json() for m in results],
            },
        )
    bad = [m for m in results if m.client_check() not in ("ok", "-")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
