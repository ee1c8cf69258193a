"""The commit loop's retry budget is time (``RetryPolicy.max_elapsed``); the
attempt count is only a large safety net."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import EngineTable, LosingHandler, append_transaction, make_table, rows

from lancetx.commit.engine.committer import CommitOptions, RetryPolicy, commit_transaction
from lancetx.commit.errors import RetriesExhaustedError


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10,))


def test_the_default_budget_is_time_with_a_large_count_cap() -> None:
    policy = RetryPolicy()
    assert policy.max_elapsed is not None and policy.max_elapsed >= 60
    assert policy.max_attempts >= 1000


def test_a_writer_that_always_loses_stops_when_its_time_is_spent(table: EngineTable) -> None:
    losing = LosingHandler(table.handler, losses=10**6)
    txn = append_transaction(table, rows(100, 5), table.latest())
    policy = RetryPolicy(max_elapsed=0.3, base_delay=0.01, max_delay=0.02)
    with pytest.raises(RetriesExhaustedError) as info:
        commit_transaction(losing, table.base, txn, options=CommitOptions(retry=policy))
    assert info.value.elapsed is not None and 0.3 <= info.value.elapsed < 5
    assert 3 <= info.value.attempts < policy.max_attempts
    assert "0.3" in str(info.value) or "s (last tried" in str(info.value)
    assert table.versions() == [1]


def test_max_elapsed_none_leaves_only_the_count(table: EngineTable) -> None:
    losing = LosingHandler(table.handler, losses=10**6)
    txn = append_transaction(table, rows(100, 5), table.latest())
    policy = RetryPolicy(max_attempts=3, max_elapsed=None, base_delay=0.0, max_delay=0.0)
    with pytest.raises(RetriesExhaustedError) as info:
        commit_transaction(losing, table.base, txn, options=CommitOptions(retry=policy))
    assert info.value.attempts == 3


def test_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_elapsed=-1)
