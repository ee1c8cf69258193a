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

from collections.abc import Mapping
from dataclasses import dataclass, field

from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.handlers.probe import PROBE_OPTION
from lancetx.commit.storage.s3store import S3ObjectStore, parse_bool_option
from lancetx.commit.storage.stores import open_object_store
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.dynamodb import DynamoDBConfig, DynamoDBManifestStore
from lancetx.externalstore.moved import check_not_moved
from lancetx.externalstore.uri import parse_ddb_uri


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
    storage_options: dict[str, str] = field(default_factory=dict)


def connect(uri: str, storage_options: Mapping[str, str] | None = None) -> TableConnection:
    """The handler, base key and data URI for ``uri``. Raises InvalidUriError,
    the DynamoDB validation errors (missing table, wrong key schema), or
    UnsupportedOperationError for a legacy ``s3://`` store, or TableMovedError for an
    ``s3+ddb://`` table migrated to conditional PUT."""
    options = dict(storage_options or {})
    if uri.lower().startswith("s3+ddb://"):
        parsed = parse_ddb_uri(uri)
        store, base = open_object_store(parsed.s3_uri, options, legacy=True)
        if isinstance(store, S3ObjectStore):
            # Messages about the table name it as the user did, not by its s3:// form.
            store.name_table(parsed.base_key, uri)
        entries = DynamoDBManifestStore.from_config(
            parsed.table_name, DynamoDBConfig.from_options(options)
        )
        # One GetItem: a table migrated to conditional PUT must not take s3+ddb:// commits.
        check_not_moved(entries, parsed.base_key, parsed.table_name)
        handler: CommitHandler = ExternalStoreCommitHandler(store, entries)
        return TableConnection(uri, handler, parsed.base_key, parsed.s3_uri, options)
    store, base = open_object_store(uri, options)
    raw = next((v for k, v in options.items() if k.lower() == PROBE_OPTION), None)
    probe = parse_bool_option(PROBE_OPTION, raw) if raw is not None else True
    handler = ConditionalPutCommitHandler(store, probe=probe)
    return TableConnection(uri, handler, base, uri, options)
