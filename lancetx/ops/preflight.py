"""What ``gc`` and ``cleanup`` check before they delete anything.

Both load every committed version that still has a manifest, and both refuse to
run — before a single request that changes anything — when the table is not in a
state they can reason about:

* an item the read path would refuse to follow (a path outside this table's
  ``_versions/``, another version's name, another bucket's item): following it
  would read or delete another table's objects (:class:`UntrustedReferenceError`);
* a manifest naming a file that could lie outside its folder (``..``, an absolute
  path, a URI) (:class:`UntrustedReferenceError`);
* a tag file that does not say which version it keeps (TagFileError);
* a committed version whose manifest cannot be read and that no cleanup removed
  (wedged, missing): its repair may need the very files they would delete
  (:class:`WedgedTableError`).

Versions a cleanup removed (their items marked so, or below the cleanup horizon,
see :mod:`lancetx.commit.format.retention`) are expected to have no manifest,
and their items, kept as fences, are not a problem.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lancetx.commit.engine.parents import LATEST_READ_ATTEMPTS
from lancetx.commit.format.retention import cleanup_horizon, read_tags
from lancetx.errors import MaintenanceRaceError, UntrustedReferenceError, WedgedTableError
from lancetx.externalstore.base import ManifestEntry
from lancetx.ops.inventory import (
    MISSING,
    LoadedVersion,
    Progress,
    VersionsListing,
    committed_manifest_keys,
    list_versions_folder,
    no_progress,
    read_manifests,
    referenced_keys,
    unsafe_references,
    untrusted_entries,
)
from lancetx.ops.table import OpsTable

log = logging.getLogger(__name__)

__all__ = [
    "CheckedTable",
    "UntrustedReferenceError",
    "WedgedTableError",
    "check_table",
    "readable_manifest_keys",
    "referenced_since",
]


@dataclass
class CheckedTable:
    """A table that passed every check: its items, its ``_versions/`` listing, its
    tagged versions, where each readable version's manifest is, and the manifests."""

    entries: list[ManifestEntry]
    listing: VersionsListing
    tagged: set[int]
    keys: dict[int, str]
    loaded: list[LoadedVersion]
    horizon: int | None


#: How many times :func:`check_table` looks again when manifests it listed could not be
#: read: a cleanup running beside it (another ``lancetx-sync cleanup``, pylance's own)
#: deletes the oldest manifests between the listing and the reads.
RECHECKS = 3


def check_table(table: OpsTable, progress: Progress = no_progress) -> CheckedTable:
    """Load ``table`` and run every check of the module docstring; raise on the first
    that fails. Reads only."""
    for attempt in range(RECHECKS + 1):
        entries = table.list_entries()
        listing = list_versions_folder(table, progress)
        tagged = {tag.version for tag in read_tags(table.store, table.base)}
        refused = untrusted_entries(table, entries)
        if refused:
            raise UntrustedReferenceError(
                table.uri, [refused[v] for v in sorted(refused)], table.command("verify")
            )
        keys = readable_manifest_keys(table, entries, listing, tagged)
        loaded, failed = read_manifests(table, sorted(keys.items()), progress)
        if not failed:
            break
        if attempt == RECHECKS:
            raise WedgedTableError(table.uri, sorted(failed), table.command("verify"))
        # Versions a concurrent cleanup removed meanwhile are below the horizon of a
        # fresh listing; a wedged version fails every time.
        log.info(
            "%s: version(s) %s listed but unreadable; listing again (a cleanup may be "
            "running beside this one)",
            table.uri,
            sorted(failed),
        )
    unsafe = [
        f"version {lv.version} names {name!r} ({why})"
        for lv in loaded
        for name, why in unsafe_references(lv.manifest, store=table.store, base=table.base)
    ]
    if unsafe:
        raise UntrustedReferenceError(table.uri, unsafe, table.command("verify"))
    return CheckedTable(
        entries, listing, tagged, keys, loaded, cleanup_horizon(listing.finals, tagged)
    )


def readable_manifest_keys(
    table: OpsTable, entries: list[ManifestEntry], listing: VersionsListing, tagged: set[int]
) -> dict[int, str]:
    """The manifest of every committed version that still has one. Versions whose
    item a cleanup marked removed, and versions below the cleanup horizon, were
    removed by a cleanup (their items may remain); any other version without a
    manifest needs repair: refused."""
    staged_keys = {s.key for s in listing.staged}
    keys = {
        v: k
        for v, k in committed_manifest_keys(table, entries, listing).items()
        if v in listing.finals or k in staged_keys
    }
    horizon = cleanup_horizon(listing.finals, tagged)
    broken = [
        e.version
        for e in entries
        if e.version not in keys and not e.is_removed and (horizon is None or e.version >= horizon)
    ]
    if broken:
        raise WedgedTableError(
            table.uri, broken, table.command("repair", "--version", str(broken[0]))
        )
    return keys


def referenced_since(
    table: OpsTable, newest_seen: int, progress: Progress = no_progress, *, command: str = "gc"
) -> tuple[set[str], set[str]]:
    """Objects referenced by versions committed after ``newest_seen``, and the
    staged manifests their items point at (names that could leave the table yield no
    key; an item the read path refuses raises UntrustedReferenceError).

    The newest of them can be removed before its manifest is read: a commit lands
    after it and a cleanup without an age floor runs. What it referenced that is
    still needed (a restore's old files, say) is then referenced by the versions
    after it, which are listed and read in turn (up to
    :data:`~lancetx.commit.engine.parents.LATEST_READ_ATTEMPTS` times).

    Raises :class:`~lancetx.errors.MaintenanceRaceError` when what they reference
    stays unknown: a manifest among them could not be read for another reason than
    being gone (a throttled or failed GET, an undecodable file), or the newest was
    removed each time. The caller then deletes nothing more."""
    referenced: set[str] = set()
    staged: set[str] = set()
    after = newest_seen
    for _ in range(LATEST_READ_ATTEMPTS):
        keys = _committed_after(table, after)
        loaded, failed = read_manifests(table, sorted(keys.items()), progress)
        unread = {v: why for v, why in failed.items() if not why.endswith(MISSING)}
        if unread:
            raise MaintenanceRaceError(table.uri, unread, table.command(command))
        for lv in loaded:
            referenced |= referenced_keys(table.base, lv.manifest, store=table.store)
        staged |= set(keys.values())
        if not keys or max(keys) not in failed:
            return referenced, staged
        after = max(keys)
    raise MaintenanceRaceError(
        table.uri,
        {after: f"removed before it could be read, {LATEST_READ_ATTEMPTS} times in a row"},
        table.command(command),
    )


def _committed_after(table: OpsTable, version: int) -> dict[int, str]:
    """The manifest key of each version after ``version``. An item the read path would
    refuse (a path outside the table, another bucket's table) raises
    UntrustedReferenceError, as :func:`check_table` does for the items it scans: what
    that version references is unknown, so nothing more is deleted."""
    if table.entries is not None:
        newer = table.entries.list_entries(table.base, version)
        refused = untrusted_entries(table, newer)
        if refused:
            raise UntrustedReferenceError(
                table.uri, [refused[v] for v in sorted(refused)], table.command("verify")
            )
        return {e.version: e.path for e in newer}
    listing = list_versions_folder(table)
    return {v: m.key for v, m in listing.finals.items() if v > version}
