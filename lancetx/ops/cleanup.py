"""``lancetx-sync cleanup``: remove old versions, their files and their DynamoDB items.

Lance's ``cleanup_old_versions`` rules, kept here:

* the latest version is never removed, nor a tagged one (``_refs/tags/``);
* a version is removed only if it is older than ``older_than`` (by its
  manifest's timestamp) **and** not among the newest ``keep_versions``, and
  only below every version kept for those reasons: what is removed is always the
  oldest untagged versions (clocks of writers differ, and a version kept
  between removed ones would look like a missing one to every reader, see
  :mod:`lancetx.commit.format.retention`). A version whose item still points at
  a staged manifest stops it too (``repair`` finalizes it) — unless it is
  below the newest version and its final manifest is in place (a writer killed
  between its copy and its flip): that one is finished first, as a reader would;
* a file is deleted only if a removed version references it and no kept
  version does; index folders likewise;
* versions committed while the cleanup runs are loaded again right before
  files are deleted, and whatever they reference is kept;
* the tags are read again after the manifests are deleted: a version tagged
  meanwhile gets its manifest back and keeps its files (see
  :func:`_put_back_tagged`; ``Table.tags.create`` checks from its side).

Before anything is deleted, every check of :mod:`lancetx.ops.preflight` passes
(no item or manifest pointing outside the table, no wedged version, every tag
readable); a refused item is reported, never followed.

Order, so that a crash leaves nothing a reader trips over: the removed
versions' manifests first, oldest first (readers stop seeing them, and at every
moment the removed ones are the oldest, so readers tell them from missing ones),
then their DynamoDB items (conditional on the path we saw), then their files.

A removed version's DynamoDB item is a **fence**: a writer still holding an
old parent claims the version after it, and only that item makes the claim
lose. Without it the claim would win, and the writer would commit a version
below the latest that no reader ever sees, referencing files this cleanup
deleted (measured: it happens within seconds with four writers and
``--keep-versions 4``). So an item is deleted only once its version is older
than ``items_older_than`` (default 7 days, far beyond any writer's retry
budget); younger ones stay and a later cleanup removes them. Items of versions
whose manifests a previous cleanup (pylance's own, say) removed follow the
same rule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lancetx.commit.errors import LancetxError, ObjectNotFoundError
from lancetx.commit.format.retention import read_tags
from lancetx.commit.storage.limits import MANIFEST, read_capped
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.protocol import finalize_steps
from lancetx.ops.inventory import (
    LoadedVersion,
    Progress,
    index_prefixes,
    no_progress,
    referenced_keys,
)
from lancetx.ops.items import (
    ItemChangedError,
    delete_item_if_path,
    mark_item_removed,
    unmark_item_removed,
)
from lancetx.ops.preflight import check_table, referenced_since
from lancetx.ops.table import OpsTable

log = logging.getLogger(__name__)

#: How old a removed version must be before its DynamoDB item (a fence) is deleted.
ITEM_FENCE_AGE = timedelta(days=7)


@dataclass(frozen=True)
class CleanupReport:
    uri: str
    dry_run: bool
    latest_version: int | None
    removed_versions: list[int] = field(default_factory=list)
    kept_versions: list[int] = field(default_factory=list)
    tagged_versions: list[int] = field(default_factory=list)
    files_deleted: list[str] = field(default_factory=list)
    items_deleted: list[int] = field(default_factory=list)
    items_kept_as_fence: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def tagged_versions(table: OpsTable) -> set[int]:
    """Versions named by ``_refs/tags/*.json`` (TagFileError for one that names none:
    cleanup stops rather than guess)."""
    return {tag.version for tag in read_tags(table.store, table.base)}


def _put_back_tagged(
    table: OpsTable,
    removed: list[LoadedVersion],
    held: dict[int, dict[str, bytes]],
    tags: set[int],
    entries: list[ManifestEntry],
    errors: list[str],
) -> list[LoadedVersion]:
    """The removed versions a tag created while this cleanup ran now names, their
    manifests written back (from ``held``, the bytes read before deleting them).

    Why this closes the race with ``Table.tags.create``: it writes the tag, then
    checks the manifest is still there (and withdraws its tag if not). The tags
    are read again here, after the manifests were deleted: a creator whose check
    found the manifest wrote its tag before that check, so before this read, and
    its version is put back here; one whose check came later found it gone. (A
    pylance ``tags.create`` checks before writing only: a tag it writes after this
    read can still name a removed version.)"""
    late = tagged_versions(table) - tags
    retagged = [lv for lv in removed if lv.version in late]
    paths = {e.version: e.path for e in entries}
    for lv in retagged:
        for key, data in held.get(lv.version, {}).items():
            table.store.put(key, data)
        if table.entries is not None and lv.version in paths:
            try:  # its manifest is back: no longer a removed version's item
                unmark_item_removed(table.entries, table.base, lv.version, paths[lv.version])
            except (ItemChangedError, LancetxError) as exc:
                errors.append(f"item of version {lv.version}: removed mark left on it ({exc})")
        log.warning(
            "version %d of %s was tagged while this cleanup removed it; its manifest is "
            "back and it is kept",
            lv.version,
            table.uri,
        )
    return retagged


def _timestamp(lv: LoadedVersion) -> datetime:
    ts = lv.manifest.manifest.timestamp
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC)


def _files_to_drop(
    table: OpsTable, kept: list[LoadedVersion], removed: list[LoadedVersion]
) -> tuple[set[str], set[str]]:
    """The files and index folders removed versions reference and no kept one does."""
    keep_refs: set[str] = set()
    keep_indices: set[str] = set()
    for lv in kept:
        keep_refs |= referenced_keys(table.base, lv.manifest, store=table.store)
        keep_indices |= index_prefixes(table.base, lv.manifest, store=table.store)
    drop: set[str] = set()
    drop_indices: set[str] = set()
    for lv in removed:
        drop |= referenced_keys(table.base, lv.manifest, store=table.store) - keep_refs
        drop_indices |= index_prefixes(table.base, lv.manifest, store=table.store) - keep_indices
    return drop, drop_indices


def _mark_removed(
    table: OpsTable,
    earlier: list[ManifestEntry],
    removed: list[LoadedVersion],
    entries: list[ManifestEntry],
    at: datetime,
    errors: list[str],
) -> int | None:
    """Mark removed (see the module docstring) the items of versions removed earlier
    that are not marked yet, then those of ``removed``, oldest first. Returns the
    first version of ``removed`` whose item could not be marked (it and every later
    one must then be kept, so the removed versions stay the oldest), else None."""
    ddb = table.entries
    if ddb is None:
        return None
    at_ms = int(at.timestamp() * 1000)
    for entry in earlier:
        if entry.is_removed:
            continue
        try:
            mark_item_removed(ddb, table.base, entry.version, entry.path, at_ms)
        except ItemChangedError:
            errors.append(f"item of version {entry.version} changed; not marked removed")
        except LancetxError as exc:
            errors.append(f"item of version {entry.version}: {exc}")
    by_version = {e.version: e for e in entries}
    for lv in removed:
        item = by_version.get(lv.version)
        if item is None or item.is_removed:
            continue  # no item (committed before the table used DynamoDB): nothing to mark
        try:
            mark_item_removed(ddb, table.base, item.version, item.path, at_ms)
        except ItemChangedError:
            errors.append(
                f"item of version {lv.version} changed while marking it removed; it and "
                "every later version are kept"
            )
            return lv.version
        except LancetxError as exc:
            errors.append(
                f"item of version {lv.version}: {exc}; it and every later version are kept"
            )
            return lv.version
    return None


def _finish_copied(table: OpsTable, entries: list[ManifestEntry], finals: set[int]) -> bool:
    """Finish the versions below the newest whose final manifest is in place but whose
    items still point at their staged ones, as any reader of them would (idempotent,
    safe beside live writers). A writer of the commit queue killed between its copy
    and its flip leaves one: the next writer claims on top once the final copy is
    there, so no writer flips it any more, and kept staged it would stop every
    cleanup at itself. Returns whether any was finished."""
    newest = max((e.version for e in entries), default=0)
    finished = False
    for entry in entries:
        if not entry.is_staged or entry.version >= newest or entry.version not in finals:
            continue
        try:
            done = table.run(finalize_steps(table.protocol_table, entry, best_effort=True))
        except LancetxError as exc:  # it stays staged, and is kept (``repair`` says why)
            log.info("%s: version %d not finished (%s)", table.uri, entry.version, exc)
            continue
        finished = finished or not done.is_staged
    return finished


def cleanup_versions(
    table: OpsTable,
    *,
    keep_versions: int | None = None,
    older_than: timedelta | None = None,
    items_older_than: timedelta = ITEM_FENCE_AGE,
    dry_run: bool = False,
    progress: Progress = no_progress,
    now: datetime | None = None,
) -> CleanupReport:
    """Remove old versions of ``table``; see the module docstring."""
    started = now or datetime.now(UTC)
    checked = check_table(table, progress)
    if not dry_run and _finish_copied(table, checked.entries, set(checked.listing.finals)):
        checked = check_table(table, progress)
    entries, listing, keys, loaded = checked.entries, checked.listing, checked.keys, checked.loaded
    if not loaded:
        return CleanupReport(table.uri, dry_run, None)
    latest = loaded[-1].version
    tags = checked.tagged
    staged = {e.version for e in entries if e.is_staged}
    newest_kept = {lv.version for lv in loaded[-keep_versions:]} if keep_versions else set()
    select = keep_versions is not None or older_than is not None
    removed: list[LoadedVersion] = []
    kept: list[LoadedVersion] = []
    keeping = not select  # once an untagged version is kept, every later one is
    for lv in loaded:
        if lv.version in tags:
            kept.append(lv)
            continue
        keeping = keeping or (
            lv.version == latest
            or lv.version in staged
            or lv.version in newest_kept
            or (older_than is not None and _timestamp(lv) >= started - older_than)
        )
        (kept if keeping else removed).append(lv)

    horizon = checked.horizon if checked.horizon is not None else latest
    # Items of versions a cleanup removed before (their manifests are gone).
    earlier = [
        e
        for e in entries
        if e.version not in keys
        and (e.is_removed or (e.version < horizon and e.version not in tags))
    ]
    errors: list[str] = []
    if not dry_run:
        stop = _mark_removed(table, earlier, removed, entries, started, errors)
        if stop is not None:
            kept = sorted(kept + [lv for lv in removed if lv.version >= stop], key=_version)
            removed = [lv for lv in removed if lv.version < stop]
    drop, drop_indices = _files_to_drop(table, kept, removed)
    removable_items, fenced = _items_to_delete(
        entries, loaded, kept, removed, earlier, started - items_older_than
    )

    files: list[str] = sorted(drop)
    items_deleted: list[int] = []
    if not dry_run:
        total = getattr(progress, "total", None)
        if total is not None:
            total("delete", len(removed) + len(removable_items) + len(files))
        held: dict[int, dict[str, bytes]] = {}
        for lv in removed:  # oldest first, one at a time: see the module docstring
            final = listing.finals.get(lv.version)
            held[lv.version] = {}
            for key in sorted({lv.key, final.key if final is not None else lv.key}):
                try:  # kept to put back if a tag names the version meanwhile (below)
                    held[lv.version][key] = read_capped(table.store, key, MANIFEST)
                except ObjectNotFoundError:
                    continue
                table.store.delete(key)
            progress("delete", 1)
        retagged = _put_back_tagged(table, removed, held, tags, entries, errors)
        if retagged:
            removed = [lv for lv in removed if lv not in retagged]
            kept = sorted(kept + retagged, key=_version)
            drop, drop_indices = _files_to_drop(table, kept, removed)
            removable_items, fenced = _items_to_delete(
                entries, loaded, kept, removed, earlier, started - items_older_than
            )
            files = sorted(drop)
        for entry in removable_items:
            progress("delete", 1)
            try:
                assert table.entries is not None
                delete_item_if_path(table.entries, table.base, entry.version, entry.path)
                items_deleted.append(entry.version)
            except ItemChangedError:
                errors.append(f"item of version {entry.version} changed; kept")
            except LancetxError as exc:
                errors.append(f"item of version {entry.version}: {exc}")
        # Versions committed meanwhile keep what they reference.
        since_refs, _ = referenced_since(table, latest, progress, command="cleanup")
        files = [k for k in files if k not in since_refs]
        for prefix in sorted(drop_indices):
            files.extend(m.key for m in table.store.list(prefix))
        if total is not None:  # files kept for versions committed meanwhile, index files added
            total("delete", len(removed) + len(removable_items) + len(files))
        for key in files:
            progress("delete", 1)
            try:
                table.store.delete(key)
            except LancetxError as exc:
                errors.append(f"{key}: {exc}")
        log.info(
            "cleanup of %s removed versions %s and %d file(s)",
            table.uri,
            [lv.version for lv in removed],
            len(files),
        )
    else:
        for prefix in sorted(drop_indices):
            files.extend(m.key for m in table.store.list(prefix))
        items_deleted = [e.version for e in removable_items]
    return CleanupReport(
        uri=table.uri,
        dry_run=dry_run,
        latest_version=latest,
        removed_versions=[lv.version for lv in removed],
        kept_versions=[lv.version for lv in kept],
        tagged_versions=sorted(tags),
        files_deleted=files,
        items_deleted=sorted(items_deleted),
        items_kept_as_fence=fenced,
        errors=errors,
    )


def _version(lv: LoadedVersion) -> int:
    return lv.version


def _items_to_delete(
    entries: list[ManifestEntry],
    loaded: list[LoadedVersion],
    kept: list[LoadedVersion],
    removed: list[LoadedVersion],
    earlier: list[ManifestEntry],
    cutoff: datetime,
) -> tuple[list[ManifestEntry], list[int]]:
    """Which removed versions' items may be deleted now, and the versions of those
    kept as fences.

    An item may go only when its version is older than the fence age (its
    timestamp is the removed manifest's; for a version removed earlier, that of
    the next version that still has a manifest, which is younger: conservative), **and** lies below every version that keeps its manifest: the
    item of a removed version above a kept one is the only record that it was
    removed on purpose once that kept version loses its tag."""
    removed_at = {lv.version: _timestamp(lv) for lv in removed}
    lowest_kept = min(lv.version for lv in kept) if kept else None

    def removed_before(version: int) -> datetime:
        # Any version after it was committed later: its time bounds this one's.
        later = [_timestamp(lv) for lv in loaded if lv.version > version]
        return min(later) if later else cutoff  # (none: not removable now)

    earlier_versions = {e.version for e in earlier}
    candidates = [e for e in entries if e.version in removed_at or e.version in earlier_versions]
    removable = [
        e
        for e in candidates
        if (lowest_kept is None or e.version < lowest_kept)
        and (removed_at[e.version] if e.version in removed_at else removed_before(e.version))
        < cutoff
    ]
    fenced = sorted(e.version for e in candidates if e not in removable)
    return removable, fenced
