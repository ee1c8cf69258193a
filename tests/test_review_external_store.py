"""Review: adversarial interleavings of the external-store commit (questions 1-7).

Each test settles one question of the protocol review:

* Q1: pylance's finalizer (unconditional copy, PutItem ``attribute_exists`` that
  does not check the path, delete staged) racing ours;
* Q2: several finalizers racing a third that deletes the staged object after
  its flip -- every interleaving explored;
* Q3: the commit loop after an unknown outcome and after a stale winner;
* Q4: a rebase that wrote merged deletion files and then lost again;
* Q5: onboarding and backfill under concurrency, stale listings, cleanup gaps;
* Q6: conflict detection across pre-onboarding versions on a stale listing;
* Q7: ambiguous conditional PUTs, wasted reads, error messages.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from engine_helpers import (
    EngineTable,
    LosingHandler,
    delete_transaction,
    make_table,
    rows,
    snapshot_of,
)
from engine_helpers import (
    lancetx_append as engine_append,
)
from protocol_helpers import (
    BOUNDARIES,
    Crash,
    CrashingHandler,
    FaultyObjectStore,
    batch,
    lancetx_append,
    pylance_create,
    verify_history,
)

from lancetx.commit.engine.committer import Parent, commit_transaction, load_parent
from lancetx.commit.engine.operations import Delete
from lancetx.commit.errors import (
    InvalidCommitError,
    LancetxError,
    ObjectNotFoundError,
    RetryableConflictError,
    TransientObjectStoreError,
)
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import read_manifest
from lancetx.commit.format.naming import NamingScheme, manifest_key, staged_manifest_key
from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.handlers.interface import (
    CommitHandler,
    CommitStateUnknownError,
    VersionAlreadyExistsError,
)
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.dynamodb import (
    DynamoDBConfig,
    DynamoDBManifestStore,
    create_table,
    make_client,
)
from lancetx.externalstore.embedded import EmbeddedAws
from lancetx.externalstore.errors import (
    AmbiguousWriteError,
    EntryMismatchError,
    ManifestCopyMismatchError,
    ManifestMissingError,
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
    GetObject,
    HeadObject,
    LatestEntry,
    PutObject,
    Steps,
    Table,
    commit_steps,
    final_key_of,
    finalize_steps,
    resolve_steps,
)

ROWS = 10
V2 = NamingScheme.V2


# ============================================================================ helpers


class StaleListingStore(FaultyObjectStore):
    """A store whose listing omits ``hidden`` keys (a legacy store's stale listing);
    GET/HEAD of a single key stay consistent."""

    def __init__(self, inner: ObjectStore, hidden: set[str] | None = None) -> None:
        super().__init__(inner)
        self.hidden: set[str] = hidden or set()

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        self.calls["list"] += 1
        return iter([m for m in self.inner.list(prefix) if m.key not in self.hidden])


def _base(path: str) -> str:
    return os.path.abspath(path).lstrip("/")


def _manifest_keys(store: ObjectStore, base: str) -> dict[int, str]:
    return {loc.version: loc.key for loc in list_manifest_locations(store, base)}


def _bytes_of(store: ObjectStore, keys: dict[int, str]) -> dict[int, bytes]:
    return {v: store.get(k) for v, k in keys.items()}


class DictWorld:
    """Objects in a dict, entries in a MemoryManifestStore: the production effect
    semantics without I/O (for exhaustive interleavings)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.entries = MemoryManifestStore()

    def __call__(self, effect: Effect) -> Any:
        if isinstance(effect, PutObject):
            self.objects[effect.key] = effect.data
            return ObjectMeta(effect.key, len(effect.data), None)
        if isinstance(effect, CopyObject):
            if effect.src not in self.objects:
                raise ObjectNotFoundError("CopyObject", effect.src)
            data = self.objects[effect.dst] = self.objects[effect.src]
            return ObjectMeta(effect.dst, len(data), None)
        if isinstance(effect, GetObject):
            if effect.key not in self.objects:
                raise ObjectNotFoundError("GetObject", effect.key)
            return self.objects[effect.key]
        if isinstance(effect, HeadObject):
            if effect.key not in self.objects:
                raise ObjectNotFoundError("HeadObject", effect.key)
            return ObjectMeta(effect.key, len(self.objects[effect.key]), None)
        if isinstance(effect, DeleteObject):
            self.objects.pop(effect.key, None)
            return None
        if isinstance(effect, ClaimEntry):
            return self.entries.put_if_not_exists(effect.entry)
        if isinstance(effect, FlipEntry):
            return self.entries.put_if_exists(effect.entry, expected_path=effect.expected_path)
        if isinstance(effect, GetEntry):
            return self.entries.get(effect.base_uri, effect.version)
        if isinstance(effect, LatestEntry):
            return self.entries.latest(effect.base_uri)
        raise AssertionError(f"unexpected effect {effect!r}")


class Stepper:
    """One actor: a protocol generator advanced one effect at a time."""

    def __init__(self, steps: Steps[Any]) -> None:
        self.steps = steps
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.pending: Effect | None = None
        self._resume(lambda: steps.send(None))

    def _resume(self, how: Callable[[], Effect]) -> None:
        try:
            self.pending = how()
        except StopIteration as stop:
            self.done, self.result, self.pending = True, stop.value, None
        except LancetxError as exc:
            self.done, self.error, self.pending = True, exc, None

    def step(self, world: Callable[[Effect], Any]) -> None:
        assert self.pending is not None
        try:
            result = world(self.pending)
        except LancetxError as exc:
            error = exc
            self._resume(lambda: self.steps.throw(error))
            return
        self._resume(lambda: self.steps.send(result))


def pylance_finalizer(table: Table) -> Steps[None]:
    """Lance's ``finalize_manifest``: read the entry, unconditional copy (a 404 means
    "someone finalized": stop), PutItem ``attribute_exists`` without a path check
    and without our token, delete the staged object."""
    entry: ManifestEntry | None = yield LatestEntry(table.base_uri)
    if entry is None or not entry.is_staged:
        return
    final = final_key_of(table, entry)
    try:
        yield CopyObject(entry.path, final)
    except ObjectNotFoundError:
        return
    yield HeadObject(final)
    done = replace(entry, path=final, commit_token=None, committer="lancedb", e_tag=None)
    yield FlipEntry(done, expected_path=None)  # type: ignore[arg-type]
    yield DeleteObject(entry.path)


def explore(make: Callable[[], tuple[DictWorld, list[Stepper]]], check: Callable[..., None]) -> int:
    """Run every interleaving of the actors ``make`` returns (stateless model
    checking by replay); ``check(world, actors)`` after each. Returns how many."""
    count = 0

    def visit(prefix: list[int]) -> None:
        nonlocal count
        world, actors = make()
        for who in prefix:
            actors[who].step(world)
        live = [i for i, a in enumerate(actors) if not a.done]
        if not live:
            check(world, actors)
            count += 1
            return
        for who in live:
            visit([*prefix, who])

    visit([])
    return count


# ============================================================================ Q1


def test_q1_our_flip_after_pylance_flipped_is_success_on_dynamodb(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    """DynamoDB, real requests: the entry was claimed by us (staged path + token);
    pylance's finalizer replaced the whole item (final path, no token, its own
    committer) without checking the path. Our flip, conditioned on the staged
    path, is then a no-op success; a flip to any OTHER path is refused; and
    pylance's PutItem cannot create an item for an unclaimed version."""
    options = aws.pylance_storage_options()
    client = make_client(DynamoDBConfig.from_options(options))
    create_table(client, ddb_table_name)
    store = DynamoDBManifestStore(client, ddb_table_name)
    base = "b/t.lance"
    token = "11111111-1111-4111-8111-111111111111"
    staged = staged_manifest_key(base, 7, V2, token)
    final = manifest_key(base, 7, V2)
    ours = ManifestEntry(base, 7, staged, 100, committer="lancetx", commit_token=token)
    store.put_if_not_exists(ours)

    raw = boto3.client("dynamodb", **aws.client_kwargs("dynamodb"))

    def pylance_put_if_exists(version: int, path: str) -> None:
        raw.put_item(
            TableName=ddb_table_name,
            Item={
                "base_uri": {"S": base},
                "version": {"N": str(version)},
                "path": {"S": path},
                "size": {"N": "100"},
                "committer": {"S": "lancedb"},
            },
            ConditionExpression="attribute_exists(base_uri) AND attribute_exists(version)",
        )

    pylance_put_if_exists(7, final)
    store.put_if_exists(replace(ours, path=final), expected_path=staged)  # no error
    after = store.get(base, 7)
    assert after.path == final and after.commit_token is None and after.committer == "lancedb"

    elsewhere = staged_manifest_key(base, 7, V2, "33333333-3333-4333-8333-333333333333")
    with pytest.raises(EntryMismatchError):
        store.put_if_exists(replace(ours, path=elsewhere), expected_path=staged)
    assert store.get(base, 7).path == final

    with pytest.raises(raw.exceptions.ConditionalCheckFailedException):
        pylance_put_if_exists(8, manifest_key(base, 8, V2))
    assert [e.version for e in store.list_entries(base)] == [7]


@pytest.mark.parametrize("pylance_at", range(6))
def test_q1_pylance_finalizer_at_every_point_of_our_commit(pylance_at: int) -> None:
    """A pylance finalizer runs to completion after each effect of our commit
    (stage, claim, copy, flip, delete). Our commit is acknowledged exactly when
    it is committed, the entry ends at the final path, and the final object
    holds our bytes: pylance's path-blind PutItem never points anywhere else."""
    world = DictWorld()
    table = Table("t", "t")
    ours = b"our manifest v1"
    writer = Stepper(commit_steps(table, 1, V2, ours))
    for _ in range(pylance_at):
        if writer.done:
            break
        writer.step(world)
    pylance = Stepper(pylance_finalizer(table))
    while not pylance.done:
        pylance.step(world)
    assert pylance.error is None
    while not writer.done:
        writer.step(world)

    assert writer.error is None, repr(writer.error)
    assert writer.result.location.version == 1
    (entry,) = world.entries.entries()
    assert entry.path == manifest_key("t", 1, V2)
    assert world.objects[entry.path] == ours
    assert [k for k in world.objects if k != entry.path] == [], "staged object left behind"


# ============================================================================ Q2


def _q2_world(readers: int, with_writer: bool) -> tuple[DictWorld, list[Stepper]]:
    """Version 1 claimed by writer W (staged, not finalized); a loser of the same
    version crashed before deleting ITS staged object (different uuid, other bytes)."""
    world = DictWorld()
    table = Table("t", "t")
    token = "11111111-1111-4111-8111-111111111111"
    staged = staged_manifest_key("t", 1, V2, token)
    world.objects[staged] = b"the winner's manifest"
    loser = staged_manifest_key("t", 1, V2, "22222222-2222-4222-8222-222222222222")
    world.objects[loser] = b"a loser's manifest, never committed!"
    entry = ManifestEntry("t", 1, staged, len(world.objects[staged]), commit_token=token)
    world.entries.put_if_not_exists(entry)
    actors = [Stepper(pylance_finalizer(table))]
    actors += [Stepper(resolve_steps(table)) for _ in range(readers)]
    if with_writer:
        actors.append(Stepper(finalize_steps(table, entry)))
    return world, actors


def _q2_check(world: DictWorld, actors: list[Stepper]) -> None:
    final = manifest_key("t", 1, V2)
    for actor in actors:
        assert not isinstance(actor.error, ManifestMissingError), actor.error
        assert actor.error is None, repr(actor.error)
    (entry,) = world.entries.entries()
    assert entry.path == final
    assert world.objects[final] == b"the winner's manifest"
    for actor in actors[1:]:
        if isinstance(actor.result, ManifestLocation):
            assert actor.result.key == final and actor.result.alternate_key is None


@pytest.mark.parametrize(
    ("readers", "with_writer"),
    [(2, False), (1, True)],
    ids=["pylance+2readers", "pylance+reader+writer"],
)
def test_q2_racing_finalizers_every_interleaving(readers: int, with_writer: bool) -> None:
    """Every interleaving of a pylance finalizer (which deletes the staged object
    right after its flip) with lancetx readers and the writer finishing its own
    commit: nobody gets ManifestMissingError for the healthy version, the entry
    ends final, and the final object holds the winner's bytes, never the loser's
    staged object of the same version."""
    explored = explore(lambda: _q2_world(readers, with_writer), _q2_check)
    assert explored > 1000


def test_q2_reader_seeing_staged_gone_and_final_wrong_size_refuses() -> None:
    """A final object with other bytes (a legacy writer, not a finalizer) is never
    flipped to: the reader refuses instead of loading it."""
    world, _ = _q2_world(0, False)
    world.objects.pop(staged_manifest_key("t", 1, V2, "11111111-1111-4111-8111-111111111111"))
    world.objects[manifest_key("t", 1, V2)] = b"something else entirely, longer"
    reader = Stepper(resolve_steps(Table("t", "t")))
    while not reader.done:
        reader.step(world)
    assert isinstance(reader.error, ManifestCopyMismatchError)
    assert world.entries.entries()[0].is_staged


def test_q2_entry_naming_another_versions_staged_object_is_never_copied() -> None:
    world = DictWorld()
    other = staged_manifest_key("t", 4, V2, "11111111-1111-4111-8111-111111111111")
    world.objects[other] = b"version 4"
    world.entries.put_if_not_exists(ManifestEntry("t", 5, other, 9))
    reader = Stepper(resolve_steps(Table("t", "t")))
    while not reader.done:
        reader.step(world)
    assert isinstance(reader.error, UntrustedManifestPathError)
    assert set(world.objects) == {other}


# ============================================================================ Q3


@pytest.fixture
def local(tmp_path: Path) -> tuple[str, str, FaultyObjectStore, MemoryManifestStore]:
    path = str(tmp_path / "t.lance")
    pylance_create(path, None, batch("setup", 0, ROWS))
    store = FaultyObjectStore(LocalObjectStore("/"))
    entries = MemoryManifestStore()
    base = _base(path)
    assert ExternalStoreCommitHandler(store, entries).resolve_latest(base) is not None  # onboard
    return path, base, store, entries


def test_q3_unknown_outcome_keeps_the_staged_manifest_names_our_transaction_and_is_not_retried(
    local: tuple[str, str, FaultyObjectStore, MemoryManifestStore],
) -> None:
    path, base, store, entries = local
    handler = ExternalStoreCommitHandler(store, entries)
    parent = load_parent(handler, base)
    assert parent is not None
    entries.land_then_fail("put_if_not_exists")
    entries.fail_next("get", ServiceUnavailableError("dynamodb:GetItem", "m", "down", 6), times=9)
    claims_before = entries.calls["put_if_not_exists"]
    with pytest.raises(CommitStateUnknownError) as info:
        lancetx_append(handler, base, path, None, batch("w", 0, ROWS), parent)
    entries.clear_faults()
    # Not retried as a conflict: one claim, no second version attempted.
    assert entries.calls["put_if_not_exists"] - claims_before == 1
    (claimed,) = [e for e in entries.entries() if e.version == 2]
    assert claimed.is_staged and store.inner.head(claimed.path) is not None  # staged kept
    # The error names OUR transaction, so "look for it before retrying" works.
    fresh = ExternalStoreCommitHandler(store, entries)
    latest = load_parent(fresh, base)
    assert latest is not None and latest.version == 2
    assert latest.manifest.transaction is not None
    assert info.value.transaction_uuid == latest.manifest.transaction.uuid
    assert info.value.version == 2


def test_q3_a_resent_claim_failing_after_an_ambiguous_one_is_unknown() -> None:
    """The first claim timed out (it may still land: a delayed request), a
    consistent read found nothing, the claim sent again is throttled through
    every retry. That is not "not committed": the delayed first attempt can
    still land, so the outcome is unknown and the staged manifest is kept."""
    world = DictWorld()
    table = Table("t", "t")
    entry_box: list[ManifestEntry] = []

    def claim(effect: Effect) -> Any:
        if isinstance(effect, ClaimEntry):
            entry_box.append(effect.entry)
            if len(entry_box) == 1:
                raise AmbiguousWriteError("dynamodb:PutItem", "m", effect.entry, "timeout")
            raise ThrottledError("dynamodb:PutItem", "m", "ThrottlingException", 6)
        return world(effect)

    writer = Stepper(commit_steps(table, 1, V2, b"m"))
    while not writer.done:
        writer.step(claim)
    assert isinstance(writer.error, CommitStateUnknownError), repr(writer.error)
    assert entry_box[0].path in world.objects  # staged manifest kept


class StaleWinnerHandler(CommitHandler):
    """Loses its first claim naming a stale winner, after two other writers committed."""

    def __init__(self, inner: CommitHandler, others: Callable[[], None]) -> None:
        self.inner = inner
        self.store = inner.store
        self.others: Callable[[], None] | None = others
        self.attempts: list[int] = []

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        return self.inner.resolve_latest(base)

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        return self.inner.resolve_version(base, version)

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        return self.inner.list_versions(base, since)

    def commit(
        self, base: str, version: int, manifest: bytes, scheme: NamingScheme
    ) -> ManifestLocation:
        self.attempts.append(version)
        if self.others is not None:
            run_others, self.others = self.others, None
            run_others()
            stale = ManifestLocation(version - 1, manifest_key(base, version - 1, scheme), scheme)
            raise VersionAlreadyExistsError(self.store.uri(base), version, winner=stale)
        return self.inner.commit(base, version, manifest, scheme)


def test_q3_a_stale_winner_still_converges(
    local: tuple[str, str, FaultyObjectStore, MemoryManifestStore],
) -> None:
    path, base, store, entries = local
    handler = ExternalStoreCommitHandler(store, entries)
    parent = load_parent(handler, base)
    assert parent is not None

    def two_others() -> None:
        first = lancetx_append(handler, base, path, None, batch("o", 0, ROWS))
        lancetx_append(handler, base, path, None, batch("o", 1, ROWS), first)

    racing = StaleWinnerHandler(handler, two_others)
    done = lancetx_append(racing, base, path, None, batch("w", 0, ROWS), parent)
    assert racing.attempts == [2, 4]
    assert done.version == 4 and done.attempts == 2
    expected = {("setup", 0): ROWS, ("o", 0): ROWS, ("o", 1): ROWS, ("w", 0): ROWS}
    verify_history(path, None, handler, base, expected, versions=4)


# ============================================================================ Q4


@pytest.fixture
def engine(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10, 10))


def _deletion_file_id(key: str) -> tuple[int, int]:
    fragment, _, rest = key.rsplit("/", 1)[-1].split("-", 2)
    return int(fragment), int(rest.split(".")[0])


def _referenced_deletion_files(table: EngineTable) -> set[tuple[int, int]]:
    refs = set()
    for loc in list_manifest_locations(table.handler.store, table.base):
        manifest = read_manifest(table.handler.store, loc.key).manifest
        for fragment in manifest.fragments:
            if fragment.HasField("deletion_file"):
                refs.add((fragment.id, fragment.deletion_file.id))
    return refs


@pytest.mark.parametrize("third_overlaps", [False, True])
def test_q4_rebased_then_lost_again(engine: EngineTable, third_overlaps: bool) -> None:
    """Ours (delete rows 5, 6 of fragment 0, read at v2) is rebased onto v3 (a
    winner deleted 0, 1), writes a merged deletion file, then loses v4 to a third
    delete. The second rebase merges against v4; if the third deleted one of
    OUR rows it is a retryable conflict. Either way the first attempt's merged
    file is an orphan no version references, and pylance reads exactly what the
    committed versions say."""
    table = engine
    read = table.latest()
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    v3 = table.latest()
    third_rows = [6, 9] if third_overlaps else [8, 9]
    third = delete_transaction(table, v3, {0: third_rows}, "third")
    files_before = {k for k, _ in table.listing("_deletions")}

    racing = LosingHandler(table.handler, before_commit=lambda v: table.commit(third, parent=v3))
    if third_overlaps:
        with pytest.raises(RetryableConflictError):
            commit_transaction(racing, table.base, ours)
        assert racing.attempts == [4]
        assert table.versions() == [1, 2, 3, 4]
        assert table.values() == [2, 3, 4, 5, 7, 8, *range(10, 20)]
    else:
        done = commit_transaction(racing, table.base, ours)
        assert racing.attempts == [4, 5] and done.version == 5
        op = done.transaction.operation
        assert isinstance(op, Delete)
        assert done.transaction.read_version == 4
        assert sorted(snapshot_of(table, done).deletion_vector(0)) == [0, 1, 5, 6, 8, 9]
        assert table.values() == [2, 3, 4, 7, *range(10, 20)]
    written = {k for k, _ in table.listing("_deletions")} - files_before
    referenced = _referenced_deletion_files(table)
    orphans = [k for k in written if _deletion_file_id(k) not in referenced]
    # The first attempt's merged file (read_version 3) was superseded by the second
    # rebase and removed once the commit landed: no orphan is left.
    assert orphans == []
    # pylance opens every version; the orphan changes nothing it reads.
    for version in table.versions():
        table.dataset(version).count_rows()


# ============================================================================ Q5


def _legacy_table(tmp_path: Path, versions: int) -> EngineTable:
    """A table written without DynamoDB: versions 1..``versions`` (5 rows each)."""
    return make_table(str(tmp_path / "t.lance"), sizes=(5,) * versions)


def _ext(
    entries: MemoryManifestStore, hidden: set[str] | None = None
) -> ExternalStoreCommitHandler:
    return ExternalStoreCommitHandler(StaleListingStore(LocalObjectStore("/"), hidden), entries)


def test_q5_two_onboarders_racing_a_ddb_committer_on_stale_listings(tmp_path: Path) -> None:
    """A and B found the external store empty and onboard late, on listings that
    show only version 1, while C onboarded and committed through the store:
    first C's v4 is final, then C's v5 is claimed but its writer crashed before
    the copy. Nobody overwrites a manifest; the history stays linear."""
    table = _legacy_table(tmp_path, 3)
    entries = MemoryManifestStore()
    keys = _manifest_keys(table.handler.store, table.base)
    legacy_bytes = _bytes_of(table.handler.store, keys)
    stale = {keys[2], keys[3]}
    a, b, c = _ext(entries, stale), _ext(entries, stale), _ext(entries)

    c4 = engine_append(EngineTable(table.uri, None, replace(table.conn, handler=c)), rows(100, 5))
    assert c4.version == 4
    onboarded_a = a._onboard(table.base)  # A: "the store was empty" a moment ago
    assert onboarded_a is not None and onboarded_a.version == 4
    with pytest.raises(Crash):
        engine_append(
            EngineTable(
                table.uri,
                None,
                replace(
                    table.conn, handler=CrashingHandler(c.store, entries, BOUNDARIES["after_claim"])
                ),
            ),
            rows(200, 5),
            parent=c4,
        )
    onboarded_b = b._onboard(table.base)
    assert onboarded_b is not None and onboarded_b.version == 4
    parent_b = Parent(onboarded_b, read_manifest(b.store, onboarded_b.key))
    txn_b = EngineTable(table.uri, None, replace(table.conn, handler=b))
    done_b = engine_append(txn_b, rows(300, 5), parent=parent_b)
    assert done_b.version == 6 and done_b.attempts == 2

    after = _manifest_keys(table.handler.store, table.base)
    assert sorted(after) == [1, 2, 3, 4, 5, 6]
    assert _bytes_of(table.handler.store, {v: after[v] for v in (1, 2, 3)}) == legacy_bytes
    assert [e.version for e in entries.entries()] == [3, 4, 5, 6]
    assert table.values() == [*range(15), *range(100, 105), *range(200, 205), *range(300, 305)]


def test_q5_stale_listing_hiding_the_latest_legacy_versions(tmp_path: Path) -> None:
    table = _legacy_table(tmp_path, 4)
    entries = MemoryManifestStore()
    keys = _manifest_keys(table.handler.store, table.base)
    legacy_bytes = _bytes_of(table.handler.store, keys)
    handler = _ext(entries, {keys[3], keys[4]})
    done = engine_append(
        EngineTable(table.uri, None, replace(table.conn, handler=handler)), rows(100, 5)
    )
    assert done.version == 5
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in range(1, 5)}) == legacy_bytes
    assert table.versions() == [1, 2, 3, 4, 5]


