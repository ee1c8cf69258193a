"""``make demo``: Spark jobs and a pylance writer sharing one table on legacy S3.

Starts an embedded moto server (S3 that silently ignores ``If-None-Match``, the
kind of store lancetx exists for, plus DynamoDB), a local-mode Spark session,
and then on one ``s3+ddb://`` table:

1. a Spark job creates the table;
2. at the same time: several Spark append jobs (threads of this driver), one
   Spark overwrite job, and a pylance writer appending through its own
   ``s3+ddb://`` commit handler — every version claimed in DynamoDB;
3. reads the table back with Spark and with pylance, prints the history
   (version, operation, job, rows) and checks it: versions 1..N with no gap,
   every job exactly once, and each version's row count equal to its parent's
   plus what it appended (or, for the overwrite, exactly what it wrote).

Run ``python -m lancetx.demo.spark --help`` for the knobs.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

PYLANCE_ROWS = 100


def _session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("lancetx-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _in_threads(work: Sequence[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # report every writer's failure, not just the first
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 when the history is linear and every row count adds up."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--append-jobs", type=int, default=4, help="concurrent Spark append jobs")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per Spark job")
    parser.add_argument("--pylance-appends", type=int, default=3, help="appends by pylance")
    args = parser.parse_args(argv)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ[key] = value  # fake credentials: nothing can reach real AWS
    started = time.perf_counter()
    spark = _session()
    try:
        ok = run(spark, args.append_jobs, args.rows, args.pylance_appends)
    finally:
        spark.stop()
    print(f"{'OK' if ok else 'FAILED'} in {time.perf_counter() - started:.0f}s")
    return 0 if ok else 1


def run(spark: Any, append_jobs: int, rows: int, pylance_appends: int) -> bool:
    """The demo on ``spark`` against a fresh embedded server; True when every check holds."""
    import boto3
    import lance
    import pyarrow as pa

    from lancetx.demo.embedded import EmbeddedAws
    from lancetx.externalstore.dynamodb.store import create_table
    from pyspark_lancetx.commit import ROWS_KEY, table_history

    with EmbeddedAws(legacy_s3=True) as aws:
        print(f"embedded S3 + DynamoDB (moto) at {aws.endpoint}; S3 ignores If-None-Match (legacy)")
        storage = aws.pylance_storage_options()
        boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket="lancetx-demo")
        create_table(boto3.client("dynamodb", **aws.client_kwargs()), "lancetx_demo_manifests")
        uri = "s3+ddb://lancetx-demo/events.lance?ddbTableName=lancetx_demo_manifests"
        print(f"table {uri}")
        context = spark.sparkContext
        print(f"Spark {spark.version} on {context.master}, {context.defaultParallelism} cores")
        options = {f"storage.{k}": v for k, v in storage.items()}

        def spark_job(name: str, mode: str, first_id: int) -> Callable[[], None]:
            def write() -> None:
                # Python data sources resolve through the JVM's active session, per thread.
                spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
                df = spark.range(first_id, first_id + rows, 1, 2).selectExpr(
                    "id", f"'{name}' AS writer", "rand() AS score"
                )
                df.write.format("lancetx").mode(mode).options(**options).option(
                    "job_id", name
                ).option("commit_message", f"{mode} by {name}").save(uri)

            def job() -> None:
                try:
                    write()
                except Exception as exc:
                    # An append planned before the overwrite landed cannot be applied on
                    # top of it (Lance's conflict rules); what a user does is run the job
                    # again: with the same job id it commits once, on the new table.
                    if "IncompatibleConflictError" not in str(exc):
                        raise
                    print(
                        f"{name}: refused, the overwrite replaced the table it had read; "
                        "running the job again (same job id)"
                    )
                    write()

            return job

        def pylance_writer() -> None:
            for k in range(pylance_appends):
                first = 10**9 + k * PYLANCE_ROWS
                data = pa.table(
                    {
                        "id": pa.array(range(first, first + PYLANCE_ROWS), pa.int64()),
                        "writer": pa.array(["pylance"] * PYLANCE_ROWS),
                        "score": pa.array([0.5] * PYLANCE_ROWS),
                    }
                )
                lance.write_dataset(data, uri, mode="append", storage_options=storage)

        spark_job("create", "append", 0)()
        work = [spark_job(f"append-{n}", "append", (n + 1) * 10**6) for n in range(append_jobs)]
        work.append(spark_job("overwrite", "overwrite", 10**8))
        work.append(pylance_writer)
        print(
            f"running {append_jobs} Spark append jobs, 1 Spark overwrite and 1 pylance writer "
            "at the same time"
        )
        errors = _in_threads(work)
        for exc in errors:
            print(f"writer failed: {type(exc).__name__}: {exc}", file=sys.stderr)

        history = table_history(uri, storage)
        print("\nversion  operation  job           rows")
        ok = not errors
        previous = 0
        for record in history:
            job = record.job_id or "(pylance)"
            added = int(record.properties.get(ROWS_KEY, PYLANCE_ROWS))
            expected = added if record.operation == "overwrite" else previous + added
            flag = "" if record.rows == expected else f"   <-- expected {expected}"
            ok = ok and not flag
            print(f"{record.version:>7}  {record.operation:<9}  {job:<12}  {record.rows:>6}{flag}")
            previous = record.rows

        versions = [r.version for r in history]
        jobs = [r.job_id for r in history if r.job_id]
        expected_jobs = ["create", "overwrite", *(f"append-{n}" for n in range(append_jobs))]
        linear = versions == list(range(1, len(versions) + 1))
        once = sorted(jobs) == sorted(expected_jobs)
        pylance_versions = sum(1 for r in history if r.job_id is None)
        spark_rows = spark.read.format("lancetx").options(**options).load(uri).count()
        lance_rows = lance.dataset(uri, storage_options=storage).count_rows()
        print(f"\nversions 1..{versions[-1]}: {'linear, no gap' if linear else versions}")
        print(
            f"every Spark job committed exactly once: {'yes' if once else jobs}; "
            f"pylance appends: {pylance_versions}/{pylance_appends}"
        )
        same = spark_rows == lance_rows == history[-1].rows
        print(
            f"rows: Spark reads {spark_rows}, pylance reads {lance_rows}: "
            f"{'agree' if same else 'DIFFER'}"
        )
        return ok and linear and once and same and pylance_versions == pylance_appends


if __name__ == "__main__":
    sys.exit(main())
