"""Typed model of a Lance transaction: the 15 operations of the transaction spec
and the :class:`Transaction` that carries one.

Each operation is a frozen dataclass whose fields follow the protobuf message of
the same name (``lance.table.Transaction.<Op>``). Lance data inside an operation
(fragments, data files, index metadata, fields, base paths, ...) stays as the
protobuf message it is on disk; only the operation layer is modelled. Treat
those messages as read-only: the dataclasses are frozen, the messages inside
them are not.

Conversion is lossless: ``Transaction.from_proto(pb).to_proto() == pb`` for
every operation, including the deprecated ``UpdateConfig`` fields, the legacy
flat ``Rewrite`` fragment lists, and fields this version of lancetx does not
know (kept as raw bytes in ``unknown_fields`` and written back).

Besides its data, every operation answers the questions conflict resolution
asks (:mod:`lancetx.commit.engine.conflicts`): which existing fragments it modifies or
removes, which fragments it adds, whether it changes the schema, which config
keys it touches, which fields and fragments its indices cover.
"""

from __future__ import annotations

import enum
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, cast

from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet
from pyroaring import BitMap

from lancetx.commit.errors import TransactionFileError
from lancetx.commit.format.naming import transaction_file_name
from lancetx.protos import file_pb2, table_pb2, transaction_pb2

__all__ = [
    "COMMIT_MESSAGE_KEY",
    "FRAG_REUSE_INDEX_NAME",
    "IDEMPOTENCY_KEY",
    "MEM_WAL_INDEX_NAME",
    "SINGLETON_INDEX_NAMES",
    "Append",
    "BasePath",
    "Clone",
    "CreateIndex",
    "DataFile",
    "DataFragment",
    "DataReplacement",
    "DataReplacementGroup",
    "Delete",
    "Field",
    "IndexMetadata",
    "KeyExistenceFilter",
    "Merge",
    "MergedGeneration",
    "Operation",
    "OperationKind",
    "Overwrite",
    "Project",
    "ReserveFragments",
    "Restore",
    "Rewrite",
    "RewriteGroup",
    "RewrittenIndex",
    "Transaction",
    "Update",
    "UpdateBases",
    "UpdateConfig",
    "UpdateMap",
    "UpdateMemWalState",
    "UpdateMode",
    "index_fragment_ids",
    "mem_wal_merged_generations",
    "operation_from_proto",
    "update_map",
]

_T = transaction_pb2.Transaction

# Lance data, kept as protobuf messages (see the module docstring).
DataFragment = table_pb2.DataFragment
DataFile = table_pb2.DataFile
IndexMetadata = table_pb2.IndexMetadata
BasePath = table_pb2.BasePath
MergedGeneration = table_pb2.MergedGeneration
Field = file_pb2.Field
# Transaction sub-messages that are plain data.
RewriteGroup = _T.Rewrite.RewriteGroup
RewrittenIndex = _T.Rewrite.RewrittenIndex
DataReplacementGroup = _T.DataReplacementGroup
UpdateMap = _T.UpdateMap
KeyExistenceFilter = _T.KeyExistenceFilter

#: Transaction property Lance reserves for the commit message.
COMMIT_MESSAGE_KEY = "__lance_commit_message"
#: The transaction property holding a commit's idempotency key (``CommitOptions.idempotency_key``).
IDEMPOTENCY_KEY = "lancetx.idempotency_key"
#: Names of Lance's singleton system indices (``lance_index::frag_reuse`` / ``mem_wal``).
FRAG_REUSE_INDEX_NAME = "__lance_frag_reuse"
MEM_WAL_INDEX_NAME = "__lance_mem_wal"
SINGLETON_INDEX_NAMES = frozenset({FRAG_REUSE_INDEX_NAME, MEM_WAL_INDEX_NAME})

_M = TypeVar("_M", bound=Message)


class OperationKind(enum.Enum):
    """The 15 operations of the spec. The value is the spec's name; ``field_name``
    is the member of the ``operation`` oneof, ``field_number`` its tag."""

    APPEND = "Append"
    DELETE = "Delete"
    OVERWRITE = "Overwrite"
    CREATE_INDEX = "CreateIndex"
    REWRITE = "Rewrite"
    MERGE = "Merge"
    PROJECT = "Project"
    RESTORE = "Restore"
    RESERVE_FRAGMENTS = "ReserveFragments"
    CLONE = "Clone"
    UPDATE = "Update"
    UPDATE_CONFIG = "UpdateConfig"
    DATA_REPLACEMENT = "DataReplacement"
    UPDATE_MEM_WAL_STATE = "UpdateMemWalState"
    UPDATE_BASES = "UpdateBases"

    @property
    def field_name(self) -> str:
        """Name of this operation in the ``Transaction.operation`` oneof."""
        return _FIELD_NAMES[self]

    @property
    def field_number(self) -> int:
        """Protobuf field number of this operation (100..114)."""
        return _T.DESCRIPTOR.fields_by_name[self.field_name].number

    def __str__(self) -> str:
        return self.value


