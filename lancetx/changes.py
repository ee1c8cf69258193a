"""What each version did to a table's rows: the change feed a streaming reader follows.

A version either *appends* rows (its new fragments hold them), changes *no* row
(compaction, an index, a config or schema-metadata change, a delete that matched
nothing), or *changes* rows that were there (a delete, an update, a merge that
updates or deletes, an overwrite, a restore, new columns written into every
fragment). :func:`load_changes` tells which from each version's manifest and the
transaction stored with it (one GET per version, in parallel) and names the
fragments an appending version added, by id, with their live rows: a reader
reads exactly those fragments at that version and gets exactly the rows it
appended, each once, however the table is compacted later.

Versions a cleanup removed cannot be told any more: :class:`VersionsRemovedError`
names them, so a follower that fell behind learns it lost their rows instead of
silently skipping them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from lancetx.commit.engine.operations import (
    Append,
    Clone,
    CreateIndex,
    DataReplacement,
    Delete,
    Merge,
    Operation,
    Overwrite,
    Project,
    ReserveFragments,
    Restore,
    Rewrite,
    Transaction,
    Update,
    UpdateBases,
    UpdateConfig,
    UpdateMemWalState,
)
from lancetx.commit.errors import VersionNotFoundError
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.errors import VersionsRemovedError
from lancetx.protos import table_pb2
from lancetx.version_history import map_versions

#: Operations that leave every row as it was (the fragments they rewrite, if any,
#: hold the same rows: compaction).
_NO_ROW_CHANGE = (
    Rewrite,
    CreateIndex,
    UpdateConfig,
    ReserveFragments,
    UpdateMemWalState,
    UpdateBases,
    Project,
)


@dataclass(frozen=True)
class FragmentRows:
    """One fragment of a version: its id and its live rows (physical rows minus
    deleted ones; the physical rows when the deletion file does not record its count)."""

    id: int
    rows: int


@dataclass(frozen=True)
class VersionChange:
    """What one version did to the table's rows (see :mod:`lancetx.changes`).

    ``appended`` lists the fragments whose rows this version added (read them at
    ``version``); ``changes_rows`` is True when it deleted or changed rows that
    were there before (``deletes_only`` when it only deleted some), and
    ``detail`` says what it did in words. ``columns`` are the table's top-level
    columns at this version.
    """

    version: int
    operation: str | None
    timestamp: datetime | None
    appended: tuple[FragmentRows, ...] = ()
    changes_rows: bool = False
    deletes_only: bool = False
    detail: str = ""
    columns: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        """The rows this version appended."""
        return sum(f.rows for f in self.appended)


def fragment_rows(fragment: table_pb2.DataFragment) -> FragmentRows:
    """A manifest fragment's id and live rows."""
    rows = fragment.physical_rows
    if fragment.HasField("deletion_file"):
        rows -= fragment.deletion_file.num_deleted_rows
    return FragmentRows(fragment.id, max(rows, 0))


def top_level_columns(manifest: table_pb2.Manifest) -> tuple[str, ...]:
    """The names of a manifest's top-level fields, in schema order."""
    return tuple(f.name for f in manifest.fields if f.parent_id == -1)


def _timestamp(manifest: table_pb2.Manifest) -> datetime | None:
    if not manifest.HasField("timestamp"):
        return None
    ts = manifest.timestamp
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC)


def _matching(
    manifest: table_pb2.Manifest, added: Iterable[table_pb2.DataFragment]
) -> tuple[FragmentRows, ...]:
    """The manifest's fragments that are ``added`` (a transaction's new fragments).

    A transaction records its new fragments before they get their ids (the commit
    assigns them), so they are recognised by their data files."""
    paths = {data_file.path for fragment in added for data_file in fragment.files}
    return tuple(
        fragment_rows(f)
        for f in sorted(manifest.fragments, key=lambda f: f.id)
        if any(data_file.path in paths for data_file in f.files)
    )


def _fragments(ids: frozenset[int]) -> str:
    count = len(ids)
    return f"{count} fragment{'s' if count != 1 else ''}"


