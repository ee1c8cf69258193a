"""What an ``s3+ddb://`` connection checks beside its first request, in one read.

Two items decide whether a connection's results may be used: the store's layout
stamp (a newer lancetx's store is refused; see :mod:`.store_schema`), read once per
table per process, and the table's moved record (a table migrated to conditional
PUT is refused; see :mod:`.moved`), read once per connection since a migration may
happen while a process runs. Both are read in one consistent BatchGetItem; once the
stamp is known, the moved record alone is one GetItem.

Each key is the table's full primary key (``base_uri``, ``version``), so DynamoDB
itself rejects the read on a table of another key layout (a hash-only table, other
names or types); the store explains that rejection through DescribeTable as a
DynamoDBTableSchemaError. Reads therefore need no DescribeTable of their own.

An asyncio connection makes the same checks (:func:`check_stamp_and_moved_async`),
when it is opened rather than beside its first request.

An IAM policy without ``dynamodb:BatchGetItem`` (written before lancetx used it) is
not an error: the two items are read with GetItem instead, for that table for the
rest of the process, and one warning says what to grant.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from lancetx.externalstore.dynamodb.plans import entry_from_item, key_of
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.dynamodb.store_schema import (
    remember_stamp,
    stamp_checked,
    stamp_key,
    stamp_of,
)
from lancetx.externalstore.errors import AccessDeniedError, TableMovedError
from lancetx.externalstore.moved import check_not_moved, check_not_moved_async, moved_key

if TYPE_CHECKING:
    # For its type only: the asyncio store needs the [async] extra, the sync API never.
    from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore

log = logging.getLogger(__name__)

#: Tables (endpoint, region, name) whose policy denied BatchGetItem in this process.
_DENIED: set[tuple[str | None, str | None, str]] = set()
_LOCK = threading.Lock()


def _table_key(
    entries: DynamoDBManifestStore | AsyncDynamoDBManifestStore,
) -> tuple[str | None, str | None, str]:
    target = entries.target
    return (target.endpoint, target.region, target.table)


def batch_get_denied(entries: DynamoDBManifestStore | AsyncDynamoDBManifestStore) -> bool:
    """Whether BatchGetItem on ``entries``' table was denied in this process."""
    with _LOCK:
        return _table_key(entries) in _DENIED


def forget_denials() -> None:
    """Try BatchGetItem again on every table (tests; after the IAM policy changed)."""
    with _LOCK:
        _DENIED.clear()


def _batch_read_denied(
    entries: DynamoDBManifestStore | AsyncDynamoDBManifestStore, exc: AccessDeniedError
) -> None:
    """Remember (and say once) that the policy denies BatchGetItem on ``entries``' table;
    re-raise ``exc`` when it is the credentials, not the policy."""
    if exc.code != "AccessDeniedException":
        raise exc  # the credentials, not the policy
    with _LOCK:
        first = _table_key(entries) not in _DENIED
        _DENIED.add(_table_key(entries))
    if first:
        log.warning(
            "the IAM policy lacks dynamodb:BatchGetItem on %s: opening a table reads its "
            "checks with two GetItem requests instead of one; grant it (see "
            "`lancetx-sync iam-policy`) to save a request per first read",
            entries.target.resource,
        )


def _settle(
    entries: DynamoDBManifestStore | AsyncDynamoDBManifestStore,
    base: str,
    stamp: dict[str, Any] | None,
    moved: dict[str, Any] | None,
) -> None:
    remember_stamp(entries.client, entries.table_name, stamp_of(stamp))
    if moved is not None:
        record = entry_from_item(moved, entries.target, "BatchGetItem")
        raise TableMovedError(base, entries.table_name, record.path)


def _one_read(entries: DynamoDBManifestStore | AsyncDynamoDBManifestStore) -> bool:
    """Whether the stamp and the moved record are read together (BatchGetItem): not when
    the stamp is known already, nor where the policy denies BatchGetItem."""
    return not (stamp_checked(entries.client, entries.table_name) or batch_get_denied(entries))


def check_stamp_and_moved(entries: DynamoDBManifestStore, base: str) -> None:
    """Refuse a store stamped by a newer lancetx and a table migrated off DynamoDB.

    Raises StoreSchemaTooNewError, TableMovedError, or what reading the table raises
    (DynamoDBTableNotFoundError, DynamoDBTableSchemaError, AccessDeniedError…).
    """
    if _one_read(entries):
        try:
            stamp, moved = entries.get_items([stamp_key(), key_of(moved_key(base), 0)])
        except AccessDeniedError as exc:
            _batch_read_denied(entries, exc)
        else:
            return _settle(entries, base, stamp, moved)
    entries.check_stamp()  # from the process's cache once read
    check_not_moved(entries, base, entries.table_name)


async def check_stamp_and_moved_async(entries: AsyncDynamoDBManifestStore, base: str) -> None:
    """:func:`check_stamp_and_moved` for an asyncio store: the same reads, awaited."""
    if _one_read(entries):
        try:
            stamp, moved = await entries.get_items([stamp_key(), key_of(moved_key(base), 0)])
        except AccessDeniedError as exc:
            _batch_read_denied(entries, exc)
        else:
            return _settle(entries, base, stamp, moved)
    await entries.check_stamp()
    await check_not_moved_async(entries, base, entries.table_name)


__all__ = [
    "batch_get_denied",
    "check_stamp_and_moved",
    "check_stamp_and_moved_async",
    "forget_denials",
]
