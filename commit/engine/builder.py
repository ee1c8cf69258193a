"""Previous manifest + transaction → next manifest, with Lance's semantics.

:func:`build_manifest` is lancetx's ``Transaction::build_manifest`` (Lance
``rust/lance/src/dataset/transaction.rs``; in pylance 14 the code lives in
``rust/lance-table/src/transaction/manifest_build.rs``) together with
``Transaction::restore_old_manifest`` and the manifest checks of
``commit_transaction`` (``rust/lance/src/io/commit.rs``). It works on the
protobuf messages directly (``table_pb2.Manifest``, ``transaction_pb2.Transaction``)
and never mutates its inputs.

Where pylance 14.0.2 (our data plane) behaves differently from the Lance source
we read (9.0.0-beta.10), we follow what pylance 14 *writes*, measured on its own
manifests:

* Fragment ids of an Overwrite on an existing table continue after the
  high-water mark (Lance 9 restarted them at 0).
* Feature flags are computed from the finished manifest, so an UpdateConfig that
  adds the first config key sets writer flag 8 in the same version, and an
  UpdateBases sets flag 16 (Lance 9 computed them before applying those).
* A new table with no data files gets data storage version ``2.2``.

Rules that are ours, stricter than Lance (Lance silently ignores or panics):
a transaction naming fragment ids that are not in the previous version is an
:class:`InvalidTransactionError`; duplicate fragment ids, an UpdateBases base id
that already exists, Merge fragments that reuse a retired fragment id, and
fragments carrying proto fields we do not know are refused.

The result's ``indices`` is the full index list of the new version; Lance writes
an index section only when it is non-empty (``encode_manifest(...,
indices=built.indices or None)``).
"""

from __future__ import annotations

import itertools
import re
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from pyroaring import BitMap

from lancetx.commit.errors import CommitError, LancetxError, UnsupportedFeatureError
from lancetx.commit.format import rowids
from lancetx.commit.format.fragments import OVERLAYS_FEATURE_FLAG, SPILLED_ROW_LINEAGE_FEATURE_FLAG
from lancetx.commit.format.manifest import clear_file_positions
from lancetx.commit.format.versioning import writer_version
from lancetx.protos import file_pb2, table_pb2, transaction_pb2

Manifest = table_pb2.Manifest
IndexMetadata = table_pb2.IndexMetadata
DataFragment = table_pb2.DataFragment
Transaction = transaction_pb2.Transaction

# ----------------------------------------------------------------- constants

#: A fragment id of 0 in Append/Overwrite/Update/Rewrite means "not assigned
#: yet" (``fragments_with_ids``): the builder gives it the next free id.
UNASSIGNED_FRAGMENT_ID = 0

FLAG_DELETION_FILES = 1
FLAG_STABLE_ROW_IDS = 2
FLAG_USE_V2_FORMAT_DEPRECATED = 4
FLAG_TABLE_CONFIG = 8
FLAG_BASE_PATHS = 16
FLAG_DISABLE_TRANSACTION_FILE = 32
#: Every flag bit Lance 9 defines (``rust/lance-table/src/feature_flags.rs``);
#: higher bits (pylance 14: 64 = data overlays, ...) are features we do not build.
KNOWN_FEATURE_FLAGS = 63

#: Flags of newer Lance releases we can name but do not build (see lancetx.commit.format.fragments).
_NEWER_FLAG_NAMES = {
    OVERLAYS_FEATURE_FLAG: "data overlays",
    SPILLED_ROW_LINEAGE_FEATURE_FLAG: "spilled row lineage",
}

#: System index names (``rust/lance-table/src/system_index/``).
FRAG_REUSE_INDEX_NAME = "__lance_frag_reuse"
MEM_WAL_INDEX_NAME = "__lance_mem_wal"
SYSTEM_INDEX_NAMES = frozenset({FRAG_REUSE_INDEX_NAME, MEM_WAL_INDEX_NAME})

#: Data storage version of a new table without data files (pylance 14.0.2 writes 2.2).
DEFAULT_DATA_STORAGE_VERSION = "2.2"
LANCE_FILE_FORMAT = "lance"

#: ``LanceFileVersion::try_from_major_minor`` and its ordering.
_FILE_VERSIONS: Mapping[tuple[int, int], str] = {
    (0, 0): "0.1",
    (0, 1): "0.1",
    (0, 2): "0.1",
    (0, 3): "2.0",
    (2, 0): "2.0",
    (2, 1): "2.1",
    (2, 2): "2.2",
    (2, 3): "2.3",
}
_VERSION_ORDER = {"0.1": 0, "2.0": 1, "2.1": 2, "2.2": 3, "2.3": 4}
_VERSION_ALIASES = {"legacy": "0.1", "0.3": "2.0"}
_VERSION_NUMBERS = {"0.1": (0, 2), "2.0": (2, 0), "2.1": (2, 1), "2.2": (2, 2), "2.3": (2, 3)}

#: Field-metadata keys of the unenforced primary / clustering keys (``lance-core`` datatypes).
PK_KEY = "lance-schema:unenforced-primary-key"
PK_POSITION_KEY = "lance-schema:unenforced-primary-key:position"
CK_POSITION_KEY = "lance-schema:unenforced-clustering-key:position"

_TOMBSTONE_FIELD = -2
_U32_MAX = 2**32 - 1
_UNKNOWN_CREATED_AT_VERSION = 1
_U32_RE = re.compile(r"^\+?[0-9]+$")

_M = TypeVar("_M", bound=Message)


# -------------------------------------------------------------------- errors


class InvalidTransactionError(CommitError):
    """The transaction cannot be applied to the previous version.

    ``operation`` is the transaction's operation (``"Delete"``), ``fragment_ids``
    the fragments at fault (if any), ``read_version`` the version it was planned
    against, ``previous_version`` the version it was applied to and ``version``
    the version being built. Nothing was written.
    """

    def __init__(
        self,
        operation: str,
        problem: str,
        *,
        read_version: int | None = None,
        previous_version: int | None = None,
        version: int | None = None,
        fragment_ids: Iterable[int] = (),
    ) -> None:
        self.operation = operation
        self.problem = problem
        self.read_version = read_version
        self.previous_version = previous_version
        self.version = version
        self.fragment_ids = tuple(sorted(fragment_ids))
        base = "a new table" if previous_version is None else f"version {previous_version}"
        super().__init__(
            f"cannot build version {version} from the {operation} transaction "
            f"(read_version {read_version}) on top of {base}: {problem}"
        )


class UnsupportedTransactionError(UnsupportedFeatureError):
    """The transaction needs a feature lancetx's manifest builder does not implement.

    Building it anyway could write a manifest Lance would build differently, so
    it is refused. ``feature`` names what is missing.
    """

    def __init__(self, operation: str, feature: str, flags: int = 0) -> None:
        self.path = f"{operation} transaction"
        self.role = "writer"
        self.flags = flags
        self.operation = operation
        self.feature = feature
        LancetxError.__init__(
            self,
            f"cannot build a manifest for the {operation} transaction: lancetx does not "
            f"implement {feature}; commit this change with pylance instead",
        )


# -------------------------------------------------------------------- result


@dataclass(frozen=True)
class BuiltManifest:
    """The new version's manifest and its full index list."""

    manifest: Manifest
    indices: list[IndexMetadata] = field(default_factory=list)


# ------------------------------------------------------------------- helpers


def _copy(msg: _M) -> _M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _op_name(op: str) -> str:
    return "".join(part.capitalize() for part in op.split("_"))


def fragment_bitmap(index: IndexMetadata) -> BitMap | None:
    """An index's fragment bitmap; None when it stores none (empty bytes)."""
    if not index.fragment_bitmap:
        return None
    return BitMap.deserialize(index.fragment_bitmap)


