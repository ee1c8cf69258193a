"""A Spark job with a job id after ``cleanup``: the removed versions' items stay (fences),
and the job's look-up of its id in history skips them instead of failing."""

from __future__ import annotations

from typing import Any

from spark_helpers import lance_ids, spark_options

from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table
from pyspark_lancetx import last_commit, table_history


def test_a_job_with_a_job_id_commits_once_after_a_cleanup(
    spark: Any, ddb_uri: str, storage: dict[str, str]
) -> None:
    opts = spark_options(storage)

    def save(start: int, job: str) -> None:
        frame = spark.range(start, start + 10, 1, 2)
        frame.write.format("lancetx").mode("append").options(**opts).option("job_id", job).save(
            ddb_uri
        )

    for n in range(3):
        save(10 * n, f"job-{n}")  # versions 1..3
    report = cleanup_versions(open_table(ddb_uri, storage), keep_versions=1)
    assert report.removed_versions == [1, 2] and report.items_kept_as_fence == [1, 2]

    save(100, "after")
    save(100, "after")  # a rerun: found in history, not committed again
    assert lance_ids(ddb_uri, storage) == [*range(30), *range(100, 110)]
    assert [(h.version, h.job_id) for h in table_history(ddb_uri, storage)] == [
        (3, "job-2"),
        (4, "after"),
    ]
    assert last_commit(ddb_uri, "after", storage) == 4
    assert last_commit(ddb_uri, "job-0", storage) is None
