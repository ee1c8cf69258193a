"""``lancetx-sync gc``: delete what no version references and no writer can still commit.

Candidates, all older than the threshold:

* staged manifests no item points at (a writer that lost or crashed before its claim);
* transaction files no committed manifest names (failed or lost attempts);
* data and deletion files no committed version references (failed Spark tasks,
  uncommitted ``write_fragments``).

Safety against concurrent writers: the scan starts at ``T0``. Nothing younger
than ``T0 - older_than`` is a candidate, so a writer that wrote its files
within that window and commits later keeps them. Right before deleting, the
versions committed since the scan began are loaded and whatever they reference
is dropped from the candidates: nothing a version after the scan start
references is deleted. The threshold must exceed how long a writer may take
between writing a file and committing it (its retry budget); the default is 7 days.

A table with a wedged version is refused: the wedged version's candidate
transaction files are exactly what gc would delete.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lancetx.commit.errors import LancetxError
from lancetx.commit.format.transaction_file import decode_transaction
from lancetx.commit.handlers.probe import PROBE_DIR
from lancetx.commit.storage.limits import TRANSACTION, read_capped
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.externalstore.base import ManifestEntry
from lancetx.ops.inventory import (
    PARALLELISM,
    Progress,
    VersionsListing,
    committed_manifest_keys,
    list_prefixes,
    list_versions_folder,
    no_progress,
    read_manifests,
    referenced_keys,
    transaction_keys,
)
from lancetx.ops.table import OpsTable

log = logging.getLogger(__name__)

#: Folders gc lists (``_versions/`` separately). ``_lancetx_probe/`` holds only probe
#: objects (doctor's, the conditional-PUT probe's) that could not be deleted: nothing
#: references them.
GC_FOLDERS = ("data", "_deletions", "_transactions", PROBE_DIR)


class WedgedTableError(LancetxError):
    """gc/cleanup refuse to run on a table with versions that need repair first."""

    def __init__(self, uri: str, versions: list[int], command: str) -> None:
        self.versions = versions
        super().__init__(
            f"{uri!r} has version(s) {versions} that cannot be read (wedged or missing "
            f"manifest); their repair may need files this would delete. Run {command} first"
        )


@dataclass(frozen=True)
class Garbage:
    """One object gc deletes (or would)."""

    key: str
    kind: str
    size: int
    last_modified: str | None


@dataclass(frozen=True)
class GcReport:
    uri: str
    dry_run: bool
    older_than_seconds: float
    scan_started: str
    versions_referenced: int
    objects_scanned: int
    candidates: list[Garbage] = field(default_factory=list)
    bytes_reclaimable: int = 0
    deleted: int = 0
    bytes_deleted: int = 0
    kept_referenced_since_scan: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _older(meta: ObjectMeta, cutoff: datetime) -> bool:
    # No timestamp: unknown age, never deleted.
    return meta.last_modified is not None and meta.last_modified < cutoff


def collect_garbage(
    table: OpsTable,
    *,
    older_than: timedelta,
    dry_run: bool = True,
    progress: Progress = no_progress,
    now: datetime | None = None,
) -> GcReport:
    """Find (and unless ``dry_run``, delete) garbage; see the module docstring."""
    started = now or datetime.now(UTC)
    cutoff = started - older_than
    entries = table.list_entries()
    listing = list_versions_folder(table, progress)
    keys = readable_manifest_keys(table, entries, listing)
    loaded, failed = read_manifests(table, sorted(keys.items()), progress)
    if failed:
        raise WedgedTableError(table.uri, sorted(failed), table.command("verify"))
    referenced: set[str] = set()
    for lv in loaded:
        referenced |= referenced_keys(table.base, lv.manifest)
    listed = list_prefixes(table, GC_FOLDERS, progress)
    pointed_at = {e.path for e in entries}

    # Files named by transaction files too young to collect belong to writers that
    # may still commit them (a writer writes its transaction file before claiming).
    in_flight = _named_by_young_transactions(table, listed["_transactions"], cutoff, referenced)
    referenced |= in_flight
    candidates: list[Garbage] = []
    for staged in listing.staged:
        if staged.key not in pointed_at and _older(staged.meta, cutoff):
            candidates.append(_garbage(staged.meta, "staged_manifest"))
    kinds = {
        "data": "data_file",
        "_deletions": "deletion_file",
        "_transactions": "transaction_file",
        PROBE_DIR: "probe_object",
    }
    for folder, metas in listed.items():
        for meta in metas:
            if meta.key not in referenced and _older(meta, cutoff):
                candidates.append(_garbage(meta, kinds[folder]))
    scanned = len(listing.finals) + len(listing.staged) + sum(len(m) for m in listed.values())

    # Versions committed since the scan began keep whatever they reference.
    newest_seen = max(keys) if keys else 0
    kept_since = _referenced_since(table, newest_seen, progress)
    live = [c for c in candidates if c.key not in kept_since[0] and c.key not in kept_since[1]]
    report_kept = len(candidates) - len(live)
    reclaimable = sum(c.size for c in live)
    deleted, bytes_deleted, errors = 0, 0, []
    if not dry_run and live:
        progress_total = getattr(progress, "total", None)
        if progress_total is not None:
            progress_total("delete", len(live))

        def delete(item: Garbage) -> str | None:
            try:
                table.store.delete(item.key)
            except LancetxError as exc:
                return f"{item.key}: {exc}"
            finally:
                progress("delete", 1)
            return None

        with ThreadPoolExecutor(max_workers=PARALLELISM) as pool:
            results = list(pool.map(delete, live))
        errors = [r for r in results if r is not None]
        done = [c for c, r in zip(live, results, strict=True) if r is None]
        deleted, bytes_deleted = len(done), sum(c.size for c in done)
        log.info("gc of %s deleted %d object(s), %d bytes", table.uri, deleted, bytes_deleted)
    return GcReport(
        uri=table.uri,
        dry_run=dry_run,
        older_than_seconds=older_than.total_seconds(),
        scan_started=started.isoformat(),
        versions_referenced=len(loaded),
        objects_scanned=scanned,
        candidates=live,
        bytes_reclaimable=reclaimable,
        deleted=deleted,
        bytes_deleted=bytes_deleted,
        kept_referenced_since_scan=report_kept,
        errors=errors,
    )


def _named_by_young_transactions(
    table: OpsTable, transactions: list[ObjectMeta], cutoff: datetime, referenced: set[str]
) -> set[str]:
    young = [m for m in transactions if m.key not in referenced and not _older(m, cutoff)]

    def read(meta: ObjectMeta) -> set[str]:
        try:
            txn = decode_transaction(
                read_capped(table.store, meta.key, TRANSACTION), path=table.store.uri(meta.key)
            )
        except LancetxError:
            return set()  # gone (a writer cleaned up) or not a transaction: names nothing
        return transaction_keys(table.base, txn)

    named: set[str] = set()
    with ThreadPoolExecutor(max_workers=PARALLELISM) as pool:
        for keys in pool.map(read, young):
            named |= keys
    return named


def _garbage(meta: ObjectMeta, kind: str) -> Garbage:
    when = meta.last_modified.isoformat() if meta.last_modified is not None else None
    return Garbage(meta.key, kind, meta.size, when)


def readable_manifest_keys(
    table: OpsTable, entries: list[ManifestEntry], listing: VersionsListing
) -> dict[int, str]:
    """The manifest of every committed version that still has one. Versions below
    the oldest manifest were removed by a cleanup (their items may remain); a
    missing manifest above it means the table needs repair: refused."""
    staged_keys = {s.key for s in listing.staged}
    keys = {
        v: k
        for v, k in committed_manifest_keys(table, entries, listing).items()
        if v in listing.finals or k in staged_keys
    }
    oldest = min(keys) if keys else None
    broken = [
        e.version
        for e in entries
        if e.version not in keys and (oldest is None or e.version > oldest)
    ]
    if broken:
        raise WedgedTableError(
            table.uri, broken, table.command("repair", "--version", str(broken[0]))
        )
    return keys


def _referenced_since(
    table: OpsTable, newest_seen: int, progress: Progress
) -> tuple[set[str], set[str]]:
    """Objects referenced by versions committed after ``newest_seen``, and the
    staged manifests their items point at."""
    if table.entries is not None:
        newer = table.entries.list_entries(table.base, newest_seen)
        keys = {e.version: e.path for e in newer}
    else:
        listing = list_versions_folder(table)
        keys = {v: m.key for v, m in listing.finals.items() if v > newest_seen}
    loaded, _failed = read_manifests(table, sorted(keys.items()), progress)
    referenced: set[str] = set()
    for lv in loaded:
        referenced |= referenced_keys(table.base, lv.manifest)
    return referenced, set(keys.values())


def parse_age(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``45s``, ``2w`` (or plain seconds) → timedelta."""
    raw = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        seconds = float(raw[:-1]) * units[raw[-1]] if raw and raw[-1] in units else float(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not an age like 7d, 12h, 30m or 45s") from None
    if seconds < 0:
        raise ValueError(f"{text!r} is negative")
    return timedelta(seconds=seconds)


__all__ = ["Garbage", "GcReport", "WedgedTableError", "collect_garbage", "parse_age"]