_FIELD_NAMES = {
    OperationKind.APPEND: "append",
    OperationKind.DELETE: "delete",
    OperationKind.OVERWRITE: "overwrite",
    OperationKind.CREATE_INDEX: "create_index",
    OperationKind.REWRITE: "rewrite",
    OperationKind.MERGE: "merge",
    OperationKind.PROJECT: "project",
    OperationKind.RESTORE: "restore",
    OperationKind.RESERVE_FRAGMENTS: "reserve_fragments",
    OperationKind.CLONE: "clone",
    OperationKind.UPDATE: "update",
    OperationKind.UPDATE_CONFIG: "update_config",
    OperationKind.DATA_REPLACEMENT: "data_replacement",
    OperationKind.UPDATE_MEM_WAL_STATE: "update_mem_wal_state",
    OperationKind.UPDATE_BASES: "update_bases",
}


class UpdateMode(enum.IntEnum):
    """How an Update rewrote rows (``Transaction.UpdateMode``).

    A value written by a newer Lance that we do not know is kept as a pseudo
    member (``UNKNOWN_<n>``) so it survives a round trip.
    """

    REWRITE_ROWS = 0
    REWRITE_COLUMNS = 1

    @classmethod
    def _missing_(cls, value: object) -> UpdateMode | None:
        if not isinstance(value, int):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"UNKNOWN_{value}"
        member._value_ = value
        return member


# ----------------------------------------------------------------------- helpers


def _copy(msg: _M) -> _M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _copies(msgs: Iterable[_M]) -> tuple[_M, ...]:
    return tuple(_copy(m) for m in msgs)


def _unknown_fields(msg: Message) -> bytes:
    """The wire bytes of the fields of ``msg`` its descriptor does not know."""
    if not len(UnknownFieldSet(msg)):
        return b""  # the common case, without copying the message
    probe = _copy(msg)
    for descriptor, _ in probe.ListFields():
        probe.ClearField(descriptor.name)
    return probe.SerializeToString()


def _optional_message(msg: Message, name: str) -> Any:
    return _copy(getattr(msg, name)) if msg.HasField(name) else None


def update_map(entries: Mapping[str, str | None], *, replace: bool = False) -> UpdateMap:
    """Build an ``UpdateMap``: a value sets the key, ``None`` removes it."""
    out = UpdateMap(replace=replace)
    for key, value in entries.items():
        entry = out.update_entries.add(key=key)
        if value is not None:
            entry.value = value
    return out


def index_fragment_ids(index: IndexMetadata) -> frozenset[int] | None:
    """Fragment ids an index covers, or None when its bitmap is absent.

    Lance stores "no bitmap" as empty bytes and then does not know which
    fragments the index covers; conflict checks must assume all of them.
    """
    if not index.fragment_bitmap:
        return None
    return frozenset(int(i) for i in BitMap.deserialize(index.fragment_bitmap))


def mem_wal_merged_generations(index: IndexMetadata) -> tuple[MergedGeneration, ...] | None:
    """The merged generations recorded in a MemWAL index's details, or None if
    the details are missing or do not decode as ``MemWalIndexDetails``."""
    details = table_pb2.MemWalIndexDetails()
    if not index.HasField("index_details"):
        return None
    try:
        if not index.index_details.Unpack(details):
            return None
    except DecodeError:
        return None
    return _copies(details.merged_generations)


def _read_update_map(msg: Message, name: str) -> UpdateMap | None:
    return cast("UpdateMap | None", _optional_message(msg, name))


def _map_keys(entries: UpdateMap | None) -> tuple[frozenset[str], frozenset[str]]:
    """(keys set, keys removed) by an UpdateMap."""
    if entries is None:
        return frozenset(), frozenset()
    upserted = frozenset(e.key for e in entries.update_entries if e.HasField("value"))
    removed = frozenset(e.key for e in entries.update_entries if not e.HasField("value"))
    return upserted, removed


# ------------------------------------------------------------------- operations


