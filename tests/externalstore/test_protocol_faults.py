"""Fault injection at every step boundary of the external-store commit.

A "crash" is a writer whose protocol generator is abandoned after its k-th
effect (``protocol_helpers.crash_after``): the effects performed so far stay,
nothing else happens. After each fault a NEW reader and a NEW writer must find
a history with no lost version, no duplicate and no gap, in which every
acknowledged commit is visible to lancetx and to pylance.

Three levels:

* local: real Lance manifests on local disk (LocalObjectStore) with the
  in-memory external store; pylance reads the directory without knowing the
  external store, so it also checks the spec's portability promise (the object
  store is at most one commit behind);
* hypothesis: 2 to 3 writers, pylance-style and lancetx finalizers and readers
  interleaved effect by effect, with injected lost/landed failures and
  crashes, checked against the invariants;
* end to end: the same crashes and faults on the moto server over HTTP with a
  legacy S3 (If-None-Match ignored), DynamoDB, and pylance through ``s3+ddb://``.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import boto3
import lance
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_helpers import (
    BOUNDARIES,
    COMMIT_EFFECTS,
    CRASH_POINTS,
    Crash,
    CrashingHandler,
    FaultyObjectStore,
    RequestLog,
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    perform,
    pylance_append,
    pylance_create,
    verify_history,
)

from lancetx.commit.engine.committer import Committed
from lancetx.commit.errors import (
    CommitStateUnknownError,
    LancetxError,
    TransientObjectStoreError,
    VersionAlreadyExistsError,
)
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.naming import NamingScheme, manifest_key
from lancetx.commit.sansio import Outcome, advance
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler, handler_commit_steps
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.errors import (
    AmbiguousWriteError,
    ManifestMissingError,
    ManifestPointerError,
    ServiceUnavailableError,
    ThrottledError,
    UntrustedManifestPathError,
)
from lancetx.externalstore.memory import MemoryManifestStore
from lancetx.externalstore.protocol import (
    ClaimEntry,
    CopyObject,
    DeleteObject,
    Effect,
    FlipEntry,
    GetEntry,
    LatestEntry,
    Steps,
    Table,
    final_key_of,
    resolve_steps,
    run,
)

ROWS = 10


# =============================================================================== local


@dataclass
class LocalTable:
    """A pylance-created table on local disk, committed through the in-memory store."""

    path: str
    store: FaultyObjectStore
    entries: MemoryManifestStore
    expected: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return os.path.abspath(self.path).lstrip("/")

    def handler(self) -> ExternalStoreCommitHandler:
        """A fresh handler: a new process as far as the protocol is concerned."""
        return ExternalStoreCommitHandler(self.store, self.entries)

    def append(
        self,
        writer: str,
        seq: int = 0,
        *,
        handler: ExternalStoreCommitHandler | None = None,
        parent: Committed | None = None,
        acknowledged: bool = True,
    ) -> Committed:
        committed = lancetx_append(
            handler or self.handler(), self.base, self.path, None, batch(writer, seq, ROWS), parent
        )
        if acknowledged:
            self.expected[(writer, seq)] = ROWS
        return committed

    def staged_objects(self) -> list[str]:
        listing = self.store.inner.list(self.base + "/_versions/")
        return [m.key for m in listing if "-" in m.key.rsplit("/", 1)[-1]]

    def verify(self, versions: int) -> None:
        verify_history(self.path, None, self.handler(), self.base, self.expected, versions=versions)


@pytest.fixture
def local(tmp_path: Any) -> LocalTable:
    path = str(tmp_path / "t.lance")
    pylance_create(path, None, batch("setup", 0, ROWS))
    table = LocalTable(path, FaultyObjectStore(LocalObjectStore("/")), MemoryManifestStore())
    table.expected[("setup", 0)] = ROWS
    location = table.handler().resolve_latest(table.base)  # onboards version 1
    assert location is not None and location.version == 1
    return table


def test_the_crash_points_are_the_effects_production_runs() -> None:
    # Recorded from the handler's own commit steps; the four steps of the spec are
    # among them, in order, and each named boundary is one of the crash points.
    assert COMMIT_EFFECTS[:4] == ("PutObject", "ClaimEntry", "CopyObject", "FlipEntry")
    assert set(BOUNDARIES.values()) <= set(CRASH_POINTS.values())
    assert list(CRASH_POINTS.values()) == list(range(1, len(COMMIT_EFFECTS)))


@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_crash_at_every_boundary_then_new_reader_and_new_writer(
    local: LocalTable, point: str
) -> None:
    crash_at = CRASH_POINTS[point]
    crashing = CrashingHandler(local.store, local.entries, crash_at)
    with pytest.raises(Crash):
        local.append("crashed", handler=crashing, acknowledged=False)
    assert [type(e).__name__ for e in crashing.effects] == list(COMMIT_EFFECTS[:crash_at])
    claimed = "ClaimEntry" in COMMIT_EFFECTS[:crash_at]
    if claimed:  # committed at the claim, though never acknowledged
        local.expected[("crashed", 0)] = ROWS

    reader = local.handler().resolve_latest(local.base)
    assert reader is not None and reader.version == 1 + claimed
    assert reader.alternate_key is None  # the reader finalized it
    assert all(not e.is_staged for e in local.entries.entries())

    committed = local.append("after")
    assert committed.version == 2 + claimed
    local.verify(versions=2 + claimed)


@pytest.mark.parametrize("boundary", ["after_claim", "after_copy"])
def test_writer_holding_a_stale_parent_finalizes_what_it_builds_on(
    local: LocalTable, boundary: str
) -> None:
    """A writer that holds its previous Committed loses to a crashed writer's
    claim and builds on that version: the version must reach the object store
    before a newer one is claimed on top of it, or a reader that does not know
    the external store (and any copy of the directory) sees a hole in the
    history forever: the spec allows the object store to lag one commit, not more."""
    writer = local.handler()
    first = local.append("holder", 0, handler=writer)
    assert first.version == 2
    with pytest.raises(Crash):
        local.append(
            "crashed",
            handler=CrashingHandler(local.store, local.entries, BOUNDARIES[boundary]),
            acknowledged=False,
        )
    local.expected[("crashed", 0)] = ROWS
    second = local.append("holder", 1, handler=writer, parent=first)
    assert second.version == 4
    finals = [loc.version for loc in list_manifest_locations(local.store, local.base)]
    assert finals == [1, 2, 3, 4], f"object store holds versions {finals}"
    assert all(not e.is_staged for e in local.entries.entries())
    local.verify(versions=4)


def test_claim_landed_but_the_answer_was_lost(local: LocalTable) -> None:
    local.entries.land_then_fail("put_if_not_exists")
    committed = local.append("w")
    assert committed.version == 2 and committed.attempts == 1
    assert local.entries.calls["put_if_not_exists"] == 1 + 1  # onboarding + our claim
    local.append("after")
    local.verify(versions=3)


def test_claim_landed_and_pylance_finalized_it_before_we_looked(local: LocalTable) -> None:
    """Our claim lands, the answer is lost, and a pylance reader finalizes the
    version (rewriting the entry without our token) before we re-read it. On a
    local disk a copy never has its source's ETag, so only the bytes can prove
    the version is ours; judging it "theirs" would commit the append twice."""
    local.entries.land_then_fail("put_if_not_exists")
    finalized = threading.Event()

    def pylance_finalizes(entries: MemoryManifestStore) -> None:
        if finalized.is_set():
            return
        finalized.set()
        entry = entries.latest(local.base)
        assert entry is not None and entry.is_staged
        final = final_key_of(Table(local.base, local.base), entry)
        local.store.inner.copy(entry.path, final)
        entries.put_if_exists(replace(entry, path=final, commit_token=None, committer="lancedb"))
        local.store.inner.delete(entry.path)

    local.entries.on_call("get", pylance_finalizes)
    committed = local.append("w")
    assert finalized.is_set()
    assert committed.version == 2 and committed.attempts == 1
    local.entries.clear_faults()
    local.append("after", parent=committed)
    local.verify(versions=3)


def test_claim_lost_in_transit_is_sent_again(local: LocalTable) -> None:
    local.entries.fail_next(
        "put_if_not_exists",
        AmbiguousWriteError("dynamodb:PutItem", "m", ManifestEntry("x", 1, "x"), "timeout"),
    )
    committed = local.append("w")
    assert committed.version == 2
    local.verify(versions=2)


def test_claim_throttled_through_every_retry_fails_cleanly(local: LocalTable) -> None:
    """A claim that was definitely not applied fails the commit; nothing is committed
    and the next writer takes the version."""
    local.entries.fail_next(
        "put_if_not_exists", ThrottledError("dynamodb:PutItem", "m", "Throttling", 6)
    )
    with pytest.raises(ThrottledError):
        local.append("w", acknowledged=False)
    assert [e.version for e in local.entries.entries()] == [1]
    assert local.append("after").version == 2
    local.verify(versions=2)


def test_unreadable_entry_after_an_ambiguous_claim_is_commit_state_unknown(
    local: LocalTable,
) -> None:
    local.entries.land_then_fail("put_if_not_exists")
    local.entries.fail_next(
        "get", ServiceUnavailableError("dynamodb:GetItem", "m", "injected 500", 6)
    )
    with pytest.raises(CommitStateUnknownError):
        local.append("w", acknowledged=False)
    local.expected[("w", 0)] = ROWS  # it did land
    assert local.append("after").version == 3
    local.verify(versions=3)


@pytest.mark.parametrize("landed", [False, True])
def test_copy_failure_leaves_a_committed_version_that_readers_finalize(
    local: LocalTable, landed: bool
) -> None:
    local.store.fail_next(
        "copy", TransientObjectStoreError("CopyObject", "x", "503 SlowDown"), landed=landed
    )
    writer = local.handler()
    committed = local.append("w", handler=writer)
    assert committed.version == 2
    assert writer.last_outcome is not None and not writer.last_outcome.finalized
    assert committed.location.alternate_key is not None  # staged, readable
    assert local.entries.entries()[-1].is_staged
    reader = local.handler().resolve_latest(local.base)
    assert reader is not None and reader.version == 2 and reader.alternate_key is None
    local.append("after")
    local.verify(versions=3)


def test_flip_landed_but_the_answer_was_lost(local: LocalTable) -> None:
    local.entries.land_then_fail("put_if_exists")
    writer = local.handler()
    committed = local.append("w", handler=writer)
    assert committed.version == 2
    assert not local.entries.entries()[-1].is_staged
    local.append("after", parent=committed)
    local.verify(versions=3)


def test_reader_finalizes_while_the_writer_does(local: LocalTable) -> None:
    """A reader runs the whole finalization between the writer's copy and flip."""
    raced = threading.Event()

    def reader_runs_first(store: MemoryManifestStore) -> None:
        if not raced.is_set():
            raced.set()
            location = local.handler().resolve_latest(local.base)
            assert location is not None and location.alternate_key is None

    local.entries.on_call("put_if_exists", reader_runs_first)
    writer = local.handler()
    committed = local.append("w", handler=writer)
    assert raced.is_set()
    assert writer.last_outcome is not None and writer.last_outcome.finalized
    assert local.staged_objects() == []
    local.entries.clear_faults()
    local.append("after", parent=committed)
    local.verify(versions=3)


