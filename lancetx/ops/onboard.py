"""``lancetx-sync onboard``: record a table's existing history in DynamoDB.

The library onboards lazily (the first ``s3+ddb://`` open records the newest
version; reading an older one records it and those after it). This records
all of it at once, through the same protocol steps (``onboard_steps``, then
``backfill_steps`` from each unrecorded version), so that no claim can ever
land on a version that exists only in the object store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from lancetx.commit.errors import LancetxError
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.sansio import relay
from lancetx.externalstore.protocol import ClaimEntry, Effect, Steps, backfill_steps, onboard_steps
from lancetx.ops.inventory import Progress, list_versions_folder, no_progress
from lancetx.ops.table import OpsTable

T = TypeVar("T")


@dataclass(frozen=True)
class OnboardReport:
    uri: str
    dry_run: bool
    manifests_found: int
    already_recorded: int
    recorded: list[int] = field(default_factory=list)
    latest_version: int | None = None

    @property
    def ok(self) -> bool:
        return True


def _observed(steps: Steps[T], on_effect: Callable[[Effect], None]) -> Steps[T]:
    """``steps`` unchanged, telling ``on_effect`` about each effect (for progress)."""

    def observe(effect: Effect) -> Effect:
        on_effect(effect)
        return effect

    # LancetxError, as the protocol's driver passes: the steps handle it.
    return relay(steps, observe, passes=LancetxError)


def onboard_table(
    table: OpsTable, *, dry_run: bool = False, progress: Progress = no_progress
) -> OnboardReport:
    """Record every manifest of ``table`` that has no DynamoDB item."""
    entries = table.require_entries("onboard")
    listing = list_versions_folder(table, progress)
    have = {e.version for e in entries.list_entries(table.base, 0)}
    missing = sorted(v for v in listing.finals if v not in have)
    latest = max([*listing.finals, *have]) if (listing.finals or have) else None
    if dry_run or not missing:
        return OnboardReport(
            table.uri, dry_run, len(listing.finals), len(have), missing, latest_version=latest
        )
    total = getattr(progress, "total", None)
    if total is not None:
        total("record", len(missing))
    recorded: list[int] = []

    def on_effect(effect: Effect) -> None:
        version = effect.entry.version if isinstance(effect, ClaimEntry) else None
        if version in missing and version not in recorded:
            recorded.append(version)
            progress("record", 1)

    ptable = table.protocol_table
    if not have:
        table.run(_observed(onboard_steps(ptable, table.store), on_effect))
    for version in missing:
        if version in recorded:
            continue
        meta = listing.finals[version]
        location = ManifestLocation(
            version, meta.key, listing.schemes[version], size=meta.size, etag=meta.etag
        )
        table.run(_observed(backfill_steps(ptable, location), on_effect))
    return OnboardReport(
        table.uri,
        dry_run,
        len(listing.finals),
        len(have),
        sorted(recorded),
        latest_version=latest,
    )
