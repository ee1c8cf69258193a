"""The protocol's steps with no I/O at all: each test feeds effect results by
hand (a scripted driver) and checks which effects the steps ask for, in which
order, and what they conclude. These pin the invariants of
``externalstore/protocol.py``: the claim is the only commit point, a staged
manifest is deleted only when provably not committed or after the flip, a
missing staged object is never read as "already finalized", untrusted paths
are never followed, and an unclear claim is reported as unknown."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from lancetx.commit.errors import (
    CommitStateUnknownError,
    LancetxError,
    ObjectNotFoundError,
    TransientObjectStoreError,
    VersionAlreadyExistsError,
)
from lancetx.commit.format.naming import NamingScheme, manifest_key, staged_manifest_key
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.errors import (
    AmbiguousWriteError,
    EntryExistsError,
    EntryNotFoundError,
    ManifestCopyMismatchError,
    ManifestMissingError,
    ServiceUnavailableError,
    UntrustedManifestPathError,
)
from lancetx.externalstore.protocol import (
    ClaimEntry,
    CommitOutcome,
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
    finalize_steps,
    location_of,
    resolve_steps,
    validate_entry,
)

BASE = "wh/t.lance"
TABLE = Table(BASE, BASE)
V2 = NamingScheme.V2
MANIFEST = b"our manifest bytes"
TOKEN = "11111111-1111-4111-8111-111111111111"
OTHER = "22222222-2222-4222-8222-222222222222"


def etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def staged_key(version: int, token: str = TOKEN, scheme: NamingScheme = V2) -> str:
    return staged_manifest_key(BASE, version, scheme, token)


def final_key(version: int, scheme: NamingScheme = V2) -> str:
    return manifest_key(BASE, version, scheme)


def our_entry(version: int = 5) -> ManifestEntry:
    return ManifestEntry(
        BASE, version, staged_key(version), len(MANIFEST), committer="lancetx", commit_token=TOKEN
    )


Responder = Callable[[Effect], Any]


def drive(steps: Steps[Any], respond: Responder) -> tuple[Any, list[Effect], BaseException | None]:
    """Run ``steps``: each effect is answered by ``respond`` (its return value is
    sent back, a LancetxError it raises is thrown in). Returns (result, effects, error)."""
    effects: list[Effect] = []
    result: Any = None
    error: LancetxError | None = None
    while True:
        try:
            effect = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value, effects, None
        except LancetxError as exc:
            return None, effects, exc
        effects.append(effect)
        assert len(effects) < 50, f"runaway steps: {effects}"
        try:
            result, error = respond(effect), None
        except LancetxError as exc:
            result, error = None, exc


class World:
    """A scripted world: objects as a dict, entries as a dict, with per-effect overrides."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.entries: dict[int, ManifestEntry] = {}
        self.overrides: dict[type, list[Callable[[Any], Any]]] = {}

    def override(self, kind: type, answer: Callable[[Any], Any]) -> None:
        """Answer the next effect of ``kind`` with ``answer(effect)`` instead of the world."""
        self.overrides.setdefault(kind, []).append(answer)

    def __call__(self, effect: Effect) -> Any:
        queue = self.overrides.get(type(effect))
        if queue:
            return queue.pop(0)(effect)
        if isinstance(effect, PutObject):
            self.objects[effect.key] = effect.data
            return ObjectMeta(effect.key, len(effect.data), etag(effect.data))
        if isinstance(effect, CopyObject):
            if effect.src not in self.objects:
                raise ObjectNotFoundError("CopyObject", effect.src)
            data = self.objects[effect.dst] = self.objects[effect.src]
            return ObjectMeta(effect.dst, -1, etag(data))
        if isinstance(effect, GetObject):
            if effect.key not in self.objects:
                raise ObjectNotFoundError("GetObject", effect.key)
            return self.objects[effect.key]
        if isinstance(effect, HeadObject):
            if effect.key not in self.objects:
                raise ObjectNotFoundError("HeadObject", effect.key)
            data = self.objects[effect.key]
            return ObjectMeta(effect.key, len(data), etag(data))
        if isinstance(effect, DeleteObject):
            self.objects.pop(effect.key, None)
            return None
        if isinstance(effect, ClaimEntry):
            existing = self.entries.get(effect.entry.version)
            if existing is not None:
                raise EntryExistsError(
                    "dynamodb:PutItem", "t", BASE, effect.entry.version, existing
                )
            self.entries[effect.entry.version] = effect.entry
            return None
        if isinstance(effect, FlipEntry):
            existing = self.entries[effect.entry.version]
            assert existing.path in (effect.expected_path, effect.entry.path)
            self.entries[effect.entry.version] = effect.entry
            return None
        if isinstance(effect, GetEntry):
            if effect.version not in self.entries:
                raise EntryNotFoundError("dynamodb:GetItem", "t", BASE, effect.version)
            return self.entries[effect.version]
        if isinstance(effect, LatestEntry):
            return self.entries[max(self.entries)] if self.entries else None
        raise AssertionError(f"unexpected effect {effect!r}")


