"""From a table URI and storage options to the commit handler that serves it.

* ``s3+ddb://bucket/path?ddbTableName=T`` — versions are claimed in DynamoDB
  (:class:`ExternalStoreCommitHandler`); the S3 store is declared legacy, so no
  request ever carries a conditional header.
* ``s3://bucket/path`` — S3 with a real conditional PUT
  (:class:`ConditionalPutCommitHandler`); refused if declared legacy, and
  probed once per process and bucket for a store that ignores ``If-None-Match``
  (``lancetx_probe_conditional_put=false`` turns the probe off).
* a local path or ``file://`` URI — rename/link-if-not-exists on disk.

``storage_options`` use pylance's names (``aws_endpoint``, ``aws_region``,
``dynamodb_endpoint``, ``aws_access_key_id``, …), so one dict serves pylance and
lancetx alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.handlers.probe import PROBE_OPTION
from lancetx.commit.storage.s3store import S3ObjectStore, parse_bool_option
from lancetx.commit.storage.stores import open_object_store
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.dynamodb.table_checks import check_stamp_and_moved
from lancetx.externalstore.dynamodb.uri import parse_ddb_uri
from lancetx.externalstore.errors import (
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
    StoreSchemaTooNewError,
    TableMovedError,
)
from lancetx.externalstore.preflight import Preflight


@dataclass(frozen=True)
class TableConnection:
    """Everything needed to read and commit one table.

    ``base`` is the table's key in ``handler.store``; ``data_uri`` is the URI
    pylance should write data files to (``s3://…`` for an ``s3+ddb://`` table);
    ``storage_options`` are the options to hand pylance.
    """

    uri: str
    handler: CommitHandler
    base: str
    data_uri: str
    #: Not in the repr: it holds credentials.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)


def _table_checks(entries: DynamoDBManifestStore, base: str) -> list[Callable[[], object]]:
    """What an ``s3+ddb://`` connection checks beside its first request: a store of a
    newer lancetx's layout (once per table per process) and a table migrated to
    conditional PUT (once per connection: a migration may happen while a process
    runs), in one BatchGetItem; a table of another key layout rejects that read (see
    :mod:`lancetx.externalstore.dynamodb.table_checks`). The layout itself is checked
    (DescribeTable) beside the first write."""
    return [lambda: check_stamp_and_moved(entries, base)]


def connect(uri: str, storage_options: Mapping[str, str] | None = None) -> TableConnection:
    """The handler, base key and data URI for ``uri``. Raises InvalidUriError, or
    UnsupportedOperationError for a legacy ``s3://`` store.

    An ``s3+ddb://`` connection sends nothing until it is first used; its DynamoDB
    table's checks (the layout stamp once per table per process, the moved record
    once per connection: one BatchGetItem) then run beside that first request (see
    :mod:`lancetx.externalstore.preflight`) and raise instead of its result:
    DynamoDBTableNotFoundError (no such table), DynamoDBTableSchemaError (another key layout),
    StoreSchemaTooNewError (a newer lancetx's store) or TableMovedError (the table
    was migrated to conditional PUT). The key layout is also checked (DescribeTable,
    once per table per process) beside the first write. Clients are the process's
    shared ones (see :mod:`lancetx.commit.storage.aws_clients`), so connecting again
    is cheap."""
    options = dict(storage_options or {})
    if uri.lower().startswith("s3+ddb://"):
        parsed = parse_ddb_uri(uri)
        store, base = open_object_store(parsed.s3_uri, options, legacy=True)
        if isinstance(store, S3ObjectStore):
            # Messages about the table name it as the user did, not by its s3:// form.
            store.name_table(parsed.base_key, uri)
        # Nothing is sent yet: the table's checks run beside its first request.
        entries = DynamoDBManifestStore.from_config(
            parsed.table_name,
            DynamoDBConfig.from_options(options),
            validate=False,
            validate_on_write=True,
        )
        handler: CommitHandler = ExternalStoreCommitHandler(
            store,
            entries,
            preflight=Preflight(
                _table_checks(entries, parsed.base_key),
                # Beside a claim, a check that could not be made is retried at the
                # next use: the claim may have landed, and must not be reported lost.
                write_verdicts=(
                    DynamoDBTableNotFoundError,
                    DynamoDBTableSchemaError,
                    StoreSchemaTooNewError,
                    TableMovedError,
                ),
            ),
        )
        return TableConnection(uri, handler, parsed.base_key, parsed.s3_uri, options)
    store, base = open_object_store(uri, options)
    raw = next((v for k, v in options.items() if k.lower() == PROBE_OPTION), None)
    probe = parse_bool_option(PROBE_OPTION, raw) if raw is not None else True
    handler = ConditionalPutCommitHandler(store, probe=probe)
    return TableConnection(uri, handler, base, uri, options)
