"""The external-store commit protocol, written once as pure steps.

The spec's four steps — stage ``_versions/{name}-{uuid}``, conditional insert,
copy to the final name, flip the pointer — and the reader's finalization are
generators that *yield effects* (put this object, claim this entry, …) and
receive each effect's result (or have its error thrown in). They perform no
I/O themselves, so one implementation is driven by both the boto3 driver
(:func:`run`) and the aioboto3 driver (:func:`run_async`) — h11's sans-IO idea —
and by the in-memory stores in fault-injection tests.

The steps also cover history the external store does not hold yet — a table
written before it was used (onboarding, probing past a stale listing),
versions read from before that (found by HEAD, then recorded so that no claim
can overwrite them), and listing such versions — so the handlers in
:mod:`lancetx.externalstore.commit_handler` only build steps and drive them.

Invariants the steps keep (each one closes a failure seen in a peer system:
Lance's own DynamoDB handler, Delta Lake's and delta-rs's S3 + DynamoDB log stores):

* The conditional insert is the only point where a version is claimed.
* A staged manifest is deleted only when it provably cannot be committed (the
  entry belongs to another writer) or after the pointer was flipped to a
  final object verified to hold the same bytes. Never after an ambiguous write.
* A missing staged object is never read as "already finalized": the entry is
  re-read and the final object checked; if both are gone the version is
  reported missing and not loaded (delta-rs #2446, lance #5515).
* An entry whose path is not a manifest of that very version inside the
  table's ``_versions/`` is refused, never followed.
* Finalizing is idempotent: any number of writers and readers may race on it.
* A claim whose transaction carries an idempotency key claims the key too, in
  the same all-or-nothing write (on a store that keeps key items): a key is
  committed at most once, however far back and however close the other commit.
"""

from __future__ import annotations

import contextlib
import logging
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from lancetx.commit import sansio
from lancetx.commit.engine.effects import DeleteObject, GetObject, HeadObject, PutObject
from lancetx.commit.errors import (
    CommitStateUnknownError,
    IdempotencyKeyCollisionError,
    KeyAlreadyCommittedError,
    LancetxError,
    ObjectNotFoundError,
    VersionAlreadyExistsError,
    VersionNotFoundError,
)
from lancetx.commit.format.listing import (
    ascending_locations,
    manifest_location,
    manifest_locations,
    newest_location,
    versions_prefix,
)
from lancetx.commit.format.location import ManifestLocation, TransactionSummary, pack_handover
from lancetx.commit.format.naming import (
    VERSIONS_DIR,
    NamingScheme,
    join,
    manifest_key,
    parse_manifest_name,
    parse_staged_name,
    staged_manifest_key,
)
from lancetx.commit.storage.limits import MANIFEST, read_capped, read_capped_async
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore, StoreCapabilities
from lancetx.externalstore.base import (
    AsyncExternalManifestStore,
    ExternalManifestStore,
    KeyRecord,
    ManifestEntry,
    Ownership,
    key_record_of,
    key_slot,
    ownership_of,
)
from lancetx.externalstore.errors import (
    AccessDeniedError,
    AmbiguousWriteError,
    BatchEntryExistsError,
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
    EntryExistsError,
    EntryMismatchError,
    EntryNotFoundError,
    InvalidRequestError,
    KeyExistsError,
    ManifestCopyMismatchError,
    ManifestMissingError,
    ManifestSizeMismatchError,
    MultiTableClaimLostError,
    UntrustedManifestPathError,
)

if TYPE_CHECKING:
    # The async object store needs aioboto3/aiohttp (the ``lancetx[async]`` extra);
    # sync users must be able to import the protocol without them.
    from lancetx.commit.storage.s3store_async import AsyncObjectStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Claim errors that prove the request was not applied (so our staged object is garbage).
_REFUSED = (
    AccessDeniedError,
    InvalidRequestError,
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
)

#: What lancetx writes in the ``committer`` attribute.
COMMITTER = "lancetx"
#: Attempts at claiming a version whose outcome stays ambiguous before giving up.
CLAIM_ATTEMPTS = 3
#: How far past a (possibly stale) listing onboarding probes with HEAD.
ONBOARD_PROBE_LIMIT = 1000


# ----------------------------------------------------------------------------- errors


# ---------------------------------------------------------------------------- effects
# The object effects are the engine's (PutObject: result ObjectMeta; GetObject;
# DeleteObject): one vocabulary for an object read or write, whoever asks.


@dataclass(frozen=True)
class CopyObject:
    """Server-side copy, overwriting ``dst`` (result: ObjectMeta of ``dst``)."""

    src: str
    dst: str


@dataclass(frozen=True)
class ClaimEntry:
    """Conditional insert: the commit point (result: None). With ``key``, the key
    item is inserted in the same all-or-nothing write, also only if absent
    (KeyExistsError when it is not; a store without key items claims the entry only)."""

    entry: ManifestEntry
    key: KeyRecord | None = None


@dataclass(frozen=True)
class ClaimEntries:
    """Conditional insert of several entries, all or nothing: the commit point of
    a multi-table commit (result: None). ``request_token`` is the same for every
    attempt of one claim."""

    entries: tuple[ManifestEntry, ...]
    request_token: str


@dataclass(frozen=True)
class FlipEntry:
    """Point an existing entry at ``entry.path`` if it still points at ``expected_path``
    (result: None when this write replaced it; the entry as found when it already
    pointed at ``entry.path``, e.g. finalized by another reader)."""

    entry: ManifestEntry
    expected_path: str


@dataclass(frozen=True)
class GetEntry:
    """Consistent read of one entry (result: ManifestEntry; EntryNotFoundError)."""

    base_uri: str
    version: int