def serialize_bitmap(bitmap: BitMap) -> bytes:
    """Portable 32-bit Roaring bytes without run containers (as roaring-rs writes)."""
    # pyroaring builds run containers from ranges and optimizes by default;
    # rebuilding from a plain list keeps array/bitset containers only.
    return bytes(BitMap(list(bitmap), optimize=False).serialize())


def _set_bitmap(index: IndexMetadata, bitmap: BitMap) -> None:
    index.fragment_bitmap = serialize_bitmap(bitmap)


def _is_vector_index(index: IndexMetadata) -> bool:
    return index.HasField("index_details") and index.index_details.type_url.endswith(
        "VectorIndexDetails"
    )


def _is_system_index(index: IndexMetadata) -> bool:
    return index.name in SYSTEM_INDEX_NAMES


def _max_fragment_id(manifest: Manifest) -> int | None:
    """``Manifest::max_fragment_id``: the stored high-water mark, else the max id."""
    if manifest.HasField("max_fragment_id"):
        return manifest.max_fragment_id
    if manifest.fragments:
        return max(f.id for f in manifest.fragments)
    return None


def _normalize_storage_version(version: str) -> str | None:
    v = version.strip().lower()
    v = _VERSION_ALIASES.get(v, v)
    return v if v in _VERSION_ORDER else None


def _file_version(data_file: table_pb2.DataFile) -> str | None:
    return _FILE_VERSIONS.get((data_file.file_major_version, data_file.file_minor_version))


def _row_count(fragment: DataFragment) -> int:
    """``physical_rows``, else the row-id count (Lance's fallback), else 0."""
    if fragment.physical_rows > 0:
        return fragment.physical_rows
    if fragment.WhichOneof("row_id_sequence") == "inline_row_ids":
        return rowids.row_id_count(fragment.inline_row_ids, f"fragment {fragment.id} row ids")
    return 0


def _parse_u32(value: str | None) -> int | None:
    if value is None or not _U32_RE.match(value):
        return None
    number = int(value)
    return number if number <= _U32_MAX else None


# -------------------------------------------------------------------- builder


def build_manifest(
    previous: Manifest | None,
    previous_indices: Sequence[IndexMetadata],
    txn: Transaction,
    *,
    version: int,
    transaction_file: str,
    restore_source: tuple[Manifest, Sequence[IndexMetadata]] | None = None,
    now: datetime | None = None,
    data_storage_version: str | None = None,
    enable_stable_row_ids: bool = False,
) -> BuiltManifest:
    """Build the manifest of ``version`` by applying ``txn`` to ``previous``.

    ``previous`` is the latest manifest (None to create a table: only Overwrite
    can), ``previous_indices`` its indices, ``version`` the new version (chosen
    by the caller, normally ``previous.version + 1``), ``transaction_file`` the
    name written to ``_transactions/`` (``""`` when only an inline transaction
    is written: writer flag 32 is then set, as Lance does). For Restore,
    ``restore_source`` is the restored version's manifest and indices. ``now``
    defaults to the current UTC time. ``data_storage_version`` is the data
    storage version the writer requested (Lance's ``WriteParams``): it is checked
    against a new table's data files and replaces the format on Overwrite.
    ``enable_stable_row_ids`` turns stable row ids on for a new table.

    Raises InvalidTransactionError when the transaction does not fit
    ``previous``, UnsupportedTransactionError / UnsupportedFeatureError for a
    feature lancetx does not build, and RowIdFormatError for undecodable
    row-id sequences. The inputs are never modified.
    """
    return _Builder(
        previous,
        previous_indices,
        txn,
        version=version,
        transaction_file=transaction_file,
        restore_source=restore_source,
        now=now,
        data_storage_version=data_storage_version,
        enable_stable_row_ids=enable_stable_row_ids,
    ).build()


