"""Randomized whole-system histories (see ``history_harness``): writer processes
(lancetx sync and async, pylance), readers/finalizers, injected faults and kill -9,
each history checked by pylance alone. Zero anomalies allowed.

Profiles (environment variables):

* ``make test`` (the quick profile): 60 histories, seeds 0..59;
* ``LANCETX_TEST_PROFILE=long`` (CI's long pass, ``.ci/run``): 1,000, seeds 0..999;
* ``LANCETX_HISTORIES=20000`` — any count (e.g. a soak);
* ``LANCETX_HISTORY_START=N`` — first seed (default 0);
* ``LANCETX_HISTORY_SEEDS=5,17`` — replay exactly these seeds;
* ``LANCETX_HISTORY_WORKERS`` / ``LANCETX_HISTORY_PARALLEL`` — pool size / histories at once;
* ``LANCETX_HISTORY_VERBOSE=1`` — print every actor's run (seconds, faults, errors, what
  it reported) and the checker's view, for replaying a seed (``=2``: and each actor's log).

A failing seed prints the command that replays it.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

import boto3
import pytest
from history_harness import (
    EFFECTS,
    ROLES,
    Actor,
    Outcome,
    Schedule,
    _judge,
    harness,
    make_schedule,
    run_histories,
)
from protocol_helpers import ensure_ddb_table
from suite_profile import sized

from lancetx.demo.embedded import EmbeddedAws


def _seeds() -> list[int]:
    explicit = os.environ.get("LANCETX_HISTORY_SEEDS")
    if explicit:
        return [int(s) for s in explicit.split(",") if s.strip()]
    start = int(os.environ.get("LANCETX_HISTORY_START", "0"))
    count = sized("LANCETX_HISTORIES", quick=24, long=1000)
    return list(range(start, start + count))


def replay_command(seeds: list[int]) -> str:
    listed = ",".join(str(s) for s in sorted(set(seeds)))
    return f"LANCETX_HISTORY_SEEDS={listed} .venv/bin/pytest tests/test_randomized_histories.py -q"


def test_schedules_are_a_function_of_the_seed() -> None:
    assert make_schedule(42) == make_schedule(42)
    assert len({make_schedule(s) for s in range(50)}) > 40
    schedules = [make_schedule(s) for s in range(1000)]
    kinds = {f.effect for s in schedules for a in s.actors for f in a.faults}
    assert set(EFFECTS) <= kinds
    assert {a.role for s in schedules for a in s.actors} == set(ROLES)
    variants = {a.kind for s in schedules for a in s.actors}
    assert {"stream/aio", "table/aio/keyed", "fragments/aio", "many/aio"} <= variants
    # the same key from two processes at once; two tables for commit_many; cleanup
    # after a tag; Ctrl-C of a keyed writer
    assert any(a.name.endswith("t") for s in schedules for a in s.actors)
    assert any(s.tables == 2 for s in schedules)
    assert any(
        [op for op, _ in a.steps if op != "sleep"][:2] == ["tag", "cleanup"]
        for s in schedules
        for a in s.actors
    )
    assert any(
        a.keyed and any(f.effect.startswith("sigint") for f in a.faults)
        for s in schedules
        for a in s.actors
    )


@pytest.mark.timeout(3600)
@pytest.mark.long
def test_randomized_histories(
    legacy_aws: EmbeddedAws, capsys: pytest.CaptureFixture[str], ddb_table_name: str
) -> None:
    aws = legacy_aws
    seeds = _seeds()
    bucket = f"histories-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket=bucket)
    ensure_ddb_table(aws.pylance_storage_options(), ddb_table_name)
    workers = int(os.environ.get("LANCETX_HISTORY_WORKERS", "8"))
    parallel = int(os.environ.get("LANCETX_HISTORY_PARALLEL", str(max(1, (workers + 1) // 3))))

    verbose = bool(os.environ.get("LANCETX_HISTORY_VERBOSE"))

    def progress(outcome: Outcome) -> None:
        if verbose:
            with capsys.disabled():
                details = "\n  ".join(outcome.details)
                print(
                    f"\nseed {outcome.seed} ({outcome.seconds:.1f} s):\n  {details}",
                    file=sys.stderr,
                )
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


def _table(**over: Any) -> dict[str, Any]:
    """A checker's view of one table of a clean history (override what a test breaks)."""
    table: dict[str, Any] = {
        "fresh": 5,
        "latest": 5,
        "versions": [1, 2, 3, 4, 5],
        "unopenable": [],
        "counts": {1: 1, 2: 2, 3: 3, 4: 4, 5: 5},
        "keys": {},
        "rows": {"init/0/0": 1, "fresh/0/0": 1, "w0/0/0": 1, "w0/1/0": 1},
        "tags": [],
    }
    return {**table, **over}


def _judged(
    schedule: Schedule, tables: list[dict[str, Any]], events: dict[str, list[dict[str, Any]]]
) -> list[str]:
    outcome = Outcome(schedule.seed, schedule)
    actors = {a.name: a for a in schedule.actors}
    _judge(outcome, {"tables": tables}, [(actors[n], e) for n, e in events.items()])
    return outcome.anomalies


