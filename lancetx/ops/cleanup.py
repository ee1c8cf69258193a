"""``lancetx-sync cleanup``: remove old versions, their files and their DynamoDB items.

Lance's ``cleanup_old_versions`` rules, kept here:

* the latest version is never removed, nor a tagged one (``_refs/tags/``);
* a version is removed only if it is older than ``older_than`` (by its
  manifest's timestamp) **and** not among the newest ``keep_versions``;
* a file is deleted only if a removed version references it and no kept
  version does; index folders likewise;
* versions committed while the cleanup runs are loaded again right before
  files are deleted, and whatever they reference is kept.

Order, so that a crash leaves nothing a reader trips over: the removed
versions' manifests first (readers stop seeing them), then their DynamoDB
items (conditional on the path we saw), then their files.

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

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lancetx.commit.errors import LancetxError
from lancetx.commit.format import naming
from lancetx.commit.storage.limits import TAG, read_capped
from lancetx.ops.gc import _referenced_since, readable_manifest_keys
from lancetx.ops.inventory import (
    LoadedVersion,
    Progress,
    index_prefixes,
    list_versions_folder,
    no_progress,
    read_manifests,
    referenced_keys,
)
from lancetx.ops.items import ItemChangedError, delete_item_if_path
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
    """Versions named by ``_refs/tags/*.json``."""
    out: set[int] = set()
    for meta in table.store.list(naming.join(table.base, "_refs", "tags") + "/"):
        try:
            out.add(int(json.loads(read_capped(table.store, meta.key, TAG))["version"]))
        except (LancetxError, ValueError, KeyError, TypeError):
            log.error("cannot read tag %s; cleanup stops rather than guess", meta.key)
            raise
    return out


def _timestamp(lv: LoadedVersion) -> datetime:
    ts = lv.manifest.manifest.timestamp
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC)


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
    entries = table.list_entries()
    listing = list_versions_folder(table, progress)
    keys = readable_manifest_keys(table, entries, listing)
    loaded, failed = read_manifests(table, sorted(keys.items()), progress)
    if failed:
        from lancetx.ops.gc import WedgedTableError

        raise WedgedTableError(table.uri, sorted(failed), table.command("verify"))
    if not loaded:
        return CleanupReport(table.uri, dry_run, None)
    latest = loaded[-1].version
    tags = tagged_versions(table)
    newest_kept = {lv.version for lv in loaded[-keep_versions:]} if keep_versions else set()
    select = keep_versions is not None or older_than is not None
    removed: list[LoadedVersion] = []
    kept: list[LoadedVersion] = []
    for lv in loaded:
        remove = (
            select
            and lv.version != latest
            and lv.version not in tags
            and lv.version not in newest_kept
            and (older_than is None or _timestamp(lv) < started - older_than)
        )
        (removed if remove else kept).append(lv)

    keep_refs: set[str] = set()
    keep_indices: set[str] = set()
    for lv in kept:
        keep_refs |= referenced_keys(table.base, lv.manifest)
        keep_indices |= index_prefixes(table.base, lv.manifest)
    drop: set[str] = set()
    drop_indices: set[str] = set()
    for lv in removed:
        drop |= referenced_keys(table.base, lv.manifest) - keep_refs
        drop_indices |= index_prefixes(table.base, lv.manifest) - keep_indices
    # Items may go only for versions older than the fence age: their timestamps are
    # the removed manifests' (for versions removed earlier, the oldest removed now or
    # kept, which is younger: conservative).
    fence_cutoff = started - items_older_than
    removed_at = {lv.version: _timestamp(lv) for lv in removed}
    oldest_known = min([_timestamp(lv) for lv in loaded])
    oldest_manifest = loaded[0].version
    candidates = [
        e
        for e in entries
        if e.version in removed_at or (e.version not in keys and e.version < oldest_manifest)
    ]
    removable_items = [
        e for e in candidates if removed_at.get(e.version, oldest_known) < fence_cutoff
    ]
    fenced = sorted(e.version for e in candidates if e not in removable_items)

    files: list[str] = sorted(drop)
    errors: list[str] = []
    items_deleted: list[int] = []
    if not dry_run:
        for lv in removed:
            final = listing.finals.get(lv.version)
            for key in {lv.key, final.key if final is not None else lv.key}:
                table.store.delete(key)
        for entry in removable_items:
            try:
                assert table.entries is not None
                delete_item_if_path(table.entries, table.base, entry.version, entry.path)
                items_deleted.append(entry.version)
            except ItemChangedError:
                errors.append(f"item of version {entry.version} changed; kept")
            except LancetxError as exc:
                errors.append(f"item of version {entry.version}: {exc}")
        # Versions committed meanwhile keep what they reference.
        since_refs, _ = _referenced_since(table, latest, progress)
        files = [k for k in files if k not in since_refs]
        for prefix in sorted(drop_indices):
            files.extend(m.key for m in table.store.list(prefix))
        for key in files:
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
