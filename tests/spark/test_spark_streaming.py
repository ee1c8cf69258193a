"""Structured Streaming into the ``lancetx`` sink: exactly once across restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark_helpers import example, lance_ids

from pyspark_lancetx import table_history


def _drop(source: Path, n: int) -> None:
    lines = [json.dumps({"id": 10 * n + i, "name": f"file{n}"}) for i in range(5)]
    (source / f"part-{n}.json").write_text("\n".join(lines) + "\n")


def test_a_replayed_micro_batch_is_not_committed_twice(spark: Any, tmp_path: Path) -> None:
    streaming_job = example("streaming_job")
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    uri = str(tmp_path / "stream.lance")
    for n in range(3):
        _drop(source, n)
    streaming_job.run(spark, str(source), uri, str(checkpoint))
    assert lance_ids(uri) == list(range(0, 5)) + list(range(10, 15)) + list(range(20, 25))
    history = table_history(uri)
    assert [h.properties["lancetx.spark.batch_id"] for h in history] == ["0", "1", "2"]
    query_id = history[0].properties["lancetx.spark.stream_id"]

    # The query "dies" after the sink committed batch 2 but before the checkpoint
    # recorded it: on restart Spark runs batch 2 again.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    _drop(source, 3)
    streaming_job.run(spark, str(source), uri, str(checkpoint))

    assert (checkpoint / "commits" / "2").exists()
    expected = [i for n in range(4) for i in range(10 * n, 10 * n + 5)]
    assert lance_ids(uri) == expected  # batch 2's rows once, batch 3's rows once
    history = table_history(uri)
    assert [h.properties["lancetx.spark.batch_id"] for h in history] == ["0", "1", "2", "3"]
    assert {h.properties["lancetx.spark.stream_id"] for h in history} == {query_id}