def test_the_checker_flags_loss_duplicates_gaps_unopenable_versions_and_wedges() -> None:
    """The judge of a history can fail: each kind of anomaly it exists to catch."""
    schedule = Schedule(7, (Actor("w0", "lancetx", (0, 1, 2), ()),))
    acked = {"w0": [{"ack": 0, "version": 2}, {"ack": 1, "version": 3}]}
    assert _judged(schedule, [_table()], acked) == []
    broken = _table(
        versions=[1, 2, 4, 5],
        unopenable=["v4: OSError: gone"],
        rows={"init/0/0": 1, "fresh/0/0": 1, "w0/0/0": 2, "w0/2/0": 1, "x9/0/0": 1},
    )
    found = "\n".join(_judged(schedule, [broken], acked))
    for expected in (
        "versions missing (not removed by cleanup): [3]",
        "version does not open: v4",
        "acknowledged commit w0/0 present [2] times",
        "acknowledged commit w0/1 present [0] times",
        "unknown rows x9/0",
    ):
        assert expected in found
    outcome = Outcome(7, schedule)
    _judge(outcome, {"tables": [broken]}, [(schedule.actors[0], acked["w0"])])
    assert outcome.unacknowledged_present == 1  # w0/2: committed, never acknowledged: allowed

    wedged = _judged(schedule, [{"wedged": "OSError: version 3 is wedged"}], {})
    assert wedged == ["a fresh pylance writer could not commit: OSError: version 3 is wedged"]


def test_the_checker_flags_what_the_new_doors_can_break() -> None:
    """Keys twice, callers told different stories, torn and one-sided commits,
    versions readers opened that vanished or changed, tags and cleanup."""
    twins = Schedule(
        8,
        (
            Actor("w0", "fragments", (0,), (), "w0", keyed=True),
            Actor("w0t", "fragments", (0,), (), "w0", keyed=True),
            Actor("p0", "poller", (), ()),
        ),
    )
    key = "lancetx.idempotency_key=w0/0"
    rows = {"init/0/0": 1, "fresh/0/0": 1, "w0/0/0": 1}
    good = _table(latest=3, versions=[1, 2, 3], counts={1: 1, 2: 2, 3: 3}, rows=rows)
    events = {
        "w0": [{"ack": 0, "version": 2, "dedup": False}],
        "w0t": [{"ack": 0, "version": 2, "dedup": True}],
        "p0": [{"opened": 2, "table": 0, "rows": 2}],
    }
    assert _judged(twins, [{**good, "keys": {key: [2]}}], events) == []
    both_new = {**events, "w0t": [{"ack": 0, "version": 3, "dedup": False}]}
    found = "\n".join(_judged(twins, [{**good, "keys": {key: [2, 3]}}], both_new))
    for expected in (
        f"key {key} in versions [2, 3]",
        "key w0/0: ['w0', 'w0t'] were each told they committed it",
        "key w0/0: callers told different versions [2, 3]",
        "key w0/0: acknowledged at version 3, found in [2, 3]",
    ):
        assert expected in found
    vanished = {**good, "keys": {key: [2]}, "versions": [1, 3], "counts": {1: 1, 3: 3}}
    found = "\n".join(_judged(twins, [vanished], events))
    assert "version 2 (p0 opened it) no longer opens" in found
    assert "versions missing (not removed by cleanup): [2]" in found
    changed = {**good, "keys": {key: [2]}, "counts": {1: 1, 2: 5, 3: 3}}
    assert "version 2 had 2 rows when p0 opened it, now 5" in "\n".join(
        _judged(twins, [changed], events)
    )
    # cleanup reported removing v2: gone is fine, the key's version is not judged
    cleaned = {
        **events,
        "m0": [{"cleanup": 1, "table": 0}, {"removed": [2], "table": 0}, {"tagged": 1, "table": 0}],
    }
    maint = Schedule(8, (*twins.actors, Actor("m0", "maint", (), ())))
    assert _judged(maint, [{**vanished, "keys": {}}], cleaned) == []
    untagged = {**vanished, "keys": {}, "versions": [3], "counts": {3: 3}}
    assert "tagged version 1 is gone" in "\n".join(_judged(maint, [untagged], cleaned))

    # a cleanup that never said what it removed (killed, interrupted, failed): any
    # version below its newest ``keep`` may be gone, no other
    unsure = {**events, "m0": [{"cleanup": 1, "table": 0}]}
    gone_two = {**vanished, "keys": {}, "fresh": 4, "latest": 4, "versions": [1, 3, 4]}
    gone_two["counts"] = {1: 1, 3: 3, 4: 4}
    assert _judged(maint, [gone_two], unsure) == []
    gone_three = {**gone_two, "versions": [1, 2, 4], "counts": {1: 1, 2: 2, 4: 4}}
    gone_three["keys"] = {key: [2]}
    assert "versions missing (not removed by cleanup): [3]" in "\n".join(
        _judged(maint, [gone_three], unsure)
    )

    # commit_many: both tables or neither, each commit whole
    many = Schedule(9, (Actor("w0", "many", (0,), ()), Actor("w1", "stream", (0,), ())), 2)
    a = _table(latest=3, versions=[1, 2, 3], counts={1: 1, 2: 2, 3: 3})
    a["rows"] = {"init/0/0": 1, "fresh/0/0": 1, "w0/0/0": 1, "w1/0/0": 1}
    b = {**a, "rows": {"init/0/0": 1, "fresh/0/0": 1}}
    found = "\n".join(_judged(many, [a, b], {}))
    assert "commit w0/0 landed in some tables only: [1, 0]" in found
    assert "commit w1/0 torn in table 0: rows present [1, 0]" in found
    assert "verify after the history: error missing_manifest" in "\n".join(
        _judge_verify(many, [a, a])
    )


def _judge_verify(schedule: Schedule, tables: list[dict[str, Any]]) -> list[str]:
    outcome = Outcome(schedule.seed, schedule)
    checked = {"tables": tables, "verify": ["error missing_manifest v3: no manifest"]}
    _judge(outcome, checked, [])
    return outcome.anomalies