def kinds(effects: list[Effect]) -> list[str]:
    return [type(e).__name__ for e in effects]


def ambiguous(entry: ManifestEntry) -> AmbiguousWriteError:
    return AmbiguousWriteError("dynamodb:PutItem", "t", entry, "injected timeout")


# ---------------------------------------------------------------- uncontended commit


def test_uncontended_commit_is_put_claim_copy_flip_delete_without_reads() -> None:
    world = World()
    outcome, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert error is None
    assert kinds(effects) == ["PutObject", "ClaimEntry", "CopyObject", "FlipEntry", "DeleteObject"]
    put, claim, copy, flip, delete = effects
    assert put == PutObject(staged_key(5), MANIFEST)
    assert claim == ClaimEntry(our_entry())
    assert copy == CopyObject(staged_key(5), final_key(5))
    assert flip == FlipEntry(replace(our_entry(), path=final_key(5)), expected_path=staged_key(5))
    assert delete == DeleteObject(staged_key(5))
    assert isinstance(outcome, CommitOutcome) and outcome.finalized
    assert outcome.location.key == final_key(5) and outcome.location.alternate_key is None
    assert world.objects == {final_key(5): MANIFEST}
    assert world.entries[5].path == final_key(5) and world.entries[5].commit_token == TOKEN


# ------------------------------------------------------------------------ the claim


def test_lost_claim_deletes_only_our_staged_object_and_names_the_winner() -> None:
    world = World()
    winner = replace(our_entry(), path=staged_key(5, OTHER), commit_token=OTHER)
    world.entries[5] = winner
    world.objects[winner.path] = b"theirs"
    _, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert isinstance(error, VersionAlreadyExistsError)
    assert error.winner is not None and error.winner.key == winner.path
    assert error.winner.alternate_key == final_key(5)
    assert kinds(effects) == ["PutObject", "ClaimEntry", "DeleteObject"]
    assert effects[-1] == DeleteObject(staged_key(5))
    assert world.objects == {winner.path: b"theirs"}  # the winner's staged object untouched


def test_claim_that_landed_but_answered_with_a_timeout_is_ours() -> None:
    world = World()

    def land_then_timeout(effect: ClaimEntry) -> None:
        world.entries[5] = effect.entry
        raise ambiguous(effect.entry)

    world.override(ClaimEntry, land_then_timeout)
    outcome, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert error is None and outcome.finalized
    assert kinds(effects) == [
        "PutObject",
        "ClaimEntry",
        "GetEntry",
        "CopyObject",
        "FlipEntry",
        "DeleteObject",
    ]
    assert world.objects == {final_key(5): MANIFEST}


