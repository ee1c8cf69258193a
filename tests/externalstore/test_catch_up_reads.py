"""A commit behind a history pylance wrote reads each version's manifest once, with a
lean GET, and trusts it no more than any other read.

pylance's items carry no summary of their transaction, so a lancetx commit planned
K versions back must read the K manifests. Each is read once, in parallel, by a lean
GET (``commit/storage/s3_lean/gets.py``): botocore's per-request pipeline (endpoint rules,
events, response parsing) runs for none of them, only its signer's credentials and
its HTTP session are used. Every check of the ordinary read still applies (the
hostile-item cases of ``test_hostile_items.py`` run through a catch-up there), and
the asyncio handler reads the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import lance
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table, pylance_create

from lancetx.commit.engine.committer import commit_transaction, commit_transaction_async
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest
from lancetx.externalstore.connect import connect, open_async_handler

BEHIND = 12


class Calls:
    """botocore ``before-call`` events of one operation on a client: one per API call
    botocore runs its pipeline for (lean GETs are not among them)."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.count = 0

    def __call__(self, **_: Any) -> None:
        self.count += 1


def _table(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, name: str
) -> tuple[str, dict[str, str], int]:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, name, ddb_table_name)
    v0 = pylance_create(uri, options, batch("create", 0, 3))
    ds = lance.dataset(uri, storage_options=options)
    for seq in range(BEHIND):
        ds.insert(batch("pylance", seq, 1))
    return uri, options, v0


def _planned_at(uri: str, options: dict[str, str], v0: int) -> Transaction:
    files = lance.fragment.write_fragments(
        batch("lancetx", 0, 2),
        uri.split("?")[0].replace("s3+ddb://", "s3://"),
        storage_options=options,
    )
    return Transaction(
        read_version=v0, operation=Append(fragments=tuple(fragment_from_pylance(f) for f in files))
    )


def _manifest_gets(requests: list[InterceptedRequest]) -> list[str]:
    return [r.path for r in requests if r.method == "GET" and "/_versions/" in r.path]


def test_a_commit_behind_pylance_history_reads_each_manifest_once_lean(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    uri, options, v0 = _table(aws, bucket, ddb_table_name, "db/catchup.lance")
    conn = connect(uri, options)
    txn = _planned_at(uri, options, v0)
    assert all(
        loc.summary is None for loc in conn.handler.list_versions(conn.base, v0)
    )  # pylance's items: nothing to settle a version without reading it
    calls = Calls("GetObject")
    conn.handler.store.client.meta.events.register("before-call.s3.GetObject", calls)
    seen: list[InterceptedRequest] = []
    aws.set_interceptor(lambda request: seen.append(request) or None)
    try:
        committed = commit_transaction(conn.handler, conn.base, txn)
    finally:
        aws.set_interceptor(None)
    assert committed.version == v0 + BEHIND + 1
    gets = _manifest_gets(seen)
    # Each version read once: the newest (the parent) by the ordinary read, the
    # others by the catch-up.
    assert len(gets) == len(set(gets)) == BEHIND, gets
    # botocore's pipeline ran for the parent's read and, once per client and bucket,
    # to learn what a lean GET sends: not for the versions caught up on.
    assert calls.count <= 2, calls.count
    rows = lance.dataset(uri, storage_options=options).to_table()
    assert rows.num_rows == 3 + BEHIND + 2


def test_the_asyncio_handler_catches_up_lean_too(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    uri, options, v0 = _table(aws, bucket, ddb_table_name, "db/catchup-aio.lance")
    conn = connect(uri, options)
    txn = _planned_at(uri, options, v0)
    seen: list[InterceptedRequest] = []

    async def commit() -> int:
        async with open_async_handler(conn) as handler:
            assert handler is not None
            calls = Calls("GetObject")
            (await handler.store.client()).meta.events.register("before-call.s3.GetObject", calls)
            aws.set_interceptor(lambda request: seen.append(request) or None)
            try:
                done = await commit_transaction_async(handler, conn.base, txn)
            finally:
                aws.set_interceptor(None)
            assert calls.count <= 2, calls.count
            return done.version

    assert asyncio.run(commit()) == v0 + BEHIND + 1
    gets = _manifest_gets(seen)
    assert len(gets) == len(set(gets)) == BEHIND, gets


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "asyncio"])
def test_a_manifest_changed_under_its_item_is_refused_in_a_catch_up(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, async_: bool
) -> None:
    """The lean read of a version whose manifest no longer matches its item (another
    size) is refused as the ordinary read refuses it, naming the item."""
    from lancetx.externalstore.errors import CorruptManifestError, ManifestSizeMismatchError

    uri, options, v0 = _table(aws, bucket, ddb_table_name, "db/catchup-hostile.lance")
    conn = connect(uri, options)
    victim = conn.handler.resolve_version(conn.base, v0 + 3)
    store = conn.handler.store
    body, _ = store.get_tail(victim.key, 1 << 20)
    store.put(victim.key, body + b"trailing bytes the item does not know of")
    txn = _planned_at(uri, options, v0)

    async def commit_async() -> None:
        async with open_async_handler(conn) as handler:
            assert handler is not None
            await commit_transaction_async(handler, conn.base, txn)

    with pytest.raises((ManifestSizeMismatchError, CorruptManifestError)) as refused:
        if async_:
            asyncio.run(commit_async())
        else:
            commit_transaction(conn.handler, conn.base, txn)
    message = str(refused.value)
    assert f"version {v0 + 3}" in message and ddb_table_name in message