@dataclass(frozen=True)
class GetEntries:
    """Consistent point reads of the entries of ``versions`` (result: the ones that
    exist, ascending: list[ManifestEntry])."""

    base_uri: str
    versions: tuple[int, ...]


@dataclass(frozen=True)
class GetKey:
    """Consistent read of an idempotency key's item (result: KeyRecord | None;
    IdempotencyKeyCollisionError when its slot holds another key's item)."""

    base_uri: str
    key: str


@dataclass(frozen=True)
class LatestEntry:
    """Consistent read of the newest entry (result: ManifestEntry | None)."""

    base_uri: str


@dataclass(frozen=True)
class ListObjects:
    """The objects under ``prefix`` in the store's listing order (result: list[ObjectMeta]).

    With ``until``, the listing ends after the first object for which it is
    true, and a driver stops fetching pages there (Lance's shortcut: on a
    lexically ordered store the first V2 manifest listed is the newest).
    """

    prefix: str
    until: Callable[[ObjectMeta], bool] | None = None


@dataclass(frozen=True)
class ListEntries:
    """Consistent read of the entries with ``version > since``, ascending
    (result: list[ManifestEntry])."""

    base_uri: str
    since: int = 0


Effect = (
    PutObject
    | CopyObject
    | GetObject
    | HeadObject
    | DeleteObject
    | ListObjects
    | ClaimEntry
    | ClaimEntries
    | FlipEntry
    | GetEntry
    | GetEntries
    | GetKey
    | LatestEntry
    | ListEntries
)
Steps = sansio.Steps[Effect, T]


class StoreInfo(Protocol):
    """What the steps may know of an object store without I/O: its capabilities and
    the URI of a key (for messages). Both ``ObjectStore`` and ``AsyncObjectStore`` are."""

    @property
    def capabilities(self) -> StoreCapabilities: ...

    def uri(self, key: str) -> str: ...


# ------------------------------------------------------------------------ the steps


@dataclass(frozen=True)
class Table:
    """The table a protocol run is about: its external-store key and its object-store base key."""

    base_uri: str
    base_key: str

    def versions_prefix(self) -> str:
        return join(self.base_key, VERSIONS_DIR) + "/"


@dataclass(frozen=True)
class CommitOutcome:
    """A won commit. ``finalized`` is False when the copy/flip did not complete;
    the version is committed all the same and readers finish it."""

    location: ManifestLocation
    entry: ManifestEntry
    finalized: bool


def commit_steps(
    table: Table,
    version: int,
    scheme: NamingScheme,
    manifest: bytes,
    *,
    token: str | None = None,
    committer: str = COMMITTER,
    summary: TransactionSummary | None = None,
) -> Steps[CommitOutcome]:
    """Claim ``version`` for ``manifest`` (already encoding that version).

    Raises VersionAlreadyExistsError (with the winner's location) when another
    writer holds the version, CommitStateUnknownError when the claim's outcome
    cannot be determined. Once the claim is won, failures while finalizing are
    logged, not raised: the version is committed and any reader completes it.
    ``summary`` (the transaction in brief) is stored in the entry with the claim.
    """
    staged = yield from claim_steps(
        table, version, scheme, manifest, token=token, committer=committer, summary=summary
    )
    return (yield from finish_steps(staged, scheme))


def claim_steps(
    table: Table,
    version: int,
    scheme: NamingScheme,
    manifest: bytes,
    *,
    token: str | None = None,
    committer: str = COMMITTER,
    summary: TransactionSummary | None = None,
) -> Steps[Staged]:
    """Steps 1 and 2 of :func:`commit_steps`: stage, then claim. Once this
    returns, the version is ours; :func:`finish_steps` completes it."""
    staged = yield from stage_steps(
        table, version, scheme, manifest, token=token, committer=committer, summary=summary
    )
    yield from _claim(table, staged.entry, staged.final_key, staged.manifest)
    return staged


def finish_steps(staged: Staged, scheme: NamingScheme) -> Steps[CommitOutcome]:
    """Steps 3 and 4 of :func:`commit_steps` for a won claim: copy, flip, clean up."""
    table, entry, version = staged.table, staged.entry, staged.entry.version
    try:
        finalized, settled = yield from finalize_outcome_steps(
            table, entry, staged_etag=staged.etag, ours=True
        )
    except LancetxError as exc:
        log.warning(
            "version %d of %s is committed but finalizing it failed (%s); readers will finish it",
            version,
            table.base_uri,
            exc,
        )
        return CommitOutcome(_location(entry, scheme), entry, finalized=False)
    return CommitOutcome(_location(finalized, scheme), finalized, finalized=settled)


@dataclass(frozen=True)
class Staged:
    """A manifest written under its staged name, and the entry that would claim it."""

    table: Table
    entry: ManifestEntry
    manifest: bytes
    final_key: str
    etag: str | None


def stage_steps(
    table: Table,
    version: int,
    scheme: NamingScheme,
    manifest: bytes,
    *,
    token: str | None = None,
    committer: str = COMMITTER,
    summary: TransactionSummary | None = None,
) -> Steps[Staged]:
    """Step 1: write ``manifest`` under ``_versions/{name}-{token}``; nothing is claimed."""
    token = token or str(uuidlib.uuid4())
    staged = staged_manifest_key(table.base_key, version, scheme, token)
    meta: ObjectMeta = yield PutObject(staged, manifest)
    entry = ManifestEntry(
        base_uri=table.base_uri,
        version=version,
        path=staged,
        size=len(manifest),
        committer=committer,
        commit_token=token,
        summary=summary,
        # A claim from the commit queue has writers waiting behind it: the next
        # one builds on this manifest, and reads it from the entry it watches.
        handover=(
            pack_handover(manifest) if summary is not None and summary.ticket is not None else None
        ),
    )
    return Staged(table, entry, manifest, manifest_key(table.base_key, version, scheme), meta.etag)


