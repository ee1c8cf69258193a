"""The driver-side commit without Spark: tasks' outputs → one transaction."""

from __future__ import annotations

import threading
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from spark_helpers import data_files, referenced_files

from pyspark_lancetx.commit import JobCommit, commit_job, table_history
from pyspark_lancetx.errors import SparkOptionError, SparkSchemaError
from pyspark_lancetx.options import ReadOptions, WriteOptions, parse_vector_columns
from pyspark_lancetx.write_task import TaskOutput, WritePlan, schema_to_ipc, write_task


def _job(uri: str, schema: pa.Schema, name: str, mode: str = "append") -> JobCommit:
    plan = WritePlan(uri=uri, data_uri=uri, storage_options={}, schema_ipc=schema_to_ipc(schema))
    return JobCommit(plan=plan, job_id=name, mode=mode, timeout=30)


def _task(job: JobCommit, table: pa.Table) -> TaskOutput:
    return write_task(iter(table.to_batches(max_chunksize=7)), job.plan)


def test_racing_creators_one_creates_the_others_append(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])
    jobs = [_job(uri, schema, f"creator-{n}") for n in range(3)]
    outputs = [
        _task(job, pa.table({"id": range(10 * n, 10 * n + 10), "s": ["x"] * 10}, schema=schema))
        for n, job in enumerate(jobs)
    ]
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def commit(n: int) -> None:
        barrier.wait()
        try:
            commit_job(jobs[n], [outputs[n]])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    history = table_history(uri)
    assert [h.operation for h in history] == ["overwrite", "append", "append"]
    assert sorted(h.job_id or "" for h in history) == ["creator-0", "creator-1", "creator-2"]
    assert sorted(lance.dataset(uri).to_table().column("id").to_pylist()) == list(range(30))


def test_columns_in_another_order_map_onto_the_table(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    first = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("info", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ]
    )
    job = _job(uri, first, "one")
    commit_job(job, [_task(job, pa.table({"id": [1], "info": [{"a": 1, "b": "x"}]}, schema=first))])
    swapped = pa.schema([first.field("info"), first.field("id")])
    job = _job(uri, swapped, "two")
    commit_job(
        job, [_task(job, pa.table({"info": [{"a": 2, "b": "y"}], "id": [2]}, schema=swapped))]
    )
    rows = sorted(lance.dataset(uri).to_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "info": {"a": 1, "b": "x"}}, {"id": 2, "info": {"a": 2, "b": "y"}}]


def test_a_creator_with_other_columns_fails_naming_them_and_removes_its_files(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    ints = pa.schema([pa.field("id", pa.int64())])
    job = _job(uri, ints, "ints")
    commit_job(job, [_task(job, pa.table({"id": [1, 2]}, schema=ints))])
    strings = pa.schema([pa.field("id", pa.string())])
    loser = _job(uri, strings, "strings")
    output = _task(loser, pa.table({"id": ["a"]}, schema=strings))
    with pytest.raises(SparkSchemaError, match=r"column 'id'.*string.*int64"):
        commit_job(loser, [output])
    assert data_files(uri) == referenced_files(uri)


def test_a_non_nullable_table_column_refuses_written_nulls(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table(
            {"id": pa.array([1], pa.int64())}, schema=pa.schema([pa.field("id", pa.int64(), False)])
        ),
        uri,
    )
    schema = pa.schema([pa.field("id", pa.int64())])
    job = _job(uri, schema, "nulls")
    with pytest.raises(SparkSchemaError, match=r"column 'id'.*non-nullable.*1 null"):
        commit_job(job, [_task(job, pa.table({"id": [None, 3]}, schema=schema))])
    job = _job(uri, schema, "no-nulls")
    commit_job(job, [_task(job, pa.table({"id": [2, 3]}, schema=schema))])
    assert lance.dataset(uri).count_rows() == 3


def test_options() -> None:
    options = WriteOptions.parse(
        {"path": "/t", "storage.aws_region": "eu", "properties.team": "x", "mergeSchema": "true"}
    )
    assert options.storage_options == {"aws_region": "eu"}
    assert options.properties == {"team": "x"} and options.merge_schema and not options.job_id_given
    assert parse_vector_columns("emb:128, img:4") == {"emb": 128, "img": 4}
    with pytest.raises(SparkOptionError, match="vector_columns"):
        parse_vector_columns("emb")
    with pytest.raises(SparkOptionError, match="nullable"):
        WriteOptions.parse({"path": "/t", "nullable": "maybe"})
    with pytest.raises(SparkOptionError, match="either version or timestamp"):
        ReadOptions.parse({"path": "/t", "version": "1", "timestamp": "2026-01-01"})
    assert ReadOptions.parse({"path": "/t", "columns": "a, b"}).columns == ("a", "b")
