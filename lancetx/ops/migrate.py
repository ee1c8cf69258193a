"""``lancetx-sync migrate-to-conditional-put``: leave DynamoDB once the bucket can do it alone.

1. Probe the bucket: a store that ignores ``If-None-Match`` is refused, nothing changes.
2. Verify the table: anything but unfinalized versions (wedged, missing
   manifests, gaps) is refused: repair first.
3. Finalize every staged version, so every committed version has its final
   manifest (what ``s3://`` readers and writers list).
4. Record in DynamoDB that the table moved (:mod:`lancetx.externalstore.moved`):
   lancetx writers opening it as ``s3+ddb://`` are refused from then on.
5. Tell pylance users what to change: pylance does not read that record.

Stop every writer before migrating: a writer that claims a version in
DynamoDB after step 3 would be invisible to ``s3://`` writers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lancetx.externalstore.moved import moved_record, record_moved
from lancetx.externalstore.protocol import finalize_steps
from lancetx.ops.findings import Finding
from lancetx.ops.probes import conditional_put_probe
from lancetx.ops.table import OpsTable
from lancetx.ops.verify import scan_table

_FINALIZABLE = ("staged_entry", "unflipped_entry")


@dataclass(frozen=True)
class MigrateReport:
    uri: str
    new_uri: str
    dry_run: bool
    conditional_put: bool | None
    probe_detail: str
    finalized: list[int] = field(default_factory=list)
    moved: bool = False
    blocking: list[Finding] = field(default_factory=list)
    pylance_changes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.conditional_put is True and not self.blocking and (self.moved or self.dry_run)


def migrate_to_conditional_put(table: OpsTable, *, dry_run: bool = False) -> MigrateReport:
    """Migrate ``table`` off DynamoDB; see the module docstring."""
    entries = table.require_entries("migrate-to-conditional-put")
    new_uri = table.s3_uri or table.uri
    changes = [
        f"open the table as {new_uri!r} instead of {table.uri!r} (lance.dataset, "
        "lance.write_dataset, Spark options)",
        "drop the DynamoDB options (dynamodb_endpoint, dynamodb_region, *_dynamodb credentials)",
        "stop and restart every long-running pylance writer: pylance does not read the "
        "moved record, and an s3+ddb:// pylance writer left running would commit versions "
        "that s3:// writers overwrite",
    ]
    already = moved_record(entries, table.base)
    probe = conditional_put_probe(table)
    report = MigrateReport(table.uri, new_uri, dry_run, probe.honoured, probe.detail)
    if already is not None:
        return MigrateReport(
            table.uri,
            already.path,
            dry_run,
            probe.honoured,
            probe.detail,
            moved=True,
            pylance_changes=changes,
        )
    if probe.honoured is not True:
        return report
    scan = scan_table(table)
    blocking = [f for f in scan.findings if f.severity == "error" and f.kind not in _FINALIZABLE]
    if blocking:
        return MigrateReport(
            table.uri, new_uri, dry_run, probe.honoured, probe.detail, blocking=blocking
        )
    by_version = {e.version: e for e in scan.entries}
    staged = sorted({f.version for f in scan.findings if f.kind in _FINALIZABLE and f.version})
    if not dry_run:
        for version in staged:
            table.run(finalize_steps(table.protocol_table, by_version[version]))
        record_moved(entries, table.base, new_uri)
    return MigrateReport(
        table.uri,
        new_uri,
        dry_run,
        probe.honoured,
        probe.detail,
        finalized=staged,
        moved=not dry_run,
        pylance_changes=changes,
    )