def test_staged_object_deleted_after_the_flip_is_harmless(local: LocalTable) -> None:
    with pytest.raises(Crash):
        local.append(
            "crashed",
            handler=CrashingHandler(local.store, local.entries, BOUNDARIES["after_flip"]),
            acknowledged=False,
        )
    local.expected[("crashed", 0)] = ROWS
    (staged,) = local.staged_objects()
    local.store.inner.delete(staged)  # `gc`, or a pylance finalizer
    local.append("after")
    local.verify(versions=3)


def test_staged_object_gone_and_final_present_falls_back_to_the_final_object(
    local: LocalTable,
) -> None:
    with pytest.raises(Crash):
        local.append(
            "crashed",
            handler=CrashingHandler(local.store, local.entries, BOUNDARIES["after_copy"]),
            acknowledged=False,
        )
    local.expected[("crashed", 0)] = ROWS
    (staged,) = local.staged_objects()
    local.store.inner.delete(staged)
    assert local.entries.entries()[-1].path == staged
    location = local.handler().resolve_latest(local.base)
    assert location is not None and location.version == 2 and location.alternate_key is None
    assert not local.entries.entries()[-1].is_staged
    local.append("after")
    local.verify(versions=3)


def test_staged_object_gone_and_no_final_object_is_refused(local: LocalTable) -> None:
    """The dangerous one (delta-rs #2446, lance #5515): the entry points at a
    staged manifest that is gone and no final copy exists. Reading "not found" as
    "already finalized" would flip the pointer to nothing; we refuse instead."""
    with pytest.raises(Crash):
        local.append(
            "crashed",
            handler=CrashingHandler(local.store, local.entries, BOUNDARIES["after_claim"]),
            acknowledged=False,
        )
    (staged,) = local.staged_objects()
    local.store.inner.delete(staged)
    before = local.entries.entries()

    with pytest.raises(ManifestMissingError) as info:
        local.handler().resolve_latest(local.base)
    assert info.value.version == 2 and info.value.staged == staged
    with pytest.raises(ManifestMissingError):
        local.handler().resolve_version(local.base, 2)
    with pytest.raises(ManifestMissingError):  # a writer refuses to build on it too
        local.append("after", acknowledged=False)
    assert local.entries.entries() == before  # never flipped to a missing object
    assert [e.version for e in before] == [1, 2]