def test_q5_pre_store_parent_is_backfilled_so_its_claim_loses(tmp_path: Path) -> None:
    """A writer holding a pre-onboarding version (v2) after the store was onboarded
    at v4: backfill records v2..v3, so its claim of v3 loses instead of
    overwriting the legacy v3 manifest."""
    table = _legacy_table(tmp_path, 4)
    entries = MemoryManifestStore()
    keys = _manifest_keys(table.handler.store, table.base)
    legacy_bytes = _bytes_of(table.handler.store, keys)
    handler = _ext(entries)
    assert handler.resolve_latest(table.base) is not None  # onboarded at v4
    old = load_parent(handler, table.base, 2)
    assert old is not None
    done = engine_append(
        EngineTable(table.uri, None, replace(table.conn, handler=handler)), rows(100, 5), parent=old
    )
    assert done.version == 5 and done.attempts == 2
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in range(1, 5)}) == legacy_bytes


def _cleanup_gap(tmp_path: Path) -> tuple[EngineTable, dict[int, bytes]]:
    """Legacy versions 1..5 whose v3 manifest was removed by a cleanup (v2 kept,
    e.g. tagged)."""
    table = _legacy_table(tmp_path, 5)
    keys = _manifest_keys(table.handler.store, table.base)
    table.handler.store.delete(keys[3])
    return table, _bytes_of(table.handler.store, {v: k for v, k in keys.items() if v != 3})