@dataclass(frozen=True)
class Operation:
    """Base class of the 15 operations.

    The properties below describe the operation's effect for conflict
    resolution; subclasses override those that apply to them.
    """

    kind: ClassVar[OperationKind]
    _message: ClassVar[type[Message]]

    #: Wire bytes of fields of this operation's message that lancetx does not know.
    unknown_fields: bytes = field(default=b"", repr=False, kw_only=True)

    # -- conversion -------------------------------------------------------

    def to_proto(self) -> Message:
        """This operation as its ``lance.table.Transaction.<Op>`` message."""
        msg = self._message()
        self._fill(msg)
        if self.unknown_fields:
            msg.MergeFromString(self.unknown_fields)
        return msg

    def _fill(self, msg: Any) -> None:
        raise NotImplementedError

    @classmethod
    def _parse(cls, msg: Any) -> Operation:
        raise NotImplementedError

    # -- effects (for conflict resolution) --------------------------------

    @property
    def name(self) -> str:
        """The spec's name of this operation (``"Delete"``)."""
        return self.kind.value

    @property
    def modified_fragment_ids(self) -> frozenset[int]:
        """Ids of existing fragments this operation changes or removes."""
        return frozenset()

    @property
    def dropped_fragment_ids(self) -> frozenset[int]:
        """Ids of existing fragments this operation removes from the table."""
        return frozenset()

    @property
    def added_fragments(self) -> tuple[DataFragment, ...]:
        """Fragments this operation adds to the table."""
        return ()

    @property
    def affects_schema(self) -> bool:
        """Whether the table's schema (fields) changes."""
        return False

    @property
    def replaces_table(self) -> bool:
        """Whether the result does not build on the table at the read version."""
        return False

    @property
    def upserted_config_keys(self) -> frozenset[str]:
        """Table config keys this operation sets."""
        return frozenset()

    @property
    def deleted_config_keys(self) -> frozenset[str]:
        """Table config keys this operation removes."""
        return frozenset()

    @property
    def replaces_config(self) -> bool:
        """Whether this operation replaces the whole config map (touching every key)."""
        return False

    @property
    def touched_config_keys(self) -> frozenset[str]:
        """Config keys this operation sets or removes."""
        return self.upserted_config_keys | self.deleted_config_keys


def _fragment_ids(fragments: Iterable[DataFragment]) -> frozenset[int]:
    return frozenset(f.id for f in fragments)


@dataclass(frozen=True)
class Append(Operation):
    """Add new fragments (ids assigned when the manifest is built)."""

    kind: ClassVar[OperationKind] = OperationKind.APPEND
    _message: ClassVar[type[Message]] = _T.Append

    fragments: tuple[DataFragment, ...] = ()

    def _fill(self, msg: _T.Append) -> None:
        msg.fragments.extend(self.fragments)

    @classmethod
    def _parse(cls, msg: _T.Append) -> Append:
        return cls(fragments=_copies(msg.fragments))

    @property
    def added_fragments(self) -> tuple[DataFragment, ...]:
        return self.fragments


@dataclass(frozen=True)
class Delete(Operation):
    """Delete rows: new deletion files for some fragments, others removed whole."""

    kind: ClassVar[OperationKind] = OperationKind.DELETE
    _message: ClassVar[type[Message]] = _T.Delete

    updated_fragments: tuple[DataFragment, ...] = ()
    deleted_fragment_ids: tuple[int, ...] = ()
    predicate: str = ""

    def _fill(self, msg: _T.Delete) -> None:
        msg.updated_fragments.extend(self.updated_fragments)
        msg.deleted_fragment_ids.extend(self.deleted_fragment_ids)
        msg.predicate = self.predicate

    @classmethod
    def _parse(cls, msg: _T.Delete) -> Delete:
        return cls(
            updated_fragments=_copies(msg.updated_fragments),
            deleted_fragment_ids=tuple(msg.deleted_fragment_ids),
            predicate=msg.predicate,
        )

    @property
    def modified_fragment_ids(self) -> frozenset[int]:
        return _fragment_ids(self.updated_fragments) | self.dropped_fragment_ids

    @property
    def dropped_fragment_ids(self) -> frozenset[int]:
        return frozenset(self.deleted_fragment_ids)

    @property
    def changes_data_files(self) -> bool:
        """A delete only writes deletion files; data files stay as they were read."""
        return False


@dataclass(frozen=True)
class Overwrite(Operation):
    """Create the table or replace all of it (fragments, schema); merge config."""

    kind: ClassVar[OperationKind] = OperationKind.OVERWRITE
    _message: ClassVar[type[Message]] = _T.Overwrite

    fragments: tuple[DataFragment, ...] = ()
    schema: tuple[Field, ...] = ()
    schema_metadata: Mapping[str, bytes] = field(default_factory=dict)
    config_upsert_values: Mapping[str, str] = field(default_factory=dict)
    initial_bases: tuple[BasePath, ...] = ()

    def _fill(self, msg: _T.Overwrite) -> None:
        msg.fragments.extend(self.fragments)
        msg.schema.extend(self.schema)
        msg.schema_metadata.update(self.schema_metadata)
        msg.config_upsert_values.update(self.config_upsert_values)
        msg.initial_bases.extend(self.initial_bases)

    @classmethod
    def _parse(cls, msg: _T.Overwrite) -> Overwrite:
        return cls(
            fragments=_copies(msg.fragments),
            schema=_copies(msg.schema),
            schema_metadata=dict(msg.schema_metadata),
            config_upsert_values=dict(msg.config_upsert_values),
            initial_bases=_copies(msg.initial_bases),
        )

    @property
    def added_fragments(self) -> tuple[DataFragment, ...]:
        return self.fragments

    @property
    def affects_schema(self) -> bool:
        return True

    @property
    def replaces_table(self) -> bool:
        return True

    @property
    def upserted_config_keys(self) -> frozenset[str]:
        return frozenset(self.config_upsert_values)


