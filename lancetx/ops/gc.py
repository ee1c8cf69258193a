"""``lancetx-sync gc``: delete what no version references and no writer can still commit.

Candidates, all older than the threshold:

* staged manifests no item points at (a writer that lost or crashed before its claim);
* transaction files no committed manifest names (failed or lost attempts);
* data and deletion files no committed version references (failed Spark tasks,
  uncommitted ``write_fragments``).

Safety against concurrent writers. A writer stays in its commit loop for up to
its budget (:data:`COMMIT_BUDGET`, the commit loop's ``RetryPolicy.max_elapsed``)
and writes its transaction file before it claims; a file it wrote may be
referenced by the version it claims until then. So:

* the threshold must be at least :data:`MINIMUM_OLDER_THAN` (the budget plus
  :data:`SAFETY_MARGIN`: the last attempt may start just before the budget ends
  and takes its own time, an object is dated by the start of its upload, clocks
  differ): a lower one is refused (:class:`UnsafeThresholdError`) unless forced;
* whatever it is told, gc never deletes an object younger than the budget, and
  treats a transaction file younger than the minimum as a commit in flight: it,
  every file it names and every staged manifest younger than the minimum stay
  (only files no transaction names, such as a failed task's, go sooner when forced);
* versions committed since the scan began are loaded right before deleting and
  whatever they reference is kept.

Ages are measured against the store's clock, not ours: an object's LastModified
is the store's time. The scan asks the store for its time (the ``Date`` header of
a one-key listing) and takes the earlier of that and the local clock, so a skew
in either direction can only make objects look younger. Without a ``Date`` header
the local clock is used and the margin is what covers a skew.

A table with a wedged version, an item or a manifest pointing outside the table,
or an unreadable tag is refused before anything is deleted (see
:mod:`lancetx.ops.preflight`).
"""

from __future__ import annotations

import email.utils
import logging
import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lancetx.commit.engine.retry import RetryPolicy
from lancetx.commit.errors import (
    LancetxError,
    ObjectNotFoundError,
    TransactionFileError,
    TransactionTooLargeError,
)
from lancetx.commit.format.bases import BaseRoot
from lancetx.commit.format.listing import versions_prefix
from lancetx.commit.format.transaction_file import decode_transaction
from lancetx.commit.handlers.probe import PROBE_DIR
from lancetx.commit.storage.limits import TRANSACTION, read_capped
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.errors import UnsafeThresholdError, UntrustedReferenceError, WedgedTableError
from lancetx.ops.inventory import (
    PARALLELISM,
    Progress,
    known_bases,
    list_prefixes,
    no_progress,
    referenced_keys,
    transaction_keys,
)
from lancetx.ops.preflight import check_table, readable_manifest_keys, referenced_since
from lancetx.ops.table import OpsTable, s3_client_of

log = logging.getLogger(__name__)

#: Folders gc lists (``_versions/`` separately). ``_lancetx_probe/`` holds only probe
#: objects (doctor's, the conditional-PUT probe's) that could not be deleted: nothing
#: references them.
GC_FOLDERS = ("data", "_deletions", "_transactions", PROBE_DIR)

#: How long a writer may stay in its commit loop: the default ``RetryPolicy.max_elapsed``.
#: A writer given a longer ``commit_timeout`` needs a longer ``--older-than``.
COMMIT_BUDGET = timedelta(seconds=RetryPolicy().max_elapsed or 300.0)
#: Added to the budget for the smallest threshold gc accepts without being forced.
SAFETY_MARGIN = timedelta(minutes=5)
#: The smallest ``older_than`` gc accepts without ``force_unsafe_threshold``.
MINIMUM_OLDER_THAN = COMMIT_BUDGET + SAFETY_MARGIN


def format_age(age: timedelta) -> str:
    """``600s`` → ``10m``: the largest unit that divides it (as ``--older-than`` takes it)."""
    seconds = int(age.total_seconds())
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{age.total_seconds():g}s"


