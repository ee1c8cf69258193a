"""One table as the operator tools see it: its object store, its DynamoDB store, its keys.

Opening never writes and never finalizes: the tools decide what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lancetx.commit.errors import InvalidUriError, ObjectNotFoundError
from lancetx.commit.format.manifest import ManifestFile, read_manifest
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.errors import NotAnExternalStoreTableError
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.connect import open_stores, scheme_of
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.protocol import Steps, Table, run

T = TypeVar("T")


@dataclass
class OpsTable:
    """A table opened for inspection or repair.

    ``base`` is the table's key in ``store`` and, for an ``s3+ddb://`` table,
    also its ``base_uri`` in DynamoDB (Lance's convention). ``entries`` is None
    for a table without a DynamoDB store.
    """

    uri: str
    store: ObjectStore
    base: str
    entries: DynamoDBManifestStore | None
    #: Not in the repr: it holds credentials.
    options: dict[str, str] = field(default_factory=dict, repr=False)
    bucket: str | None = None
    ddb_table: str | None = None
    s3_uri: str | None = None

    @property
    def protocol_table(self) -> Table:
        return Table(base_uri=self.base, base_key=self.base)

    def require_entries(self, command: str) -> DynamoDBManifestStore:
        if self.entries is None:
            raise NotAnExternalStoreTableError(self.uri, command)
        return self.entries

    def run(self, steps: Steps[T]) -> T:
        """Drive protocol steps against this table's stores."""
        return run(steps, self.store, self.require_entries("repair"))

    def list_entries(self) -> list[ManifestEntry]:
        return self.entries.list_entries(self.base, 0) if self.entries is not None else []

    def exists(self, key: str) -> bool:
        try:
            self.store.head(key)
        except ObjectNotFoundError:
            return False
        return True

    def read_manifest_or_none(self, key: str) -> ManifestFile | None:
        try:
            return read_manifest(self.store, key)
        except ObjectNotFoundError:
            return None

    def command(self, name: str, *args: str) -> str:
        """The exact ``lancetx-sync`` command line for this table."""
        return " ".join(["lancetx-sync", name, _quote(self.uri), *args])


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def open_table(
    uri: str, storage_options: Mapping[str, str] | None = None, *, validate: bool = True
) -> OpsTable:
    """Open ``uri`` (``s3+ddb://``, ``s3://`` or a local path) with pylance-style
    storage options; environment variables apply as in the library."""
    options = dict(storage_options or {})
    external = scheme_of(uri).external
    if not external and "://" in uri and not uri.lower().startswith(("s3://", "file://")):
        raise InvalidUriError(uri, "expected s3+ddb://, s3://, file:// or a local path")
    stores = open_stores(uri, options, validate=validate)
    entries = stores.entries
    if entries is not None and not isinstance(entries, DynamoDBManifestStore):
        raise NotAnExternalStoreTableError(uri, "open")  # the tools know DynamoDB's only
    return OpsTable(
        uri=uri,
        store=stores.store,
        base=stores.base,
        entries=entries,
        options=options,
        bucket=stores.bucket,
        ddb_table=stores.external_table,
        s3_uri=stores.data_uri if external else None,
    )


def s3_client_of(table: OpsTable) -> Any:
    """The boto3 S3 client behind ``table.store`` (None for a local table)."""
    return getattr(table.store, "client", None)
