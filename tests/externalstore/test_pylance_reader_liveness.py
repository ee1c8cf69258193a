"""lancetx beside a pylance reader that finalizes its versions.

A pylance reader opening an ``s3+ddb://`` table finalizes a staged newest
version itself and rewrites its item with a full PutItem holding Lance's
attributes only: lancetx's transaction summary, commit-queue ticket, claim
time, commit token and bucket are gone. Here, against the embedded server and
real pylance:

* a lancetx version finalized that way is still lancetx's: a writer loading it
  does not take it for a writer outside the queue (which would turn the queue
  off for seconds), while a real pylance commit still does;
* a lancetx finalizer that finds pylance finished first puts lancetx's
  attributes back (pylance before our copy, and between our copy and our flip);
* a reader finishing another writer's version whose flip gets no answer (it
  landed, or it did not) reads the version instead of raising about a commit it
  never made.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import lance
import pytest
from protocol_helpers import (
    Crash,
    CrashingHandler,
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)
from suite_profile import sized

from lancetx.commit.engine import contention
from lancetx.commit.engine.committer import CommitOptions, Committed, load_parent
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.connect import TableConnection, connect

ROWS = 5
#: Writers x appends beside the polling reader (the acceptance run: 4 x 40).
WRITERS = 4
APPENDS = sized("LANCETX_PYLANCE_READER_APPENDS", quick=8, long=40)
#: How often the reader opens the table (seconds).
POLL = 0.05


@dataclass
class Lake:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    base: str
    uri: str
    options: dict[str, str]

    def connect(self) -> TableConnection:
        return connect(self.uri, self.options)

    def item(self, version: int) -> dict[str, Any]:
        ddb = boto3.client("dynamodb", **self.aws.client_kwargs())
        key = {"base_uri": {"S": self.base}, "version": {"N": str(version)}}
        return dict(ddb.get_item(TableName=self.ddb_table, Key=key, ConsistentRead=True)["Item"])

    def exists(self, key: str) -> bool:
        s3 = boto3.client("s3", **self.aws.client_kwargs())
        return "Contents" in s3.list_objects_v2(Bucket=self.bucket, Prefix=key)

    def pylance_opens(self) -> int:
        """A pylance reader opening the table (it finalizes a staged newest version)."""
        return int(lance.dataset(self.uri, storage_options=self.options).version)

    def queue_fair(self, conn: TableConnection) -> bool:
        uri = conn.handler.store.uri(conn.base)
        return contention.table_contention(uri).queue_fair(time.monotonic())


@pytest.fixture
def lake(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Lake]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    base = f"lake/{uuid.uuid4().hex[:8]}.lance"
    uri = ddb_uri(bucket, base, ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    yield Lake(legacy_aws, bucket, ddb_table_name, base, uri, options)
    legacy_aws.set_interceptor(None)


def _claim_and_crash(lake: Lake) -> int:
    """A lancetx writer claims the next version and dies before finalizing it."""
    conn = lake.connect()
    assert isinstance(conn.handler, ExternalStoreCommitHandler)
    crashing = CrashingHandler(conn.handler.store, conn.handler.entries, crash_after=2)
    parent = load_parent(conn.handler, conn.base)
    assert parent is not None
    with pytest.raises(Crash):
        lancetx_append(crashing, conn.base, conn.data_uri, lake.options, batch("crash", 0, ROWS))
    staged = lake.item(parent.version + 1)
    assert staged["path"]["S"].rsplit(".", 1)[-1].startswith("manifest-")  # still staged
    assert "txn_uuid" in staged
    return parent.version + 1


def test_a_lancetx_version_finalized_by_pylance_does_not_turn_the_queue_off(lake: Lake) -> None:
    writer = lake.connect()
    parent = load_parent(writer.handler, writer.base)
    assert parent is not None
    version = _claim_and_crash(lake)
    assert lake.pylance_opens() == version
    item = lake.item(version)
    assert item["path"]["S"].endswith(".manifest")
    assert "txn_uuid" not in item and "commit_token" not in item  # pylance's PutItem

    # A writer still on the parent loses that version and loads it: it is lancetx's.
    done = lancetx_append(
        writer.handler, writer.base, writer.data_uri, lake.options, batch("w", 0, ROWS), parent
    )
    assert done.version == version + 1 and done.attempts == 2
    assert lake.queue_fair(writer), "a version lancetx committed was taken for an outsider's"

    # A version pylance committed is an outsider's: the queue stays off for a while.
    pylance_append(lake.uri, lake.options, batch("pylance", 0, ROWS))
    lancetx_append(
        writer.handler, writer.base, writer.data_uri, lake.options, batch("w", 1, ROWS), done
    )
    assert not lake.queue_fair(writer)


def _writer_request(
    kind: str,
) -> Callable[[InterceptedRequest], bool]:
    """Matches lancetx's (boto3's) copy of a staged manifest, or its pointer flip."""

    def matches(req: InterceptedRequest) -> bool:
        if "botocore" not in req.headers.get("user-agent", "").lower():
            return False
        if kind == "copy":
            return req.service == "s3" and "x-amz-copy-source" in req.headers
        return req.target == "PutItem" and b":expected_path" in req.body

    return matches


@pytest.mark.parametrize("pylance_before", ["copy", "flip"])
def test_our_finalizer_puts_back_what_pylance_stripped(lake: Lake, pylance_before: str) -> None:
    """pylance finishes our version right before our copy (we find the staged object
    gone) or right before our flip (the flip finds the item final): either way the
    item ends with lancetx's attributes, so waiting writers see the claim."""
    conn = lake.connect()
    matches = _writer_request(pylance_before)
    opened: list[int] = []

    def interceptor(req: InterceptedRequest) -> InterceptedResponse | None:
        if not opened and matches(req):
            opened.append(lake.pylance_opens())  # served by the server's other threads
        return None

    lake.aws.set_interceptor(interceptor)
    done = lancetx_append(conn.handler, conn.base, conn.data_uri, lake.options, batch("w", 0, ROWS))
    lake.aws.set_interceptor(None)
    assert opened == [done.version]  # pylance finalized our version first
    item = lake.item(done.version)
    assert item["path"]["S"].endswith(".manifest")
    assert item.get("txn_uuid", {}).get("S") == done.transaction.uuid, item
    assert item["txn_operation"]["S"] == "Append"
    assert "claimed_at" in item and "commit_token" in item and item["bucket"]["S"] == lake.bucket
    # Readable by both, and lancetx still reads its summary from the item.
    assert lake.pylance_opens() == done.version
    listed = conn.handler.list_versions(conn.base, done.version - 1)
    assert [loc.version for loc in listed] == [done.version]
    assert listed[0].summary is not None and listed[0].summary.uuid == done.transaction.uuid