def unsafe_threshold_error(older_than: timedelta) -> UnsafeThresholdError:
    """The error refusing ``older_than`` below :data:`MINIMUM_OLDER_THAN` (says why, and what to pass)."""
    return UnsafeThresholdError(
        older_than,
        MINIMUM_OLDER_THAN,
        f"--older-than {format_age(older_than)} is below the minimum of "
        f"{format_age(MINIMUM_OLDER_THAN)} (the commit budget {format_age(COMMIT_BUDGET)} "
        f"plus a {format_age(SAFETY_MARGIN)} margin): a writer can stay in its commit loop "
        "that long, and gc would delete files its commit is about to reference. Use "
        f"--older-than {format_age(MINIMUM_OLDER_THAN)} or more, or, when no writer can be "
        "committing, --force-unsafe-threshold (files younger than "
        f"{format_age(COMMIT_BUDGET)}, and those a transaction file younger than "
        f"{format_age(MINIMUM_OLDER_THAN)} names, are kept regardless)",
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
    """What gc found (and deleted). ``scan_started`` is the reference time ages
    were measured against (``clock`` says whose: "store" or "local");
    ``clock_skew_seconds`` is the local clock minus the store's, when known."""

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
    minimum_older_than_seconds: float = MINIMUM_OLDER_THAN.total_seconds()
    never_younger_than_seconds: float = COMMIT_BUDGET.total_seconds()
    clock: str = "local"
    clock_skew_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def _older(meta: ObjectMeta, cutoff: datetime) -> bool:
    # No timestamp: unknown age, never deleted.
    return meta.last_modified is not None and meta.last_modified < cutoff


def store_clock(table: OpsTable) -> tuple[datetime, str, float | None]:
    """The reference time for ages: the earlier of the local clock and the store's
    (the ``Date`` header of a one-key listing of ``_versions/``), whose clock it is,
    and the local clock minus the store's (None when the store sent no date)."""
    local = datetime.now(UTC)
    client = s3_client_of(table)
    bucket = table.bucket or getattr(table.store, "bucket", None)
    if client is None or bucket is None:
        return local, "local", None  # a local table: its files are dated by this clock
    try:
        response = client.list_objects_v2(
            Bucket=bucket, Prefix=versions_prefix(table.base), MaxKeys=1
        )
        raw = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        remote = email.utils.parsedate_to_datetime(raw) if raw else None
    except Exception as exc:  # the listing that follows reports a real failure
        log.warning("could not read the store's clock (%s); ages use the local clock", exc)
        return local, "local", None
    if remote is None or remote.tzinfo is None:
        log.warning("the store sent no usable Date header; ages use the local clock")
        return local, "local", None
    skew = (local - remote).total_seconds()
    if remote < local:
        return remote, "store", skew
    return local, "local", skew


def collect_garbage(
    table: OpsTable,
    *,
    older_than: timedelta,
    dry_run: bool = True,
    progress: Progress = no_progress,
    now: datetime | None = None,
    force_unsafe_threshold: bool = False,
) -> GcReport:
    """Find (and unless ``dry_run``, delete) garbage; see the module docstring.

    ``now`` replaces the reference time read from the store (tests). Raises
    UnsafeThresholdError for ``older_than`` below :data:`MINIMUM_OLDER_THAN` unless
    ``force_unsafe_threshold``; WedgedTableError / UntrustedReferenceError /
    TagFileError for a table it must not touch (nothing is deleted then)."""
    if older_than < MINIMUM_OLDER_THAN and not force_unsafe_threshold:
        raise unsafe_threshold_error(older_than)
    if now is not None:
        started, clock, skew = now, "given", None
    else:
        started, clock, skew = store_clock(table)
    cutoff = started - max(older_than, COMMIT_BUDGET)
    in_flight_cutoff = started - max(older_than, MINIMUM_OLDER_THAN)
    checked = check_table(table, progress)
    referenced: set[str] = set()
    for lv in checked.loaded:
        referenced |= referenced_keys(table.base, lv.manifest, store=table.store)
    listed = list_prefixes(table, GC_FOLDERS, progress)
    pointed_at = {e.path for e in checked.entries}

    # A transaction file young enough to belong to a commit in flight keeps itself
    # and whatever it names (a writer writes it before claiming).
    in_flight = _named_by_young_transactions(
        table, listed["_transactions"], in_flight_cutoff, referenced, known_bases(checked.loaded)
    )
    referenced |= in_flight
    candidates: list[Garbage] = []
    for staged in checked.listing.staged:
        if staged.key not in pointed_at and _older(staged.meta, in_flight_cutoff):
            candidates.append(_garbage(staged.meta, "staged_manifest"))
    kinds = {
        "data": "data_file",
        "_deletions": "deletion_file",
        "_transactions": "transaction_file",
        PROBE_DIR: "probe_object",
    }
    for folder, metas in listed.items():
        limit = in_flight_cutoff if folder == "_transactions" else cutoff
        for meta in metas:
            if meta.key not in referenced and _older(meta, limit):
                candidates.append(_garbage(meta, kinds[folder]))
    listing = checked.listing
    scanned = len(listing.finals) + len(listing.staged) + sum(len(m) for m in listed.values())

    # Versions committed since the scan began keep whatever they reference.
    newest_seen = max(checked.keys) if checked.keys else 0
    kept_since = referenced_since(table, newest_seen, progress)
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
        versions_referenced=len(checked.loaded),
        objects_scanned=scanned,
        candidates=live,
        bytes_reclaimable=reclaimable,
        deleted=deleted,
        bytes_deleted=bytes_deleted,
        kept_referenced_since_scan=report_kept,
        errors=errors,
        clock=clock,
        clock_skew_seconds=skew,
    )


