"""``commit_many`` beside single-table writers, and retried after an unknown outcome.

Real parts: the embedded server over HTTP (legacy S3, DynamoDB claims), tables
created and read by pylance, data files written by pylance, faults injected with
the server's interceptor.

* Single-table appenders take turns in each table's commit queue and claim back
  to back; a multi-table commit that stays outside the queue loses nearly every
  round to them (it needs a fresh round of all its tables between two claims).
  It takes its turn in the queues too, and lands.
* A ``commit_many`` whose claim landed with every answer lost raises
  CommitStateUnknownError; calling it again with the same transactions returns
  the landed versions (deduplicated), committing nothing twice.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import lance
import pyarrow as pa
import pytest
from protocol_helpers import ddb_uri, ensure_ddb_table

import lancetx
from lancetx.commit.engine.committer import CommitOptions, commit_transaction, load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import CommitStateUnknownError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.connect import connect
from lancetx.externalstore.multi_table import TableCommit
from lancetx.externalstore.multi_table import commit_many as commit_many_committed

#: Single-table appenders beside the multi-table commits, and the most each appends.
APPENDERS = 4
MAX_APPENDS = 40
#: Multi-table commits made while they append.
ROUNDS = 3


@dataclass
class Lake:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    options: dict[str, str]

    def create(self, name: str) -> str:
        uri = ddb_uri(self.bucket, f"{name}.lance", self.ddb_table)
        lance.write_dataset(_rows(name, 0), uri, storage_options=self.options)
        return uri

    def version(self, uri: str) -> int:
        return int(lance.dataset(uri, storage_options=self.options).version)

    def rows(self, uri: str) -> Counter[tuple[str, int]]:
        table = lance.dataset(uri, storage_options=self.options).to_table()
        return Counter(zip(table["src"].to_pylist(), table["seq"].to_pylist(), strict=True))

    def append(self, uri: str, src: str, seq: int, read_version: int | None = None) -> Transaction:
        """Our Append of two rows, planned at ``read_version`` (default: the latest)."""
        conn = connect(uri, self.options)
        read = self.version(uri) if read_version is None else read_version
        fragments = lance.fragment.write_fragments(
            _rows(src, seq), conn.data_uri, storage_options=self.options
        )
        return Transaction(
            read_version=read,
            operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        )


def _rows(src: str, seq: int) -> pa.Table:
    return pa.table({"src": pa.array([src] * 2), "seq": pa.array([seq] * 2, pa.int64())})


@pytest.fixture
def lake(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Lake]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    yield Lake(legacy_aws, bucket, ddb_table_name, options)
    legacy_aws.set_interceptor(None)


def test_commit_many_lands_beside_single_table_appenders(lake: Lake) -> None:
    """Four appenders keep one table's queue busy while multi-table commits of that
    table and another one are made: each multi-table commit lands within its default
    budget (it used to give up after 20 lost rounds), and every acknowledged append
    and multi-table commit is in the tables exactly once."""
    busy, quiet = lake.create("busy"), lake.create("quiet")
    stop = threading.Event()
    acked: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def appender(name: str) -> None:
        conn = connect(busy, lake.options)
        parent = load_parent(conn.handler, conn.base)
        try:
            for seq in range(MAX_APPENDS):
                if stop.is_set():
                    return
                assert parent is not None
                fragments = lance.fragment.write_fragments(
                    _rows(name, seq), conn.data_uri, storage_options=lake.options
                )
                txn = Transaction(
                    read_version=parent.version,
                    operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
                )
                parent = commit_transaction(
                    conn.handler, conn.base, txn, parent=parent, options=CommitOptions()
                )
                with lock:
                    acked.append((name, seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=appender, args=(f"a{i}",)) for i in range(APPENDERS)]
    for t in threads:
        t.start()
    published: list[dict[str, int]] = []
    try:
        while len(acked) < APPENDERS and not errors:  # the appenders are under way
            stop.wait(0.05)
        for round_ in range(ROUNDS):
            txns = {
                busy: lake.append(busy, "many", round_),
                quiet: lake.append(quiet, "many", round_),
            }
            published.append(lancetx.commit_many(txns, storage_options=lake.options))
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    assert not errors, errors
    assert len(published) == ROUNDS
    busy_rows, quiet_rows = lake.rows(busy), lake.rows(quiet)
    for round_ in range(ROUNDS):
        assert busy_rows[("many", round_)] == quiet_rows[("many", round_)] == 2
    for key in acked:
        assert busy_rows[key] == 2
    assert sum(busy_rows.values()) == 2 * (1 + len(acked) + ROUNDS)
    assert lake.version(busy) == 1 + len(acked) + ROUNDS
    assert lake.version(quiet) == 1 + ROUNDS


def _lost_answer(request: InterceptedRequest) -> InterceptedResponse | None:
    if request.service == "dynamodb" and request.target == "TransactWriteItems":
        body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"})
        return InterceptedResponse(
            500,
            body.encode(),
            [("Content-Type", "application/x-amz-json-1.0")],
            after_forwarding=True,
        )
    return None


def test_a_retry_after_an_unknown_outcome_whose_claim_landed_returns_the_landed_versions(
    lake: Lake,
) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    txns = {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)}
    lake.aws.set_interceptor(_lost_answer)
    with pytest.raises(CommitStateUnknownError):
        lancetx.commit_many(txns, storage_options=lake.options)
    lake.aws.set_interceptor(None)
    assert (lake.version(orders), lake.version(lines)) == (2, 2)  # it did land

    # The same transactions again: the landed versions, nothing committed twice.
    assert lancetx.commit_many(txns, storage_options=lake.options) == {orders: 2, lines: 2}
    commits = [TableCommit(connect(uri, lake.options), txn) for uri, txn in txns.items()]
    again = commit_many_committed(commits)
    assert [c.version for c in again] == [2, 2]
    assert all(c.deduplicated for c in again)
    assert [c.transaction.uuid for c in again] == [txn.uuid for txn in txns.values()]
    assert (lake.version(orders), lake.version(lines)) == (2, 2)
    assert lake.rows(orders) == Counter({("orders", 0): 2, ("o", 1): 2})
    assert lake.rows(lines) == Counter({("lines", 0): 2, ("l", 1): 2})


def test_a_retry_that_finds_one_table_committed_commits_the_other(lake: Lake) -> None:
    """A transaction committed already (same uuid) is returned as is while the others
    are committed: the caller's retry never commits one twice."""
    orders, lines = lake.create("orders"), lake.create("lines")
    first = lake.append(orders, "o", 1)
    lancetx.commit_many({orders: first}, storage_options=lake.options)
    both = {orders: first, lines: lake.append(lines, "l", 1)}
    assert lancetx.commit_many(both, storage_options=lake.options) == {orders: 2, lines: 2}
    assert lake.rows(orders) == Counter({("orders", 0): 2, ("o", 1): 2})
    assert lake.rows(lines) == Counter({("lines", 0): 2, ("l", 1): 2})