# ========================================================================= hypothesis


class Actor:
    """One process in an interleaving: a protocol generator, stepped effect by effect."""

    def __init__(self, name: str, steps: Steps[Any]) -> None:
        self.name = name
        self.steps = steps
        self.pending: Effect | None = None
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._advance(Outcome())

    def _advance(self, last: Outcome) -> None:
        try:
            running, value = advance(self.steps, last)
        except LancetxError as exc:
            self.done, self.error = True, exc
            return
        if running:
            self.pending = value
        else:
            self.done, self.result = True, value

    def step(self, store: LocalObjectStore, entries: MemoryManifestStore, fault: str) -> None:
        effect = self.pending
        assert effect is not None
        try:
            if fault == "lost":
                raise _fault_error(effect)
            result = perform(effect, store, entries)
            if fault == "landed":
                raise _fault_error(effect)
        except LancetxError as exc:
            self._advance(Outcome(error=exc))
            return
        self._advance(Outcome(result))


_WRITES = (ClaimEntry, FlipEntry, CopyObject, DeleteObject)


def _fault_error(effect: Effect) -> LancetxError:
    if isinstance(effect, (ClaimEntry, FlipEntry)):
        return AmbiguousWriteError("dynamodb:PutItem", "m", effect.entry, "injected")
    if isinstance(effect, (GetEntry, LatestEntry)):
        return ServiceUnavailableError("dynamodb:Query", "m", "injected", 6)
    return TransientObjectStoreError(type(effect).__name__, "x", "injected 503")