def _named_by_young_transactions(
    table: OpsTable,
    transactions: list[ObjectMeta],
    cutoff: datetime,
    referenced: set[str],
    bases: Mapping[int, BaseRoot],
) -> set[str]:
    young = [m for m in transactions if m.key not in referenced and not _older(m, cutoff)]

    def read(meta: ObjectMeta) -> set[str]:
        try:
            txn = decode_transaction(
                read_capped(table.store, meta.key, TRANSACTION), path=table.store.uri(meta.key)
            )
        except TransactionTooLargeError:
            raise  # over the cap is unread, not "not a transaction": what it names is unknown
        except (ObjectNotFoundError, TransactionFileError):
            return set()  # gone (its writer cleaned up) or not a transaction: names nothing
        # Any other failure propagates: what an unread transaction names is unknown.
        return transaction_keys(table.base, txn, store=table.store, bases=bases)

    named: set[str] = set()
    with ThreadPoolExecutor(max_workers=PARALLELISM) as pool:
        for keys in pool.map(read, young):
            named |= keys
    return named


def _garbage(meta: ObjectMeta, kind: str) -> Garbage:
    when = meta.last_modified.isoformat() if meta.last_modified is not None else None
    return Garbage(meta.key, kind, meta.size, when)


#: The largest age ``parse_age`` takes: ages are subtracted from today's date, and
#: anything older than this matches nothing anyway.
MAX_AGE_DAYS = 36500


def parse_age(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``45s``, ``2w`` (or plain seconds) → timedelta."""
    raw = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        seconds = float(raw[:-1]) * units[raw[-1]] if raw and raw[-1] in units else float(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not an age like 7d, 12h, 30m or 45s") from None
    if math.isnan(seconds):
        raise ValueError(f"{text!r} is not an age like 7d, 12h, 30m or 45s")
    if seconds < 0:
        raise ValueError(f"{text!r} is negative")
    if seconds > MAX_AGE_DAYS * 86400:  # inf, 1e309, 99999999999w, 1000000d
        raise ValueError(f"{text!r} is too large for an age (at most {MAX_AGE_DAYS}d)")
    return timedelta(seconds=seconds)


__all__ = [
    "COMMIT_BUDGET",
    "MINIMUM_OLDER_THAN",
    "SAFETY_MARGIN",
    "Garbage",
    "GcReport",
    "UnsafeThresholdError",
    "UntrustedReferenceError",
    "WedgedTableError",
    "collect_garbage",
    "format_age",
    "parse_age",
    "readable_manifest_keys",
    "store_clock",
]