def claim_all_steps(claims: list[Staged], *, request_token: str | None = None) -> Steps[None]:
    """Step 2 for several tables at once: claim every staged entry in one
    all-or-nothing conditional write (:class:`ClaimEntries`).

    A claim that may have landed is sent again with the same request token;
    condition failures then tell ours (our commit tokens) from another
    writer's. Raises MultiTableClaimLostError after deleting every staged
    manifest when another writer holds one of the versions (so none was
    claimed), CommitStateUnknownError when the outcome cannot be settled
    (staged manifests kept).
    """
    request_token = request_token or str(uuidlib.uuid4())
    entries = tuple(c.entry for c in claims)
    tables = ", ".join(f"{c.table.base_uri!r} v{c.entry.version}" for c in claims)
    last_error: AmbiguousWriteError | None = None
    for _ in range(CLAIM_ATTEMPTS):
        try:
            yield ClaimEntries(entries, request_token)
            return
        except BatchEntryExistsError as lost:
            failed, existing = lost.failed, lost.existing
            may_be_ours = last_error is not None or lost.ambiguous
        except AmbiguousWriteError as unclear:
            last_error = unclear
            continue
        except LancetxError as exc:
            if last_error is None:
                if isinstance(exc, _REFUSED):
                    for claim in claims:
                        yield from _best_effort_delete(claim.entry.path)
                raise
            raise _claims_unknown(claims, tables, f"sending it again failed ({exc})") from exc
        owners: list[tuple[Staged, Ownership, ManifestEntry | None]] = []
        try:
            for i in failed:
                claim = claims[i]
                found = existing[i]
                if found is None:
                    found = yield from _get_or_none(claim.table, claim.entry.version)
                if found is None:
                    owner = Ownership.UNKNOWN if may_be_ours else Ownership.THEIRS
                else:
                    owner = yield from _ownership(
                        found, claim.entry, claim.final_key, claim.manifest, may_be_ours=may_be_ours
                    )
                owners.append((claim, owner, found))
        except LancetxError as exc:
            if not may_be_ours:
                raise
            raise _claims_unknown(claims, tables, f"settling it failed ({exc})") from exc
        if owners and all(owner is Ownership.MINE for _, owner, _ in owners):
            return  # an earlier attempt landed: the write is all or nothing, so all of it
        if any(owner is not Ownership.THEIRS for _, owner, _ in owners):
            raise _claims_unknown(claims, tables, "the items found do not settle it")
        for claim in claims:
            yield from _best_effort_delete(claim.entry.path)
        raise MultiTableClaimLostError(
            {
                claim.table.base_uri: (claim.entry.version, found.path if found else None)
                for claim, _, found in owners
            }
        )
    raise _claims_unknown(
        claims, tables, f"it stayed ambiguous after {CLAIM_ATTEMPTS} attempts ({last_error})"
    )


def _claims_unknown(claims: list[Staged], tables: str, detail: str) -> CommitStateUnknownError:
    first = claims[0].entry
    return CommitStateUnknownError(
        tables,
        first.version,
        first.commit_token,
        f"the all-or-nothing claim of {tables} may have landed and {detail}; staged manifests "
        f"{', '.join(repr(c.entry.path) for c in claims)} were kept",
    )


def _claim(table: Table, entry: ManifestEntry, final: str, manifest: bytes) -> Steps[None]:
    """Insert ``entry`` (and its key item, when its transaction carries an idempotency
    key); settle ambiguous outcomes; on a loss, delete our staged object."""
    key = key_record_of(entry)
    last_error: AmbiguousWriteError | None = None
    for _ in range(CLAIM_ATTEMPTS):
        try:
            yield ClaimEntry(entry, key)
            return
        except EntryExistsError as lost:
            existing = lost.existing
        except KeyExistsError as taken:
            assert key is not None  # only a claim with a key item meets one
            yield from _refused_by_key(table, entry, key, taken, may_be_ours=last_error is not None)
        except AmbiguousWriteError as unclear:
            last_error = unclear
            existing = None
        except LancetxError as exc:
            if last_error is None:
                if isinstance(exc, _REFUSED):
                    # The service refused the request outright (permissions, missing
                    # table, malformed item): it cannot have landed, so the staged
                    # manifest can never be committed.
                    yield from _best_effort_delete(entry.path)
                raise
            # An earlier attempt may still land (a delayed request), whatever the
            # claim sent again says: only a win or a loss to another writer is
            # an answer.
            raise CommitStateUnknownError(
                table.base_uri,
                entry.version,
                entry.commit_token,
                f"the conditional write to the external store was ambiguous ({last_error}) and "
                f"sending it again failed ({exc}); staged manifest {entry.path!r} was kept",
            ) from exc
        try:
            if existing is None:
                existing = yield from _get_or_none(table, entry.version)
                if existing is None:
                    # A consistent read finds nothing: the write did not land (or the
                    # entry vanished). Claiming again is safe: the token makes our own
                    # landing recognizable.
                    continue
            owner = yield from _ownership(
                existing, entry, final, manifest, may_be_ours=last_error is not None
            )
        except LancetxError as exc:
            if last_error is None:
                raise
            # One of our attempts may have landed and we could not find out: any
            # other error would tell the caller "not committed".
            raise CommitStateUnknownError(
                table.base_uri,
                entry.version,
                entry.commit_token,
                f"the conditional write to the external store was ambiguous ({last_error}) and "
                f"settling it failed ({exc}); staged manifest {entry.path!r} was kept",
            ) from exc
        if owner is Ownership.MINE:
            return
        yield from _best_effort_delete(entry.path)
        raise VersionAlreadyExistsError(
            table.base_uri, entry.version, winner=_location_or_none(table, existing)
        )
    raise CommitStateUnknownError(
        table.base_uri,
        entry.version,
        entry.commit_token,
        f"the conditional write to the external store stayed ambiguous after {CLAIM_ATTEMPTS} attempts "
        f"({last_error}); staged manifest {entry.path!r} was kept",
    )