def test_claim_that_did_not_land_is_sent_again() -> None:
    world = World()

    def lost_in_transit(effect: ClaimEntry) -> None:
        raise ambiguous(effect.entry)

    world.override(ClaimEntry, lost_in_transit)
    outcome, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert error is None and outcome.finalized
    assert kinds(effects)[:5] == ["PutObject", "ClaimEntry", "GetEntry", "ClaimEntry", "CopyObject"]


def test_claim_ambiguous_every_time_is_unknown_and_keeps_the_staged_object() -> None:
    world = World()
    for _ in range(10):
        world.override(ClaimEntry, lambda e: (_ for _ in ()).throw(ambiguous(e.entry)))
    _, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert isinstance(error, CommitStateUnknownError)
    assert error.transaction_uuid == TOKEN
    assert "DeleteObject" not in kinds(effects)
    assert staged_key(5) in world.objects


def test_claim_ambiguous_then_unreadable_entry_is_unknown_not_a_plain_error() -> None:
    """After an ambiguous claim, a failing read while settling it must surface as
    CommitStateUnknownError: any other error type tells the caller "not
    committed", and a caller retrying would commit the transaction twice."""
    world = World()

    def land_then_timeout(effect: ClaimEntry) -> None:
        world.entries[5] = effect.entry
        raise ambiguous(effect.entry)

    def unavailable(effect: GetEntry) -> None:
        raise ServiceUnavailableError("dynamodb:GetItem", "t", "injected 500s", 6)

    world.override(ClaimEntry, land_then_timeout)
    world.override(GetEntry, unavailable)
    _, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert isinstance(error, CommitStateUnknownError), repr(error)
    assert "DeleteObject" not in kinds(effects)
    assert staged_key(5) in world.objects


def test_claim_lost_without_ambiguity_stays_a_plain_error_when_reads_fail() -> None:
    """A definite condition failure means nothing of ours landed: a failing read
    while looking up the winner is an ordinary error, not an unknown outcome."""
    world = World()

    def lost(effect: ClaimEntry) -> None:
        raise EntryExistsError("dynamodb:PutItem", "t", BASE, 5, None)

    def unavailable(effect: GetEntry) -> None:
        raise ServiceUnavailableError("dynamodb:GetItem", "t", "injected 500s", 6)

    world.override(ClaimEntry, lost)
    world.override(GetEntry, unavailable)
    _, _, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert isinstance(error, ServiceUnavailableError), repr(error)


@pytest.mark.parametrize("same_content", [True, False])
@pytest.mark.parametrize("etags", ["md5", "equal-for-all", "unique-per-object"])
def test_tokenless_final_entry_after_an_ambiguous_claim_is_judged_by_content(
    same_content: bool, etags: str
) -> None:
    """Our claim landed, the answer was lost, and a finalizer that keeps no
    token (pylance) rewrote the item to the final path before we re-read it.
    Only the final object's bytes can tell whether it is our commit. ETags are
    no proof: S3 SSE-KMS, local disks (inode-based) and some S3-compatible
    stores give a copy another ETag than its source; some give every object
    the same one."""
    world = World()
    final_bytes = MANIFEST if same_content else b"another writer's manifest"
    counter = iter(range(1000))

    def tag(data: bytes) -> str:
        if etags == "md5":
            return etag(data)
        return '"1"' if etags == "equal-for-all" else f'"{next(counter)}"'

    def land_finalize_timeout(effect: ClaimEntry) -> None:
        world.entries[5] = replace(
            effect.entry, path=final_key(5), commit_token=None, committer="lancedb"
        )
        world.objects[final_key(5)] = final_bytes
        world.objects.pop(effect.entry.path, None)  # pylance deletes the staged object
        raise ambiguous(effect.entry)

    def put(effect: PutObject) -> ObjectMeta:
        world.objects[effect.key] = effect.data
        return ObjectMeta(effect.key, len(effect.data), tag(effect.data))

    def head(effect: HeadObject) -> ObjectMeta:
        if effect.key not in world.objects:
            raise ObjectNotFoundError("HeadObject", effect.key)
        data = world.objects[effect.key]
        return ObjectMeta(effect.key, len(data), tag(data))

    world.override(ClaimEntry, land_finalize_timeout)
    world.override(PutObject, put)
    for _ in range(5):
        world.override(HeadObject, head)
    outcome, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    if same_content:
        assert error is None, f"our landed commit reported as {error!r}"
        assert outcome.entry.version == 5
        assert outcome.location.key == final_key(5)
    else:
        assert isinstance(error, VersionAlreadyExistsError), (
            f"another writer's version {outcome!r} reported as ours"
        )
    assert "DeleteObject" not in kinds(effects) or not same_content


