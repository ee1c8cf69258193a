"""Every door, interrupted at its claim: nothing that landed loses a file (issue 19).

Each door — the streaming writer (sync and ``lancetx.aio``), ``Table.append`` (sync
and async), ``commit_fragments`` ``commit_many`` and ``merge_insert`` (sync and async: an upsert that records its
inserted keys, a re-plannable verb writing data and deletion files) — commits once while the
embedded server lets its claim land and then (see ``claim_faults``):

* ``unknown``: loses the answer and every later DynamoDB request until healed
  (CommitStateUnknownError);
* ``sigint``: Ctrl-C arrives while the claim's answer is awaited (KeyboardInterrupt;
  under ``asyncio.run``, a cancellation of the commit, then KeyboardInterrupt);
* ``kill``: the process committing (a child) is SIGKILLed while awaiting it.

Afterwards pylance alone opens every version and reads every row: the version that
landed is readable (its data files, transaction file and manifest all kept), and
its rows are there. For the first two, the error says which files were kept and
how to settle the outcome. The Spark job's share is in
``tests/spark/test_spark_interrupted_commit.py``.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import boto3
import pytest
from claim_faults import (
    DOORS,
    ROWS,
    AtTheClaim,
    acknowledge_sigint,
    check_every_version_opens,
    run_door,
    run_in_child,
    victim_options,
)
from table_helpers import ddb_uri, ids

import lancetx
from lancetx.commit.errors import CommitStateUnknownError
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table

SETUP_ROWS = 2
#: Doors whose data files lancetx wrote (and so could have deleted).
OWNS_DATA = (
    "writer",
    "async-writer",
    "append",
    "async-append",
    "merge_insert",
    "async-merge_insert",
)
IN_PROCESS = tuple(DOORS)
KILLED = ("writer", "async-writer", "append", "commit_fragments", "commit_many", "merge_insert")


@pytest.fixture
def tables(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> list[str]:
    create_table(boto3.client("dynamodb", **legacy_aws.client_kwargs()), ddb_table_name)
    options = legacy_aws.pylance_storage_options()
    uris = [ddb_uri(bucket, ddb_table_name, name) for name in ("t.lance", "u.lance")]
    for uri in uris:
        lancetx.write_table(uri, ids(SETUP_ROWS), storage_options=options)
    return uris


def _uris(door: str, tables: list[str]) -> list[str]:
    return tables if door == "commit_many" else tables[:1]


def _judge(door: str, tables: list[str], options: dict[str, str]) -> None:
    for uri in _uris(door, tables):
        rows = check_every_version_opens(uri, options)
        assert rows == {1: SETUP_ROWS, 2: SETUP_ROWS + ROWS}, (uri, rows)


def _kept_warning(caplog: pytest.LogCaptureFixture) -> str:
    texts = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    kept = [t for t in texts if "may have landed" in t]
    assert kept, texts
    return kept[-1]


@pytest.mark.parametrize("door", IN_PROCESS)
def test_unknown_outcome_at_the_claim_keeps_every_file(
    door: str,
    tables: list[str],
    legacy_aws: EmbeddedAws,
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = legacy_aws.pylance_storage_options()
    caplog.set_level(logging.WARNING)
    with AtTheClaim(legacy_aws, "unknown") as fault:
        with pytest.raises(CommitStateUnknownError) as info:
            DOORS[door](_uris(door, tables), victim_options(options))
        assert fault.fired.wait(60)
        fault.heal()
    _judge(door, tables, options)
    message = str(info.value)
    if door in OWNS_DATA:
        assert "kept the" in message and "/data/" in message, message
        assert "may have landed" in message and "lancetx-sync gc" in message, message
    elif door == "commit_fragments":
        assert "are the caller's" in message, message
    else:
        assert "the all-or-nothing claim of version 2 of" in message, message
        assert "_transactions/" in message and "are the caller's" in message, message


@pytest.mark.parametrize("door", IN_PROCESS)
def test_ctrl_c_at_the_claim_keeps_every_file(
    door: str,
    tables: list[str],
    legacy_aws: EmbeddedAws,
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = legacy_aws.pylance_storage_options()
    caplog.set_level(logging.WARNING)
    with AtTheClaim(legacy_aws, "sigint") as fault:

        def ack() -> Any:
            return acknowledge_sigint(fault)

        with pytest.raises(KeyboardInterrupt):
            DOORS[door](_uris(door, tables), victim_options(options), ack)
        assert fault.fired.wait(60) and fault.reacted  # the server saw the handler run
    _judge(door, tables, options)
    if door in OWNS_DATA:
        warning = _kept_warning(caplog)
        assert "/data/" in warning, warning


@pytest.mark.slow  # a forked child per door
@pytest.mark.parametrize("door", KILLED)
def test_kill_9_at_the_claim_leaves_a_readable_version(
    door: str, tables: list[str], legacy_aws: EmbeddedAws
) -> None:
    options = legacy_aws.pylance_storage_options()
    with AtTheClaim(legacy_aws, "kill") as fault:
        child = run_in_child(run_door, door, _uris(door, tables), victim_options(options))
        child.join(120)
        assert fault.fired.wait(60)
    assert child.exitcode == -signal.SIGKILL, child.exitcode
    _judge(door, tables, options)