@dataclass(frozen=True)
class CreateIndex(Operation):
    """Add and/or remove indices (a drop has only ``removed_indices``)."""

    kind: ClassVar[OperationKind] = OperationKind.CREATE_INDEX
    _message: ClassVar[type[Message]] = _T.CreateIndex

    new_indices: tuple[IndexMetadata, ...] = ()
    removed_indices: tuple[IndexMetadata, ...] = ()

    def _fill(self, msg: _T.CreateIndex) -> None:
        msg.new_indices.extend(self.new_indices)
        msg.removed_indices.extend(self.removed_indices)

    @classmethod
    def _parse(cls, msg: _T.CreateIndex) -> CreateIndex:
        return cls(
            new_indices=_copies(msg.new_indices), removed_indices=_copies(msg.removed_indices)
        )

    @property
    def index_names(self) -> frozenset[str]:
        """Names of the indices created (or replaced)."""
        return frozenset(i.name for i in self.new_indices)

    @property
    def indexed_field_ids(self) -> frozenset[int]:
        """Field ids the new indices index."""
        return frozenset(f for i in self.new_indices for f in i.fields)

    @property
    def covered_fragment_ids(self) -> frozenset[int] | None:
        """Fragments the new indices cover; None if any new index does not say
        (then every fragment must be assumed covered)."""
        covered: set[int] = set()
        for index in self.new_indices:
            ids = index_fragment_ids(index)
            if ids is None:
                return None
            covered |= ids
        return frozenset(covered)

    @property
    def singleton_indices_modified(self) -> frozenset[str]:
        """Singleton system indices (fragment reuse, MemWAL) created or removed."""
        names = {i.name for i in self.new_indices} | {i.name for i in self.removed_indices}
        return frozenset(names & SINGLETON_INDEX_NAMES)

    @property
    def frag_reuse_index(self) -> IndexMetadata | None:
        """The fragment reuse index this commit writes, if any."""
        return next((i for i in self.new_indices if i.name == FRAG_REUSE_INDEX_NAME), None)

    @property
    def mem_wal_index(self) -> IndexMetadata | None:
        """The MemWAL index this commit writes, if any."""
        return next((i for i in self.new_indices if i.name == MEM_WAL_INDEX_NAME), None)

    @property
    def mixes_frag_reuse_with_other_indices(self) -> bool:
        """Lance commits a fragment reuse index alone: one new, one removed.
        Anything else alongside it is a shape Lance refuses to rebase."""
        if self.frag_reuse_index is None:
            return False
        return len(self.new_indices) != 1 or len(self.removed_indices) != 1


@dataclass(frozen=True)
class Rewrite(Operation):
    """Compaction: groups of old fragments replaced by new ones (ids reserved).

    ``legacy_old_fragments``/``legacy_new_fragments`` are the deprecated flat
    lists (fields 1 and 2); Lance reads them as one group, see :attr:`all_groups`.

    ``frag_reuse_index`` is not part of the protobuf (Lance does not serialize
    it either): it is set in memory by the writer of a rewrite that defers
    index remapping, and the commit loop may attach it to a committed rewrite
    from that version's index section. ``to_proto`` ignores it.
    """

    kind: ClassVar[OperationKind] = OperationKind.REWRITE
    _message: ClassVar[type[Message]] = _T.Rewrite

    groups: tuple[RewriteGroup, ...] = ()
    rewritten_indices: tuple[RewrittenIndex, ...] = ()
    legacy_old_fragments: tuple[DataFragment, ...] = ()
    legacy_new_fragments: tuple[DataFragment, ...] = ()
    frag_reuse_index: IndexMetadata | None = field(default=None, compare=False)

    def _fill(self, msg: _T.Rewrite) -> None:
        msg.old_fragments.extend(self.legacy_old_fragments)
        msg.new_fragments.extend(self.legacy_new_fragments)
        msg.groups.extend(self.groups)
        msg.rewritten_indices.extend(self.rewritten_indices)

    @classmethod
    def _parse(cls, msg: _T.Rewrite) -> Rewrite:
        return cls(
            groups=_copies(msg.groups),
            rewritten_indices=_copies(msg.rewritten_indices),
            legacy_old_fragments=_copies(msg.old_fragments),
            legacy_new_fragments=_copies(msg.new_fragments),
        )

    @property
    def all_groups(self) -> tuple[RewriteGroup, ...]:
        """``groups``, or the legacy flat lists as one group when there are none
        (Lance's reading)."""
        if self.groups or not (self.legacy_old_fragments or self.legacy_new_fragments):
            return self.groups
        return (
            RewriteGroup(
                old_fragments=self.legacy_old_fragments, new_fragments=self.legacy_new_fragments
            ),
        )

    @property
    def old_fragments(self) -> tuple[DataFragment, ...]:
        """The fragments being replaced, as they were read."""
        return tuple(f for g in self.all_groups for f in g.old_fragments)

    @property
    def modified_fragment_ids(self) -> frozenset[int]:
        return _fragment_ids(self.old_fragments)

    @property
    def dropped_fragment_ids(self) -> frozenset[int]:
        return self.modified_fragment_ids

    @property
    def added_fragments(self) -> tuple[DataFragment, ...]:
        return tuple(f for g in self.all_groups for f in g.new_fragments)