class _Builder:
    def __init__(
        self,
        previous: Manifest | None,
        previous_indices: Sequence[IndexMetadata],
        txn: Transaction,
        *,
        version: int,
        transaction_file: str,
        restore_source: tuple[Manifest, Sequence[IndexMetadata]] | None,
        now: datetime | None,
        data_storage_version: str | None,
        enable_stable_row_ids: bool,
    ) -> None:
        self.previous = previous
        self.previous_indices = [_copy(i) for i in previous_indices]
        self.txn = txn
        self.version = version
        self.transaction_file = transaction_file
        self.restore_source = restore_source
        if now is None:
            now = datetime.now(UTC)
        elif now.tzinfo is None:
            now = now.replace(tzinfo=UTC)  # a naive time is taken as UTC
        self.now = now
        self.requested_storage_version = data_storage_version
        self.enable_stable_row_ids = enable_stable_row_ids
        op = txn.WhichOneof("operation")
        self.op_key = op or ""
        self.op_name = _op_name(op) if op else "(no operation)"

    # ----------------------------------------------------------- errors

    def fail(self, problem: str, fragment_ids: Iterable[int] = ()) -> InvalidTransactionError:
        return InvalidTransactionError(
            self.op_name,
            problem,
            read_version=self.txn.read_version,
            previous_version=self.previous.version if self.previous is not None else None,
            version=self.version,
            fragment_ids=fragment_ids,
        )

    def unsupported(self, feature: str, flags: int = 0) -> UnsupportedTransactionError:
        return UnsupportedTransactionError(self.op_name, feature, flags)

    def require_previous(self) -> Manifest:
        if self.previous is None:
            raise self.fail(
                f"Cannot apply operation {self.op_name} to non-existent dataset; "
                "create the table with an Overwrite first"
            )
        return self.previous

    def check_flags(self, manifest: Manifest, what: str) -> None:
        unknown = (
            manifest.reader_feature_flags | manifest.writer_feature_flags
        ) & ~KNOWN_FEATURE_FLAGS
        if unknown:
            names = []
            for bit in range(64):
                if unknown >> bit & 1:
                    known = _NEWER_FLAG_NAMES.get(1 << bit)
                    names.append(f"1<<{bit} ({known})" if known else f"1<<{bit}")
            raise UnsupportedTransactionError(
                self.op_name,
                f"feature flag(s) {', '.join(names)} set on {what}",
                unknown,
            )

    # ------------------------------------------------------------ driver

    def build(self) -> BuiltManifest:
        if not self.op_key:
            raise self.fail("the transaction has no operation")
        if self.version < 1:
            raise self.fail(
                f"version {self.version} is not a valid new version (versions start at 1)"
            )
        if self.previous is not None:
            if self.version <= self.previous.version:
                raise self.fail(
                    f"the new version {self.version} must be greater than the previous "
                    f"version {self.previous.version}"
                )
            self.check_flags(self.previous, f"version {self.previous.version}")
        if self.op_key == "restore":
            return self.build_restore()
        if self.op_key == "clone":
            raise self.fail(
                "Clone operation should not enter build_manifest: a clone creates the "
                "table from the source manifest (shallow or deep copy), not from a previous "
                "version of this table"
            )
        return self.build_regular()

    # ----------------------------------------------------------- restore

    def build_restore(self) -> BuiltManifest:
        target = self.txn.restore.version
        if self.restore_source is None:
            raise self.fail(
                f"restore_source is required: pass the manifest and indices of version "
                f"{target}, the version being restored"
            )
        old, old_indices = self.restore_source
        if old.version != target:
            raise self.fail(
                f"restore_source is version {old.version}, but the transaction restores "
                f"version {target}"
            )
        self.check_flags(old, f"restored version {target}")
        # Transaction::restore_old_manifest: the old manifest as it was (writer
        # version, flags, tag, indices), with a new timestamp and transaction file;
        # the high-water mark never goes back.
        manifest = _copy(old)
        self.clear_positions(manifest)
        manifest.version = self.version
        manifest.timestamp.FromDatetime(self.now.astimezone(UTC).replace(tzinfo=None))
        manifest.transaction_file = self.transaction_file
        prev = self.previous
        if (
            prev is not None
            and prev.HasField("max_fragment_id")
            and (
                not manifest.HasField("max_fragment_id")
                or manifest.max_fragment_id < prev.max_fragment_id
            )
        ):
            manifest.max_fragment_id = prev.max_fragment_id
        return BuiltManifest(manifest, [_copy(i) for i in old_indices])

    @staticmethod
    def clear_positions(manifest: Manifest) -> None:
        # Positions in the file a manifest came from; meaningless in a new file.
        clear_file_positions(manifest)
        manifest.version_aux_data = 0

    # ----------------------------------------------------------- regular

    def build_regular(self) -> BuiltManifest:
        prev = self.previous
        op = self.op_key

        if prev is None and op != "overwrite":
            raise self.fail(
                f"Cannot apply operation {self.op_name} to non-existent dataset; "
                "create the table with an Overwrite first"
            )

        # Stable row ids: on when the previous version has them (CommitBuilder
        # uses the dataset's flag), or when a new table asks for them.
        if prev is not None:
            self.use_stable_row_ids = bool(prev.reader_feature_flags & FLAG_STABLE_ROW_IDS)
            if self.enable_stable_row_ids and not self.use_stable_row_ids:
                raise self.fail("Cannot enable stable row ids on existing dataset")
            self.next_row_id: int | None = prev.next_row_id if self.use_stable_row_ids else None
        else:
            self.use_stable_row_ids = self.enable_stable_row_ids
            self.next_row_id = 0 if self.enable_stable_row_ids else None

        # Fragment ids continue after the high-water mark, for every operation
        # (pylance 14 measured: an Overwrite of a table whose high-water mark is 3
        # gives its new fragment id 4).
        high = _max_fragment_id(prev) if prev is not None else None
        self.next_fragment_id = high + 1 if high is not None else 0
        self.prev_fragments = {f.id: f for f in prev.fragments} if prev is not None else {}
        self.indices = self.previous_indices

        # Manifest::new_from_previous / Manifest::new
        if prev is not None:
            manifest = _copy(prev)
            self.clear_positions(manifest)
            manifest.ClearField("fragments")
            manifest.ClearField("timestamp")
            manifest.tag = ""
            manifest.transaction_file = ""
            manifest.reader_feature_flags = 0
            manifest.writer_feature_flags = 0
        else:
            manifest = Manifest()
        manifest.version = self.version
        manifest.writer_version.CopyFrom(writer_version())
        self.manifest = manifest

        self.check_new_fragments()

        handler: Callable[[], list[DataFragment]] = getattr(self, f"op_{op}")
        fragments = handler()

        self.finish_fragments(fragments)
        self.apply_data_format()
        manifest.tag = self.txn.tag
        manifest.timestamp.FromDatetime(self.now.astimezone(UTC).replace(tzinfo=None))
        self.update_max_fragment_id()
        self.apply_config_changes()
        if op == "update_bases":
            self.apply_update_bases()
        if op == "reserve_fragments":
            current = manifest.max_fragment_id if manifest.HasField("max_fragment_id") else 0
            reserved = current + self.txn.reserve_fragments.num_fragments
            if reserved > _U32_MAX:
                raise self.fail(
                    f"reserving fragment ids would move max_fragment_id past 2**32-1 ({reserved})"
                )
            manifest.max_fragment_id = reserved
        manifest.transaction_file = self.transaction_file
        if self.next_row_id is not None:
            manifest.next_row_id = self.next_row_id
        self.apply_feature_flags()
        return BuiltManifest(manifest, self.indices)

    # ------------------------------------------------------ fragment helpers

    def new_fragment_lists(self) -> list[tuple[str, Sequence[DataFragment]]]:
        """Fragments the transaction brings in (as opposed to ids it names)."""
        op = getattr(self.txn, self.op_key)
        key = self.op_key
        if key in ("append", "overwrite", "merge"):
            return [(f"{key}.fragments", op.fragments)]
        if key == "delete":
            return [("delete.updated_fragments", op.updated_fragments)]
        if key == "update":
            return [
                ("update.updated_fragments", op.updated_fragments),
                ("update.new_fragments", op.new_fragments),
            ]
        if key == "rewrite":
            lists: list[tuple[str, Sequence[DataFragment]]] = [
                ("rewrite.new_fragments", op.new_fragments)
            ]
            for i, group in enumerate(op.groups):
                lists.append((f"rewrite.groups[{i}].new_fragments", group.new_fragments))
            return lists
        return []

    def check_new_fragments(self) -> None:
        legacy = self.previous is not None and (
            _normalize_storage_version(self.previous.data_format.version) == "0.1"
            and self.op_key != "overwrite"
        )
        for where, fragments in self.new_fragment_lists():
            for frag in fragments:
                unknown_set = UnknownFieldSet(frag)
                unknown = [unknown_set[i].field_number for i in range(len(unknown_set))]
                if unknown:
                    raise self.unsupported(
                        f"fragment {frag.id} in {where} carries proto field(s) {sorted(set(unknown))} "
                        "unknown to lancetx (for example data overlays, field 11)"
                    )
                for data_file in frag.files:
                    if not legacy and not data_file.fields:
                        raise self.fail(
                            f"Datafile {data_file.path} does not contain any fields", [frag.id]
                        )
                    if _file_version(data_file) is None:
                        raise self.fail(
                            f"data file {data_file.path} of fragment {frag.id} has unknown Lance "
                            f"storage version {data_file.file_major_version}.{data_file.file_minor_version}",
                            [frag.id],
                        )
                    if data_file.column_indices and len(data_file.column_indices) != len(
                        data_file.fields
                    ):
                        raise self.fail(
                            f"Data file '{data_file.path}' (fragment {frag.id}) has "
                            f"{len(data_file.fields)} field ids but {len(data_file.column_indices)} "
                            "column indices. These must be the same length.",
                            [frag.id],
                        )
                if legacy and self.op_key in ("append", "update"):
                    present = {fid for df in frag.files for fid in df.fields}
                    for schema_field in self.manifest.fields:
                        if schema_field.id not in present:
                            raise self.fail(
                                f"Fragment {frag.id} does not contain field {schema_field.name!r} "
                                f"(id {schema_field.id}); legacy tables need every field in every fragment",
                                [frag.id],
                            )

    def assign_ids(self, fragments: Iterable[DataFragment]) -> list[DataFragment]:
        """``fragments_with_ids``: copies; id 0 gets the next id, others are kept."""
        out = []
        for frag in fragments:
            copy = _copy(frag)
            if copy.id == UNASSIGNED_FRAGMENT_ID:
                copy.id = self.next_fragment_id
                self.next_fragment_id += 1
            out.append(copy)
        return out

    def existing(self) -> list[DataFragment]:
        prev = self.require_previous()
        # One C-level copy of the whole list: a Python loop of per-fragment
        # copies dominated every commit attempt on tables of many fragments.
        holder = Manifest()
        holder.fragments.extend(prev.fragments)
        return list(holder.fragments)

    def require_known(self, ids: Iterable[int], what: str) -> None:
        missing = sorted({i for i in ids if i not in self.prev_fragments})
        if missing:
            prev = self.require_previous()
            raise self.fail(
                f"{what}: fragment id(s) {_describe_ids(missing)} do not exist in version "
                f"{prev.version}, which has {_describe_ids(sorted(self.prev_fragments))}; "
                "re-plan the transaction against the latest version",
                missing,
            )

    def require_unique(self, ids: Sequence[int], what: str) -> None:
        seen: set[int] = set()
        dup: set[int] = set()
        for i in ids:
            if i in seen:
                dup.add(i)
            seen.add(i)
        if dup:
            raise self.fail(f"{what} list fragment id(s) {sorted(dup)} more than once", dup)

    def assign_row_ids(self, fragments: Sequence[DataFragment]) -> None:
        """``Transaction::assign_row_ids``: give rows without a row id the next ones."""
        assert self.next_row_id is not None
        for frag in fragments:
            physical = frag.physical_rows
            if physical <= 0:
                raise self.fail(
                    f"fragment {frag.id} does not have physical_rows; stable row ids need the row count",
                    [frag.id],
                )
            kind = frag.WhichOneof("row_id_sequence")
            if kind == "external_row_ids":
                raise self.unsupported(
                    f"row-id sequences stored in external files (fragment {frag.id})",
                    FLAG_STABLE_ROW_IDS,
                )
            if kind == "inline_row_ids":
                where = f"fragment {frag.id} row ids"
                existing = rowids.decode_row_ids(frag.inline_row_ids, where)
                if len(existing) == physical:
                    continue
                if len(existing) > physical:
                    raise self.fail(
                        f"Fragment has more row IDs ({len(existing)}) than physical rows ({physical})",
                        [frag.id],
                    )
                remaining = physical - len(existing)
                start = self.next_row_id
                frag.inline_row_ids = rowids.encode_row_ids(
                    existing + list(range(start, start + remaining))
                )
                self.next_row_id += remaining
            else:
                frag.inline_row_ids = rowids.encode_row_id_range(
                    self.next_row_id, self.next_row_id + physical
                )
                self.next_row_id += physical

    def set_uniform_version_meta(self, frag: DataFragment, *, created: bool, updated: bool) -> None:
        """``build_version_meta``: every row at the new version (none without rows)."""
        if frag.physical_rows > 0:
            data = rowids.uniform_versions(frag.physical_rows, self.version)
            if created:
                frag.inline_created_at_versions = data
            if updated:
                frag.inline_last_updated_at_versions = data
        else:
            if created:
                frag.ClearField("created_at_version_sequence")
            if updated:
                frag.ClearField("last_updated_at_version_sequence")

    def new_data_fragments(self, fragments: Iterable[DataFragment]) -> list[DataFragment]:
        """Ids, row ids and version metadata for fragments of brand-new rows (Append, Overwrite)."""
        new = self.assign_ids(fragments)
        if self.next_row_id is not None:
            self.assign_row_ids(new)
            for frag in new:
                self.set_uniform_version_meta(frag, created=True, updated=True)
        return new

    # ----------------------------------------------------------- operations

    def op_append(self) -> list[DataFragment]:
        return self.existing() + self.new_data_fragments(self.txn.append.fragments)

    def op_delete(self) -> list[DataFragment]:
        op = self.txn.delete
        updated_ids = [f.id for f in op.updated_fragments]
        self.require_unique(updated_ids, "Delete.updated_fragments")
        self.require_known(list(op.deleted_fragment_ids) + updated_ids, "Delete")
        deleted = set(op.deleted_fragment_ids)
        updated = {f.id: f for f in op.updated_fragments}
        out = [
            _copy(updated[f.id]) if f.id in updated else f
            for f in self.existing()
            if f.id not in deleted
        ]
        self.retain_relevant_indices(out)
        return out

    def op_update(self) -> list[DataFragment]:
        op = self.txn.update
        updated_ids = [f.id for f in op.updated_fragments]
        self.require_unique(updated_ids, "Update.updated_fragments")
        self.require_known(list(op.removed_fragment_ids) + updated_ids, "Update")
        removed = set(op.removed_fragment_ids)
        updated = {f.id: f for f in op.updated_fragments}
        prev = self.require_previous()
        out = [
            _copy(updated[f.id]) if f.id in updated else f
            for f in self.existing()
            if f.id not in removed
        ]

        offsets = {
            fid: lst.values for fid, lst in op.updated_fragment_offsets.items() if lst.values
        }
        if (
            self.next_row_id is not None
            and op.update_mode == transaction_pb2.Transaction.REWRITE_COLUMNS
            and offsets
        ):
            for frag in out:
                values = offsets.get(frag.id)
                if not values:
                    continue
                # Without version metadata there is nothing to refresh (Lance
                # would otherwise invent a last-updated version for old rows).
                kind = frag.WhichOneof("last_updated_at_version_sequence")
                if kind is None:
                    continue
                self.refresh_partial_last_updated(frag, values, prev.version)

        self.prune_updated_fields_from_indices(updated_ids, op.fields_modified)

        new = self.assign_ids(op.new_fragments)
        if self.next_row_id is not None:
            self.assign_row_ids(new)
            self.resolve_update_version_metadata(list(prev.fragments), new)
        if self.use_stable_row_ids and op.update_mode == transaction_pb2.Transaction.REWRITE_ROWS:
            pure = self.collect_pure_rewrite_row_fragment_ids(new)
            original = list(op.removed_fragment_ids) + updated_ids
            self.register_pure_rewrite_rows_fragments(
                pure, original, op.fields_for_preserving_frag_bitmap
            )
        out.extend(new)
        self.retain_relevant_indices(out)
        if op.merged_generations:
            self.update_mem_wal_merged_generations(op.merged_generations)
        return out

    def op_overwrite(self) -> list[DataFragment]:
        op = self.txn.overwrite
        if op.initial_bases:
            if self.previous is not None:
                raise self.fail(
                    "OVERWRITE mode cannot register new bases: initial_bases are only allowed "
                    "when the Overwrite creates the table"
                )
            seen: set[int] = set()
            for base in op.initial_bases:
                if base.id in seen:
                    raise self.fail(
                        f"Duplicate base path ID {base.id} detected. Base path IDs must be unique."
                    )
                seen.add(base.id)
                self.manifest.base_paths.append(_copy(base))
        self.set_schema(op.schema, op.schema_metadata, replace_metadata=True)
        new = self.new_data_fragments(op.fragments)
        self.indices = []
        return new

    def op_create_index(self) -> list[DataFragment]:
        op = self.txn.create_index
        drop = {i.uuid.uuid for i in op.removed_indices} | {i.uuid.uuid for i in op.new_indices}
        self.indices = [i for i in self.indices if i.uuid.uuid not in drop]
        self.indices.extend(_copy(i) for i in op.new_indices)
        return self.existing()

    def op_rewrite(self) -> list[DataFragment]:
        op = self.txn.rewrite
        groups: list[tuple[list[DataFragment], list[DataFragment]]]
        if op.groups:
            groups = [(list(g.old_fragments), list(g.new_fragments)) for g in op.groups]
        else:
            # Legacy flat lists form a single group (Lance's TryFrom).
            groups = [(list(op.old_fragments), list(op.new_fragments))]
        old_ids = [f.id for old, _ in groups for f in old]
        self.require_unique(old_ids, "Rewrite old_fragments")
        self.require_known(old_ids, "Rewrite old_fragments")

        fragments = self.existing()
        assigned_groups: list[tuple[list[DataFragment], list[DataFragment]]] = []
        for i, (old, new) in enumerate(groups):
            if not old:
                raise self.fail(f"rewrite group {i} has no old fragments")
            new_frags = self.assign_ids(new)
            assigned_groups.append((old, new_frags))
            gone = {f.id for f in old}
            # Contiguous or not, the result is the same once sorted by id.
            fragments = [f for f in fragments if f.id not in gone] + new_frags

        if self.next_row_id is not None:
            # Row ids survive the rewrite, so every index stays valid: its fragment
            # bitmap moves to the new fragments. Indices the rewrite also rebuilt
            # still swap uuid and files (pylance 14 measured; Lance 9 ignored them).
            for index in self.indices:
                bitmap = fragment_bitmap(index)
                if bitmap is not None:
                    _set_bitmap(index, self.recalculate_fragment_bitmap(bitmap, assigned_groups))
            self.handle_rewrite_indices(op.rewritten_indices, assigned_groups, remap=False)
        else:
            self.handle_rewrite_indices(op.rewritten_indices, assigned_groups, remap=True)
        return fragments

    def op_merge(self) -> list[DataFragment]:
        op = self.txn.merge
        prev = self.require_previous()
        ids = [f.id for f in op.fragments]
        self.require_unique(ids, "Merge.fragments")
        # merge_fragments_valid
        if len(op.fragments) < len(prev.fragments):
            raise self.fail(
                f"Merge operation reduced fragment count from {len(prev.fragments)} to "
                f"{len(op.fragments)}. Merge operations should only add columns, not reduce fragments."
            )
        given = {f.id: f for f in op.fragments}
        missing = [f.id for f in prev.fragments if f.id not in given]
        if missing:
            raise self.fail(
                f"Merge operation is missing original fragments: {missing}. Merge operations "
                "should preserve all original fragments and only add new columns.",
                missing,
            )
        for original in prev.fragments:
            if given[original.id].physical_rows != original.physical_rows:
                raise self.fail(
                    f"Merge operation changed row count for fragment {original.id}. Original: "
                    f"{original.physical_rows}, New: {given[original.id].physical_rows}.",
                    [original.id],
                )
        high = _max_fragment_id(prev)
        reused = sorted(
            i for i in ids if i not in self.prev_fragments and high is not None and i <= high
        )
        if reused:
            raise self.fail(
                f"Merge names fragment id(s) {reused} that are not in version {prev.version} "
                f"but not above its high-water mark {high}: fragment ids are never reused",
                reused,
            )

        # pylance writes Merge.schema_metadata empty ("TODO: handle metadata"), so an
        # empty map keeps the table's schema metadata; a non-empty one replaces it.
        self.set_schema(op.schema, op.schema_metadata, replace_metadata=bool(op.schema_metadata))
        merged = [_copy(f) for f in op.fragments]
        if self.next_row_id is not None:
            for frag in merged:
                before = self.prev_fragments.get(frag.id)
                if before is None:
                    self.refresh_full_last_updated(frag)
                    if frag.HasField("inline_last_updated_at_versions"):
                        frag.inline_created_at_versions = frag.inline_last_updated_at_versions
                    elif frag.HasField("external_last_updated_at_versions"):
                        frag.external_created_at_versions.CopyFrom(
                            frag.external_last_updated_at_versions
                        )
                    else:
                        frag.ClearField("created_at_version_sequence")
                elif _physically_rewritten(before, frag):
                    self.refresh_full_last_updated(frag)
        self.prune_merge_rewritten_fields_from_indices(list(prev.fragments), list(op.fragments))
        self.retain_relevant_indices(merged)
        return merged

    def op_project(self) -> list[DataFragment]:
        op = self.txn.project
        prev = self.require_previous()
        self.set_schema(op.schema, prev.schema_metadata, replace_metadata=False)
        remaining = {f.id for f in op.schema}
        out = self.existing()
        for frag in out:
            keep = [df for df in frag.files if any(fid in remaining for fid in df.fields)]
            if len(keep) != len(frag.files):
                del frag.files[:]
                frag.files.extend(keep)
        self.retain_relevant_indices(out)
        return out

    def op_reserve_fragments(self) -> list[DataFragment]:
        return self.existing()

    def op_update_config(self) -> list[DataFragment]:
        return self.existing()

    def op_update_bases(self) -> list[DataFragment]:
        return self.existing()

    def op_data_replacement(self) -> list[DataFragment]:
        op = self.txn.data_replacement
        groups = list(op.replacements)
        for g in groups:
            if not g.HasField("new_file"):
                raise self.fail(
                    f"DataReplacementGroup for fragment {g.fragment_id} must have a new_file"
                )
        field_sets = {tuple(g.new_file.fields) for g in groups}
        if len(field_sets) > 1:
            detail = "".join(f"File {i}: {list(g.new_file.fields)}\n" for i, g in enumerate(groups))
            raise self.fail(
                f"All new data files must have the same fields, but found different fields:\n{detail}"
            )
        ids = [g.fragment_id for g in groups]
        self.require_unique(ids, "DataReplacement")
        self.require_known(ids, "DataReplacement")
        for g in groups:
            if _file_version(g.new_file) is None:
                raise self.fail(
                    f"new data file {g.new_file.path} has unknown Lance storage version "
                    f"{g.new_file.file_major_version}.{g.new_file.file_minor_version}",
                    [g.fragment_id],
                )
        replaced_fields = [f for f in groups[0].new_file.fields if f >= 0] if groups else []

        modified: list[DataFragment] = []
        for g in groups:
            original = self.prev_fragments[g.fragment_id]
            frag = _copy(original)
            new_file = g.new_file
            covered: set[int] = set()
            for df in frag.files:
                if (
                    list(df.fields) == list(new_file.fields)
                    and df.file_major_version == new_file.file_major_version
                    and df.file_minor_version == new_file.file_minor_version
                ):
                    df.path = new_file.path
                    df.file_size_bytes = new_file.file_size_bytes
                covered.update(df.fields)
            if covered.isdisjoint(new_file.fields):
                # The replaced columns were all-null in this fragment: add the file.
                version_name = _file_version(new_file)
                assert version_name is not None
                major, minor = _VERSION_NUMBERS[version_name]
                frag.files.add(
                    path=new_file.path,
                    fields=list(new_file.fields),
                    column_indices=list(new_file.column_indices),
                    file_major_version=major,
                    file_minor_version=minor,
                    file_size_bytes=new_file.file_size_bytes,
                )
            if frag == original:
                raise self.fail(
                    "Expected to modify the fragment but no changes were made. This means the new "
                    "data files does not align with any exiting datafiles. Please check if the schema "
                    "of the new data files matches the schema of the old data files including the "
                    "file major and minor versions",
                    [g.fragment_id],
                )
            modified.append(frag)
        changed = set(ids)
        out = modified + [f for f in self.existing() if f.id not in changed]
        self.prune_updated_fields_from_indices(ids, replaced_fields)
        return out

    def op_update_mem_wal_state(self) -> list[DataFragment]:
        self.update_mem_wal_merged_generations(self.txn.update_mem_wal_state.merged_generations)
        return self.existing()

    # ----------------------------------------------------------- schema

    def set_schema(
        self,
        fields: Sequence[file_pb2.Field],
        schema_metadata: Mapping[str, bytes],
        *,
        replace_metadata: bool,
    ) -> None:
        ids: set[int] = set()
        for f in fields:
            if f.id in ids:
                raise self.fail(f"the new schema has field id {f.id} twice")
            if f.parent_id != -1 and f.parent_id not in ids:
                raise self.fail(
                    f"field {f.name!r} (id {f.id}) names parent id {f.parent_id}, which does not "
                    "precede it in the schema (fields must be in depth-first pre-order)"
                )
            ids.add(f.id)
        self.manifest.ClearField("fields")
        self.manifest.fields.extend(_copy(f) for f in fields)
        if replace_metadata:
            self.manifest.ClearField("schema_metadata")
            for key, value in schema_metadata.items():
                self.manifest.schema_metadata[key] = value

    # ---------------------------------------------------------- finishing

    def finish_fragments(self, fragments: list[DataFragment]) -> None:
        fragments.sort(key=lambda f: f.id)
        ids = [f.id for f in fragments]
        dup = sorted({a for a, b in itertools.pairwise(ids) if a == b})
        if dup:
            raise self.fail(f"the new version would hold fragment id(s) {dup} more than once", dup)
        if ids and ids[-1] > _U32_MAX:
            raise self.fail(f"fragment id {ids[-1]} does not fit max_fragment_id (u32)", [ids[-1]])
        for frag in fragments:
            # remove_tombstoned_data_files: files holding only dropped (-2) fields
            keep = [df for df in frag.files if any(fid != _TOMBSTONE_FIELD for fid in df.fields)]
            if len(keep) != len(frag.files):
                del frag.files[:]
                frag.files.extend(keep)
        self.manifest.fragments.extend(fragments)

    def apply_data_format(self) -> None:
        manifest = self.manifest
        requested: str | None = None
        if self.requested_storage_version is not None:
            requested = _normalize_storage_version(self.requested_storage_version)
            if requested is None:
                raise self.fail(f"Unknown Lance storage version: {self.requested_storage_version}")

        inferred = self.infer_file_version(manifest.fragments)
        if self.previous is None:
            # data_storage_format_from_files
            if inferred is not None:
                if requested is not None and requested != inferred:
                    raise self.fail(
                        f"User requested data storage version ({requested}) does not match "
                        f"version in data files ({inferred})"
                    )
                version = inferred
            else:
                version = requested or DEFAULT_DATA_STORAGE_VERSION
            manifest.data_format.file_format = LANCE_FILE_FORMAT
            manifest.data_format.version = version
        elif self.op_key == "overwrite" and requested is not None:
            manifest.data_format.file_format = LANCE_FILE_FORMAT
            manifest.data_format.version = requested

        # check_storage_version (commit_transaction)
        current = _normalize_storage_version(manifest.data_format.version)
        if current is None:
            raise self.unsupported(f"data storage version {manifest.data_format.version!r}")
        if inferred is None:
            return
        if current == "0.1":
            if _VERSION_ORDER[inferred] > _VERSION_ORDER[current]:
                manifest.data_format.version = inferred
        elif inferred != current:
            hint = (
                " (pass data_storage_version to replace the table's format with an Overwrite)"
                if self.op_key == "overwrite"
                else ""
            )
            raise self.fail(
                f"The operation added files with version {inferred}. However, the data storage "
                f"version is {current}{hint}"
            )

    def infer_file_version(self, fragments: Iterable[DataFragment]) -> str | None:
        found: str | None = None
        for frag in fragments:
            for df in frag.files:
                version = _file_version(df)
                if version is None:
                    raise self.fail(
                        f"data file {df.path} of fragment {frag.id} has unknown Lance storage "
                        f"version {df.file_major_version}.{df.file_minor_version}",
                        [frag.id],
                    )
                if found is None:
                    found = version
                elif version != found:
                    raise self.fail(
                        f"All data files must have the same version.  Detected both {found} and {version}",
                        [frag.id],
                    )
        return found

    def update_max_fragment_id(self) -> None:
        manifest = self.manifest
        if not manifest.fragments:
            return
        top = max(f.id for f in manifest.fragments)
        if not manifest.HasField("max_fragment_id") or top > manifest.max_fragment_id:
            manifest.max_fragment_id = top

    def apply_feature_flags(self) -> None:
        """``apply_feature_flags``, computed from the finished manifest."""
        manifest = self.manifest
        reader = writer = 0
        if any(f.HasField("deletion_file") for f in manifest.fragments):
            reader |= FLAG_DELETION_FILES
            writer |= FLAG_DELETION_FILES
        with_row_ids = [f.WhichOneof("row_id_sequence") is not None for f in manifest.fragments]
        if any(with_row_ids) or self.use_stable_row_ids:
            if not all(with_row_ids):
                missing = [
                    f.id for f, has in zip(manifest.fragments, with_row_ids, strict=True) if not has
                ]
                raise self.fail(
                    f"All fragments must have row ids (stable row ids); fragment(s) {missing} have none",
                    missing,
                )
            reader |= FLAG_STABLE_ROW_IDS
            writer |= FLAG_STABLE_ROW_IDS
        if manifest.config:
            writer |= FLAG_TABLE_CONFIG
        if manifest.base_paths:
            reader |= FLAG_BASE_PATHS
            writer |= FLAG_BASE_PATHS
        if not self.transaction_file:
            writer |= FLAG_DISABLE_TRANSACTION_FILE
        manifest.reader_feature_flags = reader
        manifest.writer_feature_flags = writer

    # -------------------------------------------------------- config maps

    def apply_config_changes(self) -> None:
        if self.op_key == "overwrite":
            for key, value in self.txn.overwrite.config_upsert_values.items():
                self.manifest.config[key] = value
        elif self.op_key == "update_config":
            self.apply_update_config()

    def apply_update_config(self) -> None:
        op = self.txn.update_config
        manifest = self.manifest
        has_new = (
            op.HasField("config_updates")
            or op.HasField("table_metadata_updates")
            or op.HasField("schema_metadata_updates")
            or bool(op.field_metadata_updates)
        )
        has_old = bool(
            op.upsert_values or op.delete_keys or op.schema_metadata or op.field_metadata
        )
        if has_new and has_old:
            raise self.fail("Cannot mix old and new style UpdateConfig fields")

        Entries = list[tuple[str, str | None]]
        config: tuple[Entries, bool] | None = None
        table_metadata: tuple[Entries, bool] | None = None
        schema_metadata: tuple[Entries, bool] | None = None
        field_updates: list[tuple[int, Entries, bool]] = []
        if has_old:
            # translate_config_updates / translate_schema_metadata_updates
            if op.upsert_values or op.delete_keys:
                entries: Entries = [(k, v) for k, v in op.upsert_values.items()]
                entries += [(k, None) for k in op.delete_keys]
                config = (entries, False)
            if op.schema_metadata:
                schema_metadata = ([(k, v) for k, v in op.schema_metadata.items()], True)
            for old_fid, old_update in op.field_metadata.items():
                field_updates.append(
                    (int(old_fid), [(k, v) for k, v in old_update.metadata.items()], True)
                )
        else:

            def entries_of(m: transaction_pb2.Transaction.UpdateMap) -> tuple[Entries, bool]:
                return (
                    [(e.key, e.value if e.HasField("value") else None) for e in m.update_entries],
                    m.replace,
                )

            if op.HasField("config_updates"):
                config = entries_of(op.config_updates)
            if op.HasField("table_metadata_updates"):
                table_metadata = entries_of(op.table_metadata_updates)
            if op.HasField("schema_metadata_updates"):
                schema_metadata = entries_of(op.schema_metadata_updates)
            for fid, update in op.field_metadata_updates.items():
                field_updates.append((int(fid), *entries_of(update)))

        if config is not None:
            _apply_str_map(manifest.config, *config)
        if table_metadata is not None:
            _apply_str_map(manifest.table_metadata, *table_metadata)
        if schema_metadata is not None:
            _apply_bytes_map(manifest.schema_metadata, *schema_metadata)
        if not field_updates:
            return

        def pk_fields() -> list[int]:
            marked = [
                f
                for f in manifest.fields
                if f.unenforced_primary_key or f.unenforced_primary_key_position > 0
            ]
            marked.sort(
                key=lambda f: (
                    (False, f.unenforced_primary_key_position, f.id)
                    if f.unenforced_primary_key_position > 0
                    else (True, f.id, f.id)
                )
            )
            return [f.id for f in marked]

        def ck_fields() -> list[int]:
            marked = [f for f in manifest.fields if f.unenforced_clustering_key_position > 0]
            marked.sort(key=lambda f: f.unenforced_clustering_key_position)
            return [f.id for f in marked]

        pk_before, ck_before = pk_fields(), ck_fields()
        writes_pk = any(
            k in (PK_KEY, PK_POSITION_KEY) for _, entries, _ in field_updates for k, _ in entries
        )
        writes_ck = any(k == CK_POSITION_KEY for _, entries, _ in field_updates for k, _ in entries)
        by_id = {f.id: f for f in manifest.fields}
        for fid, entries, replace in field_updates:
            target = by_id.get(fid)
            if target is None:
                raise self.fail(f"Field with id {fid} does not exist")
            _apply_bytes_map(target.metadata, entries, replace)
            meta = {k: v.decode("utf-8", "replace") for k, v in target.metadata.items()}
            pk_position = _parse_u32(meta.get(PK_POSITION_KEY))
            if pk_position is None and meta.get(PK_KEY, "").lower() in ("true", "1", "yes"):
                pk_position = 0
            target.unenforced_primary_key = pk_position is not None
            target.unenforced_primary_key_position = pk_position or 0
            ck_position = _parse_u32(meta.get(CK_POSITION_KEY))
            target.unenforced_clustering_key_position = ck_position or 0
        pk_after, ck_after = pk_fields(), ck_fields()
        if pk_before:
            if writes_pk or pk_after != pk_before:
                raise self.fail(
                    "the unenforced primary key is a reserved key and cannot be changed once set"
                )
        elif writes_pk and not pk_after:
            raise self.fail(
                "the unenforced primary key is a reserved key and cannot be set to an invalid value"
            )
        if ck_before:
            if writes_ck or ck_after != ck_before:
                raise self.fail(
                    "the unenforced clustering key is a reserved key and cannot be changed once set"
                )
        elif writes_ck and not ck_after:
            raise self.fail(
                "the unenforced clustering key is a reserved key and cannot be set to an invalid value"
            )

    def apply_update_bases(self) -> None:
        manifest = self.manifest
        for new_base in self.txn.update_bases.new_bases:
            new_name = new_base.name if new_base.HasField("name") else None
            for existing in manifest.base_paths:
                existing_name = existing.name if existing.HasField("name") else None
                # Lance compares Option<String> names, so two unnamed bases conflict.
                if existing_name == new_name or existing.path == new_base.path:
                    raise self.fail(
                        f"Conflict detected: Base path with name {new_name!r} or path "
                        f"{new_base.path!r} already exists. Existing: name={existing_name!r}, "
                        f"path={existing.path!r}"
                    )
            base = _copy(new_base)
            if base.id == 0:
                base.id = max((b.id for b in manifest.base_paths), default=0) + 1
            elif any(b.id == base.id for b in manifest.base_paths):
                raise self.fail(f"a base path with id {base.id} already exists")
            manifest.base_paths.append(base)

    # ------------------------------------------------------------ row versions

    def refresh_full_last_updated(self, frag: DataFragment) -> None:
        """``refresh_row_latest_update_meta_for_full_frag_rewrite_cols``."""
        if frag.physical_rows <= 0 and frag.WhichOneof("row_id_sequence") == "external_row_ids":
            raise self.unsupported(
                f"row-id sequences stored in external files (fragment {frag.id})"
            )
        count = _row_count(frag)
        if count > 0:
            frag.inline_last_updated_at_versions = rowids.uniform_versions(count, self.version)

    def refresh_partial_last_updated(
        self, frag: DataFragment, offsets: Iterable[int], prev_version: int
    ) -> None:
        """``refresh_row_latest_update_meta_for_partial_frag_rewrite_cols``."""
        if frag.physical_rows <= 0 and frag.WhichOneof("row_id_sequence") == "external_row_ids":
            raise self.unsupported(
                f"row-id sequences stored in external files (fragment {frag.id})"
            )
        count = _row_count(frag)
        if count <= 0:
            return
        kind = frag.WhichOneof("last_updated_at_version_sequence")
        if kind == "external_last_updated_at_versions":
            raise self.unsupported(
                f"row version sequences stored in external files (fragment {frag.id})"
            )
        base = [prev_version] * count
        try:
            existing = rowids.decode_versions(frag.inline_last_updated_at_versions)
        except rowids.RowIdFormatError:
            existing = []
        for i, v in enumerate(existing[:count]):
            base[i] = v
        for pos in offsets:
            if pos < count:
                base[pos] = self.version
        frag.inline_last_updated_at_versions = rowids.encode_versions(base)

    def resolve_update_version_metadata(
        self, existing: list[DataFragment], new: list[DataFragment]
    ) -> None:
        """``resolve_update_version_metadata``: created-at from the rows' sources,
        last-updated at the new version."""
        new_ids: dict[int, list[int]] = {}
        for frag in new:
            if frag.WhichOneof("row_id_sequence") == "inline_row_ids":
                new_ids[frag.id] = rowids.decode_row_ids(
                    frag.inline_row_ids, f"fragment {frag.id} row ids"
                )
        needed = {rid for ids in new_ids.values() for rid in ids}
        source: dict[int, tuple[int, int]] = {}
        if needed:
            lo, hi = min(needed), max(needed)
            for frag in sorted(existing, key=lambda f: f.id):
                if frag.WhichOneof("row_id_sequence") != "inline_row_ids":
                    continue
                try:
                    values = rowids.decode_row_ids(frag.inline_row_ids)
                except rowids.RowIdFormatError:
                    continue
                if not values or max(values) < lo or min(values) > hi:
                    continue
                for offset, rid in enumerate(values):
                    if rid in needed and rid not in source:
                        source[rid] = (frag.id, offset)
        cache: dict[int, list[int]] = {}
        by_id = {f.id: f for f in existing}
        for frag_id in {fid for fid, _ in source.values()}:
            frag = by_id[frag_id]
            if frag.WhichOneof("created_at_version_sequence") != "inline_created_at_versions":
                continue
            try:
                cache[frag_id] = rowids.decode_versions(frag.inline_created_at_versions)
            except rowids.RowIdFormatError:
                continue  # Lance: an undecodable created_at counts as unknown (version 1)

        for frag in new:
            ids = new_ids.get(frag.id)
            if ids is None:
                self.set_uniform_version_meta(frag, created=True, updated=True)
                continue
            created = []
            for rid in ids:
                if rid in source:
                    frag_id, offset = source[rid]
                    versions = cache.get(frag_id)
                    created.append(
                        versions[offset]
                        if versions is not None and offset < len(versions)
                        else _UNKNOWN_CREATED_AT_VERSION
                    )
                else:
                    created.append(self.version)
            frag.inline_created_at_versions = rowids.encode_versions(created)
            self.set_uniform_version_meta(frag, created=False, updated=True)

    def collect_pure_rewrite_row_fragment_ids(self, fragments: Sequence[DataFragment]) -> list[int]:
        out = []
        for frag in fragments:
            if frag.physical_rows <= 0:
                raise self.fail("Fragment does not have physical rows", [frag.id])
            kind = frag.WhichOneof("row_id_sequence")
            if kind is None:
                continue
            count = rowids.row_id_count(frag.inline_row_ids) if kind == "inline_row_ids" else 0
            if count == frag.physical_rows:
                out.append(frag.id)
        return out

    # -------------------------------------------------------------- indices

    def retain_relevant_indices(self, fragments: Sequence[DataFragment]) -> None:
        """``retain_relevant_indices``: drop indices of removed fields, and empty
        duplicates / empty vector indices."""
        field_ids = {f.id for f in self.manifest.fields}
        indices = [
            i
            for i in self.indices
            if all(fid in field_ids for fid in i.fields) or _is_system_index(i)
        ]
        existing = BitMap([f.id for f in fragments if f.id <= _U32_MAX])

        def is_empty(index: IndexMetadata) -> bool:
            bitmap = fragment_bitmap(index)
            return bitmap is None or not (bitmap & existing)

        by_name: dict[str, list[IndexMetadata]] = {}
        for index in indices:
            if index.name != FRAG_REUSE_INDEX_NAME:
                by_name.setdefault(index.name, []).append(index)
        keep: set[bytes] = set()
        for group in by_name.values():
            if len(group) > 1:
                empty = [i for i in group if is_empty(i)]
                non_empty = [i for i in group if not is_empty(i)]
                if not non_empty:
                    oldest = sorted(empty, key=lambda i: i.dataset_version)[0]
                    if not _is_vector_index(oldest):
                        keep.add(oldest.uuid.uuid)
                else:
                    keep.update(i.uuid.uuid for i in non_empty)
            else:
                index = group[0]
                if not is_empty(index) or not _is_vector_index(index):
                    keep.add(index.uuid.uuid)
        self.indices = [
            i for i in indices if i.name == FRAG_REUSE_INDEX_NAME or i.uuid.uuid in keep
        ]

    def prune_updated_fields_from_indices(
        self, fragment_ids: Sequence[int], fields_modified: Sequence[int]
    ) -> None:
        if not fields_modified:
            return
        modified = set(fields_modified)
        for index in self.indices:
            if any(fid >= 0 and fid in modified for fid in index.fields):
                bitmap = fragment_bitmap(index)
                if bitmap is None:
                    continue
                for frag_id in fragment_ids:
                    bitmap.discard(frag_id & _U32_MAX)
                _set_bitmap(index, bitmap)

    def prune_merge_rewritten_fields_from_indices(
        self, previous: Sequence[DataFragment], merged: Sequence[DataFragment]
    ) -> None:
        before = {f.id: f for f in previous}
        for frag in merged:
            old = before.get(frag.id)
            if old is None:
                continue
            old_paths = _field_paths(old)
            new_paths = _field_paths(frag)
            changed = [
                fid
                for fid, path in old_paths.items()
                if fid in new_paths and new_paths[fid] != path
            ]
            if changed:
                self.prune_updated_fields_from_indices([frag.id], changed)

    def register_pure_rewrite_rows_fragments(
        self, pure_ids: Sequence[int], original_ids: Sequence[int], preserving_fields: Sequence[int]
    ) -> None:
        if not pure_ids:
            return
        value_fields = set(preserving_fields)
        for index in self.indices:
            if any(fid >= 0 and fid in value_fields for fid in index.fields):
                continue
            bitmap = fragment_bitmap(index)
            if bitmap is None:
                continue
            if all((fid & _U32_MAX) in bitmap for fid in original_ids):
                for fid in pure_ids:
                    bitmap.add(fid & _U32_MAX)
                _set_bitmap(index, bitmap)

    def recalculate_fragment_bitmap(
        self, old: BitMap, groups: Sequence[tuple[Sequence[DataFragment], Sequence[DataFragment]]]
    ) -> BitMap:
        new = BitMap(old)
        for old_frags, new_frags in groups:
            inside = [f.id in old for f in old_frags]
            if any(inside):
                if not all(inside):
                    raise self.fail(
                        "The compaction plan included a rewrite group that was a split of indexed and "
                        "non-indexed data",
                        [f.id for f in old_frags],
                    )
                for f in old_frags:
                    new.discard(f.id)
                for f in new_frags:
                    new.add(f.id)
        return new

    def handle_rewrite_indices(
        self,
        rewritten: Sequence[transaction_pb2.Transaction.Rewrite.RewrittenIndex],
        groups: Sequence[tuple[Sequence[DataFragment], Sequence[DataFragment]]],
        *,
        remap: bool,
    ) -> None:
        """``handle_rewrite_indices``: remap the bitmap (when ``remap``), swap uuid and files."""
        seen: set[bytes] = set()
        for item in rewritten:
            if not item.HasField("old_id") or not item.HasField("new_id"):
                raise self.fail("a rewritten index is missing old_id or new_id")
            old_id = item.old_id.uuid
            if old_id in seen:
                raise self.fail(
                    "An invalid compaction plan must have been generated because multiple tasks "
                    f"modified the same index: {_uuid_str(old_id)}"
                )
            seen.add(old_id)
            target = next((i for i in self.indices if i.uuid.uuid == old_id), None)
            if target is None:
                continue  # removed by a concurrent operation
            if remap:
                bitmap = fragment_bitmap(target)
                if bitmap is None:
                    raise self.fail(
                        f"Cannot rewrite index {_uuid_str(old_id)} which did not store fragment bitmap"
                    )
                _set_bitmap(target, self.recalculate_fragment_bitmap(bitmap, groups))
            target.uuid.uuid = item.new_id.uuid
            # Lance swaps the uuid and the file list only: details and index
            # version stay those of the index being remapped.
            del target.files[:]
            target.files.extend(_copy(f) for f in item.new_index_files)

    def update_mem_wal_merged_generations(
        self, merged: Sequence[table_pb2.MergedGeneration]
    ) -> None:
        """``update_mem_wal_index_merged_generations``: per region, keep the higher generation."""
        if not merged:
            return
        position = next(
            (n for n, i in enumerate(self.indices) if i.name == MEM_WAL_INDEX_NAME), None
        )
        details = table_pb2.MemWalIndexDetails()
        type_url = "/lance.table.MemWalIndexDetails"
        if position is not None:
            current = self.indices.pop(position)
            if not current.HasField("index_details"):
                raise self.fail("Index details not found for the MemWAL index")
            if not current.index_details.type_url.endswith("MemWalIndexDetails"):
                raise self.fail(
                    f"Index details is not for the MemWAL index, but {current.index_details.type_url}"
                )
            type_url = current.index_details.type_url
            details.ParseFromString(current.index_details.value)
        for generation in merged:
            found = next(
                (
                    g
                    for g in details.merged_generations
                    if g.region_id.uuid == generation.region_id.uuid
                ),
                None,
            )
            if found is None:
                details.merged_generations.append(_copy(generation))
            elif generation.generation > found.generation:
                found.generation = generation.generation
        index = IndexMetadata(
            name=MEM_WAL_INDEX_NAME,
            dataset_version=self.version,
            index_version=0,
            created_at=int(self.now.timestamp() * 1000),
        )
        index.uuid.uuid = uuidlib.uuid4().bytes
        index.index_details.type_url = type_url
        index.index_details.value = details.SerializeToString()
        self.indices.append(index)


