"""The request budget of the external-store protocol, counted on the wire.

Every HTTP request our S3 and DynamoDB clients send is recorded by a botocore
``before-send`` hook (``RequestLog``), or by the server (``ServerLog``), which also
sees pylance's requests. A connection's table checks (the store's layout stamp, the
table's moved record), which ride along its first request, are done before counting
starts. Budgets:

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
  soon as its claim is won (one UpdateItem);
* connecting sends nothing; the first read is its own requests plus one BatchGetItem
  beside it (the checks), no DescribeTable; the first write of a process has one
  DescribeTable beside it (the key layout);
* an append by a writer holding its parent, counted on the server with pylance's
  data-file PUT: 7 requests (the data file + the commit), no LIST, no HEAD, no GET.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import lance
import pytest
from protocol_helpers import (
    RequestLog,
    ServerLog,
    batch,
    create_transaction,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

import lancetx
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
from lancetx.commit.format.manifest import read_manifest_at, serialized_for_pylance
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.aws_clients import clear_client_cache
from lancetx.commit.storage.s3store import S3Config
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.demo import race as demo
from lancetx.demo.embedded import DEFAULT_REGION, FAKE_ACCESS_KEY, FAKE_SECRET_KEY, EmbeddedAws
from lancetx.externalstore.commit_handler import (
    AsyncExternalStoreCommitHandler,
    ExternalStoreCommitHandler,
)
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.store import clear_validation_cache
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.dynamodb.store_schema import clear_stamp_cache

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
    conn = connect(uri, options)
    conn.handler.resolve_latest(conn.base)  # the table's checks ride on the first request
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


def test_refreshing_a_table_reads_its_manifest_only_when_a_version_is_new(
    counted: Counted,
) -> None:
    table = lancetx.open(counted.conn.uri, counted.options)
    counted.log.clear()
    assert table.refresh().version == 1 and table.latest_version == 1
    assert counted.ops() == ["Query", "Query"]  # the held version's manifest is reused
    winners(counted, 1)
    counted.log.clear()
    assert table.refresh().version == 2
    assert counted.ops() == ["Query", "GetObject"]
    assert table.count_rows() == 2 * ROWS


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
    counted: Counted, no_recent_contention: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Moments ago" however slow the machine: at a load of 38 the second append
    # started more than the 2 s after the lost round, and did not queue.
    monkeypatch.setattr(contention, "CONTENDED_FOR", 600.0)
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
    # staging — no staged-then-lost manifest. The look reads the two versions after
    # its parent by key (one consistent BatchGetItem; one landed, so it is the whole
    # news): unlike a Query from the parent on, its cost does not grow with the
    # history. Its claim serves its ticket (the entry records it): no request between
    # the claim and the copy.
    assert counted.ops() == [
        "UpdateItem",
        "PutObject",
        "BatchGetItem",
        "GetObject",
        "PutObject",
        "PutItem",
        "CopyObject",
        "PutItem",
        "DeleteObject",
    ]
    entries = counted.conn.handler.entries  # type: ignore[attr-defined]
    entry = entries.get(counted.conn.base, second.version)
    assert entry.summary is not None
    assert entry.summary.ticket == entries.read_turns(counted.conn.base).issued  # the newest


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


# ------------------------------------------------------------ cold start and data path


@pytest.fixture
def fresh_process() -> Iterator[None]:
    """As in a new process: no shared clients, no table validated or checked yet."""

    def forget() -> None:
        clear_client_cache()
        clear_validation_cache()
        clear_stamp_cache()

    forget()
    yield
    forget()


@pytest.fixture
def table_uri(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> tuple[str, dict[str, str]]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "cold.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    return uri, options


def test_a_fresh_connection_sends_nothing_before_its_first_read(
    legacy_aws: EmbeddedAws, table_uri: tuple[str, dict[str, str]], fresh_process: None
) -> None:
    uri, options = table_uri
    clear_validation_cache()  # creating the table above validated it in this process
    clear_stamp_cache()
    with ServerLog(legacy_aws) as log:
        conn = connect(uri, options)
        assert log.operations() == []  # no DescribeTable, no GetItem

        parent = load_parent(conn.handler, conn.base)
        assert parent is not None and parent.version == 1
        # The read itself (Query + GET of the manifest's tail); beside it, on another
        # thread, the checks: the store's layout stamp and the table's moved record in
        # one BatchGetItem. No DescribeTable: a read does not need one.
        assert sorted(log.operations()) == ["BatchGetItem", "GetObject", "Query"]
        log.clear()

        assert load_parent(conn.handler, conn.base) is not None
        assert log.operations() == ["Query", "GetObject"]  # checks are not repeated
        log.clear()

        # Another connection in the same process: clients and the stamp are the
        # process's; only the moved record is read again (a migration may happen while
        # the process runs).
        again = connect(uri, options)
        assert log.operations() == []
        assert load_parent(again.handler, again.base) is not None
        assert sorted(log.operations()) == ["GetItem", "GetObject", "Query"]
        log.clear()

        # The first write checks the key layout beside it, once per process.
        held = demo.lancetx_append(conn, batch("w", 0, ROWS), parent)
        assert held.version == 2
        first_write = log.operations()
        assert first_write.count("DescribeTable") == 1 and "PutItem" in first_write
        log.clear()
        held = demo.lancetx_append(again, batch("w", 1, ROWS), held)
        assert log.operations() == APPEND
    assert again.handler.store.client is conn.handler.store.client  # type: ignore[attr-defined]
    assert again.handler.entries.client is conn.handler.entries.client  # type: ignore[attr-defined]


APPEND = ["PutObject", *COMMIT]  # pylance's data file, then the commit


def test_an_append_by_the_holder_of_its_parent_is_seven_requests_on_the_server(
    legacy_aws: EmbeddedAws, table_uri: tuple[str, dict[str, str]]
) -> None:
    """Counted on the server, pylance's data-file write included: the data path opens
    no table (no LIST of _versions/, no manifest GET, no HEAD) once a writer holds it."""
    uri, options = table_uri
    conn = connect(uri, options)
    held = demo.lancetx_append(conn, batch("w", 0, ROWS), None)  # loads the parent
    with ServerLog(legacy_aws) as log:
        for seq in range(1, 4):
            held = demo.lancetx_append(conn, batch("w", seq, ROWS), held)
            assert log.operations() == APPEND, seq
            log.clear()
    assert held.version == 5
    rows = lance.dataset(uri, storage_options=options).to_table()
    assert sorted(rows.column("seq").to_pylist()) == sorted([0] * ROWS * 2 + [1, 2, 3] * ROWS)


def test_table_appends_open_pylance_from_the_held_manifest(
    legacy_aws: EmbeddedAws, table_uri: tuple[str, dict[str, str]]
) -> None:
    uri, options = table_uri
    table = lancetx.open(uri, storage_options=options)
    with ServerLog(legacy_aws) as log:
        table.append(batch("t", 0, ROWS))
        # pylance is opened on the version lancetx holds, from its manifest: one HEAD
        # (pylance's own check of the manifest's location), no LIST, no GET.
        assert sorted(log.operations()) == sorted(["HeadObject", *APPEND])
        log.clear()
        for seq in range(1, 3):
            table.append(batch("t", seq, ROWS))
            assert log.operations() == APPEND, seq
            log.clear()
    assert table.version == 4
    assert table.count_rows() == 4 * ROWS
    fresh = lance.dataset(uri, storage_options=options)
    assert fresh.version == 4 and fresh.count_rows() == 4 * ROWS
    assert fresh.schema == table.to_table().schema


def test_pylance_opened_from_a_committed_manifest_is_pylance_reading_the_file(
    table_uri: tuple[str, dict[str, str]],
) -> None:
    """The manifest lancetx hands pylance after its own commit (never read back) carries
    the file's section positions: pylance sees the same indices and transaction."""
    uri, options = table_uri
    table = lancetx.open(uri, storage_options=options)
    table.create_index("seq", "BTREE")
    version = table.append(batch("t", 1, ROWS))
    held = table._state.parent  # what the Table committed, as the commit loop built it
    assert held is not None and held.version == version

    from_file = lance.dataset(uri, version=version, storage_options=options)
    assert serialized_for_pylance(held.manifest) == from_file._ds.serialized_manifest()
    names = [i.name for i in table.dataset.describe_indices()]
    assert names and names == [i.name for i in from_file.describe_indices()]