def _refused_by_key(
    table: Table, entry: ManifestEntry, key: KeyRecord, taken: KeyExistsError, *, may_be_ours: bool
) -> Steps[None]:
    """The claim was refused for its key item: raise what the item found says.

    Another commit's item (the store tells our own retried write by its commit
    token): the key is committed already — KeyAlreadyCommittedError with its version.
    Another key's item in the slot: IdempotencyKeyCollisionError. Either way the
    all-or-nothing write wrote nothing of ours, and the item is never overwritten, so
    no earlier attempt of ours can have landed either: the staged manifest is deleted.
    """
    found = taken.existing
    if found is None or (found.commit_token is None and may_be_ours):
        if may_be_ours:
            raise CommitStateUnknownError(
                table.base_uri,
                entry.version,
                entry.commit_token,
                f"the claim with idempotency key {key.key!r} was ambiguous and the key item "
                f"found cannot tell whose it is ({taken}); staged manifest {entry.path!r} was kept",
            ) from taken
        yield from _best_effort_delete(entry.path)
        raise taken
    yield from _best_effort_delete(entry.path)
    if found.key != key.key:
        raise IdempotencyKeyCollisionError(
            table.base_uri, key.key, found.key, found.version, key_slot(key.key)
        ) from taken
    log.info(
        "%s: idempotency key %r was committed as version %d (transaction %s); version %d not "
        "claimed",
        table.base_uri,
        key.key,
        found.version,
        found.transaction_uuid,
        entry.version,
    )
    raise KeyAlreadyCommittedError(
        table.base_uri, key.key, found.version, found.transaction_uuid
    ) from None


def find_key_steps(table: Table, key: str) -> Steps[KeyRecord | None]:
    """The key item of ``key`` (one consistent read), or None."""
    found: KeyRecord | None = yield GetKey(table.base_uri, key)
    return found


def _ownership(
    existing: ManifestEntry,
    ours: ManifestEntry,
    final: str,
    manifest: bytes,
    *,
    may_be_ours: bool,
) -> Steps[Ownership]:
    owner = ownership_of(existing, ours)
    if owner is not Ownership.UNKNOWN:
        return owner
    if not may_be_ours:
        # Every attempt of ours got a definite answer: none of them wrote the item.
        return Ownership.THEIRS
    # A final path without a token: a finalizer that does not keep tokens (pylance)
    # rewrote the entry. Ours iff the final object holds our bytes. ETags cannot
    # tell: SSE-KMS, local disks and some S3-compatible stores give a copy an ETag
    # of its own, and some stores give unrelated objects equal ones.
    if existing.path != final:
        return Ownership.THEIRS
    try:
        data: bytes = yield GetObject(final, MANIFEST)
    except ObjectNotFoundError:
        return Ownership.THEIRS
    return Ownership.MINE if data == manifest else Ownership.THEIRS


def finalize_steps(
    table: Table,
    entry: ManifestEntry,
    *,
    staged_etag: str | None = None,
    ours: bool = False,
    best_effort: bool = False,
) -> Steps[ManifestEntry]:
    """Copy a staged manifest to its final name, verify it, flip the entry, delete the staged object.

    Idempotent and safe under any number of concurrent finalizers. Returns the
    entry as it points now (at the final manifest). ``ours``: the caller staged
    the manifest itself (the claiming writer), so the staged object needs no
    check before it is copied. ``best_effort`` (a reader finishing someone
    else's version): when the copy or the flip cannot be made or settled, the
    staged entry is returned (its manifest is kept and readable) instead of the
    error; see :func:`finalize_outcome_steps`.
    """
    done, _ = yield from finalize_outcome_steps(
        table, entry, staged_etag=staged_etag, ours=ours, best_effort=best_effort
    )
    return done


