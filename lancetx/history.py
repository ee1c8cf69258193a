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

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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
) -> list[tuple[ManifestLocation, T]]:
    """``read`` each location's manifest, in parallel, in the order given, leaving out
    the versions a cleanup removed (their items outlive their manifests).

    A manifest that is gone although its version was not removed (lost, deleted by
    hand, or a staged item's: a cleanup never removes one) raises its
    ObjectNotFoundError; so does anything ``read`` itself raises."""

    def one(location: ManifestLocation) -> T | _Gone:
        try:
            manifest = read_manifest_at(store, location)
        except ObjectNotFoundError as exc:
            return _Gone(exc)
        return read(location, manifest)

    if not locations:
        return []
    with ThreadPoolExecutor(max_workers=min(parallelism, len(locations))) as pool:
        results = list(pool.map(one, locations))
    gone = {
        loc.version: result.error
        for loc, result in zip(locations, results, strict=True)
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
        for loc, result in zip(locations, results, strict=True)
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
        yield from load_versions(handler, base, locations[start : start + HISTORY_PARALLELISM])


def load_versions(
    handler: CommitHandler, base: str, locations: list[ManifestLocation]
) -> list[VersionInfo]:
    """The :class:`VersionInfo` of each location, loaded in parallel, in the order
    given; versions a cleanup removed are left out (see :func:`map_versions`)."""
    loaded = map_versions(
        handler.store,
        base,
        locations,
        lambda loc, manifest: version_info(handler, base, loc, manifest),
    )
    return [info for _, info in loaded]


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
