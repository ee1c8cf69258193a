"""The commit loop through the asyncio API (aioboto3, moto's server over HTTP).

``commit_transaction_async`` / ``load_parent_async`` drive the very steps the
sync API drives (``commit_steps``), through an ``AsyncCommitHandler``:

* an append lands and pylance reads it; ``load_parent_async`` returns it;
* concurrent async writers racing on one table (tasks, one stale parent
  each): every append lands exactly once, history contiguous, lost rounds retried;
* an idempotency key committed twice gives one version;
* two concurrent deletes of different rows of one fragment both land (rebase).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import lance
import pytest
from engine_helpers import EngineTable, delete_transaction
from protocol_helpers import batch, ddb_uri, ensure_ddb_table, pylance_create, rows_by_append

from lancetx.commit.engine.committer import (
    CommitOptions,
    Committed,
    Parent,
    RetryPolicy,
    commit_transaction_async,
    load_parent_async,
)
from lancetx.commit.engine.events import CommitEvent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.handlers.interface import AsyncCommitHandler
from lancetx.commit.storage.s3store import S3Config
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.demo.embedded import DEFAULT_REGION, FAKE_ACCESS_KEY, FAKE_SECRET_KEY, EmbeddedAws
from lancetx.externalstore.commit_handler import AsyncExternalStoreCommitHandler
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.dynamodb.uri import parse_ddb_uri

T = TypeVar("T")
ROWS = 10
FAST = CommitOptions(retry=RetryPolicy(base_delay=0.002, max_delay=0.05, max_elapsed=60))


class Env:
    def __init__(self, aws: EmbeddedAws, uri: str, options: dict[str, str], bucket: str) -> None:
        self.aws = aws
        self.uri = uri
        self.options = options
        self.bucket = bucket
        parsed = parse_ddb_uri(uri)
        self.base = parsed.base_key
        self.data_uri = parsed.s3_uri
        self.table_name = parsed.table_name

    @asynccontextmanager
    async def handler(self) -> AsyncIterator[AsyncCommitHandler]:
        config = S3Config(
            endpoint_url=self.aws.endpoint,
            region=DEFAULT_REGION,
            access_key_id=FAKE_ACCESS_KEY,
            secret_access_key=FAKE_SECRET_KEY,
        )
        async with (
            AsyncS3ObjectStore(self.bucket, config=config, legacy=True) as store,
            AsyncDynamoDBManifestStore.open(
                self.table_name, DynamoDBConfig.from_options(self.options)
            ) as entries,
        ):
            yield AsyncExternalStoreCommitHandler(store, entries)

    def append(self, writer: str, seq: int, read: Parent | Committed) -> Transaction:
        fragments = lance.fragment.write_fragments(
            batch(writer, seq, ROWS), self.data_uri, storage_options=self.options
        )
        return Transaction(
            read_version=read.version,
            operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        )

    def dataset(self) -> lance.LanceDataset:
        return lance.dataset(self.uri, storage_options=self.options)


@pytest.fixture
def env(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Env:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "async.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    return Env(legacy_aws, uri, options, bucket)


def arun(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


def test_an_async_append_lands_and_pylance_reads_it(env: Env) -> None:
    async def main() -> tuple[Committed, Parent | None]:
        async with env.handler() as handler:
            read = await load_parent_async(handler, env.base)
            assert read is not None and read.version == 1
            done = await commit_transaction_async(
                handler, env.base, env.append("w", 0, read), parent=read
            )
            return done, await load_parent_async(handler, env.base)

    done, latest = arun(main)
    assert done.version == 2 and done.attempts == 1
    assert latest is not None and latest.version == 2
    assert latest.manifest.manifest.fragments == done.manifest.manifest.fragments
    assert env.dataset().count_rows() == 2 * ROWS


def test_racing_async_writers_all_land_exactly_once(env: Env) -> None:
    writers, appends = 4, 3
    events: list[CommitEvent] = []

    async def writer(handler: AsyncCommitHandler, name: str, read: Parent) -> list[Committed]:
        done: list[Committed] = []
        parent: Parent | Committed = read
        for seq in range(appends):
            txn = await asyncio.to_thread(env.append, name, seq, parent)
            options = CommitOptions(retry=FAST.retry, observer=events.append)
            parent = await commit_transaction_async(
                handler, env.base, txn, parent=parent, options=options
            )
            done.append(parent)
        return done

    async def main() -> list[list[Committed]]:
        async with env.handler() as handler:
            read = await load_parent_async(handler, env.base)
            assert read is not None
            return await asyncio.gather(*(writer(handler, f"w{i}", read) for i in range(writers)))

    results = arun(main)
    versions = sorted(c.version for done in results for c in done)
    assert versions == list(range(2, 2 + writers * appends))
    assert any(c.attempts > 1 for done in results for c in done)  # they really raced
    assert len(events) == sum(c.attempts for done in results for c in done)
    ds = env.dataset()
    assert [int(v["version"]) for v in ds.versions()] == list(range(1, 2 + writers * appends))
    expected = {("setup", 0): ROWS} | {
        (f"w{i}", s): ROWS for i in range(writers) for s in range(appends)
    }
    assert rows_by_append(ds.to_table(columns=["writer", "seq", "i"])) == expected


def test_an_async_idempotent_commit_gives_one_version(env: Env) -> None:
    async def main() -> tuple[Committed, Committed]:
        async with env.handler() as handler:
            read = await load_parent_async(handler, env.base)
            assert read is not None
            options = CommitOptions(idempotency_key="batch-9")
            first = await commit_transaction_async(
                handler, env.base, env.append("w", 0, read), parent=read, options=options
            )
            again = await commit_transaction_async(
                handler, env.base, env.append("w", 0, read), parent=read, options=options
            )
            return first, again

    first, again = arun(main)
    assert again.deduplicated and again.version == first.version == 2
    assert [int(v["version"]) for v in env.dataset().versions()] == [1, 2]


def test_concurrent_async_deletes_of_one_fragment_rebase(env: Env) -> None:
    sync = connect(env.uri, env.options)
    table = EngineTable(env.uri, env.options, sync)
    read = table.latest()
    first = delete_transaction(table, read, {0: [1]}, "i = 1")
    second = delete_transaction(table, read, {0: [2]}, "i = 2")

    async def main() -> list[Committed]:
        async with env.handler() as handler:
            return list(
                await asyncio.gather(
                    commit_transaction_async(handler, env.base, first, parent=read, options=FAST),
                    commit_transaction_async(handler, env.base, second, parent=read, options=FAST),
                )
            )

    done = arun(main)
    assert sorted(c.version for c in done) == [2, 3]
    assert [c.rebased for c in sorted(done, key=lambda c: c.version)] == [False, True]
    values = env.dataset().to_table(columns=["i"])["i"].to_pylist()
    assert sorted(values) == [i for i in range(ROWS) if i not in (1, 2)]


def test_an_async_claim_refuses_a_key_committed_before_the_parent(env: Env) -> None:
    """The async handler claims the key with the version (TransactWriteItems through
    aioboto3): a key committed before the parent the caller holds, where the commit
    loop never looks, refuses the claim, and its version comes back deduplicated."""

    async def main() -> tuple[Committed, Committed, Committed, int | None, int | None]:
        async with env.handler() as handler:
            read = await load_parent_async(handler, env.base)
            assert read is not None
            options = CommitOptions(idempotency_key="batch-9")
            first = await commit_transaction_async(
                handler, env.base, env.append("w", 0, read), parent=read, options=options
            )
            later = await commit_transaction_async(
                handler, env.base, env.append("w", 1, first), parent=first
            )
            again = await commit_transaction_async(
                handler, env.base, env.append("w", 2, later), parent=later, options=options
            )
            found = await handler.find_key(env.base, "batch-9")
            absent = await handler.find_key(env.base, "batch-10")
            return first, later, again, found, absent

    first, later, again, found, absent = arun(main)
    assert (first.version, later.version) == (2, 3)
    assert (
        again.deduplicated
        and again.version == 2
        and again.transaction.uuid == first.transaction.uuid
    )
    assert (found, absent) == (2, None)
    assert [int(v["version"]) for v in env.dataset().versions()] == [1, 2, 3]