@dataclass(frozen=True)
class Merge(Operation):
    """Add columns: ``fragments`` is the table's complete new fragment list."""

    kind: ClassVar[OperationKind] = OperationKind.MERGE
    _message: ClassVar[type[Message]] = _T.Merge

    fragments: tuple[DataFragment, ...] = ()
    schema: tuple[Field, ...] = ()
    schema_metadata: Mapping[str, bytes] = field(default_factory=dict)

    def _fill(self, msg: _T.Merge) -> None:
        msg.fragments.extend(self.fragments)
        msg.schema.extend(self.schema)
        msg.schema_metadata.update(self.schema_metadata)

    @classmethod
    def _parse(cls, msg: _T.Merge) -> Merge:
        return cls(
            fragments=_copies(msg.fragments),
            schema=_copies(msg.schema),
            schema_metadata=dict(msg.schema_metadata),
        )

    @property
    def modified_fragment_ids(self) -> frozenset[int]:
        return _fragment_ids(self.fragments)

    @property
    def affects_schema(self) -> bool:
        return True

    def fragment(self, fragment_id: int) -> DataFragment | None:
        """This merge's version of a fragment; None if its final list drops it."""
        return next((f for f in self.fragments if f.id == fragment_id), None)


@dataclass(frozen=True)
class Project(Operation):
    """Drop columns (metadata only)."""

    kind: ClassVar[OperationKind] = OperationKind.PROJECT
    _message: ClassVar[type[Message]] = _T.Project

    schema: tuple[Field, ...] = ()

    def _fill(self, msg: _T.Project) -> None:
        msg.schema.extend(self.schema)

    @classmethod
    def _parse(cls, msg: _T.Project) -> Project:
        return cls(schema=_copies(msg.schema))

    @property
    def affects_schema(self) -> bool:
        return True


@dataclass(frozen=True)
class Restore(Operation):
    """Make an older version the latest again."""

    kind: ClassVar[OperationKind] = OperationKind.RESTORE
    _message: ClassVar[type[Message]] = _T.Restore

    version: int = 0

    def _fill(self, msg: _T.Restore) -> None:
        msg.version = self.version

    @classmethod
    def _parse(cls, msg: _T.Restore) -> Restore:
        return cls(version=msg.version)

    @property
    def affects_schema(self) -> bool:
        return True

    @property
    def replaces_table(self) -> bool:
        return True


@dataclass(frozen=True)
class ReserveFragments(Operation):
    """Reserve fragment ids for a later Rewrite (raises the max fragment id)."""

    kind: ClassVar[OperationKind] = OperationKind.RESERVE_FRAGMENTS
    _message: ClassVar[type[Message]] = _T.ReserveFragments

    num_fragments: int = 0

    def _fill(self, msg: _T.ReserveFragments) -> None:
        msg.num_fragments = self.num_fragments

    @classmethod
    def _parse(cls, msg: _T.ReserveFragments) -> ReserveFragments:
        return cls(num_fragments=msg.num_fragments)


@dataclass(frozen=True)
class Clone(Operation):
    """Create the table as a shallow or deep copy of a version of another one."""

    kind: ClassVar[OperationKind] = OperationKind.CLONE
    _message: ClassVar[type[Message]] = _T.Clone

    is_shallow: bool = False
    ref_name: str | None = None
    ref_version: int = 0
    ref_path: str = ""
    branch_name: str | None = None
    #: The cloned version's manifest and indices (of the source table), which the
    #: manifest builder copies; not part of the protobuf (the transaction names the
    #: source by ``ref_path`` and ``ref_version``). :func:`lancetx.clone` sets it.
    source: tuple[table_pb2.Manifest, tuple[IndexMetadata, ...]] | None = field(
        default=None, compare=False, repr=False
    )

    def _fill(self, msg: _T.Clone) -> None:
        msg.is_shallow = self.is_shallow
        if self.ref_name is not None:
            msg.ref_name = self.ref_name
        msg.ref_version = self.ref_version
        msg.ref_path = self.ref_path
        if self.branch_name is not None:
            msg.branch_name = self.branch_name

    @classmethod
    def _parse(cls, msg: _T.Clone) -> Clone:
        return cls(
            is_shallow=msg.is_shallow,
            ref_name=msg.ref_name if msg.HasField("ref_name") else None,
            ref_version=msg.ref_version,
            ref_path=msg.ref_path,
            branch_name=msg.branch_name if msg.HasField("branch_name") else None,
        )

    @property
    def replaces_table(self) -> bool:
        return True


