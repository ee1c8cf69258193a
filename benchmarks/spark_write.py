"""Spark write throughput: the ``lancetx`` data source against Spark's own Parquet writer.

One local-mode session, one cached DataFrame (int64 id, int32, double, string,
128-d float embedding), every sink written once per round (``--repeat`` rounds, order rotated):

* ``parquet-local``   Spark's native Parquet writer to a local path (the bar);
* ``lancetx-local``   this data source to a local path (one commit per job);
* ``null-python``     a Python data source that only receives the Arrow batches
                      and drops them: the floor of any Python writer;
* ``lancetx-s3+ddb``  this data source to the embedded moto S3 (legacy) with
                      the commit through DynamoDB.

    .venv/bin/python benchmarks/spark_write.py               # ~2 min on 2 cores
    .venv/bin/python benchmarks/spark_write.py --rows 2000000 --json out.json

Prints a markdown table of rows/s and ratios. moto serves S3 from this process
(one request at a time, ~65 MB/s here): its row says nothing about S3's speed.
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
import uuid
from collections.abc import Callable, Iterator, Sequence
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

from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceArrowWriter,
    WriterCommitMessage,
)


class NullWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """Receives every Arrow batch and drops it."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages: list[Any]) -> None:
        pass


class NullSource(DataSource):  # type: ignore[misc]
    """``format("null_python")``: pickled by value (this is ``__main__``), so workers need no install."""

    @classmethod
    def name(cls) -> str:
        return "null_python"

    def writer(self, schema: Any, overwrite: bool) -> NullWriter:
        return NullWriter()


def _session(memory: str) -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("lancetx-spark-write-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", memory)
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NullSource)
    return spark


def _frame(spark: Any, rows: int, partitions: int) -> Any:
    return spark.range(0, rows, 1, partitions).selectExpr(
        "id",
        "cast(id % 1000 AS int) AS bucket",
        "rand(1) AS score",
        "concat('user-', cast(id % 100000 AS string)) AS name",
        "transform(sequence(1, 128), i -> cast(rand(2) AS float)) AS emb",
    )


def _rounds(
    runs: int, sinks: dict[str, tuple[Callable[[], None], Callable[[], None]]]
) -> dict[str, list[float]]:
    """Time every sink once per round, rotating the order each round.

    The machine is shared: load comes and goes within a minute. Running the
    sinks back to back inside each round (instead of all runs of one sink, then
    the next) exposes them to the same load, so per-round ratios are fair.
    """
    names = list(sinks)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(runs):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            prepare, write = sinks[name]
            prepare()
            started = time.perf_counter()
            write()
            times[name].append(time.perf_counter() - started)
    return times


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; prints a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory", default="3g", help="spark.driver.memory")
    parser.add_argument(
        "--skip-s3", action="store_true", help="leave out the moto S3 + DynamoDB run"
    )
    parser.add_argument("--json", help="also write the raw timings here")
    args = parser.parse_args(argv)

    import boto3

    from lancetx.demo.embedded import EmbeddedAws
    from lancetx.externalstore.dynamodb.store import create_table

    spark = _session(args.memory)
    df = _frame(spark, args.rows, args.partitions).cache()
    df.count()  # materialize: every sink below reads the same cached rows
    scratch = tempfile.mkdtemp(prefix="lancetx-bench-")
    results: dict[str, list[float]] = {}

    def clean(path: str) -> Callable[[], None]:
        return lambda: shutil.rmtree(path, ignore_errors=True)

    try:
        parquet = os.path.join(scratch, "p.parquet")
        lance_path = os.path.join(scratch, "t.lance")
        # One untimed round each: JVM and Python-worker warm-up.
        df.limit(1000).write.mode("overwrite").parquet(parquet)
        df.limit(1000).write.format("lancetx").mode("overwrite").option(
            "vector_columns", "emb:128"
        ).save(lance_path)
        df.limit(1000).write.format("null_python").mode("append").save()
        sinks: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
            "parquet-local": (
                clean(parquet),
                lambda: df.write.mode("overwrite").parquet(parquet),
            ),
            "lancetx-local": (
                clean(lance_path),
                lambda: (
                    df.write.format("lancetx")
                    .mode("append")
                    .option("vector_columns", "emb:128")
                    .save(lance_path)
                ),
            ),
            "null-python": (
                lambda: None,
                lambda: df.write.format("null_python").mode("append").save(),
            ),
        }
        results.update(_rounds(args.repeat, sinks))
        if not args.skip_s3:
            with EmbeddedAws(legacy_s3=True) as aws:
                s3 = boto3.client("s3", **aws.client_kwargs())
                table = f"bench_{uuid.uuid4().hex[:8]}"
                create_table(boto3.client("dynamodb", **aws.client_kwargs()), table)
                options = {f"storage.{k}": v for k, v in aws.pylance_storage_options().items()}
                uris: list[str] = []

                s3.create_bucket(Bucket="bench")

                def fresh() -> None:
                    # A new path per run: DynamoDB keys tables by their path in the bucket.
                    uris.append(
                        f"s3+ddb://bench/t-{uuid.uuid4().hex[:8]}.lance?ddbTableName={table}"
                    )

                results.update(
                    _rounds(
                        args.repeat,
                        {
                            "lancetx-s3+ddb": (
                                fresh,
                                lambda: (
                                    df.write.format("lancetx")
                                    .mode("append")
                                    .options(**options)
                                    .option("vector_columns", "emb:128")
                                    .save(uris[-1])
                                ),
                            )
                        },
                    )
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        spark.stop()

    best = {name: min(times) for name, times in results.items()}
    parquet_best = best["parquet-local"]
    null_best = best["null-python"]
    print(
        f"\n{args.rows:,} rows (id, int, double, string, 128-d float32 embedding), "
        f"{args.partitions} partitions, {args.repeat} rounds; Python {platform.python_version()}\n"
    )
    print("| sink | best s | median s | rows/s (best) | rows/s vs Parquet | time vs null writer |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, times in results.items():
        print(
            f"| {name} | {best[name]:.2f} | {statistics.median(times):.2f} | "
            f"{args.rows / best[name]:,.0f} | {parquet_best / best[name]:.2f} | "
            f"{best[name] / null_best:.2f} |"
        )
    # Ratios within each round (same load), then their median and range.
    lance_times = results["lancetx-local"]
    vs_parquet = [p / t for p, t in zip(results["parquet-local"], lance_times, strict=True)]
    vs_null = [t / n for t, n in zip(lance_times, results["null-python"], strict=True)]
    print(
        f"\nper round, median (min-max): lancetx-local rows/s vs Parquet {_spread(vs_parquet)}; "
        f"time vs null writer {_spread(vs_null)}"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"rows": args.rows, "partitions": args.partitions, "times": results}, out, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
