"""The external-store commit protocol, written once as pure steps.

The spec's four steps — stage ``_versions/{name}-{uuid}``, conditional insert,
copy to the final name, flip the pointer — and the reader's finalization are
generators that *yield effects* (put this object, claim this entry, …) and
receive each effect's result (or have its error thrown in). They perform no
I/O themselves, so one implementation is driven by both the boto3 driver
(:func:`run`) and the aioboto3 driver (:func:`run_async`) — h11's sans-IO idea —
and by the in-memory stores in fault-injection tests.

Invariants the steps keep (each one closes a failure seen in a peer system,
see ``shared/reference/peer-systems.md`` §5):

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
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from lancetx.commit.errors import LancetxError, ObjectNotFoundError
from lancetx.commit.handler import (
    CommitStateUnknownError,
    ManifestLocation,
    VersionAlreadyExistsError,
)
from lancetx.commit.naming import (
    VERSIONS_DIR,
    NamingScheme,
    join,
    manifest_key,
    parse_manifest_name,
    parse_staged_name,
    staged_manifest_key,
)
from lancetx.commit.objectstore import ObjectMeta, ObjectStore
from lancetx.commit.s3store_async import AsyncObjectStore
from lancetx.externalstore.base import (
    AsyncExternalManifestStore,
    ExternalManifestStore,
    ManifestEntry,
    Ownership,
    ownership_of,
)
from lancetx.externalstore.errors import AmbiguousWriteError, EntryExistsError, EntryNotFoundError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What lancetx writes in the ``committer`` attribute.
COMMITTER = "lancetx"
#: Attempts at claiming a version whose outcome stays ambiguous before giving up.
CLAIM_ATTEMPTS = 3


# ----------------------------------------------------------------------------- errors


class ManifestPointerError(LancetxError):
    """An external-store entry cannot be followed to a manifest."""


class UntrustedManifestPathError(ManifestPointerError):
    """An entry points outside the table's ``_versions/`` or at another version's name."""

    def __init__(self, base_uri: str, version: int, path: str, expected_prefix: str) -> None:
        self.base_uri = base_uri
        self.version = version
        self.path = path
        super().__init__(
            f"refusing to follow the external-store entry for version {version} of {base_uri!r}: "
            f"its path {path!r} is not a manifest of version {version} under {expected_prefix!r}. "
            "The entry was written by something other than Lance/lancetx or for another table; "
            "inspect the item in the DynamoDB table and repair or delete it"
        )


class ManifestMissingError(ManifestPointerError):
    """Both the staged and the final manifest of a committed version are gone."""

    def __init__(self, base_uri: str, version: int, staged: str, final: str) -> None:
        self.base_uri = base_uri
        self.version = version
        self.staged = staged
        self.final = final
        super().__init__(
            f"version {version} of {base_uri!r} is committed in the external store but neither its "
            f"staged manifest {staged!r} nor its final manifest {final!r} exists; refusing to load. "
            "Restore the object from a backup or bucket versioning (copy it to the final name), "
            "or, after checking no data depends on it, delete the item of this version from "
            "the DynamoDB table"
        )


class ManifestCopyMismatchError(ManifestPointerError):
    """The final manifest does not hold the staged bytes after a copy."""

    def __init__(self, base_uri: str, version: int, final: str, detail: str) -> None:
        self.base_uri = base_uri
        self.version = version
        self.final = final
        super().__init__(
            f"the final manifest {final!r} of version {version} of {base_uri!r} does not match the "
            f"committed staged manifest ({detail}); the pointer was not flipped. Retry the read; "
            "if it persists, another process is writing that key"
        )


# ---------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class PutObject:
    """Write an object (result: ObjectMeta)."""

    key: str
    data: bytes


@dataclass(frozen=True)
class CopyObject:
    """Server-side copy, overwriting ``dst`` (result: ObjectMeta of ``dst``)."""

    src: str
    dst: str


@dataclass(frozen=True)
class GetObject:
    """Read a whole object (result: bytes)."""

    key: str


@dataclass(frozen=True)
class HeadObject:
    """Object metadata (result: ObjectMeta)."""

    key: str


@dataclass(frozen=True)
class DeleteObject:
    """Delete an object; missing is fine (result: None)."""

    key: str


@dataclass(frozen=True)
class ClaimEntry:
    """Conditional insert: the commit point (result: None)."""

    entry: ManifestEntry


@dataclass(frozen=True)
class FlipEntry:
    """Point an existing entry at ``entry.path`` if it still points at ``expected_path``."""

    entry: ManifestEntry
    expected_path: str


@dataclass(frozen=True)
class GetEntry:
    """Consistent read of one entry (result: ManifestEntry; EntryNotFoundError)."""

    base_uri: str
    version: int


@dataclass(frozen=True)
class LatestEntry:
    """Consistent read of the newest entry (result: ManifestEntry | None)."""

    base_uri: str


Effect = (
    PutObject
    | CopyObject
    | GetObject
    | HeadObject
    | DeleteObject
    | ClaimEntry
    | FlipEntry
    | GetEntry
    | LatestEntry
)
Steps = Generator[Effect, Any, T]


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
) -> Steps[CommitOutcome]:
    """Claim ``version`` for ``manifest`` (already encoding that version).

    Raises VersionAlreadyExistsError (with the winner's location) when another
    writer holds the version, CommitStateUnknownError when the claim's outcome
    cannot be determined. Once the claim is won, failures while finalizing are
    logged, not raised: the version is committed and any reader completes it.
    """
    token = token or str(uuidlib.uuid4())
    staged = staged_manifest_key(table.base_key, version, scheme, token)
    final = manifest_key(table.base_key, version, scheme)
    staged_meta: ObjectMeta = yield PutObject(staged, manifest)
    entry = ManifestEntry(
        base_uri=table.base_uri,
        version=version,
        path=staged,
        size=len(manifest),
        committer=committer,
        commit_token=token,
    )
    yield from _claim(table, entry, final, manifest)
    try:
        finalized = yield from finalize_steps(table, entry, staged_etag=staged_meta.etag)
    except LancetxError as exc:
        log.warning(
            "version %d of %s is committed but finalizing it failed (%s); readers will finish it",
            version,
            table.base_uri,
            exc,
        )
        return CommitOutcome(_location(entry, scheme), entry, finalized=False)
    return CommitOutcome(_location(finalized, scheme), finalized, finalized=True)


def _claim(table: Table, entry: ManifestEntry, final: str, manifest: bytes) -> Steps[None]:
    """Insert ``entry``; settle ambiguous outcomes; on a loss, delete our staged object."""
    last_error: AmbiguousWriteError | None = None
    for _ in range(CLAIM_ATTEMPTS):
        try:
            yield ClaimEntry(entry)
            return
        except EntryExistsError as lost:
            existing = lost.existing
        except AmbiguousWriteError as unclear:
            last_error = unclear
            existing = None
        except LancetxError as exc:
            if last_error is None:
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
        data: bytes = yield GetObject(final)
    except ObjectNotFoundError:
        return Ownership.THEIRS
    return Ownership.MINE if data == manifest else Ownership.THEIRS


def finalize_steps(
    table: Table, entry: ManifestEntry, *, staged_etag: str | None = None
) -> Steps[ManifestEntry]:
    """Copy a staged manifest to its final name, verify it, flip the entry, delete the staged object.

    Idempotent and safe under any number of concurrent finalizers. Returns the
    entry as it points now (at the final manifest).
    """
    validate_entry(table, entry)  # never copy from (or flip to) a path outside this version
    staged = entry.path
    final = final_key_of(table, entry)
    done = replace(entry, path=final)
    try:
        copied: ObjectMeta = yield CopyObject(staged, final)
    except ObjectNotFoundError:
        # Someone may have finalized and removed the staged object. Check, never assume.
        current: ManifestEntry = yield GetEntry(table.base_uri, entry.version)
        validate_entry(table, current)
        if not current.is_staged:
            return current
        if current.path != staged:
            return (yield from finalize_steps(table, current))
        try:
            copied = yield HeadObject(final)
        except ObjectNotFoundError:
            raise ManifestMissingError(table.base_uri, entry.version, staged, final) from None
        staged_etag = None  # the staged object is gone; verify by size below
    yield from _verify(table, entry, final, copied, staged_etag)
    yield FlipEntry(done, expected_path=staged)
    yield from _best_effort_delete(staged)
    return done


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
    object store (a table not yet onboarded).
    """
    if version is None:
        entry: ManifestEntry | None = yield LatestEntry(table.base_uri)
    else:
        entry = yield from _get_or_none(table, version)
    if entry is None:
        return None
    validate_entry(table, entry)
    if entry.is_staged:
        entry = yield from finalize_steps(table, entry)
    return _location(entry, scheme_of(table, entry))


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
        GetObject: lambda e: store.get(e.key),
        HeadObject: lambda e: store.head(e.key),
        DeleteObject: lambda e: store.delete(e.key),
        ClaimEntry: lambda e: entries.put_if_not_exists(e.entry),
        FlipEntry: lambda e: entries.put_if_exists(e.entry, expected_path=e.expected_path),
        GetEntry: lambda e: entries.get(e.base_uri, e.version),
        LatestEntry: lambda e: entries.latest(e.base_uri),
    }
    result: Any = None
    error: LancetxError | None = None
    while True:
        try:
            effect = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            result, error = handlers[type(effect)](effect), None
        except LancetxError as exc:
            result, error = None, exc


async def run_async(
    steps: Steps[T], store: AsyncObjectStore, entries: AsyncExternalManifestStore
) -> T:
    """Drive ``steps`` with asyncio I/O (aioboto3)."""
    handlers: dict[type, Callable[[Any], Awaitable[Any]]] = {
        PutObject: lambda e: store.put(e.key, e.data),
        CopyObject: lambda e: store.copy(e.src, e.dst),
        GetObject: lambda e: store.get(e.key),
        HeadObject: lambda e: store.head(e.key),
        DeleteObject: lambda e: store.delete(e.key),
        ClaimEntry: lambda e: entries.put_if_not_exists(e.entry),
        FlipEntry: lambda e: entries.put_if_exists(e.entry, expected_path=e.expected_path),
        GetEntry: lambda e: entries.get(e.base_uri, e.version),
        LatestEntry: lambda e: entries.latest(e.base_uri),
    }
    result: Any = None
    error: LancetxError | None = None
    while True:
        try:
            effect = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            result, error = await handlers[type(effect)](effect), None
        except LancetxError as exc:
            result, error = None, exc
