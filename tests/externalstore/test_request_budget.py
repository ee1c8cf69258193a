"""The request budget of the external-store protocol, counted on the wire.

Every HTTP request our S3 and DynamoDB clients send is recorded by a botocore
``before-send`` hook (``RequestLog``). The DynamoDB table is validated
(DescribeTable) before counting starts. Budgets:

* an uncontended commit by a writer that holds its parent (the ``Committed``
  of its previous commit): PUT transaction file, PUT staged manifest, PutItem
  (claim), CopyObject, PutItem (flip), DeleteObject — no read, no LIST, no HEAD;
* the latest version: one Query; a given version: one GetItem;
* a cold open of the latest version: one Query plus one GET;
* a lost race: one Query and one GET for the winner's manifest, no LIST, no HEAD;
  the attempt after it re-stages and claims without rewriting the transaction
  file (pinned per attempt through the commit observer); K lancetx Append
  winners cost one Query and one GET (their entries' summaries settle them),
  K pylance winners one Query and K GETs, and an Overwrite among them is read;
* a writer whose process lost a round on the table moments ago takes a ticket
  in the commit queue (one UpdateItem), asks for newer versions (one Query)
  before staging instead of losing its first claim, and serves its ticket as
  soon as its claim is won (one UpdateItem).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from protocol_helpers import (
    RequestLog,
    batch,
    create_transaction,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

from lancetx.commit.engine import contention
from lancetx.commit.engine.committer import (
    CommitOptions,
    Committed,
    Parent,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.events import CommitEvent
from lancetx.commit.errors import IncompatibleConflictError
from lancetx.commit.format.manifest import read_manifest_at
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.s3store import S3Config
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.externalstore.commit_handler import (
    AsyncExternalStoreCommitHandler,
    ExternalStoreCommitHandler,
)
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb import DynamoDBConfig
from lancetx.externalstore.dynamodb_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.embedded import (
    DEFAULT_REGION,
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    EmbeddedAws,
)

ROWS = 10
COMMIT = ["PutObject", "PutObject", "PutItem", "CopyObject", "PutItem", "DeleteObject"]
READS = {"GetObject", "HeadObject", "ListObjectsV2", "Query", "GetItem", "Scan", "DescribeTable"}


@dataclass
class Counted:
    conn: TableConnection
    log: RequestLog
    options: dict[str, str]

    @property
    def handler(self) -> ExternalStoreCommitHandler:
        handler = self.conn.handler
        assert isinstance(handler, ExternalStoreCommitHandler)
        return handler

    def ops(self) -> list[str]:
        return self.log.operations()


@pytest.fixture
def counted(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Counted]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "budget.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    conn = connect(uri, options)  # validates the DynamoDB table (DescribeTable) here
    log = RequestLog()
    log.attach(conn.handler.store.client, "s3")  # type: ignore[attr-defined]
    log.attach(conn.handler.entries.client, "dynamodb")  # type: ignore[attr-defined]
    yield Counted(conn, log, options)


def append(
    counted: Counted,
    writer: str,
    seq: int,
    parent: Parent | Committed | None = None,
    options: CommitOptions | None = None,
) -> Committed:
    conn = counted.conn
    return lancetx_append(
        conn.handler,
        conn.base,
        conn.data_uri,
        counted.options,
        batch(writer, seq, ROWS),
        parent,
        options,
    )


def winners(counted: Counted, n: int) -> None:
    """``n`` appends by another writer (its own connection), uncounted."""
    other = connect(counted.conn.uri, counted.options)
    for seq in range(n):
        lancetx_append(
            other.handler, other.base, other.data_uri, counted.options, batch("winner", seq, ROWS)
        )


def test_latest_is_one_query_and_a_version_one_get_item(counted: Counted) -> None:
    location = counted.handler.resolve_latest(counted.conn.base)
    assert location is not None and location.version == 1
    assert counted.ops() == ["Query"]
    counted.log.clear()
    assert counted.handler.resolve_version(counted.conn.base, 1).version == 1
    assert counted.ops() == ["GetItem"]


def test_cold_open_is_one_query_and_one_get(counted: Counted) -> None:
    location = counted.handler.resolve_latest(counted.conn.base)
    assert location is not None
    manifest = read_manifest_at(counted.handler.store, location)
    assert manifest.manifest.version == 1
    assert counted.ops() == ["Query", "GetObject"]
    (get,) = [r for r in counted.log.requests if r.operation == "GetObject"]
    assert get.headers.get("range", "").startswith("bytes=-")  # the tail, in one request


def test_uncontended_commit_with_the_parent_in_hand_reads_nothing(counted: Counted) -> None:
    first = append(counted, "w", 0)  # cold: resolves and reads the parent
    assert counted.ops() == ["Query", "GetObject", *COMMIT]
    counted.log.clear()

    second = append(counted, "w", 1, parent=first)
    assert second.version == 3
    assert counted.ops() == COMMIT
    txn, staged, claim, copy, flip, delete = counted.log.requests
    assert "/_transactions/" in txn.url
    assert "/_versions/" in staged.url and staged.url.rsplit("/", 1)[-1].count("-") == 5
    assert copy.headers["x-amz-copy-source"].endswith(staged.url.rsplit("/", 1)[-1])
    assert delete.url == staged.url
    assert claim.service == flip.service == "dynamodb"
    assert not READS & set(counted.ops())
    assert counted.log.with_conditional_headers() == []

    counted.log.clear()
    latest = counted.handler.resolve_latest(counted.conn.base)
    assert latest is not None and latest.version == 3
    assert counted.ops() == ["Query"]


def test_a_lost_race_costs_one_query_and_one_get_per_winner(counted: Counted) -> None:
    parent = load_parent(counted.handler, counted.conn.base)
    other = connect(counted.conn.uri, counted.options)
    winner = lancetx_append(
        other.handler, other.base, other.data_uri, counted.options, batch("winner", 0, ROWS)
    )
    assert winner.version == 2
    counted.log.clear()

    ours = append(counted, "loser", 0, parent=parent)  # stale parent: loses version 2 once
    assert ours.version == 3 and ours.attempts == 2
    ops = counted.ops()
    assert ops.count("Query") == 1 and ops.count("GetObject") == 1, ops
    assert "ListObjectsV2" not in ops and "HeadObject" not in ops, ops
    assert ops[:4] == ["PutObject", "PutObject", "PutItem", "DeleteObject"]  # lost, cleaned up
    assert ops[-5:] == COMMIT[1:]


def test_async_commit_and_latest_have_the_same_budget(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    base = "budget-async.lance"
    s3_config = S3Config(
        endpoint_url=legacy_aws.endpoint,
        region=DEFAULT_REGION,
        access_key_id=FAKE_ACCESS_KEY,
        secret_access_key=FAKE_SECRET_KEY,
    )

    async def main() -> list[list[str]]:
        phases: list[list[str]] = []
        async with (
            AsyncS3ObjectStore(bucket, config=s3_config, legacy=True) as store,
            AsyncDynamoDBManifestStore.open(  # validated on open
                ddb_table_name, DynamoDBConfig.from_options(options)
            ) as entries,
        ):
            log = RequestLog()
            log.attach(await store.client(), "s3")
            log.attach(entries.client, "dynamodb")
            handler = AsyncExternalStoreCommitHandler(store, entries)
            await handler.commit(base, 1, b"v1", NamingScheme.V2)
            phases.append(log.operations())
            log.clear()
            latest = await handler.resolve_latest(base)
            assert latest is not None and latest.version == 1
            phases.append(log.operations())
        return phases

    commit, latest = asyncio.run(main())
    assert commit == COMMIT[1:]  # no transaction file: the handler is given the manifest
    assert latest == ["Query"]


@pytest.fixture
def no_recent_contention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as if this process had never lost a round."""
    monkeypatch.setattr(contention, "_tables", {})