def test_q5_time_travel_read_of_a_legacy_table_with_a_cleanup_gap_keeps_the_latest(
    tmp_path: Path,
) -> None:
    """The first thing a process does on a never-onboarded legacy table is read the
    old version 2. Backfill must not leave the store believing v2 is the latest
    (v4, v5 exist beyond the gap): a writer would claim v3, and later v4 and v5,
    overwriting legacy manifests."""
    table, legacy = _cleanup_gap(tmp_path)
    entries = MemoryManifestStore()
    handler = _ext(entries)
    assert load_parent(handler, table.base, 2) is not None
    latest = handler.resolve_latest(table.base)
    assert latest is not None and latest.version == 5
    done = engine_append(
        EngineTable(table.uri, None, replace(table.conn, handler=handler)), rows(100, 5)
    )
    assert done.version == 6
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in legacy}) == legacy


def test_q5_commit_on_a_pre_store_parent_below_a_cleanup_gap_is_never_lost(
    tmp_path: Path,
) -> None:
    """Onboarded at v5; a writer commits on the old v2, whose successor v3 was
    cleaned up. Claiming v3 must not succeed: the commit would be acknowledged
    at a version below the latest, which no reader ever sees."""
    table, legacy = _cleanup_gap(tmp_path)
    entries = MemoryManifestStore()
    handler = _ext(entries)
    assert handler.resolve_latest(table.base) is not None  # onboarded at v5
    old = load_parent(handler, table.base, 2)
    assert old is not None
    try:
        done = engine_append(
            EngineTable(table.uri, None, replace(table.conn, handler=handler)),
            rows(100, 5),
            parent=old,
        )
    except InvalidCommitError as refused:
        assert "version 3" in str(refused)
        done = None  # refused: it cannot be checked against the deleted v3
    latest = handler.resolve_latest(table.base)
    assert latest is not None
    if done is not None:
        assert done.version == latest.version, (
            f"acknowledged at v{done.version}, but the latest is v{latest.version}"
        )
    else:
        assert latest.version == 5
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in legacy}) == legacy


