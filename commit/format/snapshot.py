"""A read-only view of one version of a table.

:func:`load_snapshot` turns a :class:`~lancetx.commit.handlers.interface.ManifestLocation`
from any source (a listing, a commit handler, an external manifest store) into
a :class:`Snapshot`; :func:`load_version` finds the location by listing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyroaring import BitMap

from lancetx.commit.errors import (
    DatasetNotFoundError,
    ManifestFormatError,
    ObjectNotFoundError,
    VersionNotFoundError,
)
from lancetx.commit.format import naming
from lancetx.commit.format.deletion import read_deletion_vector
from lancetx.commit.format.listing import latest_manifest_location, list_manifest_locations
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile, read_manifest_at
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import table_pb2, transaction_pb2

if TYPE_CHECKING:
    import pyarrow as pa


_UNSET: Any = object()


@dataclass
class Snapshot:
    """One version of a table: its manifest, indices and lazily its transaction.

    Row counts come from the manifest: ``physical_rows`` per fragment and
    ``deletion_file.num_deleted_rows``. Deletion vectors and the transaction
    are read on first use and cached.
    """

    store: ObjectStore
    base: str
    location: ManifestLocation
    manifest_file: ManifestFile
    _transaction: Any = field(default=_UNSET, init=False, repr=False, compare=False)
    _deletions: dict[int, BitMap] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    # ------------------------------------------------------------ manifest facts

    @property
    def version(self) -> int:
        """The version number (from the manifest, which must match the location)."""
        return self.manifest.version

    @property
    def manifest(self) -> table_pb2.Manifest:
        """The Manifest message."""
        return self.manifest_file.manifest

    @property
    def uri(self) -> str:
        """The table's URI, for messages."""
        return self.store.uri(self.base)

    @property
    def indices(self) -> list[table_pb2.IndexMetadata]:
        """Index metadata of this version (empty when there is no index section)."""
        return list(self.manifest_file.indices or [])

    @property
    def index_names(self) -> list[str]:
        """Distinct index names, in manifest order (an index may have several segments)."""
        return list(dict.fromkeys(index.name for index in self.indices))

    @property
    def fragments(self) -> list[table_pb2.DataFragment]:
        """The fragments, in manifest order (ascending id)."""
        return list(self.manifest.fragments)

    @property
    def fragment_ids(self) -> list[int]:
        """Ids of the fragments, in manifest order."""
        return [fragment.id for fragment in self.manifest.fragments]

    def fragment(self, fragment_id: int) -> table_pb2.DataFragment:
        """The fragment with ``fragment_id``; KeyError if this version has none."""
        for fragment in self.manifest.fragments:
            if fragment.id == fragment_id:
                return fragment
        raise KeyError(f"version {self.version} of {self.uri!r} has no fragment {fragment_id}")

    @property
    def physical_rows(self) -> int:
        """Rows stored in data files, deleted ones included."""
        return sum(fragment.physical_rows for fragment in self.manifest.fragments)

    def fragment_deleted_rows(self, fragment: table_pb2.DataFragment) -> int:
        """Deleted rows of ``fragment``: the manifest's count, or (for files written
        before Lance recorded it, where it reads 0) the deletion vector's length."""
        if not fragment.HasField("deletion_file"):
            return 0
        if fragment.deletion_file.num_deleted_rows:
            return fragment.deletion_file.num_deleted_rows
        return len(self.deletion_vector(fragment.id))

    @property
    def deleted_rows(self) -> int:
        """Rows marked deleted by deletion files."""
        return sum(self.fragment_deleted_rows(fragment) for fragment in self.manifest.fragments)

    @property
    def num_rows(self) -> int:
        """Live rows: physical rows minus deleted rows."""
        return self.physical_rows - self.deleted_rows

    @property
    def field_names(self) -> list[str]:
        """Names of the top-level schema fields, in order."""
        return [f.name for f in self.manifest.fields if f.parent_id == -1]

    # --------------------------------------------------------------- lazy reads

    def transaction(self) -> transaction_pb2.Transaction | None:
        """The transaction that produced this version (inline copy first, then
        the ``_transactions/`` file); None if the version has neither."""
        if self._transaction is _UNSET:
            self._transaction = read_transaction_of(self.store, self.base, self.manifest_file)
        result: transaction_pb2.Transaction | None = self._transaction
        return result

    def deletion_vector(self, fragment_id: int) -> BitMap:
        """Deleted row offsets of fragment ``fragment_id`` (empty if it has no
        deletion file). Raises KeyError for a fragment not in this version."""
        cached = self._deletions.get(fragment_id)
        if cached is not None:
            return cached
        fragment = self.fragment(fragment_id)
        if fragment.HasField("deletion_file"):
            rows = read_deletion_vector(
                self.store,
                self.base,
                fragment_id,
                fragment.deletion_file,
                self.manifest.base_paths,
            )
        else:
            rows = BitMap()
        self._deletions[fragment_id] = rows
        return rows

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema, converted by :mod:`lancetx.commit.format.schema`."""
        try:
            module = importlib.import_module("lancetx.commit.format.schema")
        except ImportError as exc:  # pragma: no cover - depends on the checkout
            raise NotImplementedError("lancetx.commit.format.schema is not available") from exc
        schema: pa.Schema = module.fields_to_arrow_schema(
            list(self.manifest.fields), dict(self.manifest.schema_metadata)
        )
        return schema


def load_snapshot(
    store: ObjectStore,
    base: str,
    location: ManifestLocation,
    loaded: ManifestFile | None = None,
) -> Snapshot:
    """Read the manifest at ``location`` (or take ``loaded``, read from there) into a Snapshot.

    Raises VersionNotFoundError if the manifest is absent, ManifestFormatError
    if it is invalid or describes a different version than its name says, and
    UnsupportedFeatureError for unknown reader features.
    """
    try:
        manifest_file = loaded if loaded is not None else read_manifest_at(store, location)
    except ObjectNotFoundError:
        raise VersionNotFoundError(
            store.uri(base), location.version, f"manifest {store.uri(location.key)} is missing"
        ) from None
    if manifest_file.manifest.version != location.version:
        raise ManifestFormatError(
            store.uri(location.key),
            f"describes version {manifest_file.manifest.version}, but its name says version "
            f"{location.version}",
        )
    return Snapshot(store=store, base=base, location=location, manifest_file=manifest_file)


def load_version(store: ObjectStore, base: str, version: int | None = None) -> Snapshot:
    """Load ``version`` (default: the latest) of the table under ``base``, by listing.

    Raises DatasetNotFoundError if ``_versions/`` has no manifest and
    VersionNotFoundError if ``version`` is not among them.
    """
    if version is None:
        latest = latest_manifest_location(store, base)
        if latest is None:
            raise DatasetNotFoundError(store.uri(base))
        return load_snapshot(store, base, latest)
    locations = list_manifest_locations(store, base)
    if not locations:
        raise DatasetNotFoundError(store.uri(base))
    for location in locations:
        if location.version == version:
            return load_snapshot(store, base, location)
    raise VersionNotFoundError(
        store.uri(base),
        version,
        f"{store.uri(naming.join(base, naming.VERSIONS_DIR))}/ holds {len(locations)} "
        f"version(s) between {locations[0].version} and {locations[-1].version}",
    )


__all__ = ["Snapshot", "load_snapshot", "load_version"]