@dataclass
class WriterState:
    op: int = 0
    acknowledged: list[tuple[int, int, bytes]] = field(default_factory=list)  # op, version, data
    gave_up: list[int] = field(default_factory=list)


def writer_program(
    table: Table, store: LocalObjectStore, name: str, ops: int, state: WriterState
) -> Steps[None]:
    """What commit_transaction does, reduced to the protocol: resolve the latest,
    claim the next version with the handler's commit steps (those production
    drives), on a loss start over; stop at the first other error (a latest version
    it could not finish, too: the loop never claims on top of one, UnfinishedParentError)."""
    for op in range(ops):
        state.op = op
        for _ in range(8):
            location = yield from resolve_steps(table)
            if location is not None and location.alternate_key is not None:
                return
            version = (location.version if location is not None else 0) + 1
            data = json.dumps({"writer": name, "op": op, "version": version}).encode()
            try:
                yield from handler_commit_steps(
                    store, None, table.base_key, version, data, NamingScheme.V2, None
                )
            except VersionAlreadyExistsError:
                continue
            state.acknowledged.append((op, version, data))
            break
        else:
            state.gave_up.append(op)


def pylance_finalizer(table: Table, rounds: int = 3) -> Steps[None]:
    """Lance's reader: finalize a staged latest entry, unconditionally, keeping no token."""
    for _ in range(rounds):
        entry: ManifestEntry | None = yield LatestEntry(table.base_uri)
        if entry is None or not entry.is_staged:
            continue
        final = final_key_of(table, entry)
        yield CopyObject(entry.path, final)
        done = replace(entry, path=final, commit_token=None, committer="lancedb")
        yield FlipEntry(done, expected_path=None)  # type: ignore[arg-type]
        yield DeleteObject(entry.path)


