"""Concurrent writers on one legacy-S3 table through DynamoDB: Spark jobs in threads of
one driver, a pylance writer, and separate Spark applications."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pyarrow as pa
import pytest
from protocol_helpers import pylance_append_landing
from spark_helpers import EXAMPLES, lance_ids, spark_options

from lancetx.demo.embedded import EmbeddedAws
from pyspark_lancetx import table_history


def _run_all(targets: list[Any]) -> None:
    errors: list[BaseException] = []

    def guarded(target: Any) -> None:
        try:
            target()
        except BaseException as exc:  # report every writer's failure
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_four_spark_jobs_and_a_pylance_writer_append_exactly_once(
    spark: Any, legacy_aws: EmbeddedAws, ddb_uri: str, storage: dict[str, str]
) -> None:
    uri = ddb_uri
    opts = spark_options(storage)
    spark.range(0, 10, 1, 1).write.format("lancetx").mode("append").options(**opts).save(uri)

    def spark_job(n: int) -> Any:
        def run() -> None:
            # A Python data source is looked up through the JVM's active session,
            # which is per thread.
            jvm = spark._jvm
            jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
            first = 1000 * (n + 1)
            spark.range(first, first + 50, 1, 2).write.format("lancetx").mode("append").options(
                **opts
            ).option("job_id", f"thread-{n}").save(uri)

        return run

    def pylance_writer() -> None:
        for k in range(3):
            data = pa.table({"id": pa.array(range(9000 + 10 * k, 9010 + 10 * k), pa.int64())})
            # Not bound by pylance's own commit budget (it runs out under load).
            pylance_append_landing(uri, storage, data)

    _run_all([spark_job(n) for n in range(4)] + [pylance_writer])

    expected = list(range(10))
    for n in range(4):
        expected += list(range(1000 * (n + 1), 1000 * (n + 1) + 50))
    expected += list(range(9000, 9030))
    assert lance_ids(uri, storage) == sorted(expected)
    history = table_history(uri, storage)
    assert [h.version for h in history] == list(range(1, 9))  # 1 + 4 jobs + 3 pylance appends
    assert sorted(h.job_id for h in history if h.job_id and h.job_id.startswith("thread")) == [
        f"thread-{n}" for n in range(4)
    ]


@pytest.mark.slow
@pytest.mark.long_only  # minutes of CPU: CI's long pass (LANCETX_TEST_PROFILE=long)
def test_two_spark_applications_append_exactly_once(
    legacy_aws: EmbeddedAws, ddb_uri: str, storage: dict[str, str]
) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    storage_args = [a for k, v in storage.items() for a in ("--storage", f"{k}={v}")]
    apps = [
        subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLES / "batch_job.py"),
                ddb_uri,
                "--rows",
                "100",
                "--first-id",
                str(1000 * n),
                "--tag",
                f"app-{n}",
                *storage_args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    for app in apps:
        out, err = app.communicate(timeout=400)
        assert app.returncode == 0, err[-3000:]
        assert "committed version" in out
    assert lance_ids(ddb_uri, storage) == sorted([*range(0, 100), *range(1000, 1100)])
    assert [h.version for h in table_history(ddb_uri, storage)] == [1, 2]
