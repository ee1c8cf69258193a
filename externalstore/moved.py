"""The record that a table left DynamoDB for S3's own conditional PUT.

``lancetx-sync migrate-to-conditional-put`` writes it once the bucket honours
``If-None-Match`` and every version is finalized. From then on writers commit
through ``s3://``; a lancetx writer still using ``s3+ddb://`` would claim
versions the ``s3://`` writers never see, so opening the table that way is
refused with :class:`TableMovedError`.

The record is an item under its own hash key (``__lancetx_moved__/{base_uri}``,
version 0), which pylance never queries.
"""

from __future__ import annotations

from lancetx.externalstore.base import (
    AsyncExternalManifestStore,
    ExternalManifestStore,
    ManifestEntry,
)
from lancetx.externalstore.errors import EntryNotFoundError, TableMovedError

#: Prefix of the hash key of a moved-table record.
MOVED_PREFIX = "__lancetx_moved__/"
#: ``committer`` of the record; its ``path`` is the table's new ``s3://`` URI.
MOVED_COMMITTER = "lancetx-sync migrate-to-conditional-put"


def moved_key(base_uri: str) -> str:
    """The hash key of ``base_uri``'s moved-table record."""
    return MOVED_PREFIX + base_uri


def moved_record(entries: ExternalManifestStore, base_uri: str) -> ManifestEntry | None:
    """The moved-table record of ``base_uri`` (one consistent GetItem), or None."""
    try:
        return entries.get(moved_key(base_uri), 0)
    except EntryNotFoundError:
        return None


def record_moved(entries: ExternalManifestStore, base_uri: str, new_uri: str) -> None:
    """Record that ``base_uri`` now lives at ``new_uri`` (idempotent)."""
    entries.put_if_not_exists(
        ManifestEntry(
            base_uri=moved_key(base_uri), version=0, path=new_uri, committer=MOVED_COMMITTER
        )
    )


def check_not_moved(entries: ExternalManifestStore, base_uri: str, table: str) -> None:
    """Raise TableMovedError if ``base_uri`` was migrated to conditional PUT."""
    record = moved_record(entries, base_uri)
    if record is not None:
        raise TableMovedError(base_uri, table, record.path)


async def check_not_moved_async(
    entries: AsyncExternalManifestStore, base_uri: str, table: str
) -> None:
    """:func:`check_not_moved` for an asyncio store."""
    try:
        record = await entries.get(moved_key(base_uri), 0)
    except EntryNotFoundError:
        return
    raise TableMovedError(base_uri, table, record.path)


__all__ = [
    "MOVED_PREFIX",
    "TableMovedError",
    "check_not_moved",
    "check_not_moved_async",
    "moved_key",
    "moved_record",
    "record_moved",
]