def lancetx_reader(table: Table, rounds: int = 3) -> Steps[None]:
    for _ in range(rounds):
        yield from resolve_steps(table)


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_interleaved_writers_finalizers_and_crashes_keep_the_history_linear(
    data: st.DataObject,
) -> None:
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        store = LocalObjectStore(tmp)
        entries = MemoryManifestStore()
        table = Table("t", "t")
        writers = data.draw(st.integers(2, 3), label="writers")
        ops = data.draw(st.integers(1, 2), label="ops per writer")
        states = {f"w{i}": WriterState() for i in range(writers)}
        actors = [Actor(n, writer_program(table, store, n, ops, s)) for n, s in states.items()]
        for i in range(data.draw(st.integers(0, 2), label="pylance finalizers")):
            actors.append(Actor(f"lance{i}", pylance_finalizer(table)))
        for i in range(data.draw(st.integers(0, 2), label="lancetx readers")):
            actors.append(Actor(f"reader{i}", lancetx_reader(table)))
        # Out of 20: how many steps fail (half lost, half landed where that makes
        # sense); claims get their own, higher rate.
        fault_level = data.draw(st.integers(0, 4), label="fault level")
        claim_fault_level = data.draw(st.integers(0, 10), label="claim fault level")
        budget = data.draw(st.integers(0, 200), label="steps before the crash")
        steps = 0
        while steps < budget:
            live = [a for a in actors if not a.done]
            if not live:
                break
            actor = live[data.draw(st.integers(0, len(live) - 1), label="who")]
            # Runs of several steps by one actor make whole finalizations fit
            # between two steps of another (the interesting interleavings).
            for _ in range(data.draw(st.integers(1, 4), label="burst")):
                if actor.done or steps >= budget:
                    break
                steps += 1
                level = claim_fault_level if isinstance(actor.pending, ClaimEntry) else fault_level
                roll = data.draw(st.integers(0, 19), label="roll") if level else 20
                fault = "none" if roll >= level else ("landed" if roll % 2 else "lost")
                if fault == "landed" and not isinstance(actor.pending, _WRITES):
                    fault = "lost"
                actor.step(store, entries, fault)
        # Whatever is still running now has crashed.

        for actor in actors:
            assert not isinstance(actor.error, ManifestPointerError), (actor.name, actor.error)

        fresh = ExternalStoreCommitHandler(store, entries)
        latest = fresh.resolve_latest("t")
        top = latest.version if latest is not None else 0
        steps = fresh.commit_steps("t", top + 1, b'{"writer": "fresh"}', NamingScheme.V2)
        after = run(steps, store, entries)
        assert after.finalized and after.location.version == top + 1

        rows = [e for e in entries.entries() if e.base_uri == "t"]
        assert [e.version for e in rows] == list(range(1, top + 2)), "gap or hole in the entries"
        assert all(not e.is_staged for e in rows), "a version below the latest was left staged"
        finals = [loc.version for loc in list_manifest_locations(store, "t")]
        assert finals == list(range(1, top + 2)), f"object store holds {finals}"

        committed: Counter[tuple[str, int]] = Counter()
        content: dict[int, bytes] = {}
        for entry in rows[:-1]:
            body = store.get(entry.path)
            content[entry.version] = body
            decoded = json.loads(body)
            assert decoded["version"] == entry.version
            committed[(decoded["writer"], decoded["op"])] += 1
        duplicated = {k: n for k, n in committed.items() if n > 1}
        assert not duplicated, f"committed more than once: {duplicated}"

        for (name, state), actor in zip(states.items(), actors, strict=False):
            for op, version, body in state.acknowledged:
                assert content.get(version) == body, f"{name} op {op}: acknowledged v{version} lost"
            for op in state.gave_up:
                assert committed[(name, op)] == 0
            if actor.error is not None and not isinstance(actor.error, CommitStateUnknownError):
                # Any other error means "not committed".
                assert committed[(name, state.op)] == 0, (
                    f"{name} op {state.op} failed with {actor.error!r} but was committed"
                )


# ======================================================================= end to end


