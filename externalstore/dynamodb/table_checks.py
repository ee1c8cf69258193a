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

An IAM policy without ``dynamodb:BatchGetItem`` (written before lancetx used it) is
not an error: the two items are read with GetItem instead, for that table for the
rest of the process, and one warning says what to grant.
"""

from __future__ import annotations

import logging
import threading

from lancetx.externalstore.dynamodb.plans import entry_from_item, key_of
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.dynamodb.store_schema import (
    remember_stamp,
    stamp_checked,
    stamp_key,
    stamp_of,
)
from lancetx.externalstore.errors import AccessDeniedError, TableMovedError
from lancetx.externalstore.moved import check_not_moved, moved_key

log = logging.getLogger(__name__)

#: Tables (endpoint, region, name) whose policy denied BatchGetItem in this process.
_DENIED: set[tuple[str | None, str | None, str]] = set()
_LOCK = threading.Lock()


def _table_key(entries: DynamoDBManifestStore) -> tuple[str | None, str | None, str]:
    target = entries.target
    return (target.endpoint, target.region, target.table)


def batch_get_denied(entries: DynamoDBManifestStore) -> bool:
    """Whether BatchGetItem on ``entries``' table was denied in this process."""
    with _LOCK:
        return _table_key(entries) in _DENIED


def forget_denials() -> None:
    """Try BatchGetItem again on every table (tests; after the IAM policy changed)."""
    with _LOCK:
        _DENIED.clear()


def check_stamp_and_moved(entries: DynamoDBManifestStore, base: str) -> None:
    """Refuse a store stamped by a newer lancetx and a table migrated off DynamoDB.

    Raises StoreSchemaTooNewError, TableMovedError, or what reading the table raises
    (DynamoDBTableNotFoundError, DynamoDBTableSchemaError, AccessDeniedError…).
    """
    table = entries.table_name
    if stamp_checked(entries.client, table) or batch_get_denied(entries):
        entries.check_stamp()  # from the process's cache once read
        check_not_moved(entries, base, table)
        return
    try:
        stamp, moved = entries.get_items([stamp_key(), key_of(moved_key(base), 0)])
    except AccessDeniedError as exc:
        if exc.code != "AccessDeniedException":
            raise  # the credentials, not the policy
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
        entries.check_stamp()
        check_not_moved(entries, base, table)
        return
    remember_stamp(entries.client, table, stamp_of(stamp))
    if moved is not None:
        record = entry_from_item(moved, entries.target, "BatchGetItem")
        raise TableMovedError(base, table, record.path)


__all__ = ["batch_get_denied", "check_stamp_and_moved", "forget_denials"]