def finalize_outcome_steps(
    table: Table,
    entry: ManifestEntry,
    *,
    staged_etag: str | None = None,
    ours: bool = False,
    best_effort: bool = False,
) -> Steps[tuple[ManifestEntry, bool]]:
    """:func:`finalize_steps`, also telling whether the entry is known to point at the
    final manifest now (False, with ``best_effort`` only: it may still point at the
    staged one, which is kept, and the entry returned is the staged one).

    Nothing is copied before the item vouches for the staged object (its path
    names this version of this table, and — unless ``ours`` — its size is that
    object's), so a hostile item changes nothing. Only the claim is a commit:
    finishing a claimed version is the same work whoever does it, so a write
    here whose answer is lost (or refused) is settled by re-reading the entry,
    never reported as a commit of the caller's.

    An item that a finalizer without lancetx's attributes (pylance's full-item
    PutItem) rewrote before us gets them back (one conditional PutItem, only in
    that race): the commit queue's waiters read their tickets there.
    """
    validate_entry(table, entry)  # never copy from (or flip to) a path outside this version
    staged = entry.path
    final = final_key_of(table, entry)
    done = replace(entry, path=final)
    copied: ObjectMeta | None = None
    present = True
    if not ours:
        # Someone else's item: it must vouch for the staged object before anything
        # is copied over the version's final name. (Its ETag then verifies the copy,
        # so a reader sends no more requests than without the check.)
        checked = yield from _check_staged(table, entry)
        present = checked is not None
        staged_etag = checked.etag if checked is not None else None
    if present:
        try:
            copied = yield CopyObject(staged, final)
        except ObjectNotFoundError:
            copied = None
        except LancetxError as exc:
            if not best_effort:
                raise
            # A reader that may not write (or a store failing now) still reads the
            # committed bytes where they are; the next finalizer finishes the version.
            log.info(
                "could not finalize version %d of %s (%s); reading its staged manifest %s",
                entry.version,
                table.base_uri,
                exc,
                staged,
            )
            return entry, False
    if copied is None:
        # Someone may have finalized and removed the staged object. Check, never assume.
        current: ManifestEntry = yield GetEntry(table.base_uri, entry.version)
        validate_entry(table, current)
        if not current.is_staged:
            restored = yield from _restore_attributes(done, current)
            return restored, True
        if current.path != staged:
            return (yield from finalize_outcome_steps(table, current, best_effort=best_effort))
        try:
            copied = yield HeadObject(final)
        except ObjectNotFoundError:
            raise ManifestMissingError(table.base_uri, entry.version, staged, final) from None
        staged_etag = None  # the staged object is gone; verify by size below
    yield from _verify(table, entry, final, copied, staged_etag)
    flipped = yield from _flip(table, done, staged, best_effort=best_effort)
    if flipped is None:
        # The final manifest holds the bytes, but the entry may still point at the
        # staged one, which stays: say where the entry points as far as we know.
        return entry, False
    yield from _best_effort_delete(staged)
    return flipped, True


def _check_staged(table: Table, entry: ManifestEntry) -> Steps[ObjectMeta | None]:
    """The staged object of an item someone else wrote, after checking that it is the
    size the item records (None when it is gone). Raises ManifestSizeMismatchError
    (nothing copied or changed) otherwise."""
    if entry.size is None:
        raise ManifestSizeMismatchError(
            table.base_uri,
            entry.version,
            entry.path,
            "the item has no size (Lance and lancetx always record it), so the staged manifest "
            "it points at cannot be checked before it is copied to its final name",
        )
    try:
        meta: ObjectMeta = yield HeadObject(entry.path)
    except ObjectNotFoundError:
        return None
    if meta.size != entry.size:
        raise ManifestSizeMismatchError(
            table.base_uri,
            entry.version,
            entry.path,
            f"the item records size {entry.size}, the staged manifest has {meta.size} bytes",
        )
    return meta


def _flip(
    table: Table, done: ManifestEntry, staged: str, *, best_effort: bool
) -> Steps[ManifestEntry | None]:
    """Point the entry at the final manifest (verified to hold the committed bytes).

    Returns the entry as it points now. A flip whose answer was lost (or that
    failed) is settled by one consistent read; when that does not show it flipped,
    the flip's error is raised, or (``best_effort``) None is returned: the entry may
    still point at ``staged``, which must then be kept. An entry pointing elsewhere
    is another commit's and raises EntryMismatchError.
    """
    try:
        found: ManifestEntry | None = yield FlipEntry(done, expected_path=staged)
    except (EntryMismatchError, EntryNotFoundError):
        raise
    except LancetxError as exc:
        reason: LancetxError = exc
        try:
            current = yield from _get_or_none(table, done.version)
        except LancetxError as again:
            current, reason = None, again
        if current is None or current.path != done.path:
            if not best_effort:
                raise exc
            log.info(
                "pointing version %d of %s at its final manifest %s was not settled (%s); its "
                "staged manifest %s is kept for the next reader to finish",
                done.version,
                table.base_uri,
                done.path,
                reason,
                staged,
            )
            return None
        found = current
    if found is None:
        return done  # our flip
    return (yield from _restore_attributes(done, found))


def _restore_attributes(ours: ManifestEntry, found: ManifestEntry) -> Steps[ManifestEntry]:
    """``found`` (an entry already pointing at its final manifest) with the
    attributes ``ours`` records and it lacks put back, best effort.

    pylance finalizes a staged item with a PutItem of the whole item, keeping
    only Lance's attributes: the transaction summary, the commit-queue ticket and
    claim time, the commit token and the bucket are gone. Waiting writers need
    them (a claim's ticket serves its turn), so whoever finalizes an entry that
    carried them and finds them stripped writes them back, conditioned on the
    entry still pointing at that final manifest. Returns what the entry says now
    as far as we know.
    """
    if ours.summary is None or found.summary is not None or found.path != ours.path:
        return found
    if found.size is not None and found.size != ours.size:
        return found  # not the commit we know of: nothing of ours to put back
    try:
        yield FlipEntry(ours, expected_path=ours.path)
    except LancetxError as exc:  # the version is final either way; only the queue misses it
        log.debug(
            "could not restore lancetx's attributes on version %d of %s (%s)",
            ours.version,
            ours.base_uri,
            exc,
        )
        return found
    return ours


def _verify(
    table: Table, entry: ManifestEntry, final: str, copied: ObjectMeta, staged_etag: str | None
) -> Steps[None]:
    # Equal single-part ETags are equal MD5s: verified without a HEAD (the common case).
    if staged_etag is not None and _etag(copied.etag) == _etag(staged_etag) and _etag(staged_etag):
        return
    meta = copied
    if entry.size is not None and copied.size != entry.size:
        meta = yield HeadObject(final)
    if entry.size is not None and meta.size != entry.size:
        raise ManifestCopyMismatchError(
            table.base_uri, entry.version, final, f"size {meta.size}, expected {entry.size}"
        )