def classify(
    version: int, manifest: table_pb2.Manifest, operation: Operation | None
) -> tuple[tuple[FragmentRows, ...], bool, bool, str]:
    """``(appended, changes_rows, deletes_only, detail)`` of one version."""
    if operation is None:
        return (), True, False, "it has no transaction, so what it changed cannot be told"
    if isinstance(operation, Append):
        appended = _matching(manifest, operation.fragments)
        return appended, False, False, f"appended {sum(f.rows for f in appended)} row(s)"
    if isinstance(operation, Delete):
        touched = operation.modified_fragment_ids | frozenset(operation.deleted_fragment_ids)
        if not touched:
            return (), False, False, "deleted no rows"
        where = f" matching {operation.predicate!r}" if operation.predicate else ""
        return (), True, True, f"deleted rows{where} from {_fragments(touched)}"
    if isinstance(operation, Update):
        touched = operation.modified_fragment_ids
        if touched:
            return (), True, False, f"updated or deleted rows of {_fragments(touched)}"
        appended = _matching(manifest, operation.new_fragments)
        return appended, False, False, f"inserted {sum(f.rows for f in appended)} row(s)"
    if isinstance(operation, Overwrite | Clone) and version == 1:
        # The table's creation (a clone's too): every row is new.
        rows = tuple(fragment_rows(f) for f in sorted(manifest.fragments, key=lambda f: f.id))
        return rows, False, False, f"created the table with {sum(f.rows for f in rows)} row(s)"
    if isinstance(operation, Overwrite):
        return (), True, False, "replaced every row (an overwrite)"
    if isinstance(operation, Rewrite):
        return (), False, False, "compacted fragments (the same rows, rewritten)"
    if isinstance(operation, Project):
        return (), False, False, "changed the schema (columns dropped or renamed)"
    if isinstance(operation, _NO_ROW_CHANGE):
        return (), False, False, f"changed no rows ({operation.name})"
    if isinstance(operation, Merge):
        return (), True, False, "rewrote every fragment with new or changed columns"
    if isinstance(operation, DataReplacement):
        return (), True, False, "replaced the data of some columns"
    if isinstance(operation, Restore):
        return (), True, False, f"restored the table to version {operation.version}"
    if isinstance(operation, Clone):
        return (), True, False, "replaced the table with a clone"
    return (), True, False, f"a {operation.name} operation, which may change rows"


def version_change(
    store: ObjectStore, base: str, location: ManifestLocation, manifest_file: ManifestFile
) -> VersionChange:
    """The :class:`VersionChange` of one version from its manifest (and the
    transaction stored with it, or its transaction file)."""
    manifest = manifest_file.manifest
    pb = read_transaction_of(store, base, manifest_file)
    operation = Transaction.from_proto(pb).operation if pb is not None else None
    appended, changes, deletes_only, detail = classify(location.version, manifest, operation)
    return VersionChange(
        version=location.version,
        operation=operation.name if operation is not None else None,
        timestamp=_timestamp(manifest),
        appended=appended,
        changes_rows=changes,
        deletes_only=deletes_only,
        detail=detail,
        columns=top_level_columns(manifest),
    )


def load_changes(
    uri: str,
    handler: CommitHandler,
    base: str,
    since: int,
    until: int,
) -> list[VersionChange]:
    """The changes of versions ``since+1 .. until``, oldest first.

    Raises VersionNotFoundError when ``until`` is not committed yet, and
    VersionsRemovedError naming the versions of the range a cleanup removed."""
    if until <= since:
        return []
    listed = handler.list_versions(base, since)
    if not listed or listed[-1].version < until:
        latest = listed[-1].version if listed else since
        raise VersionNotFoundError(uri, until, f"the latest version is {latest}")
    locations = [loc for loc in listed if since < loc.version <= until]
    loaded = map_versions(
        handler.store,
        base,
        locations,
        lambda loc, manifest: version_change(handler.store, base, loc, manifest),
    )
    changes = [change for _, change in loaded]
    found = {change.version for change in changes}
    missing = [v for v in range(since + 1, until + 1) if v not in found]
    if missing:
        oldest = min((v for v in found if v > missing[-1]), default=None)
        raise VersionsRemovedError(uri, missing, oldest)
    return sorted(changes, key=lambda change: change.version)


__all__ = [
    "FragmentRows",
    "VersionChange",
    "classify",
    "fragment_rows",
    "load_changes",
    "top_level_columns",
    "version_change",
]
