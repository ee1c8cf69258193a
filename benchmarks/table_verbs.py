"""The Table API against pylance, verb by verb: time and requests, on one server, in one run.

Each system gets its own ``s3+ddb://`` table on one embedded moto server, created
with the same rows. Then every verb runs ``--repeats`` times on a table the writer
*holds* (lancetx: a ``Table``; pylance: a ``LanceDataset`` it keeps, as a pylance
user would), one at a time, interleaved (lancetx, pylance, lancetx, …) so both see
the same server state. Requests are counted on the server. Ratios are paired: the
median over the repeats of lancetx's time / pylance's time in the same repeat (the
ratio of the medians is shown too); the load average at start and end is printed
(the server runs in this process, so the time of each call includes the server's
work for it, as it does for pylance).

Verbs: ``append`` (100 rows), ``delete`` (one row by predicate), ``update`` (10 rows,
an SQL expression), ``merge_insert`` (upsert of 10 rows: 5 matched, 5 new).

``--server process`` runs the server in a process of its own instead (it still
counts the requests, and reports its CPU per call): in this process, moto's Python
shares one interpreter lock with lancetx's Python client, while pylance's Rust client
runs beside it, so the in-process figure charges lancetx for the server's work in a
way a remote service does not; the two modes side by side show how much. The CPU
columns are this process's ``time.process_time`` over each call (all threads,
pylance's Rust ones included; with the server in this process, its work too).

Run: ``python benchmarks/table_verbs.py [--repeats 15] [--verbs append,delete]
[--server inprocess|process] [--json out.json]``; about 40 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import lance
import pyarrow as pa
from _harness import (
    EmbeddedAws,
    Stopwatch,
    counting,
    environment,
    fmt,
    markdown_table,
    start_bench,
    unique_name,
    write_json,
)

import lancetx

ROWS = 1000
SYSTEMS = ("lancetx", "pylance")


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "v": pa.array([1.0] * n)})


def verbs_of(lx: lancetx.Table, ds_box: list[Any]) -> dict[str, tuple[Callable[[int], Any], ...]]:
    """Per verb: (lancetx call, pylance call), each taking the repetition number."""

    def pl_merge(i: int) -> None:
        src = rows(ROWS + 1000 * i - 5, 10)
        ds_box[0].merge_insert(
            "id"
        ).when_matched_update_all().when_not_matched_insert_all().execute(src)

    return {
        "append": (
            lambda i: lx.append(rows(10_000 + 100 * i, 100)),
            lambda i: ds_box[0].insert(rows(10_000 + 100 * i, 100)),
        ),
        "delete": (
            lambda i: lx.delete(f"id = {i}"),
            lambda i: ds_box[0].delete(f"id = {i}"),
        ),
        "update": (
            lambda i: lx.update(
                {"v": "v + 1"}, where=f"id >= {100 + 10 * i} AND id < {110 + 10 * i}"
            ),
            lambda i: ds_box[0].update(
                {"v": "v + 1"}, where=f"id >= {100 + 10 * i} AND id < {110 + 10 * i}"
            ),
        ),
        "merge_insert": (
            lambda i: (
                lx.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(rows(ROWS + 1000 * i - 5, 10))
            ),
            pl_merge,
        ),
    }


def serve() -> None:
    """``--serve``: a server in this process; print its bucket, table and options, then
    answer each ``take`` line with the requests and the CPU seconds since the last."""
    with EmbeddedAws() as aws, counting(aws) as counter:
        bench = start_bench(aws)
        print(
            json.dumps(
                {"uris": [bench.ddb_uri(unique_name(s)) for s in SYSTEMS], "options": bench.options}
            ),
            flush=True,
        )
        cpu = time.process_time()
        for line in sys.stdin:
            if line.strip() != "take":
                break
            now = time.process_time()
            print(json.dumps({"requests": len(counter.take()), "cpu": now - cpu}), flush=True)
            cpu = now


class _Remote:
    """The parent's side of ``--serve``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.info = json.loads(self.proc.stdout.readline())

    def take(self) -> tuple[int, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("take\n")
        self.proc.stdin.flush()
        got = json.loads(self.proc.stdout.readline())
        return int(got["requests"]), float(got["cpu"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", help="also write the raw numbers to this file")
    parser.add_argument("--verbs", help="comma-separated verbs to run (default: all)")
    parser.add_argument("--server", choices=("inprocess", "process"), default="inprocess")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.server == "process":
        remote = _Remote()
        try:
            run(args, remote.info["uris"], remote.info["options"], remote.take)
        finally:
            remote.close()
        return
    with EmbeddedAws() as aws, counting(aws) as counter:
        bench = start_bench(aws)
        uris = [bench.ddb_uri(unique_name(s)) for s in SYSTEMS]
        run(args, uris, bench.options, lambda: (len(counter.take()), float("nan")))


def run(
    args: argparse.Namespace,
    uris: list[str],
    options: dict[str, str],
    take: Callable[[], tuple[int, float]],
) -> None:
    """Run the verbs on the two tables at ``uris``; ``take()``: (requests, server CPU
    seconds) since the last call."""
    load_start = os.getloadavg()
    lx_uri, pl_uri = uris
    lx = lancetx.write_table(lx_uri, rows(0, ROWS), storage_options=options)
    ds_box = [lance.write_dataset(rows(0, ROWS), pl_uri, storage_options=options)]
    results: dict[str, dict[str, Any]] = {}
    chosen = set(args.verbs.split(",")) if args.verbs else None
    for verb, (lx_call, pl_call) in verbs_of(lx, ds_box).items():
        if chosen is not None and verb not in chosen:
            continue
        per = results.setdefault(
            verb,
            {s: {"s": [], "req": [], "server_cpu": [], "cpu": []} for s in SYSTEMS},
        )
        for i in range(args.repeats):
            for system, call in (("lancetx", lx_call), ("pylance", pl_call)):
                take()
                cpu = time.process_time()
                with Stopwatch() as sw:
                    call(i)
                per[system]["cpu"].append(time.process_time() - cpu)
                requests, server_cpu = take()
                per[system]["s"].append(sw.seconds)
                per[system]["req"].append(requests)
                per[system]["server_cpu"].append(server_cpu)
    load_end = os.getloadavg()
    table = []
    for verb, per in results.items():
        lx_ms = statistics.median(per["lancetx"]["s"]) * 1000
        pl_ms = statistics.median(per["pylance"]["s"]) * 1000
        paired = statistics.median(
            a / b for a, b in zip(per["lancetx"]["s"], per["pylance"]["s"], strict=True)
        )
        per["paired_ratio"] = {"median": [paired]}
        table.append(
            [
                verb,
                fmt(lx_ms),
                fmt(pl_ms),
                fmt(paired, 2),
                fmt(lx_ms / pl_ms, 2),
                fmt(statistics.median(per["lancetx"]["req"]), 0),
                fmt(statistics.median(per["pylance"]["req"]), 0),
                fmt(statistics.median(per["lancetx"]["cpu"]) * 1000),
                fmt(statistics.median(per["pylance"]["cpu"]) * 1000),
                fmt(statistics.median(per["lancetx"]["server_cpu"]) * 1000),
                fmt(statistics.median(per["pylance"]["server_cpu"]) * 1000),
            ]
        )
    print(f"server: {args.server}\n")
    print(
        markdown_table(
            [
                "verb",
                "lancetx ms (median)",
                "pylance ms",
                "paired ratio",
                "ratio of medians",
                "lancetx requests",
                "pylance requests",
                "CPU ms lancetx",
                "CPU ms pylance",
                "server CPU ms lancetx",
                "server CPU ms pylance",
            ],
            table,
        )
    )
    print(
        "\nload average "
        + " ".join(f"{x:.2f}" for x in load_start)
        + " -> "
        + " ".join(f"{x:.2f}" for x in load_end)
    )
    if args.json:
        write_json(
            args.json,
            {
                "environment": environment(),
                "repeats": args.repeats,
                "server": args.server,
                "results": results,
                "load_average": {"start": load_start, "end": load_end},
            },
        )


if __name__ == "__main__":
    main()
