"""The all-or-nothing claim step (``protocol.claim_all_steps``) under faults.

In-memory manifest store (its ``put_all_if_not_exists`` is atomic under one
lock) and manifests staged on local disk, so each fault lands exactly where
intended:

* the claim landed and its answer was lost: the retry finds our commit tokens,
  so it is ours -- all of it;
* an attempt failed ambiguously, and when retried another writer holds one of
  the versions: none of ours landed (it is all or nothing), so the claim is
  lost, and every staged manifest is deleted;
* refused outright (permissions): staged manifests deleted, the error kept;
* ambiguous every time: CommitStateUnknownError, staged manifests kept;
* and the DynamoDB stores (sync and async) against the embedded moto server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lancetx.commit.errors import CommitStateUnknownError
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore, create_table
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.errors import (
    AccessDeniedError,
    AmbiguousWriteError,
    BatchEntryExistsError,
    MultiTableClaimLostError,
)
from lancetx.externalstore.memory import MemoryManifestStore
from lancetx.externalstore.protocol import Staged, Table, claim_all_steps, run, stage_steps

TABLES = (
    Table("lake/orders.lance", "lake/orders.lance"),
    Table("lake/lines.lance", "lake/lines.lance"),
)


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(str(tmp_path))


def _stage(store: LocalObjectStore, entries: MemoryManifestStore) -> list[Staged]:
    return [
        run(
            stage_steps(t, 2, NamingScheme.V2, f"manifest of {t.base_uri}".encode()), store, entries
        )
        for t in TABLES
    ]


def _staged_objects(store: LocalObjectStore) -> list[str]:
    return sorted(m.key for m in store.list("lake/") if ".manifest-" in m.key)


def _ambiguous(entry: ManifestEntry) -> AmbiguousWriteError:
    return AmbiguousWriteError("dynamodb:TransactWriteItems", "memory", entry, "injected timeout")


def test_a_claim_that_landed_unseen_is_ours(store: LocalObjectStore) -> None:
    entries = MemoryManifestStore()
    claims = _stage(store, entries)
    entries.land_then_fail("put_all_if_not_exists")

    run(claim_all_steps(claims), store, entries)

    assert entries.calls["put_all_if_not_exists"] == 2
    assert [entries.get(t.base_uri, 2).commit_token for t in TABLES] == [
        c.entry.commit_token for c in claims
    ]
    assert len(_staged_objects(store)) == 2  # kept: the finalize step needs them


def test_an_ambiguous_attempt_then_another_writer_is_a_clean_loss(store: LocalObjectStore) -> None:
    entries = MemoryManifestStore()
    claims = _stage(store, entries)
    other = ManifestEntry(
        TABLES[1].base_uri, 2, f"{TABLES[1].base_key}/_versions/x.manifest-y", commit_token="y"
    )
    entries.fail_next("put_all_if_not_exists", _ambiguous(claims[0].entry))
    calls = iter([None, lambda s: s.put_if_not_exists(other)])

    def second_call_loses(s: MemoryManifestStore) -> None:
        act = next(calls, None)
        if act is not None:
            act(s)

    entries.on_call("put_all_if_not_exists", second_call_loses)

    with pytest.raises(MultiTableClaimLostError) as info:
        run(claim_all_steps(claims), store, entries)

    assert info.value.taken == {TABLES[1].base_uri: (2, other.path)}
    assert entries.latest(TABLES[0].base_uri) is None  # nothing of ours landed
    assert _staged_objects(store) == []


def test_a_refused_claim_deletes_the_staged_manifests(store: LocalObjectStore) -> None:
    entries = MemoryManifestStore()
    claims = _stage(store, entries)
    entries.fail_next(
        "put_all_if_not_exists",
        AccessDeniedError("dynamodb:TransactWriteItems", "memory", "AccessDeniedException", "no"),
    )

    with pytest.raises(AccessDeniedError):
        run(claim_all_steps(claims), store, entries)

    assert _staged_objects(store) == []
    assert [entries.latest(t.base_uri) for t in TABLES] == [None, None]


def test_a_claim_that_stays_ambiguous_is_unknown_and_keeps_everything(
    store: LocalObjectStore,
) -> None:
    entries = MemoryManifestStore()
    claims = _stage(store, entries)
    entries.fail_next("put_all_if_not_exists", _ambiguous(claims[0].entry), times=5)

    with pytest.raises(CommitStateUnknownError) as info:
        run(claim_all_steps(claims), store, entries)

    assert "lake/orders.lance" in str(info.value) and "lake/lines.lance" in str(info.value)
    assert len(_staged_objects(store)) == 2


def test_dynamodb_stores_claim_all_or_nothing(aws: Any, ddb_table_name: str) -> None:
    """Both DynamoDB stores (boto3 and aioboto3) send one TransactWriteItems:
    a held version cancels every insert and names the holder."""
    config = DynamoDBConfig.from_options(
        {"dynamodb_endpoint": aws.endpoint, "aws_region": "us-east-1"}
    )
    create_table(make_client(config), ddb_table_name)
    sync = DynamoDBManifestStore.from_config(ddb_table_name, config)

    def entry(base: str, token: str) -> ManifestEntry:
        return ManifestEntry(base, 2, f"{base}/_versions/2.manifest-{token}", 9, commit_token=token)

    held = entry("b.lance", "theirs")
    sync.put_if_not_exists(held)
    with pytest.raises(BatchEntryExistsError) as info:
        sync.put_all_if_not_exists(
            [entry("a.lance", "t1"), entry("b.lance", "t1")], request_token="r1"
        )
    assert info.value.failed == [1]
    holder = info.value.existing[1]
    assert holder is not None and holder.commit_token == "theirs"
    assert sync.latest("a.lance") is None  # cancelled: nothing of the claim landed

    async def claim() -> None:
        async with AsyncDynamoDBManifestStore.open(ddb_table_name, config) as store:
            await store.put_all_if_not_exists(
                [entry("a.lance", "t2"), entry("c.lance", "t2")], request_token="r2"
            )

    asyncio.run(claim())
    assert [sync.get(b, 2).commit_token for b in ("a.lance", "c.lance")] == ["t2", "t2"]
