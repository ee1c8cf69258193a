"""A keyed claim (version item + key item in one TransactWriteItems) under faults.

On the embedded server (S3 ignoring If-None-Match, DynamoDB over HTTP):

* the claim lands and the client sees a 500: the retry meets both items carrying
  our commit token: committed once, not deduplicated — also when pylance finalized
  the version in between (its item then has no token; the key item still does);
* a 500 that did not land, and the key committed by another writer before our
  retry: the retry meets the other's key item: deduplicated with its version, our
  staged manifest deleted;
* kill -9 of the committing process right after its claim landed (or right before
  it was sent): the key is then committed exactly once, and a retry of the key from
  another process gets that version (pylance reads it, finalized by the reader);
* pylance reads and writes the table beside key items (it never queries their
  partition).

On the in-memory store: an answer lost after the keyed write landed (the protocol's
own settling, by reading the entry).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import lance
import pytest
from protocol_helpers import (
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

import lancetx
from lancetx.commit.engine.committer import CommitOptions, RetryPolicy, load_parent
from lancetx.commit.format.naming import VERSIONS_DIR
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.memory import MemoryManifestStore

ROWS = 4
KEYED = CommitOptions(idempotency_key="job-1", retry=RetryPolicy(base_delay=0.001))


class Table:
    def __init__(self, aws: EmbeddedAws, bucket: str, ddb_table: str) -> None:
        self.aws = aws
        self.options = aws.pylance_storage_options()
        ensure_ddb_table(self.options, ddb_table)
        self.uri = ddb_uri(bucket, "keyed.lance", ddb_table)
        self.ddb_table = ddb_table
        pylance_create(self.uri, self.options, batch("setup", 0, ROWS))
        self.conn = connect(self.uri, self.options)

    def handler(self, sleep: Callable[[float], None] | None = None) -> ExternalStoreCommitHandler:
        """A fresh handler; ``sleep`` replaces the DynamoDB store's retry sleeps."""
        entries = DynamoDBManifestStore(
            make_client(DynamoDBConfig.from_options(self.options)),
            self.ddb_table,
            **({"sleep": sleep} if sleep is not None else {}),
        )
        return ExternalStoreCommitHandler(self.conn.handler.store, entries)

    def append(
        self, writer: str, handler: ExternalStoreCommitHandler | None = None, **kw: Any
    ) -> Any:
        return lancetx_append(
            handler or self.handler(),
            self.conn.base,
            self.conn.data_uri,
            self.options,
            batch(writer, 0, ROWS),
            **kw,
        )

    def writers(self) -> list[str]:
        ds = lance.dataset(self.uri, storage_options=self.options)
        return sorted(ds.to_table(columns=["writer"])["writer"].to_pylist())

    def staged(self) -> list[str]:
        prefix = f"{self.conn.base}/{VERSIONS_DIR}/"
        names = [m.key.rsplit("/", 1)[-1] for m in self.conn.handler.store.list(prefix)]
        return [n for n in names if "-" in n]