def resolve_steps(table: Table, version: int | None = None) -> Steps[ManifestLocation | None]:
    """Where the manifest of ``version`` (or the newest) lives, finalizing it first if staged.

    One consistent read in the common case. Returns None when the external store
    has no entry for the table (or for ``version``): the caller falls back to the
    object store (a table not yet onboarded). Finishing another writer's version
    is best effort: when it cannot be done or settled now, the staged location is
    returned (readable; ``alternate_key`` set), never an error about that write.
    """
    if version is None:
        entry: ManifestEntry | None = yield LatestEntry(table.base_uri)
    else:
        entry = yield from _get_or_none(table, version)
    if entry is None:
        return None
    validate_entry(table, entry)
    if entry.is_staged:
        entry = yield from finalize_steps(table, entry, best_effort=True)
    return _location(entry, scheme_of(table, entry))


# --------------------------------------------------------- history outside the store
#
# A table may have manifests the external store has no entry for: versions
# written before the table used it (by plain pylance, or by lancetx on a store
# with conditional PUT). The steps below open such history through the object
# store and record what a writer could otherwise claim over.


def resolve_latest_steps(
    table: Table, store: StoreInfo, *, committer: str = COMMITTER
) -> Steps[ManifestLocation | None]:
    """The newest version: one consistent read, finalizing it if staged.

    A table with no entries is onboarded (:func:`onboard_steps`): it is not
    empty, and a caller told "no version" would commit version 1 over the
    existing one.
    """
    location = yield from resolve_steps(table)
    if location is not None:
        return location
    return (yield from onboard_steps(table, store, committer=committer))


def onboard_steps(
    table: Table, store: StoreInfo, *, committer: str = COMMITTER
) -> Steps[ManifestLocation | None]:
    """Record the newest manifest of a table without entries; None if it has none.

    The newest manifest is found by listing, confirmed by probing the next
    names with HEAD (a stale listing must not hide a newer version; reads of
    one key are consistent where listings are not), and inserted so that every
    later commit is claimed in the external store. Losing that insert is fine:
    another process onboarded the table, or committed meanwhile.
    """
    prefix = versions_prefix(table.base_key)
    lexically_ordered = store.capabilities.lexically_ordered_list
    listed: list[ObjectMeta] = yield ListObjects(
        prefix, until=_is_v2_manifest(prefix) if lexically_ordered else None
    )
    latest = newest_location(
        manifest_locations(prefix, listed), store.uri(prefix), lexically_ordered=lexically_ordered
    )
    if latest is None:
        return None
    latest = yield from _probe_newer(table, latest)
    try:
        yield ClaimEntry(_entry_of(table, latest, committer))
        log.info(
            "onboarded %s at version %d into the external store",
            store.uri(table.base_key),
            latest.version,
        )
    except EntryExistsError:
        pass  # another process onboarded it, or committed meanwhile: both fine
    return latest


def _is_v2_manifest(prefix: str) -> Callable[[ObjectMeta], bool]:
    def until(meta: ObjectMeta) -> bool:
        location = manifest_location(prefix, meta)
        return location is not None and location.scheme is NamingScheme.V2

    return until


def _probe_newer(table: Table, latest: ManifestLocation) -> Steps[ManifestLocation]:
    """HEAD the names after ``latest`` until one is missing."""
    current = latest
    for _ in range(ONBOARD_PROBE_LIMIT):
        following = yield from _head_location(table, current.version + 1, current.scheme)
        if following is None:
            return current
        current = following
    return current


def resolve_version_steps(
    table: Table, version: int, store: StoreInfo, *, committer: str = COMMITTER
) -> Steps[ManifestLocation]:
    """``version``'s manifest, finalizing it if staged.

    A version without an entry, committed before the table used the external
    store, is found by a HEAD of its name (V2, then V1) and recorded with the
    versions after it (:func:`backfill_steps`); a table without entries is
    onboarded first. Raises VersionNotFoundError if there is no such manifest.
    """
    location = yield from resolve_steps(table, version)
    if location is not None:
        return location
    for scheme in (NamingScheme.V2, NamingScheme.V1):
        found = yield from _head_location(table, version, scheme)
        if found is None:
            continue
        latest: ManifestEntry | None = yield LatestEntry(table.base_uri)
        if latest is None:
            # Onboard first: backfilled entries alone would make the store's
            # latest entry the newest version backfilled, not the table's.
            yield from onboard_steps(table, store, committer=committer)
        yield from backfill_steps(table, found, committer=committer)
        return found
    raise VersionNotFoundError(
        store.uri(table.base_key), version, "no external-store entry and no manifest"
    )


def backfill_steps(
    table: Table, location: ManifestLocation, *, committer: str = COMMITTER
) -> Steps[None]:
    """Record ``location`` and the versions after it that exist only in the object store.

    Versions written before the table used the external store have no entry,
    so nothing stops a claim on them: a writer building on ``location`` would
    claim the next version and, if that one predates the store too, its copy
    would overwrite that version's manifest. Recorded, such a claim loses like
    any other. Stops at the first version that has an entry (or no manifest):
    three requests per version in between, and only when a pre-external-store
    version is read.

    A version with no manifest below the store's latest entry was committed and
    has been deleted since (cleanup; versions are contiguous): it is recorded
    too, pointing at its (missing) final name, so that a writer building on the
    version before it loses its claim instead of committing a version below the
    latest, which no reader would ever see.
    """
    current = location
    while True:
        try:
            yield ClaimEntry(_entry_of(table, current, committer))
        except EntryExistsError:
            return
        following_entry = yield from _get_or_none(table, current.version + 1)
        if following_entry is not None:
            return  # the external store takes over from here
        following = yield from _head_location(table, current.version + 1, current.scheme)
        if following is None:
            latest: ManifestEntry | None = yield LatestEntry(table.base_uri)
            if latest is not None and latest.version > current.version + 1:
                deleted = ManifestEntry(
                    base_uri=table.base_uri,
                    version=current.version + 1,
                    path=manifest_key(table.base_key, current.version + 1, current.scheme),
                    committer=committer,
                )
                with contextlib.suppress(EntryExistsError):
                    yield ClaimEntry(deleted)
            return
        current = following