# ------------------------------------------------------------------ map helpers


_V = TypeVar("_V", str, bytes)


def _apply_map(
    target: MutableMapping[str, _V], entries: Sequence[tuple[str, _V | None]], replace: bool
) -> None:
    """``apply_update_map``: a None value deletes the key; ``replace`` starts from an empty map."""
    if replace:
        target.clear()
        for key, value in entries:
            if value is not None:
                target[key] = value
        return
    for key, value in entries:
        if value is not None:
            target[key] = value
        elif key in target:
            del target[key]


def _apply_str_map(
    target: MutableMapping[str, str], entries: Sequence[tuple[str, str | None]], replace: bool
) -> None:
    _apply_map(target, entries, replace)


def _apply_bytes_map(
    target: MutableMapping[str, bytes], entries: Sequence[tuple[str, str | None]], replace: bool
) -> None:
    """On a ``map<string, bytes>`` field: values are stored as UTF-8."""
    _apply_map(target, [(k, None if v is None else v.encode("utf-8")) for k, v in entries], replace)


def _field_paths(frag: DataFragment) -> dict[int, str]:
    out: dict[int, str] = {}
    for df in frag.files:
        for fid in df.fields:
            if fid >= 0:
                out[fid] = df.path
    return out


def _physically_rewritten(before: DataFragment, after: DataFragment) -> bool:
    """``merge_fragment_physically_rewritten``: the data files changed (sizes aside)."""
    if len(before.files) != len(after.files):
        return True
    for p, m in zip(before.files, after.files, strict=True):
        if (
            p.path != m.path
            or list(p.fields) != list(m.fields)
            or list(p.column_indices) != list(m.column_indices)
            or p.file_major_version != m.file_major_version
            or p.file_minor_version != m.file_minor_version
            or (p.base_id if p.HasField("base_id") else None)
            != (m.base_id if m.HasField("base_id") else None)
        ):
            return True
    return False


def _describe_ids(ids: Sequence[int], limit: int = 20) -> str:
    if not ids:
        return "no fragments"
    if len(ids) <= limit:
        return str(list(ids))
    return f"{len(ids)} fragments with ids {ids[0]}..{ids[-1]}"


def _uuid_str(raw: bytes) -> str:
    try:
        return str(uuidlib.UUID(bytes=raw))
    except ValueError:
        return raw.hex()


__all__ = [
    "DEFAULT_DATA_STORAGE_VERSION",
    "FRAG_REUSE_INDEX_NAME",
    "KNOWN_FEATURE_FLAGS",
    "MEM_WAL_INDEX_NAME",
    "UNASSIGNED_FRAGMENT_ID",
    "BuiltManifest",
    "InvalidTransactionError",
    "UnsupportedTransactionError",
    "build_manifest",
    "fragment_bitmap",
    "serialize_bitmap",
]
