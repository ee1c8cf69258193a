"""Which table an item belongs to, and why an item cannot be followed.

Lance's DynamoDB key (``base_uri``) is the table's path inside its bucket,
without the bucket: tables at ``s3://a/t.lance`` and ``s3://b/t.lance`` sharing
one DynamoDB table share their items, and each would commit over the other's
versions. lancetx records the bucket in every item it writes (attribute
``bucket``, which pylance ignores) and refuses an item of another bucket with
:class:`TableCollisionError` before anything is written. Items pylance wrote
carry no bucket; they are checked when what they point at is missing from our
bucket (no request is spent when it is there).

* :func:`guard_bucket` wraps protocol steps: it stamps the bucket on every
  item they write and checks every item they read.
* :func:`explain_unreadable_steps` turns a manifest that an item points at and
  that cannot be read (missing, corrupt, another version's, another size) into
  a typed error naming the item — or a collision.

Both only read (never delete or rewrite anything) and are protocol steps, so
the sync and async handlers share them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from lancetx.commit.engine.effects import GetObject
from lancetx.commit.errors import LancetxError, ManifestFormatError, ObjectNotFoundError
from lancetx.commit.format.listing import manifest_locations
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.format.retention import (
    cleanup_horizon,
    tag_file_name,
    tag_file_version,
    tags_prefix,
)
from lancetx.commit.sansio import Outcome, advance
from lancetx.commit.storage.limits import TAG
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.errors import (
    CorruptManifestError,
    DanglingEntryError,
    EntryNotFoundError,
    ManifestSizeMismatchError,
    ManifestVersionMismatchError,
    TableCollisionError,
)
from lancetx.externalstore.protocol import (
    ClaimEntry,
    Effect,
    FlipEntry,
    GetEntries,
    GetEntry,
    LatestEntry,
    ListEntries,
    ListObjects,
    Steps,
    StoreInfo,
    Table,
)

__all__ = [
    "bucket_of",
    "check_manifest",
    "explain_unreadable_steps",
    "guard_bucket",
    "holds_manifests",
]

T = TypeVar("T")


def bucket_of(store: StoreInfo) -> str | None:
    """The bucket of an S3 store (None for other stores). Asks for the URI of the
    store's root: a table's own URI may be the name the user gave it."""
    root = store.uri("")
    for scheme in ("s3://", "s3+ddb://"):
        if root.startswith(scheme):
            return root[len(scheme) :].split("/", 1)[0].split("?", 1)[0] or None
    return None


def _collision(
    table: Table, entry: ManifestEntry, bucket: str, dynamodb_table: str | None
) -> TableCollisionError | None:
    if entry.bucket is None or entry.bucket == bucket or entry.base_uri != table.base_uri:
        return None
    return TableCollisionError(
        table.base_uri, entry.version, bucket, entry.bucket, dynamodb_table, path=entry.path
    )


def _read_entries(effect: Effect, result: Any) -> list[ManifestEntry]:
    if isinstance(effect, (GetEntry, LatestEntry)) and isinstance(result, ManifestEntry):
        return [result]
    if isinstance(effect, (ListEntries, GetEntries)) and isinstance(result, list):
        return [e for e in result if isinstance(e, ManifestEntry)]
    return []


def guard_bucket(
    steps: Steps[T], table: Table, bucket: str | None, *, dynamodb_table: str | None = None
) -> Steps[T]:
    """Run ``steps`` stamping ``bucket`` on the items they write; an item of another
    bucket read (or found in the way of a write) raises TableCollisionError.

    The collision is thrown into ``steps`` as the failed effect's error, so they
    clean up by their own rules (a claim that lost deletes its staged manifest);
    whatever they raise then, the caller gets the collision.
    """
    if bucket is None:
        return (yield from steps)
    collision: TableCollisionError | None = None
    last = Outcome()
    while True:
        try:
            running, effect = advance(steps, last)
        except LancetxError as exc:
            if collision is not None and exc is not collision:
                raise collision from exc
            raise
        if not running:
            if collision is not None:
                raise collision from None
            return effect  # type: ignore[no-any-return]
        if isinstance(effect, ClaimEntry):
            effect = replace(effect, entry=replace(effect.entry, bucket=bucket))
        elif isinstance(effect, FlipEntry):
            effect = FlipEntry(replace(effect.entry, bucket=bucket), effect.expected_path)
        try:
            last = Outcome((yield effect))
        except LancetxError as exc:
            last = Outcome(error=exc)
            existing = getattr(exc, "existing", None)
            if isinstance(existing, ManifestEntry):
                collision = collision or _collision(table, existing, bucket, dynamodb_table)
            continue
        for entry in _read_entries(effect, last.value):
            found = _collision(table, entry, bucket, dynamodb_table)
            if found is not None:
                collision = collision or found
                last = Outcome(error=found)
                break


def holds_manifests(table: Table) -> Steps[bool]:
    """Whether the object store holds any final manifest of ``table`` (one LIST)."""
    return bool((yield from final_manifest_versions(table)))


def final_manifest_versions(table: Table) -> Steps[set[int]]:
    """The versions whose final manifest the object store holds (one LIST)."""
    prefix = table.versions_prefix()
    listed: list[ObjectMeta] = yield ListObjects(prefix)
    return {location.version for location in manifest_locations(prefix, listed)}


def _tagged_versions(table: Table) -> Steps[set[int]]:
    """The versions the table's tags name (one LIST, one GET per tag). A tag that
    cannot be read counts none: the horizon is then no higher than the true one, and
    an item is called dangling rather than removed — never the other way round."""
    prefix = tags_prefix(table.base_key)
    listed: list[ObjectMeta] = yield ListObjects(prefix)
    tagged: set[int] = set()
    for meta in listed:
        if tag_file_name(prefix, meta.key) is None:
            continue
        try:
            body: bytes = yield GetObject(meta.key, kind=TAG)
            tagged.add(tag_file_version(meta.key, body))
        except LancetxError:
            continue
    return tagged


def check_manifest(
    table: Table, location: ManifestLocation, manifest: ManifestFile, dynamodb_table: str | None
) -> None:
    """Refuse a manifest read through an item that records another version or size."""
    if manifest.version != location.version:
        raise ManifestVersionMismatchError(
            table.base_uri,
            location.version,
            location.key,
            f"the manifest there encodes version {manifest.version}, not {location.version}",
            dynamodb_table=dynamodb_table,
        )
    if location.size is None:
        raise ManifestSizeMismatchError(
            table.base_uri,
            location.version,
            location.key,
            f"the item has no size (Lance and lancetx always record it); the manifest has "
            f"{manifest.size} bytes",
            dynamodb_table=dynamodb_table,
        )
    if location.size != manifest.size:
        raise ManifestSizeMismatchError(
            table.base_uri,
            location.version,
            location.key,
            f"the item records size {location.size}, the manifest has {manifest.size} bytes",
            dynamodb_table=dynamodb_table,
        )


def explain_unreadable_steps(
    table: Table,
    location: ManifestLocation,
    error: LancetxError,
    bucket: str | None,
    dynamodb_table: str | None,
) -> Steps[LancetxError]:
    """The error to raise for a manifest that ``location`` (from an item) points at and
    that could not be read with ``error``. Reads only: the item, and (for a missing
    manifest) one listing of ``_versions/``."""
    try:
        entry: ManifestEntry | None = yield GetEntry(table.base_uri, location.version)
    except EntryNotFoundError:
        entry = None  # a version from the listing (before the external store): not an item
    if entry is None:
        return error
    if bucket is not None:
        collision = _collision(table, entry, bucket, dynamodb_table)
        if collision is not None:
            return collision
    if isinstance(error, ObjectNotFoundError):
        if entry.is_removed or (entry.size is None and not entry.is_staged):
            # A cleanup marked it removed, or backfill recorded a version a cleanup
            # deleted: known to be gone, wherever it lies among the kept versions.
            return error
        finals = yield from final_manifest_versions(table)
        if bucket is not None and entry.bucket is None and not finals:
            return TableCollisionError(
                table.base_uri, entry.version, bucket, None, dynamodb_table, path=entry.path
            )
        if finals and entry.version < min(finals):
            # Older than every manifest the store holds: a cleanup removed it and kept
            # its item as a fence (a writer whose parent it was meets it). Not dangling:
            # "not found" lets readers skip it and a writer re-plan on the latest.
            return error
        if finals and entry.version < max(finals):
            # Above an older kept version, which a cleanup keeps only when it is
            # tagged (pylance's cleanup leaves the items of what it removes unmarked):
            # below the cleanup horizon it is removed too. Tags are read only here,
            # on the way to calling an item dangling.
            tagged = yield from _tagged_versions(table)
            horizon = cleanup_horizon(finals, tagged)
            if horizon is not None and entry.version < horizon:
                return error
        return DanglingEntryError(
            table.base_uri,
            entry.version,
            entry.path,
            "the manifest it points at does not exist"
            + (f" in bucket {bucket!r}" if bucket is not None else ""),
            dynamodb_table=dynamodb_table,
        )
    if isinstance(error, ManifestFormatError):
        return CorruptManifestError(
            table.base_uri,
            entry.version,
            entry.path,
            f"the manifest it points at cannot be read ({error})",
            dynamodb_table=dynamodb_table,
        )
    return error
