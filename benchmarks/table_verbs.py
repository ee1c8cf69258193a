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

Run: ``python benchmarks/table_verbs.py [--repeats 15] [--verbs append,delete]
[--json out.json]``; about 40 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", help="also write the raw numbers to this file")
    parser.add_argument("--verbs", help="comma-separated verbs to run (default: all)")
    args = parser.parse_args()
    load_start = os.getloadavg()

    with EmbeddedAws() as aws:
        bench = start_bench(aws)
        lx_uri, pl_uri = (
            bench.ddb_uri(unique_name("lancetx")),
            bench.ddb_uri(unique_name("pylance")),
        )
        lx = lancetx.write_table(lx_uri, rows(0, ROWS), storage_options=bench.options)
        ds_box = [lance.write_dataset(rows(0, ROWS), pl_uri, storage_options=bench.options)]
        results: dict[str, dict[str, dict[str, list[float]]]] = {}
        chosen = set(args.verbs.split(",")) if args.verbs else None
        for verb, (lx_call, pl_call) in verbs_of(lx, ds_box).items():
            if chosen is not None and verb not in chosen:
                continue
            per = results.setdefault(
                verb, {"lancetx": {"s": [], "req": []}, "pylance": {"s": [], "req": []}}
            )
            for i in range(args.repeats):
                for system, call in (("lancetx", lx_call), ("pylance", pl_call)):
                    with counting(aws) as counter, Stopwatch() as sw:
                        call(i)
                    per[system]["s"].append(sw.seconds)
                    per[system]["req"].append(len(counter.take()))
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
                ]
            )
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
                    "results": results,
                    "load_average": {"start": load_start, "end": load_end},
                },
            )


if __name__ == "__main__":
    main()