def list_versions_steps(
    table: Table, since: int, store: StoreInfo
) -> Steps[list[ManifestLocation]]:
    """Committed versions after ``since``, ascending, from the external store (one Query).

    Versions without an entry (pre-onboarding history) come from the listing
    (never when ``since`` has an entry: every later version has one),
    and those a stale listing misses from a HEAD of their name (reads of one
    key are consistent where listings are not); a deleted one stays a gap for
    the caller to see. Nothing is listed when the entries leave no gap.
    """
    # From the entry of ``since`` itself: when it has one, every later version
    # has one too (a table's entry-less history is older than its first
    # entry), and "nothing newer" needs no listing of the object store.
    entries: list[ManifestEntry] = yield ListEntries(table.base_uri, max(since - 1, 0))
    anchored = since > 0 and any(e.version == since for e in entries)
    found = [location_of(table, e) for e in entries if e.version > since]
    have = {loc.version for loc in found}
    top = found[-1].version if found else None
    if top is not None and len(have) >= top - since:
        return found
    if top is None and anchored:
        return []
    prefix = versions_prefix(table.base_key)
    listed: list[ObjectMeta] = yield ListObjects(prefix)
    older = [
        loc
        for loc in ascending_locations(manifest_locations(prefix, listed), store.uri(prefix))
        if loc.version > since and loc.version not in have and (top is None or loc.version < top)
    ]
    have |= {loc.version for loc in older}
    found = sorted(found + older, key=lambda loc: loc.version)
    if top is not None:
        scheme = found[-1].scheme
        for version in range(since + 1, top):
            if version in have:
                continue
            location = yield from _head_location(table, version, scheme)
            if location is not None:  # else deleted: the caller sees the gap
                found.append(location)
        found.sort(key=lambda loc: loc.version)
    return found


def look_steps(table: Table, since: int, count: int) -> Steps[list[ManifestLocation]]:
    """The versions ``since + 1`` … ``since + count`` claimed so far, ascending, up to
    the first one that is not: point reads of exactly those entries (one GetItem, or
    one BatchGetItem for several), whose cost does not grow with the history as a
    Query's from ``since`` may. Versions are claimed in order (a writer claims the
    version after the newest it saw), so the claimed ones are a prefix; a claim
    beyond a gap is left for the next look (or the claim that meets it) to find.

    What the commit queue's waiters watch (:meth:`CommitQueue.look
    <lancetx.commit.handlers.queue.CommitQueue.look>`). Nothing is finalized: the
    claimant finishes its own version while the next writer prepares."""
    wanted = tuple(range(since + 1, since + 1 + max(count, 0)))
    if not wanted:
        return []
    found: list[ManifestEntry] = yield GetEntries(table.base_uri, wanted)
    by_version = {entry.version: entry for entry in found}
    claimed: list[ManifestLocation] = []
    for version in wanted:
        entry = by_version.get(version)
        if entry is None:
            break
        claimed.append(location_of(table, entry))
    return claimed


def _head_location(
    table: Table, version: int, scheme: NamingScheme
) -> Steps[ManifestLocation | None]:
    """The final manifest of ``version`` by a HEAD of its name; None if absent."""
    key = manifest_key(table.base_key, version, scheme)
    try:
        meta: ObjectMeta = yield HeadObject(key)
    except ObjectNotFoundError:
        return None
    return ManifestLocation(version, key, scheme, size=meta.size, etag=meta.etag)


def _entry_of(table: Table, location: ManifestLocation, committer: str) -> ManifestEntry:
    """An entry recording a final manifest found in the object store (no token:
    its path is the same pointer whoever records it)."""
    return ManifestEntry(
        base_uri=table.base_uri,
        version=location.version,
        path=location.key,
        size=location.size,
        committer=committer,
    )


def _get_or_none(table: Table, version: int) -> Steps[ManifestEntry | None]:
    try:
        entry: ManifestEntry = yield GetEntry(table.base_uri, version)
    except EntryNotFoundError:
        return None
    return entry


def _best_effort_delete(key: str) -> Steps[None]:
    try:
        yield DeleteObject(key)
    except LancetxError as exc:
        log.warning(
            "could not delete staged manifest %s (%s); it is unreferenced and safe to delete",
            key,
            exc,
        )


# --------------------------------------------------------------------- entry checks


def validate_entry(table: Table, entry: ManifestEntry) -> None:
    """Refuse an entry whose path is not a manifest of ``entry.version`` in this table."""
    prefix = table.versions_prefix()
    name = entry.path[len(prefix) :] if entry.path.startswith(prefix) else None
    ok = False
    if name is not None and "/" not in name:
        staged = parse_staged_name(name)
        parsed = (staged.version, staged.scheme) if staged else parse_manifest_name(name)
        ok = parsed is not None and parsed[0] == entry.version
    if not ok:
        raise UntrustedManifestPathError(table.base_uri, entry.version, entry.path, prefix)