@dataclass
class DdbTable:
    aws: EmbeddedAws
    uri: str
    options: dict[str, str]
    bucket: str
    ddb_table: str
    conn: TableConnection
    expected: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return self.conn.base

    @property
    def handler(self) -> ExternalStoreCommitHandler:
        handler = self.conn.handler
        assert isinstance(handler, ExternalStoreCommitHandler)
        return handler

    def new_connection(self) -> TableConnection:
        return connect(self.uri, self.options)

    def append(
        self,
        writer: str,
        seq: int = 0,
        *,
        handler: ExternalStoreCommitHandler | None = None,
        parent: Committed | None = None,
        acknowledged: bool = True,
    ) -> Committed:
        committed = lancetx_append(
            handler or self.new_connection().handler,  # type: ignore[arg-type]
            self.base,
            self.conn.data_uri,
            self.options,
            batch(writer, seq, ROWS),
            parent,
        )
        if acknowledged:
            self.expected[(writer, seq)] = ROWS
        return committed

    def pylance_append(self, writer: str, seq: int = 0) -> int:
        version = pylance_append(self.uri, self.options, batch(writer, seq, ROWS))
        self.expected[(writer, seq)] = ROWS
        return version

    def items(self) -> list[dict[str, Any]]:
        client = boto3.client("dynamodb", **self.aws.client_kwargs("dynamodb"))
        response = client.query(
            TableName=self.ddb_table,
            KeyConditionExpression="base_uri = :b",
            ExpressionAttributeValues={":b": {"S": self.base}},
            ConsistentRead=True,
        )
        return list(response["Items"])

    def s3(self) -> Any:
        return boto3.client("s3", **self.aws.client_kwargs())

    def staged_objects(self) -> list[str]:
        listing = self.s3().list_objects_v2(Bucket=self.bucket, Prefix=f"{self.base}/_versions/")
        return [o["Key"] for o in listing.get("Contents", []) if "-" in o["Key"].rsplit("/", 1)[-1]]

    def verify(self, versions: int) -> None:
        verify_history(
            self.uri, self.options, self.handler, self.base, self.expected, versions=versions
        )
        assert all(i["path"]["S"].endswith(".manifest") for i in self.items())


@pytest.fixture
def e2e(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[DdbTable]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "db/t.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    table = DdbTable(legacy_aws, uri, options, bucket, ddb_table_name, connect(uri, options))
    table.expected[("setup", 0)] = ROWS
    try:
        yield table
    finally:
        legacy_aws.set_interceptor(None)


@pytest.mark.parametrize("finalizer", ["lancetx", "pylance"])
@pytest.mark.parametrize("boundary", list(BOUNDARIES))
def test_e2e_crash_at_every_boundary(e2e: DdbTable, boundary: str, finalizer: str) -> None:
    crashing = CrashingHandler(e2e.handler.store, e2e.handler.entries, BOUNDARIES[boundary])
    with pytest.raises(Crash):
        e2e.append("crashed", handler=crashing, acknowledged=False)
    claimed = boundary != "after_stage"
    if claimed:
        e2e.expected[("crashed", 0)] = ROWS

    if finalizer == "pylance":  # pylance's reader finishes our commit
        assert lance.dataset(e2e.uri, storage_options=e2e.options).version == 1 + claimed
    else:
        location = e2e.new_connection().handler.resolve_latest(e2e.base)
        assert location is not None and location.version == 1 + claimed
    assert all(i["path"]["S"].endswith(".manifest") for i in e2e.items())

    assert e2e.append("after").version == 2 + claimed
    assert e2e.pylance_append("pylance-after") == 3 + claimed
    e2e.verify(versions=3 + claimed)


def test_e2e_stale_parent_after_a_crash_leaves_no_hole_for_pylance(e2e: DdbTable) -> None:
    writer = e2e.new_connection().handler
    first = e2e.append("holder", 0, handler=writer)  # type: ignore[arg-type]
    with pytest.raises(Crash):
        e2e.append(
            "crashed",
            handler=CrashingHandler(e2e.handler.store, e2e.handler.entries, 2),
            acknowledged=False,
        )
    e2e.expected[("crashed", 0)] = ROWS
    second = e2e.append("holder", 1, handler=writer, parent=first)  # type: ignore[arg-type]
    assert second.version == 4
    e2e.verify(versions=4)


def test_e2e_staged_missing_and_no_final_is_refused(e2e: DdbTable) -> None:
    with pytest.raises(Crash):
        e2e.append(
            "crashed",
            handler=CrashingHandler(e2e.handler.store, e2e.handler.entries, 2),
            acknowledged=False,
        )
    (staged,) = e2e.staged_objects()
    e2e.s3().delete_object(Bucket=e2e.bucket, Key=staged)
    with pytest.raises(ManifestMissingError):
        e2e.new_connection().handler.resolve_latest(e2e.base)
    with pytest.raises(ManifestMissingError):
        e2e.append("after", acknowledged=False)
    with pytest.raises(Exception):  # noqa: B017 - pylance refuses too (an OSError today)
        lance.dataset(e2e.uri, storage_options=e2e.options)
    assert [i["path"]["S"] for i in e2e.items()][-1] == staged  # never flipped


def test_e2e_staged_missing_with_final_present_reads_the_final(e2e: DdbTable) -> None:
    with pytest.raises(Crash):
        e2e.append(
            "crashed",
            handler=CrashingHandler(e2e.handler.store, e2e.handler.entries, 3),
            acknowledged=False,
        )
    e2e.expected[("crashed", 0)] = ROWS
    (staged,) = e2e.staged_objects()
    e2e.s3().delete_object(Bucket=e2e.bucket, Key=staged)
    assert e2e.append("after").version == 3
    e2e.verify(versions=3)


class Once:
    """An interceptor answering the first ``times`` matching requests with ``response``."""

    def __init__(self, match: Any, response: InterceptedResponse, times: int = 1) -> None:
        self.match = match
        self.response = response
        self.remaining = times
        self.fired = 0
        self.lock = threading.Lock()

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if not self.match(request):
            return None
        with self.lock:
            if self.remaining <= 0:
                return None
            self.remaining -= 1
            self.fired += 1
        return self.response


def ddb_error(code: str, status: int, *, after_forwarding: bool = False) -> InterceptedResponse:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code})
    return InterceptedResponse(
        status,
        body.encode(),
        [("Content-Type", "application/x-amz-json-1.0")],
        after_forwarding=after_forwarding,
    )