@dataclass(frozen=True)
class Update(Operation):
    """Change rows in place: a delete (deletion files / removed fragments) plus
    new fragments holding the rewritten rows, or rewritten columns."""

    kind: ClassVar[OperationKind] = OperationKind.UPDATE
    _message: ClassVar[type[Message]] = _T.Update

    removed_fragment_ids: tuple[int, ...] = ()
    updated_fragments: tuple[DataFragment, ...] = ()
    new_fragments: tuple[DataFragment, ...] = ()
    fields_modified: tuple[int, ...] = ()
    merged_generations: tuple[MergedGeneration, ...] = ()
    fields_for_preserving_frag_bitmap: tuple[int, ...] = ()
    update_mode: UpdateMode = UpdateMode.REWRITE_ROWS
    inserted_rows: KeyExistenceFilter | None = None
    updated_fragment_offsets: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def _fill(self, msg: _T.Update) -> None:
        msg.removed_fragment_ids.extend(self.removed_fragment_ids)
        msg.updated_fragments.extend(self.updated_fragments)
        msg.new_fragments.extend(self.new_fragments)
        msg.fields_modified.extend(self.fields_modified)
        msg.merged_generations.extend(self.merged_generations)
        msg.fields_for_preserving_frag_bitmap.extend(self.fields_for_preserving_frag_bitmap)
        msg.update_mode = cast("_T.UpdateMode.ValueType", int(self.update_mode))
        if self.inserted_rows is not None:
            msg.inserted_rows.CopyFrom(self.inserted_rows)
        for fragment_id, offsets in self.updated_fragment_offsets.items():
            msg.updated_fragment_offsets[fragment_id].values.extend(offsets)

    @classmethod
    def _parse(cls, msg: _T.Update) -> Update:
        return cls(
            removed_fragment_ids=tuple(msg.removed_fragment_ids),
            updated_fragments=_copies(msg.updated_fragments),
            new_fragments=_copies(msg.new_fragments),
            fields_modified=tuple(msg.fields_modified),
            merged_generations=_copies(msg.merged_generations),
            fields_for_preserving_frag_bitmap=tuple(msg.fields_for_preserving_frag_bitmap),
            update_mode=UpdateMode(msg.update_mode),
            inserted_rows=_optional_message(msg, "inserted_rows"),
            updated_fragment_offsets={
                k: tuple(v.values) for k, v in msg.updated_fragment_offsets.items()
            },
        )

    @property
    def modified_fragment_ids(self) -> frozenset[int]:
        return _fragment_ids(self.updated_fragments) | self.dropped_fragment_ids

    @property
    def dropped_fragment_ids(self) -> frozenset[int]:
        return frozenset(self.removed_fragment_ids)

    @property
    def added_fragments(self) -> tuple[DataFragment, ...]:
        return self.new_fragments

    @property
    def changes_data_files(self) -> bool:
        """Whether updated fragments get new data files (column rewrite) rather
        than only new deletion files (row rewrite)."""
        return self.update_mode is not UpdateMode.REWRITE_ROWS