def test_untrusted_winner_is_not_offered_as_a_location() -> None:
    world = World()
    world.entries[5] = ManifestEntry(BASE, 5, "elsewhere/_versions/5.manifest", 10)
    _, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert isinstance(error, VersionAlreadyExistsError)
    assert error.winner is None
    assert kinds(effects) == ["PutObject", "ClaimEntry", "DeleteObject"]  # nothing read


# ----------------------------------------------------------------------- finalizing


def test_finalize_failure_after_the_claim_is_not_an_error_and_keeps_the_staged_object() -> None:
    world = World()
    world.override(
        CopyObject,
        lambda e: (_ for _ in ()).throw(TransientObjectStoreError("CopyObject", e.dst, "503")),
    )
    outcome, effects, error = drive(commit_steps(TABLE, 5, V2, MANIFEST, token=TOKEN), world)
    assert error is None
    assert not outcome.finalized
    assert outcome.location.key == staged_key(5)
    assert outcome.location.alternate_key == final_key(5)
    assert kinds(effects) == ["PutObject", "ClaimEntry", "CopyObject"]
    assert world.objects == {staged_key(5): MANIFEST}
    assert world.entries[5].path == staged_key(5)


def test_finalize_after_someone_else_finished_returns_their_result() -> None:
    world = World()
    world.entries[5] = replace(our_entry(), path=final_key(5))
    world.objects[final_key(5)] = MANIFEST
    entry, effects, error = drive(finalize_steps(TABLE, our_entry()), world)
    assert error is None and entry.path == final_key(5)
    assert kinds(effects) == ["HeadObject", "GetEntry"]


def test_finalize_with_staged_gone_and_final_present_flips_to_the_final_object() -> None:
    world = World()
    world.entries[5] = our_entry()
    world.objects[final_key(5)] = MANIFEST
    entry, effects, error = drive(finalize_steps(TABLE, our_entry()), world)
    assert error is None and entry.path == final_key(5)
    assert kinds(effects) == ["HeadObject", "GetEntry", "HeadObject", "FlipEntry", "DeleteObject"]
    assert world.entries[5].path == final_key(5)


def test_finalize_with_staged_and_final_gone_is_manifest_missing() -> None:
    world = World()
    world.entries[5] = our_entry()
    _, effects, error = drive(finalize_steps(TABLE, our_entry()), world)
    assert isinstance(error, ManifestMissingError)
    assert error.version == 5 and error.staged == staged_key(5) and error.final == final_key(5)
    assert kinds(effects) == ["HeadObject", "GetEntry", "HeadObject"]
    assert world.entries[5].path == staged_key(5)  # never flipped to a missing object


def test_finalize_with_a_wrong_sized_final_object_does_not_flip() -> None:
    world = World()
    world.entries[5] = our_entry()
    world.objects[final_key(5)] = b"truncated"
    _, effects, error = drive(finalize_steps(TABLE, our_entry()), world)
    assert isinstance(error, ManifestCopyMismatchError)
    assert "FlipEntry" not in kinds(effects) and "DeleteObject" not in kinds(effects)