def s3_error(code: str, status: int, *, after_forwarding: bool = False) -> InterceptedResponse:
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{code}</Message></Error>"
    return InterceptedResponse(
        status,
        body.encode(),
        [("Content-Type", "application/xml")],
        after_forwarding=after_forwarding,
    )


def is_claim(table: DdbTable) -> Any:
    def match(r: InterceptedRequest) -> bool:
        return (
            r.target == "PutItem"
            and table.ddb_table.encode() in r.body
            and b"attribute_not_exists" in r.body
        )

    return match


def is_flip(table: DdbTable) -> Any:
    def match(r: InterceptedRequest) -> bool:
        return (
            r.target == "PutItem"
            and table.ddb_table.encode() in r.body
            and b"attribute_exists(" in r.body
        )

    return match


@pytest.mark.parametrize("step", ["claim", "flip"])
def test_e2e_put_item_landed_but_the_client_saw_a_500(e2e: DdbTable, step: str) -> None:
    match = is_claim(e2e) if step == "claim" else is_flip(e2e)
    fault = Once(match, ddb_error("InternalServerError", 500, after_forwarding=True))
    e2e.aws.set_interceptor(fault)
    writer = e2e.new_connection().handler
    committed = e2e.append("w", handler=writer)  # type: ignore[arg-type]
    e2e.aws.set_interceptor(None)
    assert fault.fired == 1
    assert committed.version == 2 and committed.attempts == 1
    e2e.append("after", parent=committed)
    e2e.verify(versions=3)


def test_e2e_claim_landed_but_the_client_timed_out(e2e: DdbTable) -> None:
    """The first claim reaches DynamoDB only after the client gave up waiting (a
    read timeout); the retry then finds the item our first attempt wrote."""
    released = threading.Event()
    claims: list[float] = []

    def slow_first_claim(r: InterceptedRequest) -> InterceptedResponse | None:
        if not is_claim(e2e)(r):
            return None
        claims.append(time.monotonic())
        if len(claims) == 1:
            time.sleep(0.8)  # the client times out after 0.3 s; this attempt lands later
            released.set()
        else:
            released.wait(5)
            time.sleep(0.05)  # let the first attempt land before this one
        return None

    conn = connect(e2e.uri, {**e2e.options, "dynamodb_read_timeout": "0.3"})
    e2e.aws.set_interceptor(slow_first_claim)
    committed = e2e.append("w", handler=conn.handler)  # type: ignore[arg-type]
    e2e.aws.set_interceptor(None)
    assert len(claims) >= 2, "the first claim did not time out"
    assert committed.version == 2 and committed.attempts == 1
    item = e2e.items()[-1]
    assert int(item["version"]["N"]) == 2 and "commit_token" in item
    e2e.append("after", parent=committed)
    e2e.verify(versions=3)


