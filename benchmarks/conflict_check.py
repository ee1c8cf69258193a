"""A writer K versions behind: the cost of checking its commit against K committed transactions.

One embedded moto server (legacy S3 + DynamoDB). A table with ``--fragments``
fragments (default 1,000) is created by pylance. Per round: the latest version
``v0`` is noted, another writer commits ``--behind`` appends (default 128) —
``--history lancetx`` (default): a lancetx writer, whose DynamoDB items carry
lancetx's summaries; ``--history pylance``: a pylance writer (``ds.insert`` on a
held dataset), whose items carry Lance's attributes only, so every version must
be read — and then a *fresh child process* per system commits one append
planned at ``v0``:

* ``lancetx`` — ``commit_transaction(handler, base, Append(read_version=v0))``
  (the latest version is resolved, the K transactions loaded and checked);
* ``pylance`` — ``LanceDataset.commit(uri, LanceOperation.Append(...), read_version=v0)``
  through pylance's ``s3+ddb://`` handler.

Each child prepares outside the measured window (connect, read ``v0``, write
its data files), then signals, and the commit alone is measured: wall time,
the child's CPU seconds (``time.process_time``: all its threads, pylance's Rust
ones included; the server runs in the parent, so its CPU is not counted), the
server's CPU seconds over the same window (the parent's ``time.process_time``: it
only serves meanwhile; the server answers one request at a time, so this is a floor
under the commit's wall time) and the requests the server saw. Rounds alternate which system commits first (the
second one is ``behind + 1`` versions behind). The ratios are paired: lancetx /
pylance within each round, then the median over the rounds; the load average
at start and end is printed with them.

Run: ``python benchmarks/conflict_check.py [--history lancetx|pylance] [--behind 128]
[--fragments 1000] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import lance
from _harness import (
    ServerCounter,
    by_operation,
    counting,
    environment,
    fmt,
    markdown_table,
    start_bench,
    unique_name,
    write_json,
)

from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws
from lancetx.demo.race import batch, lancetx_append
from lancetx.externalstore.connect import connect

SYSTEMS = ("lancetx", "pylance")


def child(system: str, uri: str, options: dict[str, str], read_version: int) -> int:
    """In a fresh process: prepare, say ``ready``, wait for ``go``, commit, print the result."""
    data = batch(f"{system}-child", read_version, 10)
    if system == "lancetx":
        conn = connect(uri, options)
        files = lance.fragment.write_fragments(data, conn.data_uri, storage_options=options)
        txn = Transaction(
            read_version=read_version,
            operation=Append(fragments=tuple(fragment_from_pylance(f) for f in files)),
        )
    else:
        ds = lance.dataset(uri, version=read_version, storage_options=options)
        files = lance.fragment.write_fragments(data, ds.uri, storage_options=options)
    print("ready", flush=True)
    sys.stdin.readline()
    cpu, wall = time.process_time(), time.perf_counter()
    if system == "lancetx":
        profile = os.environ.get("LANCETX_BENCH_PROFILE")
        if profile:
            import cProfile

            profiler = cProfile.Profile(time.process_time)
            done = profiler.runcall(commit_transaction, conn.handler, conn.base, txn)
            profiler.dump_stats(profile)
        else:
            done = commit_transaction(conn.handler, conn.base, txn)
        version = done.version
    else:
        committed = lance.LanceDataset.commit(
            uri,
            lance.LanceOperation.Append(files),
            read_version=read_version,
            storage_options=options,
        )
        version = int(committed.version)
    result = {
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "version": version,
    }
    print(json.dumps(result), flush=True)
    return 0


def measure(
    system: str, uri: str, options: dict[str, str], read_version: int, counter: ServerCounter
) -> dict[str, Any]:
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--child",
            system,
            "--child-uri",
            uri,
            "--child-options",
            json.dumps(options),
            "--child-read-version",
            str(read_version),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{system} child failed to prepare: {line!r}")
    counter.take()
    # The server runs in this process, which does nothing else meanwhile: its CPU
    # over the commit is what the server spent on that system's requests.
    server_cpu = time.process_time()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    result: dict[str, Any] = json.loads(proc.stdout.readline())
    result["server_cpu_seconds"] = time.process_time() - server_cpu
    seen = counter.take()
    proc.wait(timeout=60)
    result["requests"] = len(seen)
    result["operations"] = dict(by_operation(seen))
    result["system"] = system
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--behind", type=int, default=128, help="versions committed meanwhile")
    parser.add_argument("--fragments", type=int, default=1000, help="fragments in the table")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (alternating order)")
    parser.add_argument(
        "--history",
        choices=("lancetx", "pylance"),
        default="lancetx",
        help="who writes the versions in between (pylance: items without lancetx summaries)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--child-uri", help=argparse.SUPPRESS)
    parser.add_argument("--child-options", help=argparse.SUPPRESS)
    parser.add_argument("--child-read-version", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(
            args.child, args.child_uri, json.loads(args.child_options), args.child_read_version
        )

    results: list[dict[str, Any]] = []
    load_start = os.getloadavg()
    with EmbeddedAws(legacy_s3=True) as aws:
        bench = start_bench(aws)
        uri = bench.ddb_uri(unique_name("behind"))
        options = bench.options
        # One row per file: a manifest of ``--fragments`` fragments.
        rows = batch("setup", 0, args.fragments)
        lance.write_dataset(rows, uri, storage_options=options, max_rows_per_file=1)
        conn = connect(uri, options)
        with counting(aws) as counter:
            for round_ in range(args.rounds):
                parent = load_parent(conn.handler, conn.base)
                assert parent is not None
                v0 = parent.version
                held = parent
                if args.history == "pylance":
                    ds = lance.dataset(uri, storage_options=options)
                    for seq in range(args.behind):
                        ds.insert(batch("meanwhile", round_ * 10_000 + seq, 1))
                    held_parent = load_parent(conn.handler, conn.base)
                    assert held_parent is not None
                    held = held_parent
                    # The premise of this mode: pylance's items carry no lancetx summary.
                    assert held.location.summary is None, held.location
                else:
                    for seq in range(args.behind):
                        held = lancetx_append(
                            conn, batch("meanwhile", round_ * 10_000 + seq, 1), held
                        )
                order = SYSTEMS if round_ % 2 == 0 else tuple(reversed(SYSTEMS))
                for system in order:
                    result = measure(system, uri, options, v0, counter)
                    result["round"] = round_
                    result["fragments"] = len(held.manifest.manifest.fragments)
                    results.append(result)
                    print(
                        f"round {round_} {system}: {result['seconds'] * 1000:.0f} ms, "
                        f"CPU {result['cpu_seconds'] * 1000:.0f} ms, "
                        f"server CPU {result['server_cpu_seconds'] * 1000:.0f} ms, "
                        f"{result['requests']} requests",
                        file=sys.stderr,
                    )
    rows_out = []
    by_system = {s: [r for r in results if r["system"] == s] for s in SYSTEMS}
    for system, runs in by_system.items():
        ops: Counter[str] = Counter()
        for r in runs:
            ops.update(r["operations"])
        rows_out.append(
            [
                system,
                str(len(runs)),
                fmt(statistics.median(r["seconds"] for r in runs) * 1000),
                fmt(statistics.median(r["cpu_seconds"] for r in runs) * 1000),
                fmt(statistics.median(r["server_cpu_seconds"] for r in runs) * 1000),
                fmt(statistics.fmean(r["requests"] for r in runs)),
                ", ".join(f"{op} {n / len(runs):g}" for op, n in sorted(ops.items())),
            ]
        )
    load_end = os.getloadavg()
    # Paired: lancetx / pylance within each round (same table, same moment), then the median.
    pairs = [
        (lx, py)
        for round_ in range(args.rounds)
        for lx in results
        if lx["round"] == round_ and lx["system"] == "lancetx"
        for py in results
        if py["round"] == round_ and py["system"] == "pylance"
    ]
    ratio_t = statistics.median(lx["seconds"] / py["seconds"] for lx, py in pairs)
    ratio_c = statistics.median(lx["cpu_seconds"] / py["cpu_seconds"] for lx, py in pairs)
    ratio_s = statistics.median(
        lx["server_cpu_seconds"] / py["server_cpu_seconds"] for lx, py in pairs
    )
    print(
        f"### A commit {args.behind} versions behind a history {args.history} wrote, table of "
        f"{results[-1]['fragments']} fragments\n"
    )
    print(
        markdown_table(
            [
                "system",
                "rounds",
                "median ms",
                "median CPU ms",
                "server CPU ms",
                "requests",
                "by operation",
            ],
            rows_out,
        )
    )
    print(
        f"\nlancetx / pylance, median of {len(pairs)} paired rounds: time {ratio_t:.2f}x, "
        f"CPU {ratio_c:.2f}x, server CPU {ratio_s:.2f}x "
        f"(load average {' '.join(f'{x:.2f}' for x in load_start)} -> "
        f"{' '.join(f'{x:.2f}' for x in load_end)})"
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "conflict_check",
                "behind": args.behind,
                "history": args.history,
                "load_average": {"start": load_start, "end": load_end},
                "environment": environment(),
                "results": results,
                "ratio_time": ratio_t,
                "ratio_cpu": ratio_c,
                "ratio_server_cpu": ratio_s,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
