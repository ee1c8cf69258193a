"""``lancetx-sync status``: what state a table is in. Reads only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lancetx.commit.engine.operations import COMMIT_MESSAGE_KEY
from lancetx.commit.engine.parents import LATEST_READ_ATTEMPTS
from lancetx.commit.errors import DatasetNotFoundError, LancetxError
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.format.retention import read_tags
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.dynamodb.store_schema import read_stamp
from lancetx.externalstore.moved import moved_record
from lancetx.externalstore.protocol import final_key_of
from lancetx.ops.inventory import Progress, list_versions_folder, no_progress, untrusted_entries
from lancetx.ops.table import OpsTable


@dataclass(frozen=True)
class StatusReport:
    """A table's state. ``latest_version`` is DynamoDB's newest item (the listing's
    newest manifest for a table without items)."""

    uri: str
    base_uri: str
    dynamodb_table: str | None
    latest_version: int | None
    item_count: int
    staged_versions: list[int]
    naming_scheme: str | None
    manifests_in_store: int
    staged_objects_in_store: int
    committers: dict[str, int]
    onboarded: bool
    last_commit_time: str | None
    last_commit_message: str | None
    last_operation: str | None
    store_schema_version: int | None
    moved_to: str | None
    notes: list[str] = field(default_factory=list)
    #: The table's tags (``_refs/tags/``, pylance's and lancetx's): name → version.
    tags: dict[str, int] = field(default_factory=dict)


def table_status(table: OpsTable, progress: Progress = no_progress) -> StatusReport:
    """Collect the status of ``table`` (one Query, one listing, one manifest read).
    Raises DatasetNotFoundError where nothing was ever committed.

    The latest version can move between listing the items and reading its manifest:
    a commit lands and a cleanup without an age floor removes what was the latest.
    Its manifest is then not found, and the status is taken again when a newer
    version is there (up to :data:`LATEST_READ_ATTEMPTS` times); the note that the
    latest cannot be read stands only for a latest no newer version replaced."""
    report, unread = _status_once(table, progress)
    for _ in range(LATEST_READ_ATTEMPTS - 1):
        if unread is None:
            break
        newest = table.list_entries()
        if not newest or newest[-1].version <= unread:
            break  # no newer version took its place: it is broken, not replaced
        report, unread = _status_once(table, progress)
    return report


def _status_once(table: OpsTable, progress: Progress) -> tuple[StatusReport, int | None]:
    """The status, and the latest version if its manifest could not be read."""
    entries = table.list_entries()
    listing = list_versions_folder(table, progress)
    committers = Counter(e.committer or "(none)" for e in entries)
    staged = [e.version for e in entries if e.is_staged]
    notes: list[str] = []
    latest_entry = entries[-1] if entries else None
    latest: int | None
    manifest: ManifestFile | None = None
    unread: int | None = None
    refused = untrusted_entries(table, entries)
    if refused:
        notes.append(
            f"{len(refused)} item(s) point outside the table and were not followed "
            f"(versions {_short(sorted(refused))}): " + table.command("verify") + " explains each"
        )
    if latest_entry is not None:
        latest = latest_entry.version
        manifest = None if latest in refused else _read_latest(table, latest_entry)
        if manifest is None and latest not in refused:
            unread = latest
        if manifest is None:
            notes.append(
                f"the manifest of version {latest} cannot be read: "
                + table.command("verify")
                + " explains why"
            )
    else:
        latest = max(listing.finals) if listing.finals else None
        if latest is not None:
            manifest = table.read_manifest_or_none(listing.finals[latest].key)
            if table.entries is not None:
                notes.append("the table has no DynamoDB items: " + table.command("onboard"))
    message = operation = when = None
    if manifest is not None:
        ts = manifest.manifest.timestamp
        if ts.seconds or ts.nanos:
            when = datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC).isoformat()
        txn = read_transaction_of(table.store, table.base, manifest)
        if txn is not None:
            message = txn.transaction_properties.get(COMMIT_MESSAGE_KEY)
            operation = txn.WhichOneof("operation")
    stamp = moved = None
    if table.entries is not None and table.ddb_table is not None:
        stamp = read_stamp(table.entries.client, table.ddb_table)
        record = moved_record(table.entries, table.base)
        moved = record.path if record is not None else None
    if not entries and not listing.finals and not listing.staged and moved is None:
        # Nothing was ever committed here (a mistyped path): not a table with no versions.
        raise DatasetNotFoundError(table.uri)
    tags: dict[str, int] = {}
    try:
        tags = {
            tag.name: tag.version
            for tag in sorted(read_tags(table.store, table.base), key=lambda t: t.name)
        }
    except LancetxError as exc:
        notes.append(f"the tags cannot be read ({exc}); cleanup and gc refuse until fixed")
    if staged:
        notes.append(
            f"{len(staged)} version(s) not finalized yet ({_short(staged)}): "
            + table.command("repair")
        )
    report = StatusReport(
        uri=table.uri,
        base_uri=table.base,
        dynamodb_table=table.ddb_table,
        latest_version=latest,
        item_count=len(entries),
        staged_versions=staged,
        naming_scheme=listing.scheme.name if listing.scheme else None,
        manifests_in_store=len(listing.finals),
        staged_objects_in_store=len(listing.staged),
        committers=dict(sorted(committers.items())),
        onboarded=bool(entries),
        last_commit_time=when,
        last_commit_message=message,
        last_operation=operation,
        store_schema_version=stamp,
        moved_to=moved,
        notes=notes,
        tags=tags,
    )
    return report, unread


def _read_latest(table: OpsTable, entry: ManifestEntry) -> ManifestFile | None:
    """The manifest of a trusted ``entry`` (see :func:`untrusted_entries`)."""
    found = table.read_manifest_or_none(entry.path)
    if found is None and entry.is_staged:
        found = table.read_manifest_or_none(final_key_of(table.protocol_table, entry))
    return found


def _short(versions: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(v) for v in versions[:limit])
    return shown + (f", … ({len(versions) - limit} more)" if len(versions) > limit else "")
