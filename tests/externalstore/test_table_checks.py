"""The checks an ``s3+ddb://`` connection makes beside its first request
(:mod:`lancetx.externalstore.dynamodb.table_checks`), counted on the server.

The store's layout stamp and the table's moved record are read in one consistent
BatchGetItem; an IAM policy without ``dynamodb:BatchGetItem`` falls back to two
GetItems (warned once); the key layout is checked (DescribeTable) beside the first
write, whose own outcome a check that merely could not be made never replaces.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from protocol_helpers import ServerLog, batch, ddb_uri, ensure_ddb_table, pylance_create
from test_dynamodb_store import Faults, ddb_error

from lancetx.commit.engine.committer import load_parent
from lancetx.commit.format.naming import transaction_key
from lancetx.commit.format.transaction_file import transaction_file_name
from lancetx.commit.storage.aws_clients import clear_client_cache
from lancetx.demo import race as demo
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb.store import clear_validation_cache
from lancetx.externalstore.dynamodb.store_schema import clear_stamp_cache, write_stamp
from lancetx.externalstore.dynamodb.table_checks import forget_denials
from lancetx.externalstore.errors import StoreSchemaTooNewError, TableMovedError
from lancetx.externalstore.moved import record_moved

pytestmark = pytest.mark.integration

ROWS = 5


def forget() -> None:
    clear_client_cache()
    clear_validation_cache()
    clear_stamp_cache()
    forget_denials()


@dataclass
class Checked:
    """A pylance-created ``s3+ddb://`` table, seen as by a fresh process."""

    aws: EmbeddedAws
    uri: str
    options: dict[str, str]
    table: str

    def connect(self) -> TableConnection:
        return connect(self.uri, self.options)

    def faults(self) -> Faults:
        """Faults injected into the table's DynamoDB requests from now on (counted from now)."""
        return Faults(self.aws, self.table)


@pytest.fixture
def checked(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Checked]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "checks.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    forget()  # as in a fresh process
    yield Checked(legacy_aws, uri, options, ddb_table_name)
    legacy_aws.set_interceptor(None)
    forget()


def test_a_denied_batch_get_item_falls_back_to_two_get_items_and_warns_once(
    checked: Checked, caplog: pytest.LogCaptureFixture
) -> None:
    faults = checked.faults()
    faults.always("BatchGetItem", ddb_error("AccessDeniedException"))
    with caplog.at_level(logging.WARNING):
        conn = checked.connect()
        assert load_parent(conn.handler, conn.base) is not None
        # Denied BatchGetItem, then the stamp and the moved record one by one.
        assert faults.seen == {"BatchGetItem": 1, "GetItem": 2, "Query": 1}
        clear_stamp_cache()  # the stamp must be read again: not with BatchGetItem
        again = checked.connect()
        assert load_parent(again.handler, again.base) is not None
        assert faults.seen == {"BatchGetItem": 1, "GetItem": 4, "Query": 2}
    assert faults.seen["BatchGetItem"] == 1  # asked once per process
    warnings = [r for r in caplog.records if "dynamodb:BatchGetItem" in r.getMessage()]
    assert len(warnings) == 1 and "lancetx-sync iam-policy" in warnings[0].getMessage()


def test_a_moved_table_is_refused_from_the_batch_read(checked: Checked) -> None:
    conn = checked.connect()
    record_moved(conn.handler.entries, conn.base, "s3://elsewhere/t.lance")  # type: ignore[attr-defined]
    fresh = checked.connect()
    with pytest.raises(TableMovedError, match=r"s3://elsewhere/t\.lance"):
        load_parent(fresh.handler, fresh.base)


