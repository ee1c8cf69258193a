"""What a commit tells its caller besides the result: logs and observer events.

* One INFO line per commit naming the table as the caller named it, the
  version, the attempts, the duration and whether ours was rebased; one DEBUG
  line per lost round; a WARNING when a claim's outcome is unknown.
* ``CommitOptions(observer=...)`` gets one CommitEvent per attempt: their
  number equals ``Committed.attempts``, outcomes in order (``lost`` then
  ``won``), versions and the transaction named.
* An observer that raises does not change the commit's result.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from engine_helpers import (
    EngineTable,
    LosingHandler,
    append_transaction,
    lancetx_append,
    make_table,
    rows,
)

from lancetx.commit.engine.committer import CommitOptions, commit_transaction
from lancetx.commit.engine.events import CommitEvent
from lancetx.commit.errors import CommitStateUnknownError
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme

LOGGER = "lancetx.commit.engine.committer"
SHOWN = "s3+ddb://bucket/events.lance?ddbTableName=manifests"


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10, 10))


def test_a_contended_commit_logs_once_at_info_and_reports_each_attempt(
    table: EngineTable, caplog: pytest.LogCaptureFixture
) -> None:
    read = table.latest()
    txn = append_transaction(table, rows(100, 5), read)
    racing = LosingHandler(
        table.handler, before_commit=lambda _: lancetx_append(table, rows(200, 5))
    )
    events: list[CommitEvent] = []
    caplog.set_level(logging.DEBUG, logger=LOGGER)

    done = commit_transaction(
        racing,
        table.base,
        txn,
        parent=read,
        options=CommitOptions(observer=events.append, table_uri=SHOWN),
    )

    assert done.version == 4 and done.attempts == 2
    assert len(events) == done.attempts
    assert [e.outcome for e in events] == ["lost", "won"]
    assert [e.attempt for e in events] == [1, 2]
    assert [e.attempted_version for e in events] == [3, 4]
    assert all(e.table_uri == SHOWN and e.transaction_uuid == txn.uuid for e in events)
    assert all(e.read_version == 2 and e.duration_s >= 0 for e in events)
    assert events[1].committed_since_read == 1

    info = [
        r
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.INFO and SHOWN in r.getMessage()
    ]
    assert len(info) == 1, [r.getMessage() for r in info]  # the winner logs its own commit
    message = info[0].getMessage()
    assert SHOWN in message and "version 4" in message and "2 attempt" in message
    assert " s" in message and "rebased" not in message
    debug = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG]
    assert any("lost version 3" in r.getMessage() for r in debug)


def test_an_unknown_outcome_is_a_warning_and_an_event(
    table: EngineTable, caplog: pytest.LogCaptureFixture
) -> None:
    class Unclear(LosingHandler):
        def commit(
            self,
            base: str,
            version: int,
            manifest: bytes,
            scheme: NamingScheme,
            summary: TransactionSummary | None = None,
        ) -> ManifestLocation:
            raise CommitStateUnknownError(self.store.uri(base), version, "token", "timed out")

    read = table.latest()
    events: list[CommitEvent] = []
    with pytest.raises(CommitStateUnknownError):
        commit_transaction(
            Unclear(table.handler),
            table.base,
            append_transaction(table, rows(100, 5), read),
            parent=read,
            options=CommitOptions(observer=events.append),
        )
    assert [e.outcome for e in events] == ["unknown"]
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unknown" in warnings[0].getMessage()


def test_a_failing_observer_does_not_change_the_result(table: EngineTable) -> None:
    def broken(event: CommitEvent) -> None:
        raise RuntimeError("metrics backend down")

    read = table.latest()
    done = table.commit(
        append_transaction(table, rows(100, 5), read),
        parent=read,
        options=CommitOptions(observer=broken),
    )
    assert done.version == 3 and table.versions() == [1, 2, 3]