@dataclass(frozen=True)
class UpdateConfig(Operation):
    """Change table config, table metadata, schema metadata or field metadata.

    Fields 1-4 are the deprecated forms (``upsert_values``, ``delete_keys``,
    ``schema_metadata``, ``field_metadata``); they are kept as read, and the
    ``effective_*`` properties translate them as Lance does.
    """

    kind: ClassVar[OperationKind] = OperationKind.UPDATE_CONFIG
    _message: ClassVar[type[Message]] = _T.UpdateConfig

    config_updates: UpdateMap | None = None
    table_metadata_updates: UpdateMap | None = None
    schema_metadata_updates: UpdateMap | None = None
    field_metadata_updates: Mapping[int, UpdateMap] = field(default_factory=dict)
    # deprecated
    upsert_values: Mapping[str, str] = field(default_factory=dict)
    delete_keys: tuple[str, ...] = ()
    schema_metadata: Mapping[str, str] = field(default_factory=dict)
    field_metadata: Mapping[int, Mapping[str, str]] = field(default_factory=dict)

    def _fill(self, msg: _T.UpdateConfig) -> None:
        if self.config_updates is not None:
            msg.config_updates.CopyFrom(self.config_updates)
        if self.table_metadata_updates is not None:
            msg.table_metadata_updates.CopyFrom(self.table_metadata_updates)
        if self.schema_metadata_updates is not None:
            msg.schema_metadata_updates.CopyFrom(self.schema_metadata_updates)
        for field_id, updates in self.field_metadata_updates.items():
            msg.field_metadata_updates[field_id].CopyFrom(updates)
        msg.upsert_values.update(self.upsert_values)
        msg.delete_keys.extend(self.delete_keys)
        msg.schema_metadata.update(self.schema_metadata)
        for field_id, metadata in self.field_metadata.items():
            msg.field_metadata[field_id].metadata.update(metadata)

    @classmethod
    def _parse(cls, msg: _T.UpdateConfig) -> UpdateConfig:
        return cls(
            config_updates=_read_update_map(msg, "config_updates"),
            table_metadata_updates=_read_update_map(msg, "table_metadata_updates"),
            schema_metadata_updates=_read_update_map(msg, "schema_metadata_updates"),
            field_metadata_updates={k: _copy(v) for k, v in msg.field_metadata_updates.items()},
            upsert_values=dict(msg.upsert_values),
            delete_keys=tuple(msg.delete_keys),
            schema_metadata=dict(msg.schema_metadata),
            field_metadata={k: dict(v.metadata) for k, v in msg.field_metadata.items()},
        )

    @property
    def uses_deprecated_fields(self) -> bool:
        """Whether any deprecated field (1-4) is set."""
        return bool(
            self.upsert_values or self.delete_keys or self.schema_metadata or self.field_metadata
        )

    @property
    def effective_config_updates(self) -> UpdateMap | None:
        """Config changes, from ``config_updates`` or else the deprecated
        ``upsert_values``/``delete_keys`` (an incremental map, as Lance translates it)."""
        if self.config_updates is not None or not (self.upsert_values or self.delete_keys):
            return self.config_updates
        entries: dict[str, str | None] = dict(self.upsert_values)
        entries.update(dict.fromkeys(self.delete_keys))
        return update_map(entries)

    @property
    def effective_schema_metadata_updates(self) -> UpdateMap | None:
        """Schema-metadata changes; the deprecated form was a full replacement."""
        if self.schema_metadata_updates is not None or not self.schema_metadata:
            return self.schema_metadata_updates
        return update_map(dict(self.schema_metadata), replace=True)

    @property
    def effective_field_metadata_updates(self) -> Mapping[int, UpdateMap]:
        """Field-metadata changes by field id; the deprecated form replaced each map."""
        if self.field_metadata_updates or not self.field_metadata:
            return self.field_metadata_updates
        return {k: update_map(dict(v), replace=True) for k, v in self.field_metadata.items()}

    @property
    def upserted_config_keys(self) -> frozenset[str]:
        return _map_keys(self.effective_config_updates)[0]

    @property
    def deleted_config_keys(self) -> frozenset[str]:
        return _map_keys(self.effective_config_updates)[1]

    @property
    def replaces_config(self) -> bool:
        updates = self.effective_config_updates
        return updates is not None and updates.replace

    @property
    def table_metadata_keys(self) -> frozenset[str]:
        """Table-metadata keys set or removed."""
        upserted, removed = _map_keys(self.table_metadata_updates)
        return upserted | removed

    @property
    def replaces_table_metadata(self) -> bool:
        return self.table_metadata_updates is not None and self.table_metadata_updates.replace

    @property
    def changes_schema_metadata(self) -> bool:
        return self.effective_schema_metadata_updates is not None

    @property
    def field_metadata_field_ids(self) -> frozenset[int]:
        """Ids of the fields whose metadata changes."""
        return frozenset(self.effective_field_metadata_updates)


@dataclass(frozen=True)
class DataReplacement(Operation):
    """Swap the data file holding some columns of existing fragments."""

    kind: ClassVar[OperationKind] = OperationKind.DATA_REPLACEMENT
    _message: ClassVar[type[Message]] = _T.DataReplacement

    replacements: tuple[DataReplacementGroup, ...] = ()

    def _fill(self, msg: _T.DataReplacement) -> None:
        msg.replacements.extend(self.replacements)

    @classmethod
    def _parse(cls, msg: _T.DataReplacement) -> DataReplacement:
        return cls(replacements=_copies(msg.replacements))

    @property
    def modified_fragment_ids(self) -> frozenset[int]:
        return frozenset(r.fragment_id for r in self.replacements)

    @property
    def replaced_field_ids(self) -> Mapping[int, frozenset[int]]:
        """Field ids replaced, per fragment id."""
        out: dict[int, set[int]] = {}
        for r in self.replacements:
            out.setdefault(r.fragment_id, set()).update(r.new_file.fields)
        return {k: frozenset(v) for k, v in out.items()}

    @property
    def all_replaced_field_ids(self) -> frozenset[int]:
        return frozenset(f for r in self.replacements for f in r.new_file.fields)


@dataclass(frozen=True)
class UpdateMemWalState(Operation):
    """Mark MemWAL region generations as merged into the table."""

    kind: ClassVar[OperationKind] = OperationKind.UPDATE_MEM_WAL_STATE
    _message: ClassVar[type[Message]] = _T.UpdateMemWalState

    merged_generations: tuple[MergedGeneration, ...] = ()

    def _fill(self, msg: _T.UpdateMemWalState) -> None:
        msg.merged_generations.extend(self.merged_generations)

    @classmethod
    def _parse(cls, msg: _T.UpdateMemWalState) -> UpdateMemWalState:
        return cls(merged_generations=_copies(msg.merged_generations))


