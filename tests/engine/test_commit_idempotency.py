"""Idempotent commits: ``CommitOptions(idempotency_key=...)``.

* The key is stored in the transaction properties (``lancetx.idempotency_key``),
  visible to pylance.
* The same key committed twice from the same read version (a retried job) gives
  one version: the second call returns it with ``deduplicated=True`` and writes
  nothing — sequentially, and from two racing processes on legacy S3 through
  DynamoDB.
* A transaction retried after an unknown outcome (the same uuid) is found the
  same way.
* A different key commits normally.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import lance
import pytest
from engine_helpers import EngineTable, append_transaction, make_table, rows
from protocol_helpers import batch, ddb_uri, ensure_ddb_table, pylance_create

from lancetx.commit.engine.committer import (
    IDEMPOTENCY_KEY,
    CommitOptions,
    RetryPolicy,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10,))


def test_the_key_is_stored_in_the_transaction(table: EngineTable) -> None:
    read = table.latest()
    done = table.commit(
        append_transaction(table, rows(100, 5), read),
        parent=read,
        options=CommitOptions(idempotency_key="job-1"),
    )
    assert not done.deduplicated
    assert done.transaction.properties[IDEMPOTENCY_KEY] == "job-1"
    assert table.dataset().read_transaction(2).transaction_properties[IDEMPOTENCY_KEY] == "job-1"


def test_the_same_key_committed_twice_gives_one_version(table: EngineTable) -> None:
    read = table.latest()
    options = CommitOptions(idempotency_key="job-7")
    first = table.commit(append_transaction(table, rows(100, 5), read), options=options)
    before = (table.versions(), table.listing("_versions"), table.listing("_transactions"))

    # The job is retried: it writes its data again and commits from the same read version.
    again = table.commit(append_transaction(table, rows(100, 5), read), options=options)

    assert again.deduplicated and not first.deduplicated
    assert again.version == first.version == 2
    assert again.transaction.uuid == first.transaction.uuid
    assert again.attempts == 1
    assert (table.versions(), table.listing("_versions"), table.listing("_transactions")) == before
    assert table.values() == [*range(10), *range(100, 105)]


def test_the_key_is_found_after_a_lost_round(table: EngineTable) -> None:
    """The caller holds a stale parent (its read version): the first claim loses,
    the loop loads the winners and finds its key among them."""
    read = table.latest()
    options = CommitOptions(idempotency_key="stream-batch-3")
    first = table.commit(append_transaction(table, rows(100, 5), read), options=options)
    other = table.commit(append_transaction(table, rows(200, 5), first), parent=first)
    assert other.version == 3

    again = table.commit(
        append_transaction(table, rows(100, 5), read), parent=read, options=options
    )

    assert again.deduplicated and again.version == first.version == 2
    assert again.attempts == 2  # one lost claim, then the key found
    assert table.versions() == [1, 2, 3]


def test_a_transaction_retried_after_an_unknown_outcome_is_found_by_its_uuid(
    table: EngineTable,
) -> None:
    read = table.latest()
    txn = append_transaction(table, rows(100, 5), read)
    first = table.commit(txn, parent=read)
    again = table.commit(txn, parent=read)
    assert again.deduplicated and again.version == first.version == 2
    assert table.versions() == [1, 2]


def test_another_key_commits_normally(table: EngineTable) -> None:
    read = table.latest()
    table.commit(
        append_transaction(table, rows(100, 5), read),
        options=CommitOptions(idempotency_key="a"),
    )
    other = table.commit(
        append_transaction(table, rows(200, 5), read),
        options=CommitOptions(idempotency_key="b"),
    )
    assert not other.deduplicated and other.version == 3


def racing_commit(uri: str, options: dict[str, str], key: str, start: Any) -> tuple[int, bool]:
    """A spawned process: write the data, wait for the other one, commit with ``key``."""
    conn = connect(uri, options)
    read = load_parent(conn.handler, conn.base)
    assert read is not None
    fragments = lance.fragment.write_fragments(
        batch("racer", 0, 10), conn.data_uri, storage_options=options
    )
    txn = Transaction(
        read_version=read.version,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
    )
    start.wait()
    done = commit_transaction(
        conn.handler,
        conn.base,
        txn,
        parent=read,
        options=CommitOptions(idempotency_key=key, retry=RetryPolicy(base_delay=0.001)),
    )
    return done.version, done.deduplicated


def test_two_racing_processes_with_the_same_key_make_one_version(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "idem.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, 10))
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(2)
        with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
            results = list(
                pool.map(racing_commit, [uri] * 2, [options] * 2, ["job-42"] * 2, [start] * 2)
            )
    assert sorted(results) == [(2, False), (2, True)], results
    ds = lance.dataset(uri, storage_options=options)
    assert [int(v["version"]) for v in ds.versions()] == [1, 2]
    assert ds.count_rows() == 20