def test_finalize_verifies_a_copy_without_matching_etag_by_size() -> None:
    world = World()
    world.entries[5] = our_entry()
    world.objects[staged_key(5)] = MANIFEST

    def short_copy(effect: CopyObject) -> ObjectMeta:
        world.objects[effect.dst] = MANIFEST[:-1]
        return ObjectMeta(effect.dst, -1, '"not-an-md5"')

    world.override(CopyObject, short_copy)
    _, effects, error = drive(
        finalize_steps(TABLE, our_entry(), staged_etag=etag(MANIFEST), ours=True), world
    )
    assert isinstance(error, ManifestCopyMismatchError)
    assert kinds(effects) == ["CopyObject", "HeadObject"]
    assert staged_key(5) in world.objects


def test_resolve_finalizes_a_staged_latest_entry() -> None:
    world = World()
    world.entries[5] = our_entry()
    world.objects[staged_key(5)] = MANIFEST
    location, effects, error = drive(resolve_steps(TABLE), world)
    assert error is None and location.key == final_key(5) and location.version == 5
    # The staged object is checked before it is copied; its ETag verifies the copy.
    assert kinds(effects) == [
        "LatestEntry",
        "HeadObject",
        "CopyObject",
        "FlipEntry",
        "DeleteObject",
    ]


def _staged_world() -> World:
    world = World()
    world.entries[5] = our_entry()
    world.objects[staged_key(5)] = MANIFEST
    return world


def test_a_reader_that_cannot_copy_reads_the_staged_manifest() -> None:
    """Finishing someone else's version is best effort: a reader whose copy fails
    (no write permission, a store failing now) reads the staged manifest."""
    world = _staged_world()
    world.override(
        CopyObject,
        lambda e: (_ for _ in ()).throw(TransientObjectStoreError("CopyObject", e.dst, "503")),
    )
    location, effects, error = drive(resolve_steps(TABLE), world)
    assert error is None
    assert location.key == staged_key(5) and location.alternate_key == final_key(5)
    assert kinds(effects) == ["LatestEntry", "HeadObject", "CopyObject"]
    assert world.entries[5] == our_entry()


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
def test_a_readers_flip_without_an_answer_is_settled_by_reading_the_entry(landed: bool) -> None:
    world = _staged_world()

    def lost(effect: FlipEntry) -> None:
        if landed:
            world.entries[5] = effect.entry
        raise ambiguous(effect.entry)

    world.override(FlipEntry, lost)
    location, effects, error = drive(resolve_steps(TABLE), world)
    assert error is None
    assert world.objects[final_key(5)] == MANIFEST  # copied and verified either way
    if landed:
        assert location.key == final_key(5) and location.alternate_key is None
        assert world.entries[5].path == final_key(5)
        assert kinds(effects)[-2:] == ["GetEntry", "DeleteObject"]
        assert staged_key(5) not in world.objects
    else:
        # The entry may still point at the staged manifest: it stays for the next reader.
        assert location.key == staged_key(5) and location.alternate_key == final_key(5)
        assert world.entries[5].path == staged_key(5)
        assert kinds(effects)[-1] == "GetEntry"
        assert world.objects[staged_key(5)] == MANIFEST


def test_resolve_of_a_final_entry_is_one_read() -> None:
    world = World()
    world.entries[5] = replace(our_entry(), path=final_key(5))
    location, effects, error = drive(resolve_steps(TABLE), world)
    assert error is None and location.key == final_key(5)
    assert kinds(effects) == ["LatestEntry"]
    location, effects, error = drive(resolve_steps(TABLE, 5), world)
    assert kinds(effects) == ["GetEntry"]
    location, effects, error = drive(resolve_steps(TABLE, 6), world)
    assert location is None and error is None


# ------------------------------------------------------------------- untrusted paths