@dataclass(frozen=True)
class UpdateBases(Operation):
    """Register additional base paths."""

    kind: ClassVar[OperationKind] = OperationKind.UPDATE_BASES
    _message: ClassVar[type[Message]] = _T.UpdateBases

    new_bases: tuple[BasePath, ...] = ()

    def _fill(self, msg: _T.UpdateBases) -> None:
        msg.new_bases.extend(self.new_bases)

    @classmethod
    def _parse(cls, msg: _T.UpdateBases) -> UpdateBases:
        return cls(new_bases=_copies(msg.new_bases))


#: Operation class per kind.
OPERATION_TYPES: Mapping[OperationKind, type[Operation]] = {
    cls.kind: cls
    for cls in (
        Append,
        Delete,
        Overwrite,
        CreateIndex,
        Rewrite,
        Merge,
        Project,
        Restore,
        ReserveFragments,
        Clone,
        Update,
        UpdateConfig,
        DataReplacement,
        UpdateMemWalState,
        UpdateBases,
    )
}
_BY_FIELD = {kind.field_name: cls for kind, cls in OPERATION_TYPES.items()}


def operation_from_proto(msg: Message) -> Operation:
    """The operation for a ``lance.table.Transaction.<Op>`` message."""
    for cls in OPERATION_TYPES.values():
        if isinstance(msg, cls._message):
            return _parse_operation(cls, msg)
    raise TypeError(f"{type(msg).__name__} is not a lance.table.Transaction operation message")


def _parse_operation(cls: type[Operation], msg: Message) -> Operation:
    op = cls._parse(msg)
    unknown = _unknown_fields(msg)
    if unknown:
        object.__setattr__(op, "unknown_fields", unknown)
    return op


# ------------------------------------------------------------------ transaction


def _new_uuid() -> str:
    return str(uuidlib.uuid4())


@dataclass(frozen=True)
class Transaction:
    """What one commit intends to change, planned against ``read_version``.

    ``tag`` None and the empty string are the same on disk (proto3 string).
    ``properties`` are Lance's ``transaction_properties``; the commit message
    lives under :data:`COMMIT_MESSAGE_KEY`.
    """

    read_version: int
    operation: Operation
    uuid: str = field(default_factory=_new_uuid)
    tag: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    #: Wire bytes of Transaction fields lancetx does not know.
    unknown_fields: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        # Caught here, not as protobuf's ValueError about a uint64 at serialization.
        if isinstance(self.read_version, bool) or not isinstance(self.read_version, int):
            raise TypeError(f"Transaction.read_version={self.read_version!r}: give an int")
        if self.read_version < 0:
            raise ValueError(
                f"Transaction.read_version={self.read_version}: a version number is 0 "
                "(a new table) or more"
            )

    @property
    def kind(self) -> OperationKind:
        return self.operation.kind

    @property
    def commit_message(self) -> str | None:
        return self.properties.get(COMMIT_MESSAGE_KEY)

    @property
    def file_name(self) -> str:
        """``{read_version}-{uuid}.txn``, the transaction file's name."""
        return transaction_file_name(self.read_version, self.uuid)

    def describe(self) -> str:
        """``Delete (read v3)``: for messages."""
        return f"{self.operation.name} (read v{self.read_version})"

    def to_proto(self) -> transaction_pb2.Transaction:
        """This transaction as a ``lance.table.Transaction`` message."""
        msg = _T(read_version=self.read_version, uuid=self.uuid, tag=self.tag or "")
        msg.transaction_properties.update(self.properties)
        slot = getattr(msg, self.operation.kind.field_name)
        slot.SetInParent()
        slot.CopyFrom(self.operation.to_proto())
        if self.unknown_fields:
            msg.MergeFromString(self.unknown_fields)
        return msg

    def to_bytes(self) -> bytes:
        """The transaction-file bytes (plain protobuf, no length prefix)."""
        return self.to_proto().SerializeToString()

    @classmethod
    def from_proto(
        cls, msg: transaction_pb2.Transaction, *, source: str = "<Transaction message>"
    ) -> Transaction:
        """Model a ``lance.table.Transaction``. Raises TransactionFileError
        (naming ``source``) if it carries no operation."""
        which = msg.WhichOneof("operation")
        if which is None:
            raise TransactionFileError(
                source,
                "the Transaction has no operation (or one newer than this lancetx "
                "understands); upgrade lancetx or check the file",
            )
        op = _parse_operation(_BY_FIELD[which], getattr(msg, which))
        return cls(
            read_version=msg.read_version,
            operation=op,
            uuid=msg.uuid,
            tag=msg.tag or None,
            properties=dict(msg.transaction_properties),
            unknown_fields=_unknown_fields(msg),
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "<bytes>") -> Transaction:
        """Decode transaction-file bytes. Raises TransactionFileError naming ``source``."""
        msg = _T()
        try:
            msg.ParseFromString(data)
        except DecodeError as exc:
            raise TransactionFileError(
                source, f"does not decode as a lance.table.Transaction protobuf ({exc})"
            ) from None
        return cls.from_proto(msg, source=source)
