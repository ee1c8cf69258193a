"""``lancetx-sync repair``: bring items and manifests back into agreement.

* a staged item whose staged manifest exists, or whose final manifest exists:
  finalized by the protocol's own idempotent step (safe beside live writers);
* a final manifest that is gone while a staged copy of it remains: copied back;
* a **wedged** version (the item points at a staged manifest that was deleted
  and no final manifest exists, e.g. a pylance writer removed it after a claim
  that landed): rebuilt from its parent plus the transaction file the operator
  picks from the listed candidates (``transaction=``), or the only usable one
  with ``yes``; the manifest is written, read back and checked, then the item
  is flipped to it. Nothing is guessed: with several candidates and no pick,
  nothing changes;
* with no usable candidate, ``force`` removes the item, only for the newest
  version, after saving it to a backup file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from lancetx.commit.engine.builder import build_manifest
from lancetx.commit.errors import LancetxError, ObjectNotFoundError, VersionNotFoundError
from lancetx.commit.format.manifest import ManifestFile, encode_manifest, read_manifest
from lancetx.commit.format.transaction_file import decode_transaction
from lancetx.commit.storage.limits import TRANSACTION, read_capped
from lancetx.errors import NoParentError, RepairVerificationError
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.protocol import final_key_of, finalize_steps
from lancetx.ops.findings import ERROR, Finding
from lancetx.ops.inventory import Progress, no_progress
from lancetx.ops.items import ItemChangedError, delete_item_if_path, raw_item, save_backup
from lancetx.ops.table import OpsTable
from lancetx.ops.verify import TableScan, _staged_copies, scan_table
from lancetx.ops.wedged import Candidate, wedged_candidates
from lancetx.state import nearest_versions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepairAction:
    """One change (made, or in a dry run planned). ``kind`` is one of "finalize",
    "restore_final", "rematerialize", "remove_item"."""

    kind: str
    version: int
    detail: str
    done: bool
    backup_file: str | None = None


@dataclass(frozen=True)
class RepairReport:
    """What repair did and what it left. ``ok`` is True when nothing is left."""

    uri: str
    dry_run: bool
    actions: list[RepairAction] = field(default_factory=list)
    unresolved: list[Finding] = field(default_factory=list)
    candidates: dict[int, list[Candidate]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(f.severity == ERROR for f in self.unresolved)


_FINALIZE = ("staged_entry", "unflipped_entry")


def repair_table(
    table: OpsTable,
    *,
    version: int | None = None,
    transaction: str | None = None,
    yes: bool = False,
    force: bool = False,
    dry_run: bool = False,
    backup_dir: str = ".",
    progress: Progress = no_progress,
) -> RepairReport:
    """Repair ``table`` (only ``version`` when given); see the module docstring."""
    table.require_entries("repair")  # an s3:// table has no items to repair
    scan = scan_table(table, progress=progress)
    newest = scan.entries[-1].version if scan.entries else None
    by_version = {e.version: e for e in scan.entries}
    if (
        version is not None
        and version not in by_version
        and not any(f.version == version for f in scan.findings)
    ):
        # Not "nothing to repair": the operator named a version the table does not have.
        known = sorted(by_version.keys() | {f.version for f in scan.findings if f.version})
        raise VersionNotFoundError(table.uri, version, nearest_versions(known, version))
    actions: list[RepairAction] = []
    unresolved: list[Finding] = []
    candidates: dict[int, list[Candidate]] = {}
    for finding in sorted(scan.findings, key=lambda f: (f.version or 0, f.kind)):
        if version is not None and finding.version != version:
            continue
        entry = by_version.get(finding.version) if finding.version is not None else None
        if entry is None or finding.version is None:
            unresolved.append(finding)
            continue
        if finding.kind in _FINALIZE:
            actions.append(_finalize(table, entry, dry_run))
        elif finding.kind == "missing_final":
            done = _restore_final(table, scan, entry, dry_run)
            if done is None:
                unresolved.append(finding)
            else:
                actions.append(done)
        elif finding.kind == "wedged_version":
            found = wedged_candidates(table, finding.version, scan)
            candidates[finding.version] = found
            action = _repair_wedged(
                table, scan, entry, found, transaction=transaction, yes=yes, dry_run=dry_run
            )
            if action is None and force:
                action = _remove_item(table, entry, newest, backup_dir, dry_run)
            if action is None:
                unresolved.append(finding)
            else:
                actions.append(action)
        elif finding.kind in ("missing_manifest", "untrusted_path") and force:
            action = _remove_item(table, entry, newest, backup_dir, dry_run)
            if action is None:
                unresolved.append(finding)
            else:
                actions.append(action)
        else:
            unresolved.append(finding)
    return RepairReport(table.uri, dry_run, actions, unresolved, candidates)


def _finalize(table: OpsTable, entry: ManifestEntry, dry_run: bool) -> RepairAction:
    final = final_key_of(table.protocol_table, entry)
    if dry_run:
        return RepairAction(
            "finalize", entry.version, f"would finalize {entry.path} → {final}", False
        )
    done = table.run(finalize_steps(table.protocol_table, entry))
    log.info("finalized version %d of %s: %s", entry.version, table.uri, done.path)
    return RepairAction("finalize", entry.version, f"finalized {entry.path} → {done.path}", True)


def _restore_final(
    table: OpsTable, scan: TableScan, entry: ManifestEntry, dry_run: bool
) -> RepairAction | None:
    """Copy the one staged copy of ``entry``'s manifest back to its final name."""
    copies = _staged_copies(scan.listing, entry)
    final = final_key_of(table.protocol_table, entry)
    usable = []
    for copy in copies:
        try:
            manifest = read_manifest(table.store, copy.key)
        except LancetxError:
            continue
        if manifest.version == entry.version:
            usable.append(copy)
    if len(usable) != 1:
        return None  # none, or several we could only guess between
    source = usable[0].key
    if dry_run:
        return RepairAction("restore_final", entry.version, f"would copy {source} → {final}", False)
    table.store.copy(source, final)
    meta = table.store.head(final)
    if entry.size is not None and meta.size != entry.size:
        raise RepairVerificationError(
            table.store.uri(final), f"{meta.size} bytes, expected {entry.size}"
        )
    log.info("restored the final manifest of version %d of %s", entry.version, table.uri)
    return RepairAction("restore_final", entry.version, f"copied {source} → {final}", True)