def test_a_claim_that_is_a_connections_first_use_is_not_sent_to_a_moved_table(
    checked: Checked,
) -> None:
    """The checks run beside a read, but a claim waits for them: a claim that landed on a
    moved table would be finalized into it by the next s3+ddb:// reader."""
    parent = load_parent(checked.connect().handler, checked.connect().base)
    conn = checked.connect()
    record_moved(conn.handler.entries, conn.base, "s3://elsewhere/t.lance")  # type: ignore[attr-defined]
    fresh = checked.connect()  # its first use is the claim: the parent came from elsewhere
    with ServerLog(checked.aws) as log, pytest.raises(TableMovedError):
        demo.lancetx_append(fresh, batch("w", 0, ROWS), parent)
    assert "PutItem" not in log.operations()  # no claim was sent
    entries = fresh.handler.entries  # type: ignore[attr-defined]
    assert [e.version for e in entries.list_entries(fresh.base)] == [1]


def test_a_verdict_that_arrives_after_the_claim_landed_does_not_undo_it(
    checked: Checked,
) -> None:
    """The checks could not be made before the claim (500s), so it went ahead; when they
    can be made again the table turns out moved. The claim has landed by then: its
    finishing is not refused, and its transaction file is not discarded."""
    parent = load_parent(checked.connect().handler, checked.connect().base)
    conn = checked.connect()
    record_moved(conn.handler.entries, conn.base, "s3://elsewhere/t.lance")  # type: ignore[attr-defined]
    forget()
    claimed: list[str] = []

    def checks_fail_until_a_claim(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service == "dynamodb" and request.target == "PutItem":
            claimed.append(request.target)
        checking = request.target in ("BatchGetItem", "GetItem")
        if request.service == "dynamodb" and checking and not claimed:
            return ddb_error("InternalServerError", 500)
        return None

    checked.aws.set_interceptor(checks_fail_until_a_claim)
    fresh = checked.connect()
    held = demo.lancetx_append(fresh, batch("w", 0, ROWS), parent)
    assert held.version == 2
    checked.aws.set_interceptor(None)
    txn = transaction_key(fresh.base, transaction_file_name(held.transaction.to_proto()))
    assert fresh.handler.store.head(txn).size > 0  # kept: version 2 refers to it
    with pytest.raises(TableMovedError):  # the next use is refused
        load_parent(fresh.handler, fresh.base)


def test_a_newer_stamp_is_refused_from_the_batch_read(checked: Checked) -> None:
    conn = checked.connect()
    write_stamp(conn.handler.entries.client, checked.table, 99)  # type: ignore[attr-defined]
    with ServerLog(checked.aws) as log, pytest.raises(StoreSchemaTooNewError, match="layout 99"):
        load_parent(conn.handler, conn.base)
    assert "BatchGetItem" in log.operations()


def test_keys_left_unprocessed_are_asked_for_again(checked: Checked) -> None:
    conn = checked.connect()
    write_stamp(conn.handler.entries.client, checked.table, 99)  # type: ignore[attr-defined]
    stamp_key = {"base_uri": {"S": "__lancetx_schema__"}, "version": {"N": "0"}}
    unprocessed = {
        "Responses": {checked.table: []},
        "UnprocessedKeys": {checked.table: {"Keys": [stamp_key], "ConsistentRead": True}},
    }
    faults = checked.faults()
    faults.plan(
        "BatchGetItem",
        [
            InterceptedResponse(
                200,
                json.dumps(unprocessed).encode(),
                [("Content-Type", "application/x-amz-json-1.0")],
            )
        ],
    )
    with pytest.raises(StoreSchemaTooNewError):  # the stamp was read at the second ask
        load_parent(conn.handler, conn.base)
    assert faults.seen["BatchGetItem"] == 2


def test_a_describe_table_that_cannot_be_made_does_not_fail_the_first_write(
    checked: Checked, caplog: pytest.LogCaptureFixture
) -> None:
    conn = checked.connect()
    parent = load_parent(conn.handler, conn.base)
    faults = checked.faults()
    faults.always("DescribeTable", ddb_error("InternalServerError", 500))
    with caplog.at_level(logging.WARNING):
        held = demo.lancetx_append(conn, batch("w", 0, ROWS), parent)  # landed: no error
    assert held.version == 2
    assert faults.seen["DescribeTable"] >= 1
    assert any("will check again" in r.getMessage() for r in caplog.records)
    checked.aws.set_interceptor(None)
    seen = faults.seen["DescribeTable"]
    with ServerLog(checked.aws) as log:
        demo.lancetx_append(conn, batch("w", 1, ROWS), held)
        assert log.operations().count("DescribeTable") == 1  # checked at the next write
    assert faults.seen["DescribeTable"] == seen


def test_a_claim_that_landed_is_not_reported_failed_because_its_check_could_not_be_made(
    checked: Checked, caplog: pytest.LogCaptureFixture
) -> None:
    # A fresh connection whose first use is a claim (its parent came from elsewhere):
    # the moved-record check beside it cannot be made (500s). The claim landed, so
    # the commit must come back as committed — reporting it failed would make the
    # caller clean up its transaction file and commit the same rows again.
    parent = load_parent(checked.connect().handler, checked.connect().base)
    fresh = checked.connect()
    faults = checked.faults()
    faults.always("GetItem", ddb_error("InternalServerError", 500))
    faults.always("BatchGetItem", ddb_error("InternalServerError", 500))
    with caplog.at_level(logging.WARNING):
        held = demo.lancetx_append(fresh, batch("w", 0, ROWS), parent)
    assert held.version == 2
    assert faults.seen["GetItem"] + faults.seen["BatchGetItem"] >= 1  # it did try
    assert any("will check again" in r.getMessage() for r in caplog.records)
    checked.aws.set_interceptor(None)
    with ServerLog(checked.aws) as log:
        assert load_parent(fresh.handler, fresh.base).version == 2  # type: ignore[union-attr]
        ops = log.operations()
    assert "GetItem" in ops or "BatchGetItem" in ops  # checked again at the next use


def test_an_asyncio_handler_makes_the_checks_of_a_sync_connection(checked: Checked) -> None:
    """``lancetx.aio`` opens its DynamoDB handler (aioboto3) on a table's first verb, and
    makes there the checks a sync connection makes, the moved record included: a table
    migrated off DynamoDB after it was opened is refused before anything is claimed."""
    import lancetx.aio

    async def append_after_the_move() -> None:
        table = await lancetx.aio.open(checked.uri, checked.options)  # checks pass: not moved
        conn = checked.connect()
        record_moved(conn.handler.entries, conn.base, "s3://elsewhere/t.lance")  # type: ignore[attr-defined]
        async with table:
            with pytest.raises(TableMovedError, match=r"s3://elsewhere/t\.lance"):
                await table.append(batch("aio", 0, ROWS))

    asyncio.run(append_after_the_move())
    entries = checked.connect().handler.entries  # type: ignore[attr-defined]
    assert [e.version for e in entries.list_entries(checked.connect().base)] == [1]


def test_an_asyncio_handler_reads_the_stamp_and_the_moved_record_as_a_sync_connection_does(
    checked: Checked,
) -> None:
    """The asyncio handler's checks are the sync connection's reads: the stamp and the
    moved record in one BatchGetItem, and a store a newer lancetx stamped is refused
    before anything is claimed."""
    import lancetx.aio

    async def append_after_a_newer_stamp() -> list[str]:
        table = await lancetx.aio.open(checked.uri, checked.options)
        write_stamp(checked.connect().handler.entries.client, checked.table, 99)  # type: ignore[attr-defined]
        clear_stamp_cache()  # as a process that has not read the stamp yet
        async with table:
            with ServerLog(checked.aws) as log:
                with pytest.raises(StoreSchemaTooNewError, match="layout 99"):
                    await table.append(batch("aio", 0, ROWS))
                return log.operations()

    operations = asyncio.run(append_after_a_newer_stamp())
    assert "BatchGetItem" in operations
    assert not {"PutItem", "TransactWriteItems"} & set(operations)
