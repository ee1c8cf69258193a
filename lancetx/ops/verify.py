"""``lancetx-sync verify``: do the DynamoDB items and the objects agree? Reads only.

Checked per item: its path is a manifest of its version inside ``_versions/``;
the object it points at exists (or, for a staged item, that it can still be
finalized); the recorded size matches; the manifest decodes and encodes the
same version; its transaction file exists; no file name in it could leave its
folder of the table. Across items: versions are contiguous, every manifest
between the first and the newest item has an item (a claim on a version without
one would land), and no final manifest is newer than the newest item (a commit
that bypassed DynamoDB). A path where nothing was ever committed is a finding
too. ``deep`` also checks that every data and deletion file of the latest
version (or of every version) exists, with the recorded size.

Versions a cleanup removed are told from missing ones by the mark lancetx's
cleanup sets on their items (``removed_at``) and by the cleanup horizon
(:mod:`lancetx.commit.format.retention`): a marked item, or a version below the
horizon, without a manifest (or without an item either) is informational; any
other, a problem.

Beside live writers a scan can catch a commit half-way (its item claimed after
the Query, its manifest listed; a staged item finalized between the Query and
the listing). So when a scan finds problems, the table is scanned again, and
only problems found both times are reported (the second scan's view of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lancetx.commit.errors import LancetxError, ObjectNotFoundError
from lancetx.commit.format.retention import cleanup_horizon, read_tags
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.commit.storage.stores import open_object_store
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.errors import UntrustedManifestPathError
from lancetx.externalstore.protocol import final_key_of, validate_entry
from lancetx.ops.findings import ERROR, INFO, Finding
from lancetx.ops.inventory import (
    ForeignFile,
    LoadedVersion,
    Progress,
    StagedObject,
    VersionsListing,
    committed_manifest_keys,
    data_file_keys,
    deletion_keys,
    foreign_files,
    list_prefixes,
    list_versions_folder,
    no_progress,
    read_manifests,
    transaction_key_of,
    unsafe_references,
)
from lancetx.ops.table import OpsTable


@dataclass(frozen=True)
class VerifyReport:
    """``ok`` is True when no finding has severity "error"."""

    uri: str
    latest_version: int | None
    versions_checked: int
    deep: bool
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)


@dataclass
class TableScan:
    """Everything verify learned, for repair to act on."""

    entries: list[ManifestEntry]
    listing: VersionsListing
    loaded: list[LoadedVersion]
    findings: list[Finding]


def scan_table(
    table: OpsTable,
    *,
    deep: bool = False,
    all_versions: bool = False,
    progress: Progress = no_progress,
) -> TableScan:
    """Check ``table``; see the module docstring (problems are re-checked once)."""
    first = _scan_once(table, deep=deep, all_versions=all_versions, progress=progress)
    problems = {(f.kind, f.version) for f in first.findings if f.severity == ERROR}
    if not problems:
        return first
    second = _scan_once(table, deep=deep, all_versions=all_versions, progress=progress)
    second.findings = [
        f for f in second.findings if f.severity != ERROR or (f.kind, f.version) in problems
    ]
    return second


def _scan_once(
    table: OpsTable,
    *,
    deep: bool,
    all_versions: bool,
    progress: Progress,
) -> TableScan:
    entries = table.list_entries()
    listing = list_versions_folder(table, progress)
    findings: list[Finding] = []
    ptable = table.protocol_table
    by_version = {e.version: e for e in entries}
    readable: list[ManifestEntry] = []
    try:
        tagged = {tag.version for tag in read_tags(table.store, table.base)}
    except LancetxError as exc:
        tagged = set()  # a lower horizon: fewer versions pass as removed
        findings.append(
            Finding(
                "unreadable_tag",
                f"{exc}; until it is fixed, cleanup refuses to run (it cannot tell which "
                "version the tag keeps)",
                "fix or delete the tag file (pylance: dataset.tags.delete(name))",
            )
        )
    horizon = cleanup_horizon(listing.finals, tagged)

    if not entries and not listing.finals and not listing.staged:
        where = table.s3_uri or table.store.uri(table.base)
        findings.append(
            Finding(
                "no_versions",
                f"nothing was ever committed at {where}: no manifest"
                + (f" and no item in DynamoDB table {table.ddb_table!r}" if table.entries else ""),
                "check the bucket, the path and ddbTableName; a table is created by its first "
                "write (lancetx.write_table, pylance's write_dataset)",
            )
        )
        return TableScan(entries, listing, [], findings)

    if table.entries is not None and not entries and listing.finals:
        findings.append(
            Finding(
                "not_onboarded",
                f"{len(listing.finals)} manifest(s) and no DynamoDB item: the first "
                "s3+ddb:// writer records only the newest",
                table.command("onboard"),
            )
        )
    collision_fix = (
        f"another bucket's table at path {table.base!r} shares DynamoDB table "
        f"{table.ddb_table!r} (Lance's key omits the bucket): give one of them another "
        "DynamoDB table (ddbTableName=...) or another path"
    )
    if entries and not listing.finals and not listing.staged:
        findings.append(
            Finding(
                "table_collision",
                f"DynamoDB holds {len(entries)} item(s) under {table.base!r} but bucket "
                f"{table.bucket!r} has no manifest there",
                collision_fix,
            )
        )
        return TableScan(entries, listing, [], findings)
    for entry in entries:
        version = entry.version
        if entry.bucket is not None and table.bucket is not None and entry.bucket != table.bucket:
            findings.append(
                Finding(
                    "table_collision",
                    f"version {version}'s item was written for bucket {entry.bucket!r}, "
                    f"not {table.bucket!r}",
                    collision_fix,
                    version,
                    entry.path,
                )
            )
            continue
        try:
            validate_entry(ptable, entry)
        except UntrustedManifestPathError as exc:
            findings.append(
                Finding(
                    "untrusted_path",
                    str(exc),
                    "inspect the item; if it is not this table's, delete it "
                    f"({table.command('repair', '--version', str(version), '--force')} "
                    "for the newest version)",
                    version,
                    entry.path,
                )
            )
            continue
        final_key = final_key_of(ptable, entry)
        final = listing.finals.get(version)
        if entry.is_staged:
            staged_here = any(s.key == entry.path for s in listing.staged)
            if staged_here:
                findings.append(
                    Finding(
                        "staged_entry",
                        f"version {version} is committed but not finalized (its item "
                        "still points at the staged manifest: its writer stopped "
                        + (
                            "after copying it to its final name, before pointing the item there)"
                            if final is not None
                            else "before copying it to its final name)"
                        ),
                        table.command("repair"),
                        version,
                        entry.path,
                    )
                )
                readable.append(entry)
            elif final is not None:
                findings.append(
                    Finding(
                        "unflipped_entry",
                        f"the final manifest of version {version} exists but the item still "
                        "points at the staged one, which is gone",
                        table.command("repair"),
                        version,
                        entry.path,
                    )
                )
            else:
                findings.append(
                    Finding(
                        "wedged_version",
                        f"version {version}'s item points at staged manifest {entry.path!r}, "
                        f"which is gone, and there is no final manifest {final_key!r}: the "
                        "table cannot be read past version "
                        f"{version - 1} or written until it is repaired",
                        table.command("repair", "--version", str(version)),
                        version,
                        entry.path,
                    )
                )
            continue
        if final is None:
            copies = _staged_copies(listing, entry)
            if copies:
                findings.append(
                    Finding(
                        "missing_final",
                        f"the final manifest {final_key!r} of version {version} is gone; a "
                        f"staged copy {copies[0].key!r} is still there",
                        table.command("repair", "--version", str(version)),
                        version,
                        final_key,
                    )
                )
            elif entry.is_removed or (horizon is not None and version < horizon):
                findings.append(
                    Finding(
                        "cleaned_up_version",
                        f"version {version}'s manifest was deleted by a cleanup; its item remains",
                        table.command("cleanup", "--older-than", "7d")
                        + " (deletes such items once they are older than the fence age)",
                        version,
                        final_key,
                        severity=INFO,
                    )
                )
            else:
                findings.append(
                    Finding(
                        "missing_manifest",
                        f"version {version}'s item points at {final_key!r}, which does not "
                        "exist, and no staged copy is left",
                        "restore the object from bucket versioning or a backup; if this is the "
                        "newest version and nothing depends on it: "
                        + table.command("repair", "--version", str(version), "--force"),
                        version,
                        final_key,
                    )
                )
            continue
        if entry.size is not None and final.size != entry.size:
            findings.append(
                Finding(
                    "size_mismatch",
                    f"version {version}'s item records {entry.size} bytes, the manifest "
                    f"{final_key!r} has {final.size}",
                    "inspect the manifest; another process may have overwritten it",
                    version,
                    final_key,
                )
            )
        readable.append(entry)

    # Versions contiguous from the first item to the newest one; below the cleanup
    # horizon, versions a cleanup removed (items deleted after their fence age).
    if entries:
        first, last = entries[0].version, entries[-1].version
        for version in range(first, last + 1):
            if version in by_version:
                continue
            if version in listing.finals:
                findings.append(
                    Finding(
                        "missing_item",
                        f"version {version} has a manifest but no DynamoDB item, between "
                        f"versions {first} and {last} that have one: a writer holding version "
                        f"{version - 1} would claim it and overwrite its manifest",
                        table.command("onboard") + " (records it)",
                        version,
                        listing.finals[version].key,
                    )
                )
            elif horizon is None or version >= horizon:
                findings.append(
                    Finding(
                        "version_gap",
                        f"version {version} has neither a DynamoDB item nor a manifest, "
                        f"between {first} and {last}",
                        "restore it from bucket versioning or a backup",
                        version,
                    )
                )
        for version in sorted(v for v in listing.finals if v > last):
            findings.append(
                Finding(
                    "unrecorded_version",
                    f"manifest of version {version} is newer than the newest DynamoDB item "
                    f"({last}): a writer committed without DynamoDB (s3:// instead of "
                    "s3+ddb://?), so versions may have been overwritten",
                    table.command("onboard"),
                    version,
                    listing.finals[version].key,
                )
            )

    # The manifests themselves.
    keys = committed_manifest_keys(table, readable, listing)
    keys = {v: k for v, k in keys.items() if v in by_version or v in listing.finals}
    keys = {v: k for v, k in keys.items() if v not in _skip(findings)}
    loaded, failed = read_manifests(table, sorted(keys.items()), progress)
    for version, why in sorted(failed.items()):
        findings.append(
            Finding(
                "unreadable_manifest",
                why,
                "restore the manifest from bucket versioning or a backup",
                version,
                keys[version],
            )
        )
    folders = ["_transactions"] + (["data", "_deletions"] if deep else [])
    listed = list_prefixes(table, folders, progress)
    transactions = {m.key for m in listed["_transactions"]}
    for lv in loaded:
        for name, why in unsafe_references(lv.manifest, store=table.store, base=table.base):
            findings.append(
                Finding(
                    "untrusted_file_path",
                    f"version {lv.version}'s manifest {lv.key!r} names file {name!r} ({why}); "
                    "no tool follows it, and gc and cleanup refuse to run",
                    "inspect the manifest: it was not written by Lance or lancetx for this "
                    "table; restore it from bucket versioning or a backup",
                    lv.version,
                    lv.key,
                )
            )
        if lv.manifest.version != lv.version:
            findings.append(
                Finding(
                    "version_mismatch",
                    f"the manifest at {lv.key!r} describes version {lv.manifest.version}, "
                    f"not {lv.version}",
                    "inspect the item and the manifest; do not write until resolved",
                    lv.version,
                    lv.key,
                )
            )
        txn = transaction_key_of(table.base, lv.manifest)
        if txn is not None and txn not in transactions and lv.manifest.transaction is None:
            findings.append(
                Finding(
                    "missing_transaction",
                    f"version {lv.version} names transaction file {txn!r}, which is gone "
                    "(concurrent writers cannot check conflicts against this version)",
                    "restore it from bucket versioning; conflict checks against this version "
                    "fail until then",
                    lv.version,
                    txn,
                )
            )
    if deep and loaded:
        objects = {m.key: m for m in listed["data"] + listed["_deletions"]}
        heads: dict[str, ObjectMeta | None] = {}
        for lv in loaded if all_versions else loaded[-1:]:
            findings.extend(_deep_findings(table, lv, objects))
            findings.extend(_foreign_findings(table, lv, heads))
    return TableScan(entries, listing, loaded, findings)


def verify_table(
    table: OpsTable,
    *,
    deep: bool = False,
    all_versions: bool = False,
    progress: Progress = no_progress,
) -> VerifyReport:
    """Verify ``table``; see the module docstring."""
    scan = scan_table(table, deep=deep, all_versions=all_versions, progress=progress)
    latest = (
        scan.entries[-1].version
        if scan.entries
        else (max(scan.listing.finals) if scan.listing.finals else None)
    )
    return VerifyReport(table.uri, latest, len(scan.loaded), deep, scan.findings)


def _skip(findings: list[Finding]) -> set[int]:
    """Versions whose manifest is already known to be unreadable."""
    return {
        f.version
        for f in findings
        if f.version is not None
        and f.kind in ("wedged_version", "missing_manifest", "missing_final", "cleaned_up_version")
    }


def _staged_copies(listing: VersionsListing, entry: ManifestEntry) -> list[StagedObject]:
    """Staged objects of ``entry``'s version that may hold its manifest: the one
    named by its commit token, else those of the recorded size."""
    candidates = listing.staged_of(entry.version)
    if entry.commit_token is not None:
        return [s for s in candidates if s.token == entry.commit_token]
    return [s for s in candidates if entry.size is None or s.meta.size == entry.size]


def _foreign_findings(
    table: OpsTable, lv: LoadedVersion, heads: dict[str, ObjectMeta | None]
) -> list[Finding]:
    """Files read from base paths outside the table (a clone reads its source's): HEAD
    each once per scan (``heads``). A source's own cleanup may have removed them."""
    out: list[Finding] = []
    for found in foreign_files(table.store, table.base, lv.manifest):
        if found.uri not in heads:
            heads[found.uri] = _head_foreign(table, found)
        meta = heads[found.uri]
        kind = "missing_data_file" if found.kind == "data" else "missing_deletion_file"
        if meta is None:
            out.append(
                Finding(
                    kind,
                    f"version {lv.version} reads {found.kind} file {found.uri} from "
                    f"{found.root.describe()}, which does not have it any more (a cleanup "
                    "of the table there removes what none of its own versions references)",
                    "restore it from bucket versioning; tag the version a clone was made "
                    "from on its source, so that the source's cleanup keeps its files",
                    lv.version,
                    found.uri,
                )
            )
        elif found.size is not None and meta.size != found.size:
            out.append(
                Finding(
                    "data_file_size_mismatch",
                    f"data file {found.uri} has {meta.size} bytes, version {lv.version} "
                    f"records {found.size}",
                    "restore it from bucket versioning",
                    lv.version,
                    found.uri,
                )
            )
    return out


def _head_foreign(table: OpsTable, found: ForeignFile) -> ObjectMeta | None:
    try:
        if found.own_store_key is not None:
            return table.store.head(found.own_store_key)
        other, key = open_object_store(found.uri, table.options)
        return other.head(key)
    except ObjectNotFoundError:
        return None


def _deep_findings(
    table: OpsTable, lv: LoadedVersion, objects: dict[str, ObjectMeta]
) -> list[Finding]:
    out: list[Finding] = []
    for key, size in sorted(data_file_keys(table.base, lv.manifest, store=table.store).items()):
        meta = objects.get(key)
        if meta is None:
            out.append(
                Finding(
                    "missing_data_file",
                    f"version {lv.version} references data file {key!r}, which does not exist",
                    "restore it from bucket versioning; rows in it cannot be read",
                    lv.version,
                    key,
                )
            )
        elif size is not None and meta.size != size:
            out.append(
                Finding(
                    "data_file_size_mismatch",
                    f"data file {key!r} has {meta.size} bytes, version {lv.version} records {size}",
                    "restore it from bucket versioning",
                    lv.version,
                    key,
                )
            )
    for key in sorted(deletion_keys(table.base, lv.manifest, store=table.store)):
        if key not in objects:
            out.append(
                Finding(
                    "missing_deletion_file",
                    f"version {lv.version} references deletion file {key!r}, which does "
                    "not exist (deleted rows would reappear)",
                    "restore it from bucket versioning",
                    lv.version,
                    key,
                )
            )
    return out
