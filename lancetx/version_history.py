"""A table's history: one :class:`VersionInfo` per version, read from its manifest.

Each version's manifest carries its transaction inline (lancetx and pylance 14 both
write it), so a version costs one GET; older versions without it fall back to the
transaction file. Versions are loaded in parallel.

Versions a cleanup removed keep their DynamoDB items for a while (fences against
writers holding an old parent), so the version store still lists them: they are
left out — those whose item the cleanup marked removed, and those below the
cleanup horizon (:func:`lancetx.commit.format.retention.removed_versions`) — and
told from versions whose manifest is missing, which raise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

from lancetx.commit.engine.committer import IDEMPOTENCY_KEY
from lancetx.commit.engine.operations import COMMIT_MESSAGE_KEY, Transaction
from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile, read_manifest_at
from lancetx.commit.format.retention import removed_versions
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import table_pb2

T = TypeVar("T")

#: Transaction property holding a commit's idempotency key (the commit loop's).
IDEMPOTENCY_KEY_PROPERTY = IDEMPOTENCY_KEY

#: Versions loaded at once while reading history.
HISTORY_PARALLELISM = 8


@dataclass(frozen=True)
class VersionInfo:
    """One committed version as ``Table.history()`` reports it.

    ``operation`` is the spec's name (``"Append"``, ``"Delete"`` …; ``None`` for a
    version written without a transaction); ``properties`` are the transaction
    properties without Lance's reserved commit-message key, which is
    ``commit_message``; ``committer`` is the library named in the manifest
    (``"lancetx"`` or ``"lance"``).
    """

    version: int
    timestamp: datetime | None
    operation: str | None
    commit_message: str | None
    properties: Mapping[str, str] = field(default_factory=dict)
    committer: str = ""
    transaction_uuid: str | None = None
    #: Live rows (physical rows minus deleted rows) as the manifest records them;
    #: None when a deletion file does not record its count (files older than Lance
    #: recording it: ``Table.checkout(version).count_rows()`` counts them).
    rows: int | None = None
    #: Fragments in this version.
    fragments: int = 0
    #: Bytes of the data files this version references, as the manifest records
    #: them; None when it does not record a file's size (Lance before it did).
    #: Deletion files and indices are not counted.
    data_bytes: int | None = None
    #: Bytes of the data files this version references and the version before it
    #: did not (written by this commit, or brought back by a restore), and the
    #: reverse (no longer referenced: compacted, overwritten, fragments deleted).
    #: For version 1, everything it references is added. None when the version
    #: before it cannot be read (a cleanup removed it) or a size is not recorded.
    bytes_added: int | None = None
    bytes_removed: int | None = None

    @property
    def idempotency_key(self) -> str | None:
        return self.properties.get(IDEMPOTENCY_KEY_PROPERTY)


def version_info(
    handler: CommitHandler,
    base: str,
    location: ManifestLocation,
    loaded: ManifestFile | None = None,
) -> VersionInfo:
    """The :class:`VersionInfo` of one version (one GET unless ``loaded`` is given)."""
    manifest_file = loaded if loaded is not None else read_manifest_at(handler.store, location)
    manifest = manifest_file.manifest
    pb = read_transaction_of(handler.store, base, manifest_file)
    txn = Transaction.from_proto(pb) if pb is not None else None
    stamp = None
    if manifest.HasField("timestamp"):
        ts = manifest.timestamp
        stamp = datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC)
    properties = dict(txn.properties) if txn is not None else {}
    message = properties.pop(COMMIT_MESSAGE_KEY, None)
    return VersionInfo(
        version=location.version,
        timestamp=stamp,
        operation=txn.operation.name if txn is not None else None,
        commit_message=message,
        properties=properties,
        committer=manifest.writer_version.library,
        transaction_uuid=txn.uuid if txn is not None else None,
        rows=_live_rows(manifest),
        fragments=len(manifest.fragments),
        data_bytes=_total(_data_files(manifest).values()),
    )


def _data_files(manifest: table_pb2.Manifest) -> dict[tuple[int | None, str], int]:
    """Each data file a manifest references (by base and path) and its recorded size
    (0: not recorded)."""
    return {
        (f.base_id if f.HasField("base_id") else None, f.path): f.file_size_bytes
        for fragment in manifest.fragments
        for f in fragment.files
    }


def _total(sizes: Iterable[int]) -> int | None:
    total = 0
    for size in sizes:
        if size <= 0:
            return None  # a size the manifest does not record
        total += size
    return total


def with_changes(
    info: VersionInfo, manifest: ManifestFile, previous: ManifestFile | None
) -> VersionInfo:
    """``info`` with :attr:`VersionInfo.bytes_added` and ``bytes_removed`` against the
    version before it (``previous``; None when it cannot be read)."""
    if previous is None and info.version > 1:
        return info
    ours = _data_files(manifest.manifest)
    theirs = _data_files(previous.manifest) if previous is not None else {}
    return replace(
        info,
        bytes_added=_total(size for key, size in ours.items() if key not in theirs),
        bytes_removed=_total(size for key, size in theirs.items() if key not in ours),
    )


def _live_rows(manifest: table_pb2.Manifest) -> int | None:
    rows = 0
    for fragment in manifest.fragments:
        rows += fragment.physical_rows
        if fragment.HasField("deletion_file"):
            if not fragment.deletion_file.num_deleted_rows:
                return None  # not recorded: only the deletion vector knows
            rows -= fragment.deletion_file.num_deleted_rows
    return rows


class _Gone:
    """A version whose manifest was not found (see :func:`map_versions`)."""

    def __init__(self, error: ObjectNotFoundError) -> None:
        self.error = error


def map_versions(
    store: ObjectStore,
    base: str,
    locations: Sequence[ManifestLocation],
    read: Callable[[ManifestLocation, ManifestFile], T],
    *,
    parallelism: int = HISTORY_PARALLELISM,
    extra: Sequence[ManifestLocation] = (),
) -> list[tuple[ManifestLocation, T]]:
    """``read`` each location's manifest, in parallel, in the order given, leaving out
    the versions a cleanup removed (their items outlive their manifests).

    A manifest that is gone although its version was not removed (lost, deleted by
    hand, or a staged item's: a cleanup never removes one) raises its
    ObjectNotFoundError; so does anything ``read`` itself raises. ``extra``
    locations are read in the same pass and follow ``locations`` in the result,
    left out without a word when their manifest is gone."""

    def one(location: ManifestLocation) -> T | _Gone:
        try:
            manifest = read_manifest_at(store, location)
        except ObjectNotFoundError as exc:
            return _Gone(exc)
        return read(location, manifest)

    if not locations:
        return []
    every = [*locations, *extra]
    with ThreadPoolExecutor(max_workers=min(parallelism, len(every))) as pool:
        results = list(pool.map(one, every))
    gone = {
        loc.version: result.error
        for loc, result in zip(locations, results, strict=False)
        if isinstance(result, _Gone)
    }
    if gone:
        # A staged item's version is never removed by a cleanup; an item a cleanup
        # marked is, wherever it lies; others are judged by the cleanup horizon.
        marked = {loc.version for loc in locations if loc.version in gone and loc.removed}
        removable = [
            loc.version
            for loc in locations
            if loc.version in gone and loc.alternate_key is None and loc.version not in marked
        ]
        removed = marked | removed_versions(store, base, removable)
        for version in sorted(gone):
            if version not in removed:
                raise gone[version]
    return [
        (loc, result)
        for loc, result in zip(every, results, strict=True)
        if not isinstance(result, _Gone)
    ]


def iter_history_newest_first(
    handler: CommitHandler, base: str, *, until: int | None = None, since: int = 0
) -> Iterator[VersionInfo]:
    """Versions ``since+1 .. until`` (default: latest) newest first, loaded in parallel
    batches; versions a cleanup removed are left out."""
    locations = handler.list_versions(base, since)
    if until is not None:
        locations = [loc for loc in locations if loc.version <= until]
    locations.sort(key=lambda loc: loc.version, reverse=True)
    for start in range(0, len(locations), HISTORY_PARALLELISM):
        batch = locations[start : start + HISTORY_PARALLELISM]
        yield from load_versions(handler, base, batch, known=locations)


def load_versions(
    handler: CommitHandler,
    base: str,
    locations: list[ManifestLocation],
    known: Sequence[ManifestLocation] = (),
) -> list[VersionInfo]:
    """The :class:`VersionInfo` of each location, loaded in parallel, in the order
    given; versions a cleanup removed are left out (see :func:`map_versions`).

    What each version added and removed is measured against the version before
    it: one of ``locations``, else found in ``known`` (the table's other versions)
    and read too, in the same parallel pass (a manifest gone from there leaves the
    change unknown)."""
    wanted = {loc.version for loc in locations}
    by_version = {loc.version: loc for loc in known}
    before = [
        by_version[v - 1] for v in sorted(wanted) if v - 1 not in wanted and v - 1 in by_version
    ]

    def read(
        loc: ManifestLocation, manifest: ManifestFile
    ) -> tuple[VersionInfo | None, ManifestFile]:
        if loc.version not in wanted:
            return None, manifest  # only the version before one asked for
        return version_info(handler, base, loc, manifest), manifest

    loaded = map_versions(handler.store, base, locations, read, extra=before)
    manifests = {loc.version: manifest for loc, (_, manifest) in loaded}
    return [
        with_changes(info, manifest, manifests.get(loc.version - 1))
        for loc, (info, manifest) in loaded
        if info is not None
    ]


def load_history(
    handler: CommitHandler, base: str, *, until: int | None = None
) -> list[VersionInfo]:
    """Every version up to ``until`` (default: latest), oldest first."""
    return sorted(
        iter_history_newest_first(handler, base, until=until), key=lambda info: info.version
    )


__all__ = [
    "IDEMPOTENCY_KEY_PROPERTY",
    "VersionInfo",
    "iter_history_newest_first",
    "load_history",
    "load_versions",
    "map_versions",
    "version_info",
]