def test_nothing_newer_than_a_version_with_an_entry_is_one_query(counted: Counted) -> None:
    # "Anything after v?" is asked by every look of a queued writer and before
    # a contended commit stages: when v has an entry, every later version has one
    # too, so an empty answer needs no listing of the object store.
    latest = counted.handler.resolve_latest(counted.conn.base)
    assert latest is not None
    counted.log.clear()
    assert counted.handler.list_versions(counted.conn.base, latest.version) == []
    assert counted.ops() == ["Query"]
    # A table whose history predates its entries still finds that history by listing.
    assert [v.version for v in counted.handler.list_versions(counted.conn.base, 0)] == [1]


#: A commit with an idempotency key: its claim is one TransactWriteItems (the version
#: item and the key item) in place of the PutItem; nothing else changes.
KEYED_COMMIT = [
    "PutObject",
    "PutObject",
    "TransactWriteItems",
    "CopyObject",
    "PutItem",
    "DeleteObject",
]


def test_a_keyed_commit_claims_its_key_in_the_same_request(counted: Counted) -> None:
    first = append(counted, "w", 0)
    counted.log.clear()
    keyed = append(counted, "w", 1, parent=first, options=CommitOptions(idempotency_key="job-1"))
    assert keyed.version == 3 and not keyed.deduplicated
    assert counted.ops() == KEYED_COMMIT
    assert len(KEYED_COMMIT) == len(COMMIT)
    counted.log.clear()

    # An unkeyed commit after it sends exactly what it always did.
    plain = append(counted, "w", 2, parent=keyed)
    assert plain.version == 4 and counted.ops() == COMMIT
    counted.log.clear()

    # The key again, from the same held parent: the claim itself is refused (one
    # request), the staged manifest and the transaction file are deleted, and the
    # version the key names is read (one GetItem, one GET).
    again = append(counted, "w", 3, parent=plain, options=CommitOptions(idempotency_key="job-1"))
    assert again.deduplicated and again.version == 3
    assert counted.ops() == [
        "PutObject",  # transaction file
        "PutObject",  # staged manifest
        "TransactWriteItems",  # refused: the key item names version 3
        "DeleteObject",  # the staged manifest
        "GetItem",  # version 3's item
        "GetObject",  # its manifest (the transaction in it)
        "DeleteObject",  # our transaction file
    ]


