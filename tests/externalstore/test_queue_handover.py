"""The claim of a writer in the commit queue hands its manifest to the next in line.

A claim made from the commit queue carries its staged manifest (packed) in its
DynamoDB item; the writer next in line, watching that item, builds on those
bytes without reading the object, and checks that the version's final copy is in
place with one HEAD (the copy's ETag is the MD5 of the bytes it was handed)
instead of finishing the version itself. The claim stays the only arbiter:

* the next in line reads nothing of its parent and finishes nothing of it, and
  the handover is dropped from the item once the version is final;
* a parent whose copy is not there yet is finished before the claim on top of it;
* a version claimed outside the queue (pylance: no handover) is read as before;
* a conflict with the version handed over stops the commit with nothing of ours
  left, however late it is found;
* a crash between the stage and the claim keeps our files and names the version;
* a handover that is not the manifest the item describes is ignored, and one
  whose bytes are not the version's committed manifest is never claimed on;
* a keyed commit next in line is deduplicated by the version handed over;
* pylance reads, finishes and commits over an item that carries a handover;
* a crash between copy and flip leaves the version readable, and ``cleanup``
  finishes it instead of stopping there.

Deterministic: the two writers' steps are ordered by events, never by sleeps.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import pytest
from protocol_helpers import (
    FAST_COMMIT,
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

from lancetx.commit.engine import contention
from lancetx.commit.engine.committer import (
    Committed,
    Parent,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import IDEMPOTENCY_KEY, Append, Delete, Transaction
from lancetx.commit.errors import (
    IncompatibleConflictError,
    InvalidCommitError,
    RetryableConflictError,
)
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.location import (
    HANDOVER_LIMIT,
    ManifestLocation,
    TransactionSummary,
    pack_handover,
    unpack_handover,
)
from lancetx.commit.format.manifest import decode_manifest
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore import commit_handler as commit_handler_module
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb.plans import HANDOVER
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.memory import MemoryManifestStore
from lancetx.externalstore.protocol import Table, run, stage_steps
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.repair import repair_table
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table

ROWS = 10
WAIT = 60.0  # generous: an event that does not come within this is a failure


@dataclass
class Pair:
    """Two writers (connections) of one table in this process, and the table's options."""

    uri: str
    options: dict[str, str]
    first: TableConnection
    second: TableConnection

    def handler(self, conn: TableConnection) -> ExternalStoreCommitHandler:
        assert isinstance(conn.handler, ExternalStoreCommitHandler)
        return conn.handler

    def entries(self, conn: TableConnection) -> DynamoDBManifestStore:
        entries = self.handler(conn).entries
        assert isinstance(entries, DynamoDBManifestStore)
        return entries

    def item(self, version: int) -> dict[str, Any]:
        entries = self.entries(self.first)
        found = entries.client.get_item(
            TableName=entries.table_name,
            Key={"base_uri": {"S": self.first.base}, "version": {"N": str(version)}},
            ConsistentRead=True,
        )
        item: dict[str, Any] = found["Item"]
        return item


@pytest.fixture
def pair(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Pair]:
    monkeypatch.setattr(contention, "_tables", {})  # no contention remembered from other tests
    # The queue must never be passed by a waiter here: the order is the events'.
    monkeypatch.setattr(contention, "MIN_STALL", 600.0)
    monkeypatch.setattr(contention, "MIN_QUEUE_CHECK", 600.0)
    # However slow the machine, the contention met below is still fresh when a
    # writer starts: both writers queue.
    monkeypatch.setattr(contention, "CONTENDED_FOR", 600.0)
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "handover.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    first, second = connect(uri, options), connect(uri, options)
    assert first.handler.store is not second.handler.store
    # As if this process had just met contention on the table: both writers queue.
    contention.table_contention(first.handler.store.uri(first.base)).queued(time.monotonic())
    yield Pair(uri, options, first, second)


def _wrap(
    monkeypatch: pytest.MonkeyPatch, target: Any, name: str, around: Callable[..., Any]
) -> None:
    original = getattr(target, name)
    monkeypatch.setattr(target, name, lambda *a, **k: around(original, *a, **k))