def scheme_of(table: Table, entry: ManifestEntry) -> NamingScheme:
    """The naming scheme of a validated entry's path."""
    name = entry.path.rsplit("/", 1)[-1]
    staged = parse_staged_name(name)
    if staged is not None:
        return staged.scheme
    parsed = parse_manifest_name(name)
    if parsed is None:  # validate_entry() rules this out
        raise UntrustedManifestPathError(
            table.base_uri, entry.version, entry.path, table.versions_prefix()
        )
    return parsed[1]


def final_key_of(table: Table, entry: ManifestEntry) -> str:
    """The final manifest key for a (staged or final) entry."""
    return manifest_key(table.base_key, entry.version, scheme_of(table, entry))


def location_of(table: Table, entry: ManifestEntry) -> ManifestLocation:
    """A validated entry as a ManifestLocation (staged paths are readable: same bytes)."""
    validate_entry(table, entry)
    return _location(entry, scheme_of(table, entry))


def _location(entry: ManifestEntry, scheme: NamingScheme) -> ManifestLocation:
    alternate = None
    if entry.is_staged:
        folder, _, name = entry.path.rpartition("/")
        staged = parse_staged_name(name)
        if staged is not None:
            alternate = f"{folder}/{staged.final_name}" if folder else staged.final_name
    return ManifestLocation(
        version=entry.version,
        key=entry.path,
        scheme=scheme,
        size=entry.size,
        alternate_key=alternate,
        summary=entry.summary,
        removed=entry.is_removed,
        handover=entry.handover if entry.is_staged else None,
    )


def _location_or_none(table: Table, entry: ManifestEntry) -> ManifestLocation | None:
    try:
        return location_of(table, entry)
    except UntrustedManifestPathError:
        return None


def _etag(value: str | None) -> str | None:
    return value.strip('"') if value else None


# --------------------------------------------------------------------------- drivers


def run(steps: Steps[T], store: ObjectStore, entries: ExternalManifestStore) -> T:
    """Drive ``steps`` with blocking I/O (boto3, local disk, in-memory stores)."""
    handlers: dict[type, Callable[[Any], Any]] = {
        PutObject: lambda e: store.put(e.key, e.data),
        CopyObject: lambda e: store.copy(e.src, e.dst),
        GetObject: lambda e: (
            store.get(e.key) if e.kind is None else read_capped(store, e.key, e.kind)
        ),
        HeadObject: lambda e: store.head(e.key),
        DeleteObject: lambda e: store.delete(e.key),
        ListObjects: lambda e: _listing(store.list(e.prefix), e.until),
        ClaimEntry: lambda e: (
            entries.put_if_not_exists(e.entry)
            if e.key is None
            else entries.put_with_key_if_not_exists(e.entry, e.key)
        ),
        ClaimEntries: lambda e: entries.put_all_if_not_exists(
            e.entries, request_token=e.request_token
        ),
        FlipEntry: lambda e: entries.put_if_exists(e.entry, expected_path=e.expected_path),
        GetEntry: lambda e: entries.get(e.base_uri, e.version),
        GetEntries: lambda e: entries.get_entries(e.base_uri, e.versions),
        GetKey: lambda e: entries.get_key(e.base_uri, e.key),
        LatestEntry: lambda e: entries.latest(e.base_uri),
        ListEntries: lambda e: entries.list_entries(e.base_uri, e.since),
    }
    # LancetxError: the steps handle it; anything else leaves them where they stand.
    return sansio.drive(steps, lambda e: handlers[type(e)](e), passes=LancetxError)


async def run_async(
    steps: Steps[T], store: AsyncObjectStore, entries: AsyncExternalManifestStore
) -> T:
    """Drive ``steps`` with asyncio I/O (aioboto3)."""
    handlers: dict[type, Callable[[Any], Awaitable[Any]]] = {
        PutObject: lambda e: store.put(e.key, e.data),
        CopyObject: lambda e: store.copy(e.src, e.dst),
        GetObject: lambda e: (
            store.get(e.key) if e.kind is None else read_capped_async(store, e.key, e.kind)
        ),
        HeadObject: lambda e: store.head(e.key),
        DeleteObject: lambda e: store.delete(e.key),
        ListObjects: lambda e: _listing_async(store, e),
        ClaimEntry: lambda e: (
            entries.put_if_not_exists(e.entry)
            if e.key is None
            else entries.put_with_key_if_not_exists(e.entry, e.key)
        ),
        ClaimEntries: lambda e: entries.put_all_if_not_exists(
            e.entries, request_token=e.request_token
        ),
        FlipEntry: lambda e: entries.put_if_exists(e.entry, expected_path=e.expected_path),
        GetEntry: lambda e: entries.get(e.base_uri, e.version),
        GetEntries: lambda e: entries.get_entries(e.base_uri, e.versions),
        GetKey: lambda e: entries.get_key(e.base_uri, e.key),
        LatestEntry: lambda e: entries.latest(e.base_uri),
        ListEntries: lambda e: entries.list_entries(e.base_uri, e.since),
    }
    return await sansio.drive_async(steps, lambda e: handlers[type(e)](e), passes=LancetxError)


def _listing(
    listing: Iterable[ObjectMeta], until: Callable[[ObjectMeta], bool] | None
) -> list[ObjectMeta]:
    """``listing`` up to and including the first object ``until`` accepts; a lazy
    listing fetches no page past it."""
    taken: list[ObjectMeta] = []
    for meta in listing:
        taken.append(meta)
        if until is not None and until(meta):
            break
    return taken


async def _listing_async(store: AsyncObjectStore, effect: ListObjects) -> list[ObjectMeta]:
    return _listing(await store.list(effect.prefix), effect.until)
