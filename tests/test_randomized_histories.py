"""Randomized whole-system histories (see ``history_harness``): writer processes
(lancetx sync and async, pylance), readers/finalizers, injected faults and kill -9,
each history checked by pylance alone. Zero anomalies allowed.

Profiles (environment variables):

* default (CI): 1,000 histories, seeds 0..999;
* ``LANCETX_HISTORIES=20000`` — the long profile (any count);
* ``LANCETX_HISTORY_START=N`` — first seed (default 0);
* ``LANCETX_HISTORY_SEEDS=5,17`` — replay exactly these seeds;
* ``LANCETX_HISTORY_WORKERS`` / ``LANCETX_HISTORY_PARALLEL`` — pool size / histories at once.

A failing seed prints the command that replays it.
"""

from __future__ import annotations

import os
import sys
import uuid

import boto3
import pytest
from history_harness import (
    Actor,
    Outcome,
    Schedule,
    _judge,
    harness,
    make_schedule,
    run_histories,
)
from protocol_helpers import ensure_ddb_table

from lancetx.externalstore.embedded import EmbeddedAws


def _seeds() -> list[int]:
    explicit = os.environ.get("LANCETX_HISTORY_SEEDS")
    if explicit:
        return [int(s) for s in explicit.split(",") if s.strip()]
    start = int(os.environ.get("LANCETX_HISTORY_START", "0"))
    count = int(os.environ.get("LANCETX_HISTORIES", "1000"))
    return list(range(start, start + count))


def replay_command(seeds: list[int]) -> str:
    listed = ",".join(str(s) for s in sorted(set(seeds)))
    return f"LANCETX_HISTORY_SEEDS={listed} .venv/bin/pytest tests/test_randomized_histories.py -q"


def test_schedules_are_a_function_of_the_seed() -> None:
    assert make_schedule(42) == make_schedule(42)
    assert len({make_schedule(s) for s in range(50)}) > 40
    kinds = {f.effect for s in range(500) for a in make_schedule(s).actors for f in a.faults}
    assert {"lost", "5xx", "throttle", "reset", "reset-landed", "kill", "kill-landed"} <= kinds
    roles = {a.role for s in range(100) for a in make_schedule(s).actors}
    assert roles == {"lancetx", "async", "pylance", "reader"}


@pytest.mark.timeout(3600)
def test_randomized_histories(
    aws: EmbeddedAws, capsys: pytest.CaptureFixture[str], ddb_table_name: str
) -> None:
    seeds = _seeds()
    bucket = f"histories-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket=bucket)
    ensure_ddb_table(aws.pylance_storage_options(), ddb_table_name)
    workers = int(os.environ.get("LANCETX_HISTORY_WORKERS", "8"))
    parallel = int(os.environ.get("LANCETX_HISTORY_PARALLEL", str(max(1, (workers + 1) // 3))))

    def progress(outcome: Outcome) -> None:
        if outcome.anomalies:
            with capsys.disabled():
                print(
                    f"\nseed {outcome.seed}: {outcome.anomalies}\n  schedule: {outcome.schedule}"
                    f"\n  replay: {replay_command([outcome.seed])}",
                    file=sys.stderr,
                )

    with harness(aws, bucket, ddb_table_name, workers) as (world, pool):
        summary = run_histories(world, pool, seeds, parallel, progress)
    with capsys.disabled():
        print(f"\n{summary.line()}", file=sys.stderr)
    failed = sorted({seed for seed, _ in summary.anomalies})
    assert summary.histories == len(seeds)
    assert not summary.anomalies, (
        f"{len(summary.anomalies)} anomalies in {len(failed)} histories, e.g. "
        f"{summary.anomalies[:5]}; replay: {replay_command(failed)}"
    )


def test_the_checker_flags_loss_duplicates_gaps_unopenable_versions_and_wedges() -> None:
    """The judge of a history can fail: each kind of anomaly it exists to catch."""
    schedule = Schedule(7, (Actor("w0", "lancetx", (0, 1, 2), ()),))
    broken = Outcome(7, schedule)
    checked = {
        "fresh": 5,
        "latest": 5,
        "versions": [1, 2, 4, 5],
        "unopenable": ["v4: OSError: gone"],
        "rows": {"init/0": 1, "fresh/0": 1, "w0/0": 2, "w0/2": 1, "x9/0": 1},
    }
    _judge(broken, checked, {"w0": {0, 1}})
    found = "\n".join(broken.anomalies)
    for expected in (
        "versions not contiguous",
        "version does not open: v4",
        "acknowledged append w0/0 present 2 times",
        "acknowledged append w0/1 present 0 times",
        "unknown row x9/0",
    ):
        assert expected in found
    assert broken.unacknowledged_present == 1  # w0/2: committed, never acknowledged: allowed

    wedged = Outcome(8, schedule)
    _judge(wedged, {"wedged": "OSError: version 3 is wedged"}, {})
    assert wedged.anomalies == [
        "a fresh pylance writer could not commit: OSError: version 3 is wedged"
    ]

    clean = Outcome(9, schedule)
    rows = {"init/0": 1, "fresh/0": 1, "w0/0": 1, "w0/1": 1}
    _judge(
        clean,
        {**checked, "versions": [1, 2, 3, 4, 5], "unopenable": [], "rows": rows},
        {"w0": {0, 1}},
    )
    assert clean.anomalies == [] and clean.acknowledged == 2
