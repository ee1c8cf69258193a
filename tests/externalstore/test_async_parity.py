"""Sync/async parity for history the external store does not hold, and for recovery.

Issue 4: the aioboto3 handler must answer like the boto3 one, from one protocol
implementation. Every scenario runs through :class:`ExternalStoreCommitHandler`
(boto3) and :class:`AsyncExternalStoreCommitHandler` (aioboto3) on the moto
server with a legacy bucket, and most check the requests sent too:

* tables written before DynamoDB: onboarding (also past a stale listing),
  reading a pre-DynamoDB version (HEAD, then backfill so no claim can overwrite
  it; cleanup gaps), listing versions with entries for only some of them;
* crash after staging, crash after the flip, a failing copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import lance
import pytest
from protocol_helpers import (
    BOUNDARIES,
    Crash,
    RequestLog,
    batch,
    crash_after,
    ddb_uri,
    ensure_ddb_table,
    pylance_append,
    pylance_create,
)
from test_async_protocol import BASE, KINDS, ROWS, V2, Env, Side, real_manifest, s3_config

from lancetx.commit.errors import VersionAlreadyExistsError, VersionNotFoundError
from lancetx.commit.format.naming import manifest_key
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.demo.embedded import (
    DEFAULT_REGION,
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    EmbeddedAws,
    InterceptedRequest,
    InterceptedResponse,
)
from lancetx.externalstore.commit_handler import (
    AsyncExternalStoreCommitHandler,
    ExternalStoreCommitHandler,
)
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore

PLAIN_ROWS = 5

# ------------------------------------------------------------------------- machinery


class HidingS3Store(S3ObjectStore):
    """A legacy S3 store whose listing misses ``hidden`` keys (a stale listing);
    reads of one key stay consistent."""

    hidden: frozenset[str] = frozenset()

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        return (meta for meta in super().list(prefix) if meta.key not in self.hidden)


class AsyncHidingS3Store(AsyncS3ObjectStore):
    """The aioboto3 twin of :class:`HidingS3Store`."""

    hidden: frozenset[str] = frozenset()

    async def list(self, prefix: str) -> list[ObjectMeta]:
        return [meta for meta in await super().list(prefix) if meta.key not in self.hidden]


class ParitySide(Side):
    """A :class:`Side` that also records the S3 and DynamoDB requests it sends."""

    def __init__(self, kind: str, handler: Any, store: Any, entries: Any, log: RequestLog) -> None:
        super().__init__(kind, handler, store, entries)
        self.log = log

    async def list_since(self, since: int) -> list[int]:
        listed = await self._call(self.handler.list_versions(BASE, since))
        return [loc.version for loc in listed]

    def ops(self) -> list[str]:
        operations = self.log.operations()
        self.log.clear()
        return operations


@contextlib.asynccontextmanager
async def open_side(
    kind: str, env: Env, hidden: frozenset[str] = frozenset()
) -> AsyncIterator[ParitySide]:
    config = DynamoDBConfig.from_options(env.options)
    log = RequestLog()
    if kind == "sync":
        store = HidingS3Store(env.bucket, config=s3_config(env.aws), legacy=True)
        store.hidden = hidden
        entries = DynamoDBManifestStore.from_config(env.ddb_table, config)
        log.attach(store.client, "s3")
        log.attach(entries.client, "dynamodb")
        try:
            yield ParitySide(kind, ExternalStoreCommitHandler(store, entries), store, entries, log)
        finally:
            store.close()
        return
    async with (
        AsyncHidingS3Store(env.bucket, config=s3_config(env.aws), legacy=True) as astore,
        AsyncDynamoDBManifestStore.open(env.ddb_table, config) as aentries,
    ):
        astore.hidden = hidden
        log.attach(await astore.client(), "s3")
        log.attach(aentries.client, "dynamodb")
        handler = AsyncExternalStoreCommitHandler(astore, aentries)
        yield ParitySide(kind, handler, astore, aentries, log)


def play(kind: str, env: Env, scenario: Any, hidden: frozenset[str] = frozenset()) -> None:
    async def main() -> None:
        async with open_side(kind, env, hidden) as side:
            side.log.clear()
            await scenario(side, env)

    try:
        asyncio.run(main())
    finally:
        env.aws.set_interceptor(None)


def plain_env(aws: EmbeddedAws, bucket: str, ddb_table: str, versions: int) -> Env:
    """A table at ``BASE`` written by plain pylance (no DynamoDB): versions 1..``versions``."""
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table)
    made = Env(aws, bucket, ddb_table, options)
    plain = f"s3://{bucket}/{BASE}"
    pylance_create(plain, options, batch("plain", 0, PLAIN_ROWS))
    for seq in range(1, versions):
        pylance_append(plain, options, batch("plain", seq, PLAIN_ROWS))
    assert made.items() == []
    return made


def key(version: int) -> str:
    return manifest_key(BASE, version, V2)


def versions_of(env: Env) -> list[int]:
    return sorted(int(i["version"]["N"]) for i in env.items())


@pytest.fixture
def legacy3(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Env:
    return plain_env(legacy_aws, bucket, ddb_table_name, 3)


@pytest.fixture
def legacy5(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Env:
    return plain_env(legacy_aws, bucket, ddb_table_name, 5)


@pytest.fixture
def env(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Env:
    """Version 1 created through DynamoDB by pylance."""
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    made = Env(legacy_aws, bucket, ddb_table_name, options)
    pylance_create(made.uri, options, batch("setup", 0, ROWS))
    return made


# ------------------------------------------------------------------ the audit's case


def test_async_handler_sees_pre_dynamodb_history_like_the_sync_one(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """The acceptance audit's case (issue 4), as it was proposed: on a table written
    before DynamoDB the aioboto3 handler lists and opens the old versions, as the
    boto3 one and pylance do."""
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    base = "old.lance"
    plain = f"s3://{bucket}/{base}"
    for seq in range(3):
        lance.write_dataset(
            batch("plain", seq, 5),
            plain,
            mode="create" if seq == 0 else "append",
            storage_options=options,
        )
    s3 = S3Config(
        endpoint_url=legacy_aws.endpoint,
        region=DEFAULT_REGION,
        access_key_id=FAKE_ACCESS_KEY,
        secret_access_key=FAKE_SECRET_KEY,
    )

    async def async_view() -> tuple[int | None, list[int], int]:
        async with (
            AsyncS3ObjectStore(bucket, config=s3, legacy=True) as store,
            AsyncDynamoDBManifestStore.open(
                ddb_table_name, DynamoDBConfig.from_options(options)
            ) as entries,
        ):
            handler = AsyncExternalStoreCommitHandler(store, entries)
            latest = await handler.resolve_latest(base)
            listed = [loc.version for loc in await handler.list_versions(base, 0)]
            first = (await handler.resolve_version(base, 1)).version
            return (latest.version if latest else None), listed, first

    latest, listed, first = asyncio.run(async_view())
    conn = connect(ddb_uri(bucket, base, ddb_table_name), options)
    assert latest == 3
    assert listed == [loc.version for loc in conn.handler.list_versions(conn.base, 0)] == [1, 2, 3]
    assert first == conn.handler.resolve_version(conn.base, 1).version == 1
    assert lance.dataset(plain, version=1, storage_options=options).count_rows() == 5


# ----------------------------------------------------------------------- onboarding


@pytest.mark.parametrize("kind", KINDS)
def test_onboarding_then_the_pre_dynamodb_history(kind: str, legacy3: Env) -> None:
    """Onboarding records the newest version only (one LIST, one probe); listing
    finds the older ones without writing; reading version 1 records 1 and 2, so a
    writer building on it loses its claim of 2 instead of overwriting it."""
    v2_before = legacy3.body(key(2))

    async def scenario(side: ParitySide, env: Env) -> None:
        latest = await side.resolve_latest()
        assert latest is not None and (latest.version, latest.key) == (3, key(3))
        assert side.ops() == ["Query", "ListObjectsV2", "HeadObject", "PutItem"]
        assert versions_of(env) == [3]

        assert [loc.key for loc in await side.list_versions()] == [key(1), key(2), key(3)]
        assert side.ops() == ["Query", "ListObjectsV2"]
        assert await side.list_since(1) == [2, 3]
        assert side.ops() == ["Query", "ListObjectsV2"]
        assert await side.list_since(2) == [3]
        assert side.ops() == ["Query"]  # no gap below the entries: nothing listed
        assert versions_of(env) == [3]  # listing writes nothing

        first = await side.resolve_version(1)
        assert (first.version, first.key) == (1, key(1))
        assert side.ops() == [
            "GetItem",  # no entry for version 1
            "HeadObject",  # its manifest
            "Query",  # the table is onboarded already
            "PutItem",  # backfill 1
            "GetItem",
            "HeadObject",
            "PutItem",  # backfill 2
            "GetItem",  # 3 has an entry: the store takes over
        ]
        assert versions_of(env) == [1, 2, 3]
        assert [loc.version for loc in await side.list_versions()] == [1, 2, 3]
        assert side.ops() == ["Query"]

        with pytest.raises(VersionAlreadyExistsError) as lost:
            await side.commit(2, b"built on version 1")
        assert lost.value.winner is not None and lost.value.winner.key == key(2)
        assert (await side.resolve_version(2)).key == key(2)

    play(kind, legacy3, scenario)
    assert legacy3.body(key(2)) == v2_before
    assert legacy3.staged() == []
    ds = lance.dataset(legacy3.uri, storage_options=legacy3.options)
    assert ds.version == 3 and ds.count_rows() == 3 * PLAIN_ROWS
    old = lance.dataset(legacy3.uri, version=1, storage_options=legacy3.options)
    assert old.count_rows() == PLAIN_ROWS


@pytest.mark.parametrize("kind", KINDS)
def test_onboarding_probes_past_a_stale_listing_and_listing_fills_gaps_by_head(
    kind: str, legacy3: Env
) -> None:
    hidden = frozenset({key(2), key(3)})

    async def scenario(side: ParitySide, env: Env) -> None:
        latest = await side.resolve_latest()
        assert latest is not None and (latest.version, latest.key) == (3, key(3))
        probes = ["HeadObject"] * 3  # 2 and 3 found, 4 missing
        assert side.ops() == ["Query", "ListObjectsV2", *probes, "PutItem"]
        # entries: [3]; the listing shows only 1; version 2 comes from a HEAD
        assert [loc.key for loc in await side.list_versions()] == [key(1), key(2), key(3)]
        assert side.ops() == ["Query", "ListObjectsV2", "HeadObject"]
        assert (await side.commit(4, b"next")).key == key(4)

    play(kind, legacy3, scenario, hidden)
    assert versions_of(legacy3) == [3, 4]
    assert legacy3.body(key(4)) == b"next"


@pytest.mark.parametrize("kind", KINDS)
def test_a_table_without_manifests_is_empty(
    kind: str, legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    empty = Env(legacy_aws, bucket, ddb_table_name, options)

    async def scenario(side: ParitySide, env: Env) -> None:
        assert await side.resolve_latest() is None
        assert side.ops() == ["Query", "ListObjectsV2"]
        assert await side.list_versions() == []
        with pytest.raises(VersionNotFoundError) as info:
            await side.resolve_version(1)
        assert info.value.version == 1 and "no manifest" in str(info.value)

    play(kind, empty, scenario)
    assert empty.items() == []


def test_sync_onboarding_stops_listing_at_the_newest_v2_manifest(legacy3: Env) -> None:
    """On a lexically ordered store the first V2 manifest listed is the newest: the
    boto3 store fetches no page past it (pages of one key here)."""
    store = S3ObjectStore(legacy3.bucket, config=s3_config(legacy3.aws), legacy=True, page_size=1)
    entries = DynamoDBManifestStore.from_config(
        legacy3.ddb_table, DynamoDBConfig.from_options(legacy3.options)
    )
    log = RequestLog().attach(store.client, "s3")
    try:
        latest = ExternalStoreCommitHandler(store, entries).resolve_latest(BASE)
    finally:
        store.close()
    assert latest is not None and latest.version == 3
    assert log.operations("s3") == ["ListObjectsV2", "HeadObject"]


# ---------------------------------------------------------- pre-DynamoDB versions


@pytest.mark.parametrize("kind", KINDS)
def test_reading_an_old_version_of_a_never_onboarded_table_onboards_it_first(
    kind: str, legacy5: Env
) -> None:
    """Backfilled entries alone would make version 4 the store's latest while 5
    exists: a writer would claim 5 and overwrite its manifest."""

    async def scenario(side: ParitySide, env: Env) -> None:
        second = await side.resolve_version(2)
        assert (second.version, second.key) == (2, key(2))
        assert versions_of(env) == [2, 3, 4, 5]
        latest = await side.resolve_latest()
        assert latest is not None and latest.version == 5
        with pytest.raises(VersionAlreadyExistsError):
            await side.commit(5, b"over the newest")
        with pytest.raises(VersionAlreadyExistsError):
            await side.commit(3, b"built on version 2")
        assert [loc.version for loc in await side.list_versions()] == [1, 2, 3, 4, 5]

    before = {v: legacy5.body(key(v)) for v in range(1, 6)}
    play(kind, legacy5, scenario)
    assert {v: legacy5.body(key(v)) for v in range(1, 6)} == before
    assert legacy5.staged() == []


@pytest.mark.parametrize("kind", KINDS)
def test_backfill_across_a_cleanup_gap_records_the_deleted_version(kind: str, legacy5: Env) -> None:
    """Version 3's manifest was cleaned up (2 kept, e.g. tagged). Reading 2 records
    3 too (at its missing final name), so a writer building on 2 loses instead of
    committing a version 3 below the latest that no reader would see."""
    legacy5.s3().delete_object(Bucket=legacy5.bucket, Key=key(3))

    async def scenario(side: ParitySide, env: Env) -> None:
        assert (await side.resolve_version(2)).key == key(2)
        assert versions_of(env) == [2, 3, 5]
        assert env.item(3)["path"]["S"] == key(3)
        latest = await side.resolve_latest()
        assert latest is not None and latest.version == 5
        with pytest.raises(VersionAlreadyExistsError):
            await side.commit(3, b"built on version 2")
        assert (await side.commit(6, b"next")).version == 6
        with pytest.raises(VersionNotFoundError):
            await side.resolve_version(7)

    play(kind, legacy5, scenario)
    assert key(3) not in legacy5.object_keys()
    assert versions_of(legacy5) == [2, 3, 5, 6]


# ---------------------------------------------------------------------- recovery


@pytest.mark.parametrize("kind", KINDS)
def test_crash_after_staging_claims_nothing(kind: str, env: Env) -> None:
    _, crashed = real_manifest(env, "crashed")
    _, survivor = real_manifest(env, "survivor")

    async def scenario(side: ParitySide, env: Env) -> None:
        steps = side.handler.commit_steps(BASE, 2, crashed, V2)
        with pytest.raises(Crash):
            await side.run(crash_after(steps, BOUNDARIES["after_stage"]))
        (orphan,) = env.staged()
        assert versions_of(env) == [1]
        side.log.clear()
        latest = await side.resolve_latest()
        assert latest is not None and latest.version == 1
        assert side.ops() == ["Query"]
        location = await side.commit(2, survivor)
        assert location.key == key(2) and side.last_outcome and side.last_outcome.finalized
        assert env.staged() == [orphan]  # unreferenced: never read, safe to delete

    play(kind, env, scenario)
    assert env.body(key(2)) == survivor
    ds = lance.dataset(env.uri, storage_options=env.options)
    assert ds.version == 2 and ds.count_rows() == 2 * ROWS
    assert set(ds.to_table().column("writer").to_pylist()) == {"setup", "survivor"}


@pytest.mark.parametrize("kind", KINDS)
def test_crash_after_the_flip_is_committed_and_final(kind: str, env: Env) -> None:
    _, crashed = real_manifest(env, "crashed")

    async def scenario(side: ParitySide, env: Env) -> None:
        steps = side.handler.commit_steps(BASE, 2, crashed, V2)
        with pytest.raises(Crash):
            await side.run(crash_after(steps, BOUNDARIES["after_flip"]))
        (leftover,) = env.staged()
        assert env.item(2)["path"]["S"] == key(2)
        side.log.clear()
        latest = await side.resolve_latest()
        assert latest is not None and (latest.key, latest.alternate_key) == (key(2), None)
        assert side.ops() == ["Query"]  # final already: nothing to finish
        assert (await side.resolve_version(2)).key == key(2)
        assert env.staged() == [leftover]
        with pytest.raises(VersionAlreadyExistsError):
            await side.commit(2, b"late")

    play(kind, env, scenario)
    assert env.body(key(2)) == crashed
    ds = lance.dataset(env.uri, storage_options=env.options)
    assert ds.version == 2 and ds.count_rows() == 2 * ROWS


class FailingCopies:
    """Answers every S3 CopyObject with a 500 while armed."""

    def __init__(self) -> None:
        self.fired = 0
        self.lock = threading.Lock()

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if not (
            request.service == "s3"
            and request.method == "PUT"
            and "x-amz-copy-source" in request.headers
        ):
            return None
        with self.lock:
            self.fired += 1
        body = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code></Error>"
        return InterceptedResponse(500, body, [("Content-Type", "application/xml")])


@pytest.mark.parametrize("kind", KINDS)
def test_copy_failure_leaves_a_committed_version_that_readers_finalize(kind: str, env: Env) -> None:
    _, manifest = real_manifest(env, "w")
    failing = FailingCopies()

    async def scenario(side: ParitySide, env: Env) -> None:
        env.aws.set_interceptor(failing)
        location = await side.commit(2, manifest)
        env.aws.set_interceptor(None)
        assert failing.fired >= 1
        assert side.last_outcome is not None and not side.last_outcome.finalized
        assert location.version == 2 and location.alternate_key == key(2)  # staged, readable
        (staged,) = env.staged()
        assert location.key == staged == env.item(2)["path"]["S"]
        assert key(2) not in env.object_keys()

        latest = await side.resolve_latest()  # the reader finishes the commit
        assert latest is not None and (latest.key, latest.alternate_key) == (key(2), None)
        assert env.item(2)["path"]["S"] == key(2) and env.staged() == []
        assert (await side.commit(3, b"next")).version == 3

    play(kind, env, scenario)
    assert env.body(key(2)) == manifest
    ds = lance.dataset(env.uri, version=2, storage_options=env.options)
    assert ds.count_rows() == 2 * ROWS
