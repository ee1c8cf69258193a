"""The Table API against pylance, verb by verb: time and requests, on one server, in one run.

Each system gets its own ``s3+ddb://`` table on one embedded moto server, created
with the same rows. Then every verb runs ``--repeats`` times on a table the writer
*holds* (lancetx: a ``Table``; pylance: a ``LanceDataset`` it keeps, as a pylance
user would), one at a time, interleaved (lancetx, pylance, lancetx, …) so both see
the same server state. Requests are counted on the server.

Verbs: ``append`` (100 rows), ``delete`` (one row by predicate), ``update`` (10 rows,
an SQL expression), ``merge_insert`` (upsert of 10 rows: 5 matched, 5 new).

Run: ``python benchmarks/table_verbs.py [--repeats 15] [--json out.json]``; about 40 s.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()

    with EmbeddedAws() as aws:
        bench = start_bench(aws)
        lx_uri, pl_uri = (
            bench.ddb_uri(unique_name("lancetx")),
            bench.ddb_uri(unique_name("pylance")),
        )
        lx = lancetx.write_table(lx_uri, rows(0, ROWS), storage_options=bench.options)
        ds_box = [lance.write_dataset(rows(0, ROWS), pl_uri, storage_options=bench.options)]
        results: dict[str, dict[str, dict[str, list[float]]]] = {}
        for verb, (lx_call, pl_call) in verbs_of(lx, ds_box).items():
            per = results.setdefault(
                verb, {"lancetx": {"s": [], "req": []}, "pylance": {"s": [], "req": []}}
            )
            for i in range(args.repeats):
                for system, call in (("lancetx", lx_call), ("pylance", pl_call)):
                    with counting(aws) as counter, Stopwatch() as sw:
                        call(i)
                    per[system]["s"].append(sw.seconds)
                    per[system]["req"].append(len(counter.take()))
        table = []
        for verb, per in results.items():
            lx_ms = statistics.median(per["lancetx"]["s"]) * 1000
            pl_ms = statistics.median(per["pylance"]["s"]) * 1000
            table.append(
                [
                    verb,
                    fmt(lx_ms),
                    fmt(pl_ms),
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
                    "ratio",
                    "lancetx requests",
                    "pylance requests",
                ],
                table,
            )
        )
        if args.json:
            write_json(
                args.json,
                {"environment": environment(), "repeats": args.repeats, "results": results},
            )


if __name__ == "__main__":
    main()