@pytest.fixture
def table(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Table:
    return Table(legacy_aws, bucket, ddb_table_name)


def is_keyed_claim(r: InterceptedRequest) -> bool:
    return r.target == "TransactWriteItems" and b"#lancetx-keys" in r.body


def ddb_500(*, after_forwarding: bool) -> InterceptedResponse:
    body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"})
    return InterceptedResponse(
        500,
        body.encode(),
        [("Content-Type", "application/x-amz-json-1.0")],
        after_forwarding=after_forwarding,
    )


class First:
    """Answer the first keyed claim with ``response``; let the others through."""

    def __init__(self, response: InterceptedResponse) -> None:
        self.response = response
        self.fired = 0
        self.lock = threading.Lock()

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if not is_keyed_claim(request):
            return None
        with self.lock:
            self.fired += 1
            return self.response if self.fired == 1 else None


@pytest.mark.parametrize("pylance_finalizes_first", [False, True])
def test_a_keyed_claim_that_landed_behind_a_500_is_committed_once(
    table: Table, pylance_finalizes_first: bool
) -> None:
    finalized: list[int] = []

    def backoff(seconds: float) -> None:
        if pylance_finalizes_first and not finalized:
            finalized.append(lance.dataset(table.uri, storage_options=table.options).version)

    fault = First(ddb_500(after_forwarding=True))
    table.aws.set_interceptor(fault)
    committed = table.append("w", handler=table.handler(sleep=backoff), options=KEYED)
    table.aws.set_interceptor(None)

    assert fault.fired == 2  # the landed attempt, then the retry that found both items ours
    assert finalized == ([2] if pylance_finalizes_first else [])
    assert committed.version == 2 and not committed.deduplicated
    assert table.writers() == ["setup"] * ROWS + ["w"] * ROWS
    assert table.staged() == []
    assert lancetx.open(table.uri, storage_options=table.options).find_idempotency_key("job-1") == 2


def test_a_keyed_claim_that_did_not_land_and_lost_its_key_meanwhile_is_deduplicated(
    table: Table,
) -> None:
    other: list[Any] = []

    def another_writer_commits_the_key(seconds: float) -> None:
        if not other:
            other.append(table.append("other", options=KEYED))

    fault = First(ddb_500(after_forwarding=False))
    table.aws.set_interceptor(fault)
    ours = table.append(
        "ours", handler=table.handler(sleep=another_writer_commits_the_key), options=KEYED
    )
    table.aws.set_interceptor(None)

    assert other[0].version == 2 and not other[0].deduplicated
    assert ours.deduplicated and ours.version == 2
    assert ours.transaction.uuid == other[0].transaction.uuid
    assert table.writers() == ["other"] * ROWS + ["setup"] * ROWS
    assert table.staged() == []


def test_pylance_reads_and_writes_beside_key_items(table: Table) -> None:
    first = table.append("keyed", options=KEYED)
    assert pylance_append(table.uri, table.options, batch("pylance", 0, ROWS)) == 3
    again = table.append("again", options=KEYED)
    assert again.deduplicated and again.version == first.version == 2
    ds = lance.dataset(table.uri, storage_options=table.options)
    assert [int(v["version"]) for v in ds.versions()] == [1, 2, 3]
    assert table.writers() == ["keyed"] * ROWS + ["pylance"] * ROWS + ["setup"] * ROWS


# ------------------------------------------------------------------------ kill -9


def _commit_in_child(uri: str, options: dict[str, str], key: str, ready: Any) -> None:
    """A spawned process: commit one batch with ``key`` (it is killed at its claim)."""
    conn = connect(uri, options)
    ready.set()
    lancetx_append(
        conn.handler,
        conn.base,
        conn.data_uri,
        options,
        batch("killed", 0, ROWS),
        options=CommitOptions(idempotency_key=key),
    )


@pytest.mark.slow  # a spawned process
@pytest.mark.parametrize("landed", [True, False])
def test_kill_9_at_the_keyed_claim_then_the_key_again(table: Table, landed: bool) -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(
        target=_commit_in_child, args=(table.uri, table.options, "job-1", ready)
    )
    killed = threading.Event()

    def kill() -> None:
        assert child.pid is not None
        with suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        killed.set()

    def at_the_claim(request: InterceptedRequest) -> InterceptedResponse | None:
        if not is_keyed_claim(request) or killed.is_set():
            return None
        response = ddb_500(after_forwarding=landed)
        response.then = kill
        return response

    table.aws.set_interceptor(at_the_claim)
    try:
        child.start()
        child.join(120)
    finally:
        table.aws.set_interceptor(None)
    assert killed.is_set() and child.exitcode == -signal.SIGKILL

    retry = table.append("retry", options=KEYED)
    if landed:
        assert retry.deduplicated and retry.version == 2
        assert table.writers() == ["killed"] * ROWS + ["setup"] * ROWS
    else:
        assert not retry.deduplicated and retry.version == 2
        assert table.writers() == ["retry"] * ROWS + ["setup"] * ROWS
    latest = load_parent(table.conn.handler, table.conn.base)
    assert latest is not None and latest.version == 2


# ------------------------------------------------------------------ in-memory store


def test_a_lost_answer_after_the_keyed_write_landed_is_settled_as_ours(
    tmp_path: Any,
) -> None:
    path = str(tmp_path / "t.lance")
    pylance_create(path, None, batch("setup", 0, ROWS))
    from lancetx.commit.storage.stores import open_object_store

    store, base = open_object_store(path)
    entries = MemoryManifestStore()
    handler = ExternalStoreCommitHandler(store, entries)
    conn = TableConnection(uri=path, handler=handler, base=base, data_uri=path)
    entries.land_then_fail("put_with_key_if_not_exists")
    committed = lancetx_append(conn.handler, base, path, None, batch("w", 0, ROWS), options=KEYED)
    assert committed.version == 2 and not committed.deduplicated
    assert (
        entries.calls["put_with_key_if_not_exists"] == 1
    )  # landed, answer lost: settled by a read
    (record,) = entries.key_records()
    assert (record.key, record.version) == ("job-1", 2)
    assert record.transaction_uuid == committed.transaction.uuid
    assert lance.dataset(path).version == 2


def test_the_async_door_settles_a_keyed_claim_that_landed_behind_a_500(table: Table) -> None:
    """The same fault through ``lancetx.aio`` (aiobotocore's DynamoDB store): committed
    once, the key found, no staged manifest left."""
    import asyncio

    import lancetx.aio

    async def main() -> tuple[int, bool]:
        async with await lancetx.aio.open(table.uri, table.options) as opened:
            version = await opened.append(batch("w", 0, ROWS), idempotency_key="job-1")
            assert opened.last_commit is not None
            again = await opened.append(batch("again", 0, ROWS), idempotency_key="job-1")
            assert again == version
            return version, opened.last_commit.deduplicated

    fault = First(ddb_500(after_forwarding=True))
    table.aws.set_interceptor(fault)
    try:
        version, deduplicated = asyncio.run(main())
    finally:
        table.aws.set_interceptor(None)
    assert fault.fired >= 2  # the landed attempt, then the retry that found both items ours
    assert (version, deduplicated) == (2, True)
    assert table.writers() == ["setup"] * ROWS + ["w"] * ROWS
    assert table.staged() == []
    assert lancetx.open(table.uri, storage_options=table.options).find_idempotency_key("job-1") == 2
