"""The losers' waiting policy (``commit/engine/contention.py``), as numbers.

* The window after k lost rounds is 4 * 2**(k-1) measured slots, capped at
  ``RetryPolicy.max_delay``; draws stay inside it (full jitter).
* A process remembers a table's contention: after a lost round it looks for
  newer versions first, and a commit starts its backoff at the recent level
  (lost rounds per commit, moving average, capped); that memory expires.
* The last winner's wait before its next first attempt is at most one slot.
"""

from __future__ import annotations

import random

import pytest

from lancetx.commit.engine import contention
from lancetx.commit.engine.retry import RetryPolicy


def test_windows_start_at_four_slots_and_double_up_to_the_cap() -> None:
    policy = RetryPolicy(base_delay=0.001, max_delay=1.0)
    assert [contention.window(policy, k, 0.01) for k in (1, 2, 3, 4)] == pytest.approx(
        [0.04, 0.08, 0.16, 0.32]
    )
    assert contention.window(policy, 10, 0.01) == 1.0  # capped
    assert contention.window(policy, 1, 0.0) == pytest.approx(0.004)  # base_delay as the slot


def test_delays_are_drawn_inside_the_window() -> None:
    policy = RetryPolicy(max_delay=1.0)
    rng = random.Random(3)
    draws = [contention.delay(policy, 2, 0.01, rng) for _ in range(200)]
    assert all(0 <= d <= 0.08 for d in draws)
    assert max(draws) > 0.06 and min(draws) < 0.02  # spread over the window


def test_a_table_remembers_its_contention_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    table = contention.TableContention()
    assert not table.refresh_first(100.0) and table.start_level(100.0) == 0
    table.lost(100.0, slot=0.05)
    for losses in (4, 4, 4):
        table.committed(losses)
    assert table.refresh_first(100.5)
    assert table.start_level(100.5) == 3  # 0.5, 0.75, 0.875 of 4
    table.committed(0)
    assert table.start_level(100.5) == 1
    assert not table.refresh_first(100.0 + contention.CONTENDED_FOR + 0.1)
    assert table.start_level(100.0 + contention.CONTENDED_FOR + 0.1) == 0
    for _ in range(10):
        table.committed(100)
    assert table.start_level(100.5) == contention.LEVEL_CAP


def test_the_last_winner_yields_at_most_one_slot() -> None:
    table = contention.TableContention()
    table.lost(0.0, slot=0.02)
    table.level = 3.0
    rng = random.Random(5)
    draws = [contention.yield_delay(RetryPolicy(), table, rng) for _ in range(100)]
    assert all(0 <= d <= 0.02 for d in draws) and max(draws) > 0.015


def test_tables_are_remembered_per_uri() -> None:
    a = contention.table_contention("s3://b/a.lance")
    assert contention.table_contention("s3://b/a.lance") is a
    assert contention.table_contention("s3://b/other.lance") is not a


def test_queue_waits_are_timed_by_turn_work_not_by_late_turns() -> None:
    table = contention.TableContention()
    policy = RetryPolicy()
    assert contention.turn_wait(policy, table, 1) == pytest.approx(contention.DEFAULT_TURN)
    table.worked(0.1)
    table.turns_served(1, 1.0)  # one turn took a second (a late look): not a measure of work
    # Next in line: first look when the current turn's claim is due, then a quarter turn.
    assert contention.turn_wait(policy, table, 1, into_turn=0.04) == pytest.approx(0.06)
    assert contention.turn_wait(policy, table, 1, first_look=False) == pytest.approx(0.025)
    # Far back, before any claim was timed: by work.
    aim = 4 + contention.FAR_SLACK - contention.FAR_MARGIN * 2  # 4 turns to go: sqrt(4) = 2
    assert contention.turn_wait(policy, table, 5) == pytest.approx(0.1 * aim)
    assert contention.turn_wait(policy, table, 5, into_turn=0.05) == pytest.approx(0.1 * aim - 0.05)
    assert contention.turn_wait(policy, table, 1, into_turn=5.0) == pytest.approx(0.1 / 5)


def test_far_back_waits_follow_the_median_time_between_claims() -> None:
    table = contention.TableContention()
    policy = RetryPolicy()
    table.worked(0.1)
    # Claims 0.15 s apart, and one 2 s gap after a holder overslept its turn.
    table.claims_timed([0.15, 0.15, 2.0, 0.15, 0.16])
    assert contention.far_turn(table) == pytest.approx(0.15)  # the median, not the mean
    aim = 9 + contention.FAR_SLACK - contention.FAR_MARGIN * 3  # 9 turns to go
    assert contention.turn_wait(policy, table, 10) == pytest.approx(0.15 * aim)
    # One slow turn of our own (a busy moment) stretches neither far-back waits
    # nor the next-in-line look: the claims' pace bounds them.
    table.worked(5.0)
    assert contention.far_turn(table) == pytest.approx(0.15)
    assert contention.turn_work(table) == pytest.approx(0.15)
    # A turn overdue by a second: look again after half of that, not every turn.
    assert contention.turn_wait(policy, table, 2, into_turn=1.25) >= 0.5


def test_a_stalled_queue_is_passed_after_several_turns_and_at_least_a_second() -> None:
    table = contention.TableContention()
    assert contention.stall_limit(table) == contention.MIN_STALL
    table.turns_served(1, 0.5)
    assert contention.stall_limit(table) == pytest.approx(contention.STALL_TURNS * 0.5)