@pytest.mark.parametrize("landed", [True, False], ids=["flip-landed", "flip-lost"])
def test_a_reader_finishing_another_writers_version_reads_it_whatever_the_flip_answers(
    lake: Lake, landed: bool
) -> None:
    """The writer of version 2 died after its claim; a plain reader finishes it and
    every answer to its pointer flip is lost (after the flip landed, or before it
    arrived). The reader reads version 2; nothing of the version is lost; a later
    reader finishes what is left."""
    version = _claim_and_crash(lake)
    staged = lake.item(version)["path"]["S"]
    flips = [0]
    is_flip = _writer_request("flip")

    def interceptor(req: InterceptedRequest) -> InterceptedResponse | None:
        if is_flip(req):
            flips[0] += 1
            return InterceptedResponse(500, b"{}", after_forwarding=landed)
        return None

    lake.aws.set_interceptor(interceptor)
    reader = lake.connect()
    read = load_parent(reader.handler, reader.base)
    lake.aws.set_interceptor(None)
    assert flips[0] >= 1
    assert read is not None and read.version == version
    assert read.manifest.transaction is not None
    item = lake.item(version)
    if landed:
        assert item["path"]["S"].endswith(".manifest")
        assert not lake.exists(staged)
    else:
        # Unsettled: the item may still point at the staged manifest, which is kept.
        assert item["path"]["S"] == staged and lake.exists(staged)
    again = load_parent(lake.connect().handler, reader.base)
    assert again is not None and again.version == version
    assert lake.item(version)["path"]["S"].endswith(".manifest")
    assert lake.pylance_opens() == version
    rows = lance.dataset(lake.uri, storage_options=lake.options).count_rows()
    assert rows == 2 * ROWS


@pytest.mark.long
def test_writers_beside_a_polling_pylance_reader_keep_their_queue(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four lancetx writers append while a pylance reader opens the table every 50 ms
    (finalizing whatever newest version is still staged). No version of theirs is
    taken for an outsider's (which turned the queue off for 10 s at a time), no
    commit runs out of budget, every append lands once, and every version the
    reader opened still opens. Timing is measured in benchmarks/pylance_reader.py,
    not asserted here."""
    marks: list[float] = []
    original = contention.TableContention.outsider

    def counted(self: contention.TableContention, now: float) -> None:
        marks.append(now)
        original(self, now)

    monkeypatch.setattr(contention.TableContention, "outsider", counted)
    stop = threading.Event()
    opened: list[int] = []
    reader_errors: list[BaseException] = []
    writer_errors: list[BaseException] = []
    acked: list[Committed] = []
    lock = threading.Lock()

    def reader() -> None:
        while not stop.is_set():
            try:
                opened.append(lake.pylance_opens())
            except BaseException as exc:
                reader_errors.append(exc)
            stop.wait(POLL)

    def writer(name: str) -> None:
        conn = lake.connect()
        parent = None
        try:
            for seq in range(APPENDS):
                parent = lancetx_append(
                    conn.handler,
                    conn.base,
                    conn.data_uri,
                    lake.options,
                    batch(name, seq, ROWS),
                    parent,
                    options=CommitOptions(),
                )
                with lock:
                    acked.append(parent)
        except BaseException as exc:
            writer_errors.append(exc)

    polling = threading.Thread(target=reader)
    polling.start()
    while not opened and not reader_errors:
        time.sleep(0.01)
    writers = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(WRITERS)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(600)
    stop.set()
    polling.join(60)

    assert not writer_errors, writer_errors  # no RetriesExhaustedError, nothing else
    assert not reader_errors, reader_errors
    assert marks == [], f"the queue was turned off {len(marks)} time(s) by lancetx's own versions"
    assert len(acked) == WRITERS * APPENDS
    assert sorted(c.version for c in acked) == list(range(2, 2 + WRITERS * APPENDS))
    table = lance.dataset(lake.uri, storage_options=lake.options).to_table()
    rows = Counter(zip(table["writer"].to_pylist(), table["seq"].to_pylist(), strict=True))
    assert rows == Counter(
        {("setup", 0): ROWS, **{(f"w{i}", q): ROWS for i in range(WRITERS) for q in range(APPENDS)}}
    )
    for version in sorted(set(opened)):
        ds = lance.dataset(lake.uri, version=version, storage_options=lake.options)
        assert ds.count_rows() == ROWS * version