# ============================================================================ Q6


def test_q6_stale_listing_cannot_hide_a_pre_store_version_from_conflict_checks(
    tmp_path: Path,
) -> None:
    """Ours deletes rows 5, 6 of fragment 0, planned at v2. Before the table used
    the external store, v3 deleted rows 0, 1 of the same fragment and v4
    appended. The store is onboarded at v4; the stale listing omits v3. Ours must
    still be checked against v3 (rebased: all four rows deleted), or its
    deletion file silently replaces v3's and rows 0, 1 come back."""
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))
    read = table.latest()
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)  # v3
    engine_append(table, rows(100, 5))  # v4
    keys = _manifest_keys(table.handler.store, table.base)
    handler = _ext(MemoryManifestStore(), {keys[3]})

    done = commit_transaction(handler, table.base, ours)

    assert done.version == 5
    assert table.values() == [2, 3, 4, 7, 8, 9, *range(10, 20), *range(100, 105)]


def test_q6_a_cleaned_up_version_between_read_and_latest_is_refused_not_skipped(
    tmp_path: Path,
) -> None:
    """Any handler: the version right after ours' read version was cleaned up, so
    its transaction cannot be checked. The commit is refused; before, the gap
    was skipped and ours (planned without v3's deletions) resurrected rows."""
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))
    read = table.latest()
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)  # v3
    engine_append(table, rows(100, 5))  # v4
    table.handler.store.delete(_manifest_keys(table.handler.store, table.base)[3])

    with pytest.raises(InvalidCommitError, match=r"\[3\]"):
        commit_transaction(table.handler, table.base, ours)
    assert [loc.version for loc in table.handler.list_versions(table.base)] == [1, 2, 4]