class Writer(threading.Thread):
    """A writer committing on a thread; its result (or error) once joined."""

    def __init__(self, fn: Callable[[], Committed]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Committed | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def outcome(self) -> Committed:
        self.join(WAIT)
        assert not self.is_alive(), "the writer did not finish"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _first_holds_ticket_one(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, go: threading.Event
) -> Writer:
    """The first writer takes ticket 1 and stops before its claim until ``go``."""
    _wrap(
        monkeypatch,
        pair.handler(pair.first),
        "commit",
        lambda original, *a, **k: (go.wait(WAIT), original(*a, **k))[1],
    )
    handler = pair.handler(pair.first)
    writer = Writer(
        lambda: lancetx_append(
            handler, pair.first.base, pair.first.data_uri, pair.options, batch("first", 0, ROWS)
        )
    )
    writer.start()
    entries = pair.entries(pair.second)
    _wait_for(lambda: entries.read_turns(pair.first.base).issued >= 1, "ticket 1")
    return writer


def _second_waits_with_ticket_two(pair: Pair, fn: Callable[[], Committed]) -> Writer:
    writer = Writer(fn)
    writer.start()
    entries = pair.entries(pair.second)
    _wait_for(lambda: entries.read_turns(pair.first.base).issued >= 2, "ticket 2")
    return writer


def _calls(monkeypatch: pytest.MonkeyPatch, store: Any) -> list[tuple[str, str]]:
    """(method, key) of every call of ``store``'s object reads and writes. (Its
    botocore client may be shared with other connections: a request hook on it
    would also see the other writer's requests.)"""
    calls: list[tuple[str, str]] = []
    for name in ("get", "get_range", "get_tail", "get_tail_bulk", "head", "put", "copy", "delete"):

        def record(original: Callable[..., Any], *args: Any, _name: str = name) -> Any:
            calls.append((_name, str(args[-1] if _name == "copy" else args[0])))
            return original(*args)

        _wrap(monkeypatch, store, name, record)
    return calls


def _when_seen(monkeypatch: pytest.MonkeyPatch, pair: Pair, version: int) -> threading.Event:
    """Set once a look of the second writer shows ``version`` claimed."""
    seen = threading.Event()

    def look(original: Callable[..., Any], base_uri: str, versions: Any) -> Any:
        found = original(base_uri, versions)
        if any(e.version == version for e in found):
            seen.set()
        return found

    _wrap(monkeypatch, pair.entries(pair.second), "get_entries", look)
    return seen


def test_the_next_in_line_builds_on_the_handed_over_manifest_without_reading_it(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    go, copied = threading.Event(), threading.Event()
    seen = _when_seen(monkeypatch, pair, 2)
    # The first writer's copy is signalled; its flip waits until the second saw its
    # claim (so the second meets version 2 still staged, as it does under load).
    _wrap(
        monkeypatch,
        pair.handler(pair.first).store,
        "copy",
        lambda original, *a: (original(*a), copied.set())[0],
    )
    _wrap(
        monkeypatch,
        pair.entries(pair.first),
        "put_if_exists",
        lambda original, *a, **k: (seen.wait(WAIT), original(*a, **k))[1],
    )
    parent = load_parent(pair.handler(pair.second), pair.second.base)
    # The second writer's HEAD comes after the first writer's copy.
    _wrap(
        monkeypatch,
        pair.handler(pair.second).store,
        "head",
        lambda original, key: (copied.wait(WAIT), original(key))[1],
    )
    first = _first_holds_ticket_one(pair, monkeypatch, go)
    calls = _calls(monkeypatch, pair.handler(pair.second).store)
    second = _second_waits_with_ticket_two(
        pair,
        lambda: lancetx_append(
            pair.handler(pair.second),
            pair.second.base,
            pair.second.data_uri,
            pair.options,
            batch("second", 0, ROWS),
            parent,
        ),
    )
    go.set()
    ours, theirs = second.outcome(), first.outcome()

    assert (theirs.version, ours.version) == (2, 3)
    assert ours.attempts == 1
    reads = [key for op, key in calls if op.startswith("get") and "/_versions/" in key]
    assert reads == [], calls  # built on the bytes the claim handed over
    heads = [key for op, key in calls if op == "head"]
    assert len(heads) == 1 and _is_v2(heads[0]), calls  # the copy checked with one HEAD
    finished = [key for op, key in calls if op in ("copy", "delete") and _of_v2(key)]
    assert finished == [], calls  # it finished nothing of version 2 (its writer does)
    # Once final, an item carries no handover (the first writer's flip dropped it).
    assert HANDOVER not in pair.item(2)
    ds = lance.dataset(pair.uri, storage_options=pair.options)
    assert [v["version"] for v in ds.versions()] == [1, 2, 3]
    assert ds.count_rows() == 3 * ROWS


def test_a_handed_over_parent_not_copied_yet_is_finished_before_the_claim_on_top(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first writer stops after its claim (before its copy) until the second
    claimed: the second's HEAD finds no final copy, so it finishes version 2
    itself before claiming 3 — the object store never lags two versions."""
    go, claimed = threading.Event(), threading.Event()
    _wrap(
        monkeypatch,
        pair.handler(pair.first).store,
        "copy",
        lambda original, *a: (claimed.wait(WAIT), original(*a))[1],
    )
    store = pair.handler(pair.second).store
    final_at_claim: list[bool] = []

    def claim(original: Callable[..., Any], entry: Any, *rest: Any) -> Any:
        if entry.version == 3:
            final_at_claim.append(
                any(
                    m.key.endswith(".manifest") and _is_v2(m.key)
                    for m in store.list(_vprefix(pair))
                )
            )
        try:
            return original(entry, *rest)
        finally:
            if entry.version == 3:
                claimed.set()

    entries = pair.entries(pair.second)
    _wrap(monkeypatch, entries, "put_if_not_exists", claim)
    parent = load_parent(pair.handler(pair.second), pair.second.base)
    first = _first_holds_ticket_one(pair, monkeypatch, go)
    second = _second_waits_with_ticket_two(
        pair,
        lambda: lancetx_append(
            pair.handler(pair.second),
            pair.second.base,
            pair.second.data_uri,
            pair.options,
            batch("second", 0, ROWS),
            parent,
        ),
    )
    go.set()
    ours, theirs = second.outcome(), first.outcome()

    assert (theirs.version, ours.version) == (2, 3)
    assert final_at_claim == [True]
    ds = lance.dataset(pair.uri, storage_options=pair.options)
    assert [v["version"] for v in ds.versions()] == [1, 2, 3]
    assert ds.count_rows() == 3 * ROWS


def _vprefix(pair: Pair) -> str:
    return f"{pair.first.base}/_versions/"


def _of_v2(key: str) -> bool:
    """Version 2's final or staged manifest."""
    return _is_v2(key) or _is_v2(key.rsplit("-", 5)[0])


def _is_v2(key: str) -> bool:
    # Version 2's final name under either naming scheme.
    name = key.rsplit("/", 1)[-1]
    return name in ("2.manifest", f"{2**64 - 1 - 2:020d}.manifest")


def test_a_version_pylance_claimed_in_the_turn_before_ours_is_read_as_before(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version the next in line watches is not the queued writer's but a
    pylance writer's (no handover in its item): ours reads it and builds on it."""
    entries = pair.entries(pair.second)
    ahead = entries.take_ticket(pair.second.base).issued  # a queued writer before us...
    seen = threading.Event()

    def look(original: Callable[..., Any], base_uri: str, versions: Any) -> Any:
        seen.set()
        return original(base_uri, versions)

    _wrap(monkeypatch, entries, "get_entries", look)
    parent = load_parent(pair.handler(pair.second), pair.second.base)
    calls = _calls(monkeypatch, pair.handler(pair.second).store)
    second = _second_waits_with_ticket_two(
        pair,
        lambda: lancetx_append(
            pair.handler(pair.second),
            pair.second.base,
            pair.second.data_uri,
            pair.options,
            batch("second", 0, ROWS),
            parent,
        ),
    )
    assert seen.wait(WAIT)
    pylance_append(pair.uri, pair.options, batch("pylance", 0, ROWS))  # ...but pylance claims 2
    entries.end_turn(pair.second.base, ahead)  # and the writer ahead gives up its turn
    ours = second.outcome()

    assert ours.version == 3
    assert HANDOVER not in pair.item(2)
    reads = [key for op, key in calls if op.startswith("get") and "/_versions/" in key]
    assert reads, calls  # pylance's manifest, read as before
    ds = lance.dataset(pair.uri, storage_options=pair.options)
    assert [v["version"] for v in ds.versions()] == [1, 2, 3]
    assert ds.count_rows() == 3 * ROWS


def test_a_conflict_with_the_version_handed_over_leaves_nothing_of_ours(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next in line deletes the fragment the version handed over deleted
    first: found only when the handover arrives, it stops the commit, and
    nothing ours wrote is left (not the transaction file it wrote while waiting,
    nor any staged manifest)."""
    go = threading.Event()
    parent = load_parent(pair.handler(pair.second), pair.second.base)
    assert parent is not None
    fragment = parent.manifest.manifest.fragments[0].id

    def delete_setup(conn: TableConnection, at: Parent) -> Committed:
        txn = Transaction(
            read_version=at.version,
            operation=Delete(deleted_fragment_ids=(fragment,), predicate="writer = 'setup'"),
        )
        return commit_transaction(
            pair.handler(conn), conn.base, txn, parent=at, options=FAST_COMMIT
        )

    first_parent = load_parent(pair.handler(pair.first), pair.first.base)
    assert first_parent is not None
    _wrap(
        monkeypatch,
        pair.handler(pair.first),
        "commit",
        lambda original, *a, **k: (go.wait(WAIT), original(*a, **k))[1],
    )
    before = _objects(pair)
    first = Writer(lambda: delete_setup(pair.first, first_parent))
    first.start()
    entries = pair.entries(pair.second)
    _wait_for(lambda: entries.read_turns(pair.first.base).issued >= 1, "ticket 1")
    second = _second_waits_with_ticket_two(pair, lambda: delete_setup(pair.second, parent))
    go.set()
    assert first.outcome().version == 2
    with pytest.raises((IncompatibleConflictError, RetryableConflictError)):
        second.outcome()

    assert _objects(pair) - before == _objects_of_version(pair, 2)
    turns = entries.read_turns(pair.first.base)
    assert turns.served == 2  # its turn ended without a claim: served in the queue item


def _objects(pair: Pair) -> set[str]:
    store = pair.handler(pair.first).store
    return {m.key for m in store.list(pair.first.base + "/") if "/data/" not in m.key}


def _objects_of_version(pair: Pair, version: int) -> set[str]:
    """The final manifest and transaction file of ``version`` (the first writer's)."""
    committed = load_parent(pair.handler(pair.first), pair.first.base, version)
    assert committed is not None
    txn = committed.manifest.manifest.transaction_file
    return {committed.location.key, f"{pair.first.base}/_transactions/{txn}"}


def test_a_crash_between_the_stage_and_the_claim_keeps_our_files_and_names_the_version(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next in line is killed (KeyboardInterrupt) after staging on the
    handed-over parent, before its claim is sent: its staged manifest and its
    transaction file stay, and the error says which version would settle them."""
    go = threading.Event()

    def crash(original: Callable[..., Any], entry: Any, *rest: Any) -> Any:
        if entry.version == 3:
            raise KeyboardInterrupt
        return original(entry, *rest)

    _wrap(monkeypatch, pair.entries(pair.second), "put_if_not_exists", crash)
    parent = load_parent(pair.handler(pair.second), pair.second.base)
    before = _objects(pair)
    first = _first_holds_ticket_one(pair, monkeypatch, go)
    second = _second_waits_with_ticket_two(
        pair,
        lambda: lancetx_append(
            pair.handler(pair.second),
            pair.second.base,
            pair.second.data_uri,
            pair.options,
            batch("second", 0, ROWS),
            parent,
        ),
    )
    go.set()
    assert first.outcome().version == 2
    with pytest.raises(KeyboardInterrupt) as crashed:
        second.outcome()

    notes = "\n".join(getattr(crashed.value, "__notes__", []))
    assert "version 3" in notes, notes
    left = _objects(pair) - before - _objects_of_version(pair, 2)
    staged = [k for k in left if "/_versions/" in k]
    transactions = [k for k in left if "/_transactions/" in k]
    assert len(staged) == 1 and len(transactions) == 1, left  # kept: the claim was in flight
    assert transactions[0].rsplit("/", 1)[-1] in notes  # named, with what settles it
    assert pair.entries(pair.first).latest(pair.first.base).version == 2  # type: ignore[union-attr]


# ----------------------------------------------------------- the handover itself


def test_only_a_claim_from_the_queue_carries_a_handover(tmp_path: Any) -> None:
    store, entries = LocalObjectStore(str(tmp_path)), MemoryManifestStore()
    table = Table(base_uri="t.lance", base_key="t.lance")
    data = b"manifest bytes " * 100
    queued = TransactionSummary("Append", "u1", ticket=7)
    alone = TransactionSummary("Append", "u2")
    with_ticket = run(stage_steps(table, 2, NamingScheme.V2, data, summary=queued), store, entries)
    without = run(stage_steps(table, 3, NamingScheme.V2, data, summary=alone), store, entries)

    assert without.entry.handover is None
    assert with_ticket.entry.handover is not None
    assert unpack_handover(with_ticket.entry.handover, len(data)) == data


def test_a_handover_that_is_not_the_manifest_described_is_ignored() -> None:
    data = b"\x01manifest" * 50
    packed = pack_handover(data)
    assert packed is not None
    assert unpack_handover(packed, len(data)) == data
    assert unpack_handover(packed, len(data) - 1) is None  # another size
    assert unpack_handover(packed, None) is None
    assert unpack_handover(b"not zlib at all", len(data)) is None
    assert unpack_handover(packed[:-4], len(data)) is None  # truncated
    bomb = zlib.compress(b"\0" * (10 * len(data)))
    assert unpack_handover(bomb, len(data)) is None  # never inflated past the size
    location = ManifestLocation(2, "k", NamingScheme.V2, size=len(data) + 1, handover=packed)
    assert location.handed_over() is None


def test_a_manifest_too_large_to_hand_over_is_not_carried() -> None:
    incompressible = hashlib.sha256(b"0").digest()
    big = b"".join(
        hashlib.sha256(incompressible + bytes([i % 256, i // 256])).digest()
        for i in range(HANDOVER_LIMIT // 16)
    )
    assert pack_handover(big) is None


def test_a_manifest_no_compression_could_fit_is_not_compressed(monkeypatch: Any) -> None:
    calls: list[int] = []
    real = zlib.compress

    def counting(data: bytes, level: int = -1) -> bytes:
        calls.append(len(data))
        return real(data, level)

    monkeypatch.setattr(zlib, "compress", counting)
    assert pack_handover(b"\0" * (64 * HANDOVER_LIMIT)) is None  # would pack, but no claim takes it
    assert calls == []
    assert pack_handover(b"\0" * 1000) is not None
    assert calls == [1000]


# ------------------------------------------------------- attacks on the handover


@dataclass
class Solo(Pair):
    """A table with one pylance version and two lancetx connections that do not queue."""

    @property
    def ddb(self) -> DynamoDBManifestStore:
        return self.entries(self.first)

    def item(self, version: int) -> dict[str, Any]:
        found = self.ddb.client.get_item(
            TableName=self.ddb.table_name,
            Key={"base_uri": {"S": self.first.base}, "version": {"N": str(version)}},
            ConsistentRead=True,
        )
        item: dict[str, Any] = found.get("Item", {})
        return item

    def put(self, item: dict[str, Any]) -> None:
        self.ddb.client.put_item(TableName=self.ddb.table_name, Item=item)


@pytest.fixture
def solo(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> Solo:
    monkeypatch.setattr(contention, "_tables", {})  # no contention remembered from other tests
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "attacked.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    return Solo(uri, options, connect(uri, options), connect(uri, options))


def _claim_then_crash(
    solo: Solo, monkeypatch: pytest.MonkeyPatch, *, at: str, writer: str = "first"
) -> None:
    """The first connection commits an append as a writer in the queue does (its
    claim carries a ticket, so its item the handover) and is killed at ``at`` of
    its finish: ``"copy"`` (nothing copied) or ``"flip"`` (copied, item still
    pointing at the staged manifest)."""
    handler = solo.handler(solo.first)
    with monkeypatch.context() as m:
        m.setattr(
            commit_handler_module,
            "_stamped",
            lambda s: dataclasses.replace(s, ticket=1, claimed_at=time.time()) if s else None,
        )

        def crash(*_: Any, **__: Any) -> Any:
            raise KeyboardInterrupt

        if at == "copy":
            m.setattr(handler.store, "copy", crash)
        else:
            m.setattr(handler.entries, "put_if_exists", crash)
        with pytest.raises(KeyboardInterrupt):
            lancetx_append(
                handler, solo.first.base, solo.first.data_uri, solo.options, batch(writer, 0, ROWS)
            )


def _fragment_paths(manifest: Any) -> list[str]:
    return [f.path for frag in manifest.fragments for f in frag.files]


def test_a_handover_that_is_not_the_staged_manifest_is_never_built_on(
    solo: Solo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The item of version 2 (claimed, not copied yet) carries a handover of the
    right version and size whose bytes are not the staged manifest's (an item
    edited by another tool, or by someone with DynamoDB access only): the next
    writer must not commit a version built on those bytes — the committed
    manifest of version 2 is the staged object the item points at."""
    parent = load_parent(solo.handler(solo.second), solo.second.base)
    assert parent is not None and parent.version == 1
    _claim_then_crash(solo, monkeypatch, at="copy")
    item = solo.item(2)
    staged = item["path"]["S"]
    real = zlib.decompress(bytes(item[HANDOVER]["B"]))
    assert real == bytes(
        solo.handler(solo.first).store.get(staged)
    )  # what a claim carries: the staged bytes
    theirs = _fragment_paths(decode_manifest(real, path="v2").manifest)[-1]
    forged_path = ("0" if theirs[0] != "0" else "1") + theirs[1:]  # same length
    assert theirs.encode() in real  # in the fragment and in the inline transaction
    forged = real.replace(theirs.encode(), forged_path.encode())
    assert len(forged) == len(real)
    solo.put({**item, HANDOVER: {"B": zlib.compress(forged)}})

    try:
        ours = lancetx_append(
            solo.handler(solo.second),
            solo.second.base,
            solo.second.data_uri,
            solo.options,
            batch("second", 0, ROWS),
            parent,
        )
    except InvalidCommitError as refused:
        assert "version 2" in str(refused), refused
        assert solo.item(3) == {}  # nothing claimed on top
    else:
        built_on = _fragment_paths(ours.manifest.manifest)
        assert forged_path not in built_on, (
            f"version {ours.version} was built on the forged handover: it references "
            f"{forged_path!r}, a file version 2 never had"
        )
        assert theirs in built_on
    # Version 2 itself is the staged object's, for pylance and for lancetx.
    ds = lance.dataset(solo.uri, version=2, storage_options=solo.options)
    assert theirs in [f.path for frag in ds.get_fragments() for f in frag.metadata.files]
    assert ds.count_rows() == 2 * ROWS


def _keyed_append(
    handler: ExternalStoreCommitHandler,
    conn: TableConnection,
    options: dict[str, str],
    writer: str,
    key: str,
    parent: Parent | None = None,
) -> Committed:
    if parent is None:
        parent = load_parent(handler, conn.base)
    assert parent is not None
    fragments = lance.fragment.write_fragments(
        batch(writer, 0, ROWS), conn.data_uri, storage_options=options
    )
    txn = Transaction(
        read_version=parent.version,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        properties={IDEMPOTENCY_KEY: key},
    )
    return commit_transaction(handler, conn.base, txn, parent=parent, options=FAST_COMMIT)


def test_a_keyed_commit_next_in_line_is_deduplicated_by_the_version_handed_over(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """House rule 2 through the handover: the writer next in line carries the key
    the version it is handed was committed with; it builds on nothing and claims
    nothing, it returns that version (deduplicated)."""
    go = threading.Event()
    _wrap(
        monkeypatch,
        pair.handler(pair.first),
        "commit",
        lambda original, *a, **k: (go.wait(WAIT), original(*a, **k))[1],
    )
    parent = load_parent(pair.handler(pair.second), pair.second.base)
    first = Writer(
        lambda: _keyed_append(pair.handler(pair.first), pair.first, pair.options, "first", "job-7")
    )
    first.start()
    entries = pair.entries(pair.second)
    _wait_for(lambda: entries.read_turns(pair.first.base).issued >= 1, "ticket 1")
    calls = _calls(monkeypatch, pair.handler(pair.second).store)
    second = _second_waits_with_ticket_two(
        pair,
        lambda: _keyed_append(
            pair.handler(pair.second), pair.second, pair.options, "second", "job-7", parent
        ),
    )
    go.set()
    theirs, ours = first.outcome(), second.outcome()

    assert theirs.version == 2 and not theirs.deduplicated
    assert ours.version == 2 and ours.deduplicated
    assert not [k for op, k in calls if op == "put" and "/_versions/" in k], calls  # no stage
    ds = lance.dataset(pair.uri, storage_options=pair.options)
    assert [v["version"] for v in ds.versions()] == [1, 2]
    assert ds.count_rows() == 2 * ROWS


def test_pylance_reads_and_writes_over_a_claim_that_carries_a_handover(
    solo: Solo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued writer killed after its claim, before its copy: the item points at
    the staged manifest and carries the handover. pylance (which knows nothing of
    the attribute) reads the version, finishes it, and commits on top; lancetx then
    commits after pylance's version."""
    _claim_then_crash(solo, monkeypatch, at="copy")
    assert HANDOVER in solo.item(2)
    ds = lance.dataset(solo.uri, storage_options=solo.options)
    assert (ds.version, ds.count_rows()) == (2, 2 * ROWS)
    assert pylance_append(solo.uri, solo.options, batch("pylance", 0, ROWS)) == 3
    assert HANDOVER not in solo.item(2)  # pylance's finalization rewrote the item without it
    ours = lancetx_append(
        solo.handler(solo.second),
        solo.second.base,
        solo.second.data_uri,
        solo.options,
        batch("second", 0, ROWS),
    )
    assert ours.version == 4
    ds = lance.dataset(solo.uri, storage_options=solo.options)
    assert [v["version"] for v in ds.versions()] == [1, 2, 3, 4]
    assert ds.count_rows() == 4 * ROWS


def test_a_parent_copied_but_not_flipped_stays_readable_and_is_finished_by_a_reader(
    solo: Solo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued writer killed between its copy and its flip: the next writer's HEAD
    finds the final copy with the handed-over bytes and claims on top without
    flipping the version (only its writer, a reader of it or ``repair`` does).
    The version stays readable at its final name (pylance's conflict checks list
    final names) and through its item, whose staged manifest is kept; reading it
    finishes it."""
    parent = load_parent(solo.handler(solo.second), solo.second.base)
    _claim_then_crash(solo, monkeypatch, at="flip")
    staged = solo.item(2)["path"]["S"]
    ours = lancetx_append(
        solo.handler(solo.second),
        solo.second.base,
        solo.second.data_uri,
        solo.options,
        batch("second", 0, ROWS),
        parent,
    )
    assert ours.version == 3
    assert solo.item(2)["path"]["S"] == staged  # left to a reader of version 2
    store = solo.handler(solo.first).store
    assert store.head(staged).size == int(solo.item(2)["size"]["N"])  # kept: the item names it
    ds = lance.dataset(solo.uri, storage_options=solo.options)
    assert (ds.version, ds.count_rows()) == (3, 3 * ROWS)
    assert lance.dataset(solo.uri, version=2, storage_options=solo.options).count_rows() == 2 * ROWS
    assert solo.item(2)["path"]["S"].endswith(".manifest")  # pylance's read finished it
    assert HANDOVER not in solo.item(2)


def test_a_handover_larger_than_any_claim_carries_is_not_inflated() -> None:
    """No claim carries more than HANDOVER_LIMIT packed bytes: a larger attribute
    (another tool's, or a hostile item's, up to DynamoDB's 400 KB) is ignored
    before it is inflated — however large a size its item records, what a
    reader inflates stays bounded by what a claim can carry."""
    data = b"\x02manifest" * (HANDOVER_LIMIT // 2)
    packed = zlib.compress(data, 0)  # stored blocks: larger than the data
    assert len(packed) > HANDOVER_LIMIT
    assert unpack_handover(packed, len(data)) is None
    fits = pack_handover(data)
    assert fits is not None and unpack_handover(fits, len(data)) == data


def test_a_parent_copied_but_not_flipped_does_not_stop_a_cleanup(
    solo: Solo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same crash (copy made, flip not): the next writer claims on top, so no
    writer flips version 2 any more. ``cleanup`` finishes such a version (as any
    reader would) instead of keeping it and every version after it for good."""
    parent = load_parent(solo.handler(solo.second), solo.second.base)
    _claim_then_crash(solo, monkeypatch, at="flip")
    lancetx_append(
        solo.handler(solo.second),
        solo.second.base,
        solo.second.data_uri,
        solo.options,
        batch("second", 0, ROWS),
        parent,
    )
    (finding,) = [
        f for f in verify_table(open_table(solo.uri, solo.options)).findings if f.version == 2
    ]
    assert "stopped after copying it to its final name" in finding.detail, finding
    report = cleanup_versions(open_table(solo.uri, solo.options), keep_versions=1)

    assert report.errors == []
    assert report.removed_versions == [1, 2], report
    assert report.kept_versions == [3]
    ds = lance.dataset(solo.uri, storage_options=solo.options)
    assert (ds.version, ds.count_rows()) == (3, 3 * ROWS)
    assert verify_table(open_table(solo.uri, solo.options)).ok


def test_repair_force_backs_up_an_item_that_carries_a_handover(
    solo: Solo, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A queued claim whose staged manifest was deleted before its copy (no final
    copy, no transaction file left: wedged, nothing to rebuild it from): ``repair
    --force`` saves the item — binary handover included, as ``aws dynamodb
    put-item --item`` takes it (base64) — before it deletes it."""
    _claim_then_crash(solo, monkeypatch, at="copy")
    item = solo.item(2)
    store = solo.handler(solo.first).store
    store.delete(item["path"]["S"])
    for meta in store.list(f"{solo.first.base}/_transactions/"):
        if not meta.key.rsplit("/", 1)[-1].startswith("0-"):
            store.delete(meta.key)  # the crashed writer's: no candidate to rebuild from

    forced = repair_table(
        open_table(solo.uri, solo.options), version=2, force=True, backup_dir=str(tmp_path)
    )
    assert forced.ok, forced
    (action,) = forced.actions
    assert action.kind == "remove_item" and action.backup_file is not None
    saved = json.loads(Path(action.backup_file).read_text())["Item"]
    assert base64.b64decode(saved[HANDOVER]["B"]) == bytes(item[HANDOVER]["B"])
    assert saved["path"] == item["path"]
    assert solo.item(2) == {}
    assert lance.dataset(solo.uri, storage_options=solo.options).version == 1