@pytest.mark.parametrize(
    "path",
    [
        "other.lance/_versions/5.manifest",  # another table
        "wh/t.lance2/_versions/5.manifest",  # a sibling whose name extends ours
        f"{BASE}/_versions/4.manifest",  # another version's final name
        f"{BASE}/_versions/{NamingScheme.V2.file_name(6)}",  # another version, V2
        f"{BASE}/_versions/4.manifest-{TOKEN}",  # another version's staged name
        f"{BASE}/_versions/sub/5.manifest",  # nested
        f"{BASE}/_versions/../_versions/5.manifest",  # traversal
        f"{BASE}/data/5.manifest",  # outside _versions/
        f"{BASE}/_versions/5.manifest-not-a-uuid",
        f"{BASE}/_versions/latest_version_hint.json",
        f"s3://bucket/{BASE}/_versions/5.manifest",  # a URI, not a key
        f"/{BASE}/_versions/5.manifest",
    ],
)
def test_untrusted_paths_are_refused_and_never_touched(path: str) -> None:
    entry = ManifestEntry(BASE, 5, path, 10)
    with pytest.raises(UntrustedManifestPathError) as info:
        validate_entry(TABLE, entry)
    assert info.value.path == path and info.value.version == 5
    with pytest.raises(UntrustedManifestPathError):
        location_of(TABLE, entry)
    world = World()
    world.entries[5] = entry
    world.objects[path] = MANIFEST
    for steps in (resolve_steps(TABLE), resolve_steps(TABLE, 5), finalize_steps(TABLE, entry)):
        _, effects, error = drive(steps, world)
        assert isinstance(error, UntrustedManifestPathError), repr(error)
        assert all(isinstance(e, (GetEntry, LatestEntry)) for e in effects), effects
    assert world.objects == {path: MANIFEST}


@pytest.mark.parametrize(
    "path",
    [
        f"{BASE}/_versions/5.manifest",
        f"{BASE}/_versions/{NamingScheme.V2.file_name(5)}",
        f"{BASE}/_versions/5.manifest-{TOKEN}",
        f"{BASE}/_versions/{NamingScheme.V2.file_name(5)}-{TOKEN}",
    ],
)
def test_trusted_paths(path: str) -> None:
    entry = ManifestEntry(BASE, 5, path, 10)
    validate_entry(TABLE, entry)
    location = location_of(TABLE, entry)
    assert location.version == 5 and location.key == path
    if entry.is_staged:
        assert location.alternate_key == path.rsplit("-", 5)[0]
    else:
        assert location.alternate_key is None


# ------------------------------------------------- the store layer under the claim


def test_store_claim_ambiguous_then_unreadable_item_is_ambiguous() -> None:
    from botocore.exceptions import ClientError

    from lancetx.externalstore.dynamodb.plans import ApiCall, RequestContext, put_if_not_exists_plan
    from lancetx.externalstore.dynamodb.retry import RetryPolicy
    from lancetx.externalstore.errors import DynamoDBTarget

    def error(code: str, status: int) -> ClientError:
        return ClientError(
            {
                "Error": {"Code": code, "Message": code},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },  # type: ignore[typeddict-item]
            "PutItem",
        )

    ctx = RequestContext(DynamoDBTarget("t"), retry=RetryPolicy(max_attempts=2, base_delay=0))
    plan = put_if_not_exists_plan(ctx, our_entry())
    answers = iter(
        [
            error("InternalServerError", 500),  # PutItem: may have landed
            error("ConditionalCheckFailedException", 400),  # retry: no ALL_OLD item
            error("InternalServerError", 500),  # GetItem
            error("InternalServerError", 500),  # GetItem again
        ]
    )
    step = next(plan)
    outcome: BaseException | None = None
    try:
        while True:
            step = plan.throw(next(answers)) if isinstance(step, ApiCall) else plan.send(None)
    except StopIteration:
        pass
    except LancetxError as exc:
        outcome = exc
    assert isinstance(outcome, AmbiguousWriteError), repr(outcome)