def test_q6_versions_up_to_the_parent_missing_from_a_stale_listing_are_refused(
    tmp_path: Path,
) -> None:
    """Conditional-PUT handler over a listing that lags: the caller holds v3 as
    parent (read by name), ours read v2, and the listing does not show v3 yet.
    Ours must not be committed unchecked against v3."""
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))
    read = table.latest()
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)  # v3
    keys = _manifest_keys(table.handler.store, table.base)
    handler = ConditionalPutCommitHandler(StaleListingStore(LocalObjectStore("/"), {keys[3]}))
    parent = load_parent(handler, table.base, 3)

    with pytest.raises(InvalidCommitError, match=r"\[3\]"):
        commit_transaction(handler, table.base, ours, parent=parent)
    assert table.versions() == [1, 2, 3]


# ============================================================================ Q7


@pytest.mark.parametrize("landed", [True, False])
def test_q7_conditional_put_that_may_have_landed_is_never_not_committed(
    tmp_path: Path, landed: bool
) -> None:
    """A create-if-absent PUT answered by a transient error (5xx/timeout after the
    request was sent): the handler reads the object back. Ours → committed;
    absent → unknown (a delayed request may still land), never a plain
    transient error the caller would retry into a duplicate commit."""
    path = str(tmp_path / "t.lance")
    pylance_create(path, None, batch("setup", 0, ROWS))
    store = FaultyObjectStore(LocalObjectStore("/"))
    handler = ConditionalPutCommitHandler(store)
    base = _base(path)
    store.fail_next(
        "put_if_not_exists",
        TransientObjectStoreError("PutObject", "x", "injected 500 after sending"),
        landed=landed,
    )
    if landed:
        done = lancetx_append(handler, base, path, None, batch("w", 0, ROWS))
        assert done.version == 2 and done.attempts == 1
        verify_history(path, None, handler, base, {("setup", 0): ROWS, ("w", 0): ROWS}, versions=2)
    else:
        with pytest.raises(CommitStateUnknownError):
            lancetx_append(handler, base, path, None, batch("w", 0, ROWS))
        assert [loc.version for loc in handler.list_versions(base)] == [1]


def test_q7_a_clean_loss_to_a_pylance_finalized_entry_reads_no_object() -> None:
    """Nothing of ours can have landed: the winner's tokenless final entry is
    theirs without downloading its manifest."""
    world = DictWorld()
    world.entries.put_if_not_exists(ManifestEntry("t", 1, manifest_key("t", 1, V2), 5))
    world.objects[manifest_key("t", 1, V2)] = b"their"
    effects: list[str] = []

    def log(effect: Effect) -> Any:
        effects.append(type(effect).__name__)
        return world(effect)

    writer = Stepper(commit_steps(Table("t", "t"), 1, V2, b"ours"))
    while not writer.done:
        writer.step(log)
    assert isinstance(writer.error, VersionAlreadyExistsError)
    assert effects == ["PutObject", "ClaimEntry", "DeleteObject"]


def test_q7_error_messages_name_no_tool_that_does_not_exist() -> None:
    missing = ManifestMissingError("t", 1, "a", "b")
    untrusted = UntrustedManifestPathError("t", 1, "x", "t/_versions/")
    for message in (str(missing), str(untrusted)):
        assert "lancetx-sync" not in message
