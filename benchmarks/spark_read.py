"""Spark read throughput: the ``lancetx`` data source against Spark's own Parquet reader.

One local-mode session; one 10-column table (int64 x3, double x3, string x2, a
timestamp and a 128-d float32 embedding) written once, untimed, both as Lance
(``format("lancetx")``, ``vector_columns=emb:128``) and as Parquet, to local
paths. Then ``--repeat`` paired rounds, the order of the readers rotated each
round, each read materializing its columns into Spark's ``noop`` sink
(``df.write.format("noop")``: the whole scan runs, every column of every row
reaches the JVM as Spark's rows, nothing is written):

* ``parquet-full``      ``spark.read.parquet(p)`` — all 10 columns (the bar);
* ``lancetx-full``      ``spark.read.format("lancetx").load(t)`` — all 10 columns;
* ``parquet-2col``      ``spark.read.parquet(p).select("id", "score")``;
* ``lancetx-2col``      ``spark.read.format("lancetx").schema("id long, score
                        double").load(t)`` (the Python data source API's only
                        way to prune columns: a given schema, or ``columns``).

    .venv/bin/python benchmarks/spark_read.py                           # ~3 min on 2 cores
    .venv/bin/python benchmarks/spark_read.py --rows 2000000 --repeat 4 --json out.json
    .venv/bin/python benchmarks/spark_read.py --arrow-unchecked   # Arrow Java's checks off

Where a full scan's time goes (profiled for issue 23): Spark turns each row a Python
data source yields into its own row format reading the Arrow batch value by value,
through Arrow Java's accessors, which check bounds and validity on every read; for the
128-d embedding that is 128 checked reads per row, and it is most of the gap to
Parquet, whose reader fills Spark's own on-heap vectors. ``--arrow-unchecked`` starts
the JVM with Arrow's switches for those checks (a session setting, not the data
source's), to show what that hand-off costs.

Prints a markdown table and the per-round ratios (the ones that count on a shared
machine: both sides of a round ran back to back under about the same load), with
the load average before and after. No cache is shared between the sides: each
read opens its own files (the OS page cache holds both tables alike: each was
read once, untimed, before the rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

for _key, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ[_key] = _value
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

COLUMNS = 10
PROJECTION = ("id", "score")


#: Arrow Java's own switches for its per-value accessors (bounds and null checks on every
#: read of an Arrow buffer). Spark reads a Python data source's output through those
#: accessors, one call per value (128 per row for the embedding); Parquet's reader does not
#: use Arrow, so they change nothing on its side.
ARROW_UNCHECKED = "-Darrow.enable_unsafe_memory_access=true -Darrow.enable_null_check_for_get=false"


def _session(memory: str, arrow_batch: int | None, java_options: str | None = None) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("lancetx-spark-read-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", memory)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if arrow_batch is not None:
        builder = builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch))
    if java_options:
        # local mode: the driver JVM is the executor; read when pyspark launches it.
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _frame(spark: Any, rows: int, partitions: int) -> Any:
    """The 10 columns (the write benchmark's five, widened)."""
    return spark.range(0, rows, 1, partitions).selectExpr(
        "id",
        "id % 1000 AS bucket",
        "id * 7 AS seq",
        "rand(1) AS score",
        "rand(3) * 100 AS price",
        "cast(id AS double) / 3 AS ratio",
        "concat('user-', cast(id % 100000 AS string)) AS name",
        "concat('tag-', cast(id % 97 AS string)) AS tag",
        "timestamp_seconds(1700000000 + id) AS ts",
        "transform(sequence(1, 128), i -> cast(rand(2) AS float)) AS emb",
    )


def _rounds(runs: int, readers: dict[str, Callable[[], None]]) -> dict[str, list[float]]:
    """Time every reader once per round, rotating the order each round."""
    names = list(readers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(runs):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            readers[name]()
            times[name].append(time.perf_counter() - started)
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names)
            + f"; load {_load()}",
            flush=True,
        )
    return times


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; prints a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4, help="of the written tables")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory", default="3g", help="spark.driver.memory")
    parser.add_argument(
        "--arrow-batch", type=int, help="spark.sql.execution.arrow.maxRecordsPerBatch"
    )
    parser.add_argument("--batch-size", type=int, help="the lancetx read option batch_size")
    parser.add_argument(
        "--arrow-unchecked",
        action="store_true",
        help=f"start the JVM with Arrow's unchecked accessors ({ARROW_UNCHECKED})",
    )
    parser.add_argument("--json", help="also write the raw timings here")
    args = parser.parse_args(argv)

    spark = _session(
        args.memory, args.arrow_batch, ARROW_UNCHECKED if args.arrow_unchecked else None
    )
    scratch = tempfile.mkdtemp(prefix="lancetx-read-bench-")
    parquet = os.path.join(scratch, "p.parquet")
    table = os.path.join(scratch, "t.lance")
    load_before = _load()
    try:
        df = _frame(spark, args.rows, args.partitions)
        assert len(df.columns) == COLUMNS
        df.write.mode("overwrite").parquet(parquet)
        df.write.format("lancetx").mode("overwrite").option("vector_columns", "emb:128").save(table)

        def lancetx() -> Any:
            reader = spark.read.format("lancetx")
            if args.batch_size:
                reader = reader.option("batch_size", str(args.batch_size))
            return reader

        schema = "id long, score double"
        readers: dict[str, Callable[[], None]] = {
            "parquet-full": lambda: (
                spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()
            ),
            "lancetx-full": lambda: (
                lancetx().load(table).write.format("noop").mode("overwrite").save()
            ),
            "parquet-2col": lambda: (
                spark.read.parquet(parquet)
                .select(*PROJECTION)
                .write.format("noop")
                .mode("overwrite")
                .save()
            ),
            "lancetx-2col": lambda: (
                lancetx().schema(schema).load(table).write.format("noop").mode("overwrite").save()
            ),
        }
        # Same rows on both sides, and one untimed read each (JIT, Python workers, page cache).
        assert spark.read.parquet(parquet).count() == args.rows
        assert lancetx().load(table).count() == args.rows
        assert lancetx().load(table).columns == spark.read.parquet(parquet).columns
        for read in readers.values():
            read()
        partitions = {
            "lancetx-full": lancetx().load(table).rdd.getNumPartitions(),
            "lancetx-2col": lancetx().schema(schema).load(table).rdd.getNumPartitions(),
            "parquet-full": spark.read.parquet(parquet).rdd.getNumPartitions(),
        }
        results = _rounds(args.repeat, readers)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        spark.stop()
    load_after = _load()

    best = {name: min(times) for name, times in results.items()}
    print(
        f"\n{args.rows:,} rows, {COLUMNS} columns (int64 x3, double x3, string x2, timestamp, "
        f"128-d float32 embedding), {args.repeat} paired rounds; partitions {partitions}; "
        f"Python {platform.python_version()}; "
        f"JVM options {ARROW_UNCHECKED if args.arrow_unchecked else 'default'}; load average before {load_before}, "
        f"after {load_after}\n"
    )
    print("| reader | best s | median s | rows/s (median) |")
    print("|---|---:|---:|---:|")
    for name, times in results.items():
        median = statistics.median(times)
        print(f"| {name} | {best[name]:.2f} | {median:.2f} | {args.rows / median:,.0f} |")
    full = [p / t for p, t in zip(results["parquet-full"], results["lancetx-full"], strict=True)]
    projection = [
        f / p for f, p in zip(results["lancetx-full"], results["lancetx-2col"], strict=True)
    ]
    parquet_projection = [
        f / p for f, p in zip(results["parquet-full"], results["parquet-2col"], strict=True)
    ]
    print(
        f"\nper round, median (min-max): lancetx-full rows/s vs parquet-full {_spread(full)}; "
        f"lancetx-2col rows/s vs lancetx-full {_spread(projection)} "
        f"(parquet-2col vs parquet-full {_spread(parquet_projection)})"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "rows": args.rows,
                    "partitions": partitions,
                    "load_before": load_before,
                    "load_after": load_after,
                    "arrow_unchecked": args.arrow_unchecked,
                    "times": results,
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