def test_each_attempt_after_a_lost_append_race_costs_pinned_requests(
    counted: Counted, no_recent_contention: None
) -> None:
    parent = load_parent(counted.handler, counted.conn.base)
    winners(counted, 1)
    counted.log.clear()
    per_attempt: list[list[str]] = []
    events: list[CommitEvent] = []

    def observe(event: CommitEvent) -> None:
        events.append(event)
        per_attempt.append(counted.ops()[sum(len(a) for a in per_attempt) :])

    ours = append(counted, "loser", 0, parent, CommitOptions(observer=observe))

    assert ours.attempts == 2 and [e.outcome for e in events] == ["lost", "won"]
    lost, won = per_attempt
    # The lost attempt: transaction file, staged manifest, claim, cleanup; then
    # the winner is learnt: one Query, one GET of its manifest.
    assert lost == ["PutObject", "PutObject", "PutItem", "DeleteObject", "Query", "GetObject"]
    # The next attempt reuses the transaction file: the four-step commit only.
    assert won == COMMIT[1:]
    # As the loop counts them (a claim is one handler call).
    assert [e.requests for e in events] == [4, 1]


def test_k_append_winners_cost_one_query_and_one_get(
    counted: Counted, no_recent_contention: None
) -> None:
    # The winners' entries say "Append" (and their uuids): an Append is compatible
    # with them by kind alone, so only the newest manifest (the next parent) is read.
    parent = load_parent(counted.handler, counted.conn.base)
    winners(counted, 3)
    counted.log.clear()
    ours = append(counted, "loser", 0, parent)
    assert ours.version == 5 and ours.attempts == 2
    ops = counted.ops()
    assert ops.count("Query") == 1 and ops.count("GetObject") == 1, ops
    assert ops.count("PutItem") == 3 and ops.count("PutObject") == 3, ops  # 1 lost claim


