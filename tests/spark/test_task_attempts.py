"""Task attempts at the commit: one report per Spark partition is committed.

Spark's output commit coordinator lets one attempt of each partition report (the
cluster tests, ``tests/spark/cluster/``, run real speculative and killed attempts);
should two attempts' reports of one partition reach the commit anyway, the second's
rows must not be committed twice and its files, which no claim references, go.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import lance
import pyarrow as pa
from spark_helpers import data_files, referenced_files

from pyspark_lancetx.commit import JobCommit, commit_job
from pyspark_lancetx.write_task import TaskOutput, WritePlan, schema_to_ipc, write_task

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("attempt", pa.int32())])


def _job(uri: str) -> JobCommit:
    plan = WritePlan(uri=uri, data_uri=uri, storage_options={}, schema_ipc=schema_to_ipc(SCHEMA))
    return JobCommit(plan=plan, job_id="attempts", mode="append", timeout=30)


def _attempt(job: JobCommit, partition: int, attempt: int, ids: range) -> TaskOutput:
    data = pa.table({"id": list(ids), "attempt": [attempt] * len(ids)}, schema=SCHEMA)
    out = write_task(iter(data.to_batches()), job.plan)
    return replace(out, partition=partition, attempt=attempt)


def test_two_attempts_of_one_partition_commit_once_and_the_second_files_go(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    job = _job(uri)
    p0 = _attempt(job, 0, 0, range(0, 10))
    p1 = _attempt(job, 1, 0, range(10, 20))
    p0_again = _attempt(job, 0, 1, range(0, 10))  # a speculative copy of partition 0
    done = commit_job(job, [p0, p1, p0_again, p1])  # and partition 1's report twice
    assert done.version == 1
    table = lance.dataset(uri).to_table()
    assert table.num_rows == 20
    assert sorted(table.column("id").to_pylist()) == list(range(20))
    assert set(table.column("attempt").to_pylist()) == {0}  # the first report of each
    assert data_files(uri) == referenced_files(uri)  # the second attempt's files are gone


def test_reports_outside_a_spark_task_all_count(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    job = _job(uri)
    outs = [_attempt(job, 0, 0, range(i * 5, i * 5 + 5)) for i in range(3)]
    outs = [replace(out, partition=None, attempt=None) for out in outs]
    commit_job(job, outs)
    assert lance.dataset(uri).count_rows() == 15


def test_a_task_reports_its_spark_partition_and_attempt(tmp_path: Path) -> None:
    from pyspark import TaskContext

    job = _job(str(tmp_path / "t.lance"))
    # The running task's context, as a Python worker sets it up.
    TaskContext(partitionId=3, attemptNumber=2, localProperties={})
    try:
        out = write_task(
            iter(pa.table({"id": [1], "attempt": [2]}, schema=SCHEMA).to_batches()), job.plan
        )
    finally:
        TaskContext._setTaskContext(None)
    assert (out.partition, out.attempt) == (3, 2)
    outside = write_task(
        iter(pa.table({"id": [1], "attempt": [0]}, schema=SCHEMA).to_batches()), job.plan
    )
    assert (outside.partition, outside.attempt) == (None, None)