def test_a_keyed_table_append_looks_its_key_up_in_one_get_item_and_one_query(
    legacy_aws: EmbeddedAws, table_uri: tuple[str, dict[str, str]]
) -> None:
    """Counted on the server: the look-up before a keyed append is the key item (one
    GetItem) and the history's entries (one Query; versions lancetx claimed name their
    key there, a version pylance wrote is read once per process); then the append,
    whose claim is a TransactWriteItems."""
    uri, options = table_uri
    table = lancetx.open(uri, storage_options=options)
    with ServerLog(legacy_aws) as log:
        table.append(batch("t", 0, ROWS), idempotency_key="job-0")
        # pylance's version 1 has no summary: its manifest is read, once.
        assert sorted(log.operations()) == sorted(
            ["GetItem", "Query", "GetObject", "HeadObject", "PutObject", *KEYED_COMMIT]
        )
        log.clear()
        for seq in range(1, 3):
            table.append(batch("t", seq, ROWS), idempotency_key=f"job-{seq}")
            assert log.operations() == ["GetItem", "Query", "PutObject", *KEYED_COMMIT], seq
            log.clear()
        # Found by its key item: nothing else is sent.
        assert table.append(batch("t", 9, ROWS), idempotency_key="job-1") == 3
        assert log.operations() == ["GetItem"]
    assert table.count_rows() == 4 * ROWS


@pytest.mark.parametrize("door", ["Table.commit", "Table.commit_fragments"])
def test_committing_n_fragments_written_elsewhere_sends_no_request_per_file(
    legacy_aws: EmbeddedAws, table_uri: tuple[str, dict[str, str]], door: str
) -> None:
    """A commit of fragments written elsewhere checks that their files are objects in
    the table's data directory with one LIST of it (the table holds fewer than 1,000
    data files), not a HEAD per file; the commit is the usual six requests."""
    uri, options = table_uri
    table = lancetx.open(uri, storage_options=options)
    fragments = [
        fragment
        for seq in range(4)
        for fragment in lance.fragment.write_fragments(
            batch("elsewhere", seq, ROWS), table.data_uri, storage_options=options
        )
    ]
    files = sum(len(f.files) for f in fragments)
    assert files == 4
    with ServerLog(legacy_aws) as log:
        if door == "Table.commit":
            version = table.commit(lance.LanceOperation.Append(fragments))
        else:
            version = table.commit_fragments(fragments, schema=batch("x", 0, 1).schema).version
        assert sorted(log.operations()) == sorted(["ListObjectsV2", *COMMIT])
    assert version == 2
    assert lance.dataset(uri, storage_options=options).count_rows() == ROWS * 5