def _parent(table: OpsTable, scan: TableScan, version: int) -> ManifestFile:
    for lv in scan.loaded:
        if lv.version == version - 1:
            return lv.manifest
    meta = scan.listing.finals.get(version - 1)
    if meta is not None:
        return read_manifest(table.store, meta.key)
    raise NoParentError(
        f"version {version - 1} (the parent of wedged version {version}) of {table.uri!r} "
        "cannot be read; repair it first"
    )


def _repair_wedged(
    table: OpsTable,
    scan: TableScan,
    entry: ManifestEntry,
    candidates: list[Candidate],
    *,
    transaction: str | None,
    yes: bool,
    dry_run: bool,
) -> RepairAction | None:
    usable = [c for c in candidates if c.usable]
    chosen: Candidate | None = None
    if transaction is not None:
        named = [c for c in usable if transaction in (c.name, c.key)]
        chosen = named[0] if named else None
    elif yes and len(usable) == 1:
        chosen = usable[0]
    if chosen is None:
        return None
    version = entry.version
    final = final_key_of(table.protocol_table, entry)
    if dry_run:
        return RepairAction(
            "rematerialize",
            version,
            f"would rebuild version {version} from version {version - 1} + {chosen.name} "
            f"into {final} and point the item at it",
            False,
        )
    parent = _parent(table, scan, version)
    txn = decode_transaction(
        read_capped(table.store, chosen.key, TRANSACTION), path=table.store.uri(chosen.key)
    )
    built = build_manifest(
        parent.manifest,
        parent.indices or [],
        txn,
        version=version,
        transaction_file=chosen.name,
    )
    data = encode_manifest(built.manifest, indices=list(built.indices) or None, transaction=txn)
    if table.exists(final):
        raise RepairVerificationError(
            table.store.uri(final), "it already exists; run verify again, the table changed"
        )
    table.store.put(final, data)
    try:
        back = read_manifest(table.store, final)
    except ObjectNotFoundError:
        raise RepairVerificationError(table.store.uri(final), "it is missing") from None
    if back.version != version or back.size != len(data):
        raise RepairVerificationError(
            table.store.uri(final), f"version {back.version}, {back.size} bytes"
        )
    entries = table.require_entries("repair")
    flipped = replace(entry, path=final, size=len(data), e_tag=None)
    entries.put_if_exists(flipped, expected_path=entry.path)
    log.warning(
        "re-materialized wedged version %d of %s from version %d + %s into %s",
        version,
        table.uri,
        version - 1,
        chosen.name,
        final,
    )
    return RepairAction(
        "rematerialize",
        version,
        f"rebuilt version {version} from version {version - 1} + {chosen.name} into {final}; "
        "item flipped",
        True,
    )


def _remove_item(
    table: OpsTable, entry: ManifestEntry, newest: int | None, backup_dir: str, dry_run: bool
) -> RepairAction | None:
    if newest is None or entry.version != newest:
        return None  # removing an older version's item would leave a hole readers trip over
    entries = table.require_entries("repair")
    if dry_run:
        return RepairAction(
            "remove_item",
            entry.version,
            f"would save the item of version {entry.version} to {backup_dir} and delete it",
            False,
        )
    item = raw_item(entries, table.base, entry.version)
    if item is None:
        return None
    backup = save_backup(item, backup_dir, entries.table_name, entry.version)
    try:
        delete_item_if_path(entries, table.base, entry.version, entry.path)
    except ItemChangedError:
        return None
    log.warning(
        "removed the item of version %d of %s (saved to %s)", entry.version, table.uri, backup
    )
    return RepairAction(
        "remove_item",
        entry.version,
        f"deleted the item of version {entry.version} (saved to {backup})",
        True,
        backup,
    )


__all__ = ["RepairAction", "RepairReport", "RepairVerificationError", "repair_table"]
