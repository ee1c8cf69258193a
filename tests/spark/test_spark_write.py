"""Batch writes through the ``lancetx`` data source: targets, one version per job,
history, task retries, schema checks."""

from __future__ import annotations

from typing import Any

import lance
import pytest
from spark_helpers import data_files, lance_ids, referenced_files, spark_options

from pyspark_lancetx import last_commit, table_history
from pyspark_lancetx.datasource import FAIL_FIRST_ATTEMPT_PROPERTY


def _target(kind: str, tmp_path: Any, ddb_uri: str, bucket: str) -> str:
    if kind == "s3+ddb":
        return ddb_uri
    if kind == "s3":
        return f"s3://{bucket}/plain.lance"
    return str(tmp_path / "local.lance")


@pytest.mark.parametrize("kind", ["s3+ddb", "s3", "local"])
def test_append_and_overwrite_commit_one_version_per_job(
    spark: Any, kind: str, tmp_path: Any, ddb_uri: str, bucket: str, storage: dict[str, str]
) -> None:
    uri = _target(kind, tmp_path, ddb_uri, bucket)
    opts = spark_options(storage) if kind != "local" else {}
    df = spark.range(0, 40, 1, 2).selectExpr("id", "cast(id as string) as s")

    def save(frame: Any, mode: str, job: str) -> None:
        frame.write.format("lancetx").mode(mode).options(**opts).option("job_id", job).option(
            "commit_message", f"{mode} by {job}"
        ).option("properties.team", "ingest").save(uri)

    save(df, "append", "first")
    save(df.selectExpr("id + 40 as id", "s"), "append", "second")
    assert lance_ids(uri, storage) == list(range(80))
    save(df.selectExpr("id + 100 as id", "s"), "overwrite", "third")
    assert lance_ids(uri, storage) == list(range(100, 140))

    history = table_history(uri, storage)
    assert [(h.version, h.operation, h.job_id) for h in history] == [
        (1, "overwrite", "first"),
        (2, "append", "second"),
        (3, "overwrite", "third"),
    ]
    assert history[1].properties["__lance_commit_message"] == "append by second"
    assert history[1].properties["team"] == "ingest"
    assert history[1].rows == 80
    assert last_commit(uri, "second", storage) == 2
    assert last_commit(uri, None, storage) == 3
    assert last_commit(uri, "never-ran", storage) is None
    # pylance sees the same history and reads the old version too.
    ds = lance.dataset(uri, storage_options=storage if kind != "local" else None)
    assert [v["version"] for v in ds.versions()] == [1, 2, 3]
    assert ds.checkout_version(2).count_rows() == 80


def test_rerun_with_the_same_job_id_commits_once(spark: Any, tmp_path: Any) -> None:
    uri = str(tmp_path / "t.lance")
    df = spark.range(0, 10, 1, 2)
    for _ in range(2):
        df.write.format("lancetx").mode("append").option("job_id", "nightly-42").save(uri)
    assert lance_ids(uri) == list(range(10))
    assert [h.job_id for h in table_history(uri)] == ["nightly-42"]
    # The rerun's files were removed: only the committed version's files remain.
    assert data_files(uri) == referenced_files(uri)


def test_a_task_retried_after_failing_mid_stream_leaves_no_duplicates_and_no_orphans(
    spark: Any, tmp_path: Any
) -> None:
    uri = str(tmp_path / "t.lance")

    def fail_first_attempt(value: int) -> int:  # defined here: pickled by value for the workers
        from pyspark import TaskContext

        context = TaskContext.get()
        if value == 150 and context is not None and context.attemptNumber() == 0:
            raise RuntimeError("injected failure of the first attempt")
        return value

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        from pyspark.sql.functions import col, udf

        fail_once = udf(fail_first_attempt, "long")
        df = spark.range(0, 400, 1, 2).select(fail_once(col("id")).alias("id"))
        # Small files: the failing attempt finishes some before it fails.
        df.write.format("lancetx").mode("append").option("max_rows_per_file", "10").save(uri)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert lance_ids(uri) == list(range(400))
    assert data_files(uri) == referenced_files(uri)


def test_a_task_failing_after_its_files_are_written_removes_them(spark: Any, tmp_path: Any) -> None:
    """pylance had finished (and would never remove) the files: only the task can."""
    uri = str(tmp_path / "t.lance")
    context = spark.sparkContext
    context.setLocalProperty(FAIL_FIRST_ATTEMPT_PROPERTY, "true")
    try:
        spark.range(0, 400, 1, 2).write.format("lancetx").mode("append").option(
            "max_rows_per_file", "50"
        ).save(uri)
    finally:
        context.setLocalProperty(FAIL_FIRST_ATTEMPT_PROPERTY, None)
    assert lance_ids(uri) == list(range(400))
    # Each of the 2 tasks wrote 4 files twice (the failed attempt and the retry).
    assert len(referenced_files(uri)) == 8
    assert data_files(uri) == referenced_files(uri)


def test_append_with_a_different_type_names_the_column(spark: Any, tmp_path: Any) -> None:
    uri = str(tmp_path / "t.lance")
    spark.range(0, 4, 1, 1).selectExpr("id", "'a' as name").write.format("lancetx").mode(
        "append"
    ).save(uri)
    bad = spark.range(0, 4, 1, 1).selectExpr("id", "1.5 as name")
    with pytest.raises(Exception, match=r"SparkSchemaError.*column 'name'.*decimal.*string"):
        bad.write.format("lancetx").mode("append").save(uri)
    extra = spark.range(0, 4, 1, 1).selectExpr("id", "'b' as name", "id * 2 as extra")
    with pytest.raises(Exception, match=r"column 'extra'.*merge_schema"):
        extra.write.format("lancetx").mode("append").save(uri)
    extra.write.format("lancetx").mode("append").option("mergeSchema", "true").save(uri)
    rows = lance.dataset(uri).to_table().to_pylist()
    pairs = sorted((r["id"], -1 if r["extra"] is None else r["extra"]) for r in rows)
    assert pairs == sorted([(i, -1) for i in range(4)] + [(i, i * 2) for i in range(4)])
    assert [h.operation for h in table_history(uri)] == ["overwrite", "merge"]


@pytest.mark.parametrize(
    ("expression", "column"),
    [
        ("interval 1 day as gap", "gap"),
        ("null as nothing", "nothing"),
        ("named_struct('inner', interval 2 months) as nested", "nested.inner"),
    ],
)
def test_unsupported_types_name_the_column(
    spark: Any, tmp_path: Any, expression: str, column: str
) -> None:
    uri = str(tmp_path / "t.lance")
    df = spark.range(0, 2, 1, 1).selectExpr("id", expression)
    with pytest.raises(Exception, match=rf"UnsupportedSparkTypeError.*column '{column}'"):
        df.write.format("lancetx").mode("append").save(uri)
    assert not (tmp_path / "t.lance").exists() or not lance_ids_exist(uri)


def lance_ids_exist(uri: str) -> bool:
    try:
        lance.dataset(uri)
    except (ValueError, OSError):
        return False
    return True