def test_k_pylance_winners_cost_one_query_and_k_gets(
    counted: Counted, no_recent_contention: None
) -> None:
    # pylance's entries carry no summary: each winner's transaction is read.
    parent = load_parent(counted.handler, counted.conn.base)
    for seq in range(3):
        pylance_append(counted.conn.uri, counted.options, batch("pylance", seq, ROWS))
    counted.log.clear()
    ours = append(counted, "loser", 0, parent)
    assert ours.version == 5 and ours.attempts == 2
    ops = counted.ops()
    assert ops.count("Query") == 1 and ops.count("GetObject") == 3, ops


def test_an_overwrite_winner_is_read_and_refuses_the_append(
    counted: Counted, no_recent_contention: None
) -> None:
    # Append vs Overwrite is not decided by kind alone in ours' favour: the
    # summary must not let the loser skip it.
    parent = load_parent(counted.handler, counted.conn.base)
    other = connect(counted.conn.uri, counted.options)
    replacement = create_transaction(other.data_uri, counted.options, batch("w", 0, ROWS))
    commit_transaction(other.handler, other.base, dataclasses.replace(replacement, read_version=1))
    lancetx_append(other.handler, other.base, other.data_uri, counted.options, batch("w", 1, ROWS))
    overwrite, after = other.handler.list_versions(other.base, 1)
    assert overwrite.summary is not None and overwrite.summary.operation == "Overwrite"
    assert after.summary is not None and after.summary.operation == "Append"
    counted.log.clear()
    with pytest.raises(IncompatibleConflictError, match="Overwrite"):
        append(counted, "loser", 0, parent)
    assert counted.ops().count("GetObject") == 2  # the Overwrite's manifest, and the newest


def test_after_a_lost_round_the_next_commit_looks_before_it_stages(
    counted: Counted, no_recent_contention: None
) -> None:
    parent = load_parent(counted.handler, counted.conn.base)
    winners(counted, 1)
    first = append(counted, "loser", 0, parent)  # loses once: the table is contended
    assert first.attempts == 2
    winners(counted, 1)  # the table moves on while we prepare the next append
    counted.log.clear()

    second = append(counted, "loser", 1, first)

    assert second.attempts == 1 and second.version == first.version + 2
    # Contended moments ago: it queues (a ticket; nobody is ahead here), writes its
    # transaction file while it would wait, then looks for newer versions before
    # staging — no staged-then-lost manifest — and serves its ticket at the end.
    assert counted.ops() == [
        "UpdateItem",
        "PutObject",
        "Query",
        "GetObject",
        "PutObject",
        "PutItem",
        "UpdateItem",  # served right after the claim, before copy and flip
        "CopyObject",
        "PutItem",
        "DeleteObject",
    ]


def test_without_recent_contention_the_holder_of_its_parent_reads_nothing(
    counted: Counted, no_recent_contention: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = load_parent(counted.handler, counted.conn.base)
    winners(counted, 1)
    first = append(counted, "loser", 0, parent)
    monkeypatch.setattr(contention, "CONTENDED_FOR", 0.0)  # the lost round is long past
    counted.log.clear()
    second = append(counted, "loser", 1, first)
    assert second.attempts == 1 and counted.ops() == COMMIT
