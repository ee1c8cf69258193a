"""The runnable examples and the ``make demo`` job, on the shared session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_helpers import example


def test_the_batch_and_time_travel_examples(spark: Any, tmp_path: Path) -> None:
    batch_job, time_travel = example("batch_job"), example("time_travel")
    uri = str(tmp_path / "events.lance")
    first = batch_job.run(spark, uri, rows=30, tag="monday")
    second = batch_job.run(spark, uri, rows=20, tag="tuesday", first_id=100)
    assert (first, second) == (1, 2)
    assert time_travel.run(spark, uri, version=1) == {"monday": 30}
    assert time_travel.run(spark, uri) == {"monday": 30, "tuesday": 20}


def test_the_demo_checks_pass(spark: Any) -> None:
    from lancetx.demo import spark as demo

    assert demo.run(spark, append_jobs=2, rows=50, pylance_appends=1)