def test_e2e_claim_landed_then_pylance_finalized_it_before_our_retry(e2e: DdbTable) -> None:
    """The claim lands, the client sees a 500; before the retry, pylance opens the
    table and finalizes our commit, rewriting the item without our token. The
    retry finds a final path it cannot attribute by token: the final object's
    bytes prove it is ours, so the commit succeeds once and is not repeated; our
    finalizer then finds pylance's rewrite and puts our attributes back."""
    fault = Once(is_claim(e2e), ddb_error("InternalServerError", 500, after_forwarding=True))
    finalized_by_pylance: list[int] = []

    def pylance_reads_during_backoff(seconds: float) -> None:
        if not finalized_by_pylance:
            ds = lance.dataset(e2e.uri, storage_options=e2e.options)
            finalized_by_pylance.append(int(ds.version))

    config = DynamoDBConfig.from_options(e2e.options)
    entries = DynamoDBManifestStore(
        make_client(config), e2e.ddb_table, sleep=pylance_reads_during_backoff
    )
    handler = ExternalStoreCommitHandler(e2e.handler.store, entries)
    e2e.aws.set_interceptor(fault)
    committed = e2e.append("w", handler=handler)
    e2e.aws.set_interceptor(None)
    assert fault.fired == 1
    assert finalized_by_pylance == [2]
    item = e2e.items()[-1]
    assert item["path"]["S"].endswith(".manifest")
    assert item["txn_uuid"]["S"] == committed.transaction.uuid and "commit_token" in item
    assert committed.version == 2 and committed.attempts == 1
    e2e.append("after")
    e2e.verify(versions=3)


def test_e2e_copy_failing_through_every_retry(e2e: DdbTable) -> None:
    def is_copy(r: InterceptedRequest) -> bool:
        return r.service == "s3" and r.method == "PUT" and "x-amz-copy-source" in r.headers

    fault = Once(is_copy, s3_error("InternalError", 500), times=10)
    e2e.aws.set_interceptor(fault)
    writer = e2e.new_connection().handler
    committed = e2e.append("w", handler=writer)  # type: ignore[arg-type]
    e2e.aws.set_interceptor(None)
    assert fault.fired >= 1
    assert writer.last_outcome is not None and not writer.last_outcome.finalized  # type: ignore[attr-defined]
    assert committed.version == 2
    assert lance.dataset(e2e.uri, storage_options=e2e.options).version == 2  # pylance finalizes
    e2e.append("after", parent=committed)
    e2e.verify(versions=3)


# ------------------------------------------------------------------ untrusted paths


@pytest.mark.parametrize("where", ["other table", "other version", "outside _versions"])
def test_e2e_untrusted_entry_is_refused_and_never_followed(e2e: DdbTable, where: str) -> None:
    other_uri = ddb_uri(e2e.bucket, "db/other.lance", e2e.ddb_table)
    pylance_create(other_uri, e2e.options, batch("other", 0, 99))
    name = NamingScheme.V2.file_name
    target = {
        "other table": f"db/other.lance/_versions/{name(1)}",
        "other version": manifest_key(e2e.base, 1, NamingScheme.V2),
        "outside _versions": f"db/other.lance/_versions/{name(1)}".replace("_versions/", ""),
    }[where]
    client = boto3.client("dynamodb", **e2e.aws.client_kwargs("dynamodb"))
    client.put_item(
        TableName=e2e.ddb_table,
        Item={
            "base_uri": {"S": e2e.base},
            "version": {"N": "2"},
            "path": {"S": target},
            "size": {"N": "100"},
            "committer": {"S": "mallory"},
        },
    )
    conn = e2e.new_connection()
    log = RequestLog().attach(conn.handler.store.client, "s3")  # type: ignore[attr-defined]
    with pytest.raises(UntrustedManifestPathError) as info:
        conn.handler.resolve_latest(e2e.base)
    assert info.value.path == target and info.value.version == 2
    with pytest.raises(UntrustedManifestPathError):
        conn.handler.resolve_version(e2e.base, 2)
    with pytest.raises(UntrustedManifestPathError):
        conn.handler.list_versions(e2e.base, 0)
    with pytest.raises(UntrustedManifestPathError):
        e2e.append("w", handler=conn.handler, acknowledged=False)  # type: ignore[arg-type]
    touched = [
        r
        for r in log.requests
        if target in r.url or target in r.headers.get("x-amz-copy-source", "")
    ]
    assert touched == [], touched
    assert e2e.items()[-1]["path"]["S"] == target  # not "repaired" either
