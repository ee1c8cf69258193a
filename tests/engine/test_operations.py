"""The typed transaction model: lossless protobuf conversion, conflict facts,
and interchange with real pylance (its transaction files parse; ours it reads)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from google.protobuf.any_pb2 import Any as AnyPb
from pyroaring import BitMap

from lancetx.commit.engine.conflicts import Outcome, classify
from lancetx.commit.engine.operations import (
    COMMIT_MESSAGE_KEY,
    FRAG_REUSE_INDEX_NAME,
    MEM_WAL_INDEX_NAME,
    Append,
    BasePath,
    Clone,
    CreateIndex,
    DataFile,
    DataFragment,
    DataReplacement,
    DataReplacementGroup,
    Delete,
    Field,
    IndexMetadata,
    KeyExistenceFilter,
    Merge,
    MergedGeneration,
    Operation,
    OperationKind,
    Overwrite,
    Project,
    ReserveFragments,
    Restore,
    Rewrite,
    RewriteGroup,
    RewrittenIndex,
    Transaction,
    Update,
    UpdateBases,
    UpdateConfig,
    UpdateMemWalState,
    UpdateMode,
    index_fragment_ids,
    mem_wal_merged_generations,
    operation_from_proto,
    update_map,
)
from lancetx.commit.errors import TransactionFileError
from lancetx.commit.format import manifest as manifest_file
from lancetx.commit.format.naming import parse_manifest_name
from lancetx.protos import table_pb2, transaction_pb2

# ------------------------------------------------------------------ samples


def _file(path: str, *fields: int) -> DataFile:
    return DataFile(
        path=path,
        fields=list(fields),
        column_indices=list(range(len(fields))),
        file_major_version=2,
        file_minor_version=1,
        file_size_bytes=1234,
    )


def _fragment(fragment_id: int, *, deleted: int = 0, base_id: int | None = None) -> DataFragment:
    out = DataFragment(
        id=fragment_id, files=[_file(f"{fragment_id}.lance", 0, 1)], physical_rows=50
    )
    if base_id is not None:
        out.files[0].base_id = base_id
    if deleted:
        out.deletion_file.CopyFrom(
            table_pb2.DeletionFile(
                file_type=table_pb2.DeletionFile.BITMAP,
                read_version=4,
                id=99,
                num_deleted_rows=deleted,
            )
        )
    out.inline_row_ids = b"\x01\x02"
    return out


def _uuid(n: int) -> table_pb2.UUID:
    return table_pb2.UUID(uuid=bytes([n]) * 16)


def _index(name: str, fragments: list[int] | None, *fields: int) -> IndexMetadata:
    out = IndexMetadata(uuid=_uuid(7), name=name, fields=list(fields), dataset_version=4)
    if fragments is not None:
        out.fragment_bitmap = BitMap(fragments).serialize()
    out.index_details.Pack(table_pb2.VectorIndexDetails())
    out.index_version = 1
    out.created_at = 1_700_000_000_000
    out.files.add(path="index.idx", size_bytes=10)
    return out


def _generation(region: int, generation: int) -> MergedGeneration:
    return MergedGeneration(region_id=_uuid(region), generation=generation)


_FIELDS = (
    Field(
        name="a", id=0, parent_id=-1, logical_type="int64", type=Field.LEAF, metadata={"k": b"v"}
    ),
    Field(name="b", id=1, parent_id=-1, logical_type="double", type=Field.LEAF, nullable=True),
)
_BLOOM = KeyExistenceFilter(
    field_ids=[0],
    bloom=transaction_pb2.Transaction.BloomFilter(
        bitmap=b"\x00\x10" * 16, num_bits=256, number_of_items=8192, probability=0.00057
    ),
)

SAMPLES: dict[str, Operation] = {
    "append": Append(fragments=(_fragment(0), _fragment(0, base_id=2))),
    "delete": Delete(
        updated_fragments=(_fragment(3, deleted=4),), deleted_fragment_ids=(1, 2), predicate="a < 2"
    ),
    "overwrite": Overwrite(
        fragments=(_fragment(0),),
        schema=_FIELDS,
        schema_metadata={"m": b"\x00\x01"},
        config_upsert_values={"lance.auto_cleanup.interval": "10"},
        initial_bases=(BasePath(id=1, name="n", is_dataset_root=True, path="s3://b/t"),),
    ),
    "create_index": CreateIndex(
        new_indices=(_index("a_idx", [0, 1], 0),), removed_indices=(_index("old", None, 0),)
    ),
    "rewrite": Rewrite(
        groups=(
            RewriteGroup(old_fragments=[_fragment(1), _fragment(2)], new_fragments=[_fragment(9)]),
        ),
        rewritten_indices=(
            RewrittenIndex(
                old_id=_uuid(1),
                new_id=_uuid(2),
                new_index_details=AnyPb(type_url="type.googleapis.com/x", value=b"\x08\x01"),
                new_index_version=3,
                new_index_files=[table_pb2.IndexFile(path="p", size_bytes=5)],
            ),
        ),
    ),
    "rewrite_groups_only": Rewrite(
        groups=(
            RewriteGroup(old_fragments=[_fragment(1)], new_fragments=[_fragment(8)]),
            RewriteGroup(old_fragments=[_fragment(2)], new_fragments=[_fragment(9)]),
        )
    ),
    "rewrite_legacy_lists": Rewrite(
        legacy_old_fragments=(_fragment(1), _fragment(2)), legacy_new_fragments=(_fragment(0),)
    ),
    "merge": Merge(
        fragments=(_fragment(0), _fragment(1)), schema=_FIELDS, schema_metadata={"x": b"y"}
    ),
    "project": Project(schema=_FIELDS[:1]),
    "restore": Restore(version=7),
    "reserve_fragments": ReserveFragments(num_fragments=5),
    "clone": Clone(
        is_shallow=True, ref_name="v1-tag", ref_version=4, ref_path="s3://src/t", branch_name="dev"
    ),
    "clone_without_names": Clone(is_shallow=False, ref_version=4, ref_path="s3://src/t"),
    "clone_with_empty_names": Clone(ref_name="", branch_name=""),
    "update": Update(
        removed_fragment_ids=(4,),
        updated_fragments=(_fragment(3, deleted=1),),
        new_fragments=(_fragment(0),),
        fields_modified=(1,),
        merged_generations=(_generation(1, 3),),
        fields_for_preserving_frag_bitmap=(0,),
        update_mode=UpdateMode.REWRITE_COLUMNS,
        inserted_rows=_BLOOM,
        updated_fragment_offsets={3: (0, 5, 9), 5: ()},
    ),
    "update_config": UpdateConfig(
        config_updates=update_map({"a": "1", "b": None}),
        table_metadata_updates=update_map({"owner": "me"}, replace=True),
        schema_metadata_updates=update_map({}),
        field_metadata_updates={0: update_map({"unit": "m"}), -1: update_map({"x": None})},
    ),
    "update_config_deprecated": UpdateConfig(
        upsert_values={"a": "1"},
        delete_keys=("b", "c"),
        schema_metadata={"s": "1"},
        field_metadata={3: {"unit": "m"}, 4: {}},
    ),
    "data_replacement": DataReplacement(
        replacements=(DataReplacementGroup(fragment_id=2, new_file=_file("2-b.lance", 1)),)
    ),
    "update_mem_wal_state": UpdateMemWalState(
        merged_generations=(_generation(1, 3), _generation(2, 8))
    ),
    "update_bases": UpdateBases(
        new_bases=(BasePath(id=3, path="s3://x/y"), BasePath(id=4, name="z", path="/z"))
    ),
}


def test_samples_cover_every_operation_kind() -> None:
    assert {op.kind for op in SAMPLES.values()} == set(OperationKind)


# --------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(name: str) -> None:
    op = SAMPLES[name]
    txn = Transaction(5, op, tag="nightly", properties={COMMIT_MESSAGE_KEY: "msg", "k": "v"})
    pb = txn.to_proto()
    assert pb.WhichOneof("operation") == op.kind.field_name
    assert pb.read_version == 5 and pb.uuid == txn.uuid and pb.tag == "nightly"
    back = Transaction.from_proto(pb)
    assert back == txn
    assert back.to_proto() == pb
    again = transaction_pb2.Transaction()
    again.ParseFromString(txn.to_bytes())
    assert again == pb
    assert Transaction.from_bytes(txn.to_bytes()) == txn


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_from_proto_then_to_proto_is_identity(name: str) -> None:
    """Starting from the protobuf side (what a file holds)."""
    pb = Transaction(2, SAMPLES[name], uuid=str(uuid.uuid4())).to_proto()
    assert Transaction.from_proto(pb).to_proto() == pb


def _varint_field(number: int, value: int) -> bytes:
    key = number << 3
    out = bytearray()
    for v in (key, value):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def test_unknown_fields_survive_at_every_level() -> None:
    """A newer Lance's fields (in the Transaction, the operation, a fragment)
    are written back unchanged."""
    pb = Transaction(3, SAMPLES["delete"], uuid="u").to_proto()
    pb.delete.updated_fragments[0].MergeFromString(_varint_field(77, 1))
    pb.delete.MergeFromString(_varint_field(40, 2))
    pb.MergeFromString(_varint_field(300, 3))
    data = pb.SerializeToString()

    parsed = transaction_pb2.Transaction()
    parsed.ParseFromString(data)
    txn = Transaction.from_bytes(data)
    assert txn.unknown_fields == _varint_field(300, 3)
    assert txn.operation.unknown_fields == _varint_field(40, 2)
    assert txn.to_proto() == parsed
    plain = transaction_pb2.Transaction()
    plain.ParseFromString(Transaction(3, SAMPLES["delete"], uuid="u").to_bytes())
    assert txn.to_proto() != plain, "the unknown fields must make a difference"


def test_empty_operations_still_set_the_oneof() -> None:
    for op in (Append(), ReserveFragments(), Restore(), Project(), UpdateBases()):
        pb = Transaction(1, op).to_proto()
        assert pb.WhichOneof("operation") == op.kind.field_name
        assert Transaction.from_proto(pb).operation == op


def test_unknown_update_mode_round_trips() -> None:
    pb = Transaction(1, Update(), uuid="u").to_proto()
    pb.update.update_mode = 7  # type: ignore[assignment]
    txn = Transaction.from_proto(pb)
    assert int(txn.operation.update_mode) == 7  # type: ignore[attr-defined]
    assert txn.to_proto() == pb


def test_transaction_defaults() -> None:
    a, b = Transaction(4, Append()), Transaction(4, Append())
    assert a.uuid != b.uuid and uuid.UUID(a.uuid).version == 4
    assert a.tag is None and a.to_proto().tag == ""
    assert Transaction.from_proto(a.to_proto()).tag is None
    assert a.file_name == f"4-{a.uuid}.txn"
    assert a.commit_message is None
    assert Transaction(4, Append(), properties={COMMIT_MESSAGE_KEY: "hi"}).commit_message == "hi"
    assert a.describe() == "Append (read v4)"
    assert OperationKind.UPDATE_BASES.field_number == 114
    assert OperationKind.APPEND.field_number == 100


def test_bytes_without_an_operation_are_rejected() -> None:
    with pytest.raises(TransactionFileError, match=r"3-x\.txn.*no operation"):
        Transaction.from_bytes(
            transaction_pb2.Transaction(read_version=3).SerializeToString(), source="3-x.txn"
        )
    with pytest.raises(TransactionFileError, match="does not decode"):
        Transaction.from_bytes(b"\xff\xff\xff", source="bad.txn")


def test_operation_from_proto_dispatches_on_message_type() -> None:
    assert operation_from_proto(transaction_pb2.Transaction.Restore(version=3)) == Restore(
        version=3
    )
    with pytest.raises(TypeError):
        operation_from_proto(table_pb2.DataFragment())


# ------------------------------------------------------------ conflict facts


def test_fragment_facts() -> None:
    delete = SAMPLES["delete"]
    assert delete.modified_fragment_ids == {1, 2, 3}
    assert delete.dropped_fragment_ids == {1, 2}
    update = SAMPLES["update"]
    assert update.modified_fragment_ids == {3, 4} and update.dropped_fragment_ids == {4}
    assert [f.id for f in update.added_fragments] == [0]
    rewrite = SAMPLES["rewrite"]
    assert rewrite.modified_fragment_ids == {1, 2} == rewrite.dropped_fragment_ids
    assert [f.id for f in rewrite.added_fragments] == [9]
    merge = SAMPLES["merge"]
    assert merge.modified_fragment_ids == {0, 1} and merge.affects_schema
    assert SAMPLES["data_replacement"].modified_fragment_ids == {2}
    assert SAMPLES["data_replacement"].replaced_field_ids == {2: {1}}  # type: ignore[attr-defined]
    assert [f.id for f in SAMPLES["append"].added_fragments] == [0, 0]
    for name in (
        "append",
        "create_index",
        "project",
        "restore",
        "reserve_fragments",
        "update_config",
    ):
        assert SAMPLES[name].modified_fragment_ids == frozenset(), name
    assert SAMPLES["overwrite"].replaces_table and SAMPLES["restore"].replaces_table
    assert not SAMPLES["append"].affects_schema


def test_legacy_rewrite_lists_read_as_one_group() -> None:
    legacy = SAMPLES["rewrite_legacy_lists"]
    assert isinstance(legacy, Rewrite)
    (group,) = legacy.all_groups
    assert [f.id for f in group.old_fragments] == [1, 2]
    assert legacy.modified_fragment_ids == {1, 2}
    assert not legacy.groups  # the stored form is untouched


def test_index_facts() -> None:
    create = SAMPLES["create_index"]
    assert isinstance(create, CreateIndex)
    assert create.index_names == {"a_idx"} and create.indexed_field_ids == {0}
    assert create.covered_fragment_ids == {0, 1}
    assert CreateIndex(new_indices=(_index("x", None, 0),)).covered_fragment_ids is None
    assert index_fragment_ids(_index("x", [3, 70000], 0)) == {3, 70000}
    fri = _index(FRAG_REUSE_INDEX_NAME, [1], 0)
    with_fri = CreateIndex(new_indices=(fri,), removed_indices=(fri,))
    assert (
        with_fri.frag_reuse_index is not None and not with_fri.mixes_frag_reuse_with_other_indices
    )
    assert with_fri.singleton_indices_modified == {FRAG_REUSE_INDEX_NAME}
    assert CreateIndex(new_indices=(fri, _index("a", [1], 0))).mixes_frag_reuse_with_other_indices


def test_mem_wal_details() -> None:
    mem_wal = IndexMetadata(name=MEM_WAL_INDEX_NAME)
    assert mem_wal_merged_generations(mem_wal) is None
    mem_wal.index_details.Pack(table_pb2.MemWalIndexDetails(merged_generations=[_generation(1, 4)]))
    (gen,) = mem_wal_merged_generations(mem_wal) or ()
    assert gen.generation == 4
    mem_wal.index_details.Pack(table_pb2.VectorIndexDetails())
    assert mem_wal_merged_generations(mem_wal) is None


def test_update_config_facts_translate_deprecated_fields_like_lance() -> None:
    new = SAMPLES["update_config"]
    assert isinstance(new, UpdateConfig)
    assert new.upserted_config_keys == {"a"} and new.deleted_config_keys == {"b"}
    assert new.touched_config_keys == {"a", "b"} and not new.replaces_config
    assert new.table_metadata_keys == {"owner"} and new.replaces_table_metadata
    assert new.changes_schema_metadata and new.field_metadata_field_ids == {0, -1}
    assert not new.uses_deprecated_fields

    old = SAMPLES["update_config_deprecated"]
    assert isinstance(old, UpdateConfig) and old.uses_deprecated_fields
    assert old.upserted_config_keys == {"a"} and old.deleted_config_keys == {"b", "c"}
    config = old.effective_config_updates
    assert config is not None and not config.replace  # translate_config_updates: incremental
    schema = old.effective_schema_metadata_updates
    assert schema is not None and schema.replace  # old schema metadata replaced the map
    assert old.field_metadata_field_ids == {3, 4}
    assert all(m.replace for m in old.effective_field_metadata_updates.values())
    assert Overwrite(config_upsert_values={"x": "1"}).touched_config_keys == {"x"}


# ============================================================ real pylance


@dataclass
class History:
    uri: str
    #: operation kind of each version, as pylance committed it
    kinds: dict[int, OperationKind]


EXPECTED_HISTORY = [
    (1, OperationKind.OVERWRITE, "write_dataset"),
    (2, OperationKind.APPEND, "write_dataset(mode=append)"),
    (3, OperationKind.DELETE, "delete"),
    (4, OperationKind.UPDATE, "update"),
    (5, OperationKind.MERGE, "add_columns"),
    (6, OperationKind.PROJECT, "drop_columns"),
    (7, OperationKind.RESERVE_FRAGMENTS, "compact_files (reserve)"),
    (8, OperationKind.REWRITE, "compact_files"),
    (9, OperationKind.CREATE_INDEX, "create_scalar_index"),
    (10, OperationKind.UPDATE_CONFIG, "update_config"),
    (11, OperationKind.UPDATE_CONFIG, "delete_config_keys"),
    (12, OperationKind.UPDATE_CONFIG, "update_schema_metadata"),
    (13, OperationKind.UPDATE_CONFIG, "update_field_metadata"),
    (14, OperationKind.UPDATE_CONFIG, "update_metadata"),
    (15, OperationKind.CREATE_INDEX, "drop_index"),
    (16, OperationKind.UPDATE, "merge_insert"),
    (17, OperationKind.RESTORE, "restore"),
]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    uri = str(tmp_path_factory.mktemp("pylance") / "t.lance")
    table = pa.table({"a": list(range(20)), "b": [float(i) for i in range(20)]})
    ds = lance.write_dataset(table, uri, max_rows_per_file=5)
    ds = lance.write_dataset(table, uri, mode="append")
    ds.delete("a < 2")
    ds.update({"b": "b + 1"}, where="a > 17")
    ds.add_columns({"c": "a * 2"})
    ds.drop_columns(["c"])
    ds.optimize.compact_files()
    ds = lance.dataset(uri)
    ds.create_scalar_index("a", "BTREE")
    ds.update_config({"k1": "v1"})
    ds.delete_config_keys(["k1"])
    ds.update_schema_metadata({"s": "1"})
    ds.update_field_metadata({"a": {"unit": "m"}})
    ds.update_metadata({"owner": "me"})
    ds.drop_index("a_idx")
    new_rows = pa.table({"a": [1, 100], "b": [0.0, 1.0]})
    ds.merge_insert("a").when_matched_update_all().when_not_matched_insert_all().execute(new_rows)
    lance.dataset(uri, version=2).restore()
    kinds = {}
    for path in _transaction_files(uri):
        txn = Transaction.from_bytes(Path(path).read_bytes(), source=path)
        kinds[_version_of(uri, txn.uuid)] = txn.kind
    return History(uri, kinds)


def _transaction_files(uri: str) -> list[str]:
    return sorted(glob.glob(os.path.join(uri, "_transactions", "*.txn")))


def _manifests(uri: str) -> dict[int, str]:
    out = {}
    for path in glob.glob(os.path.join(uri, "_versions", "*.manifest")):
        parsed = parse_manifest_name(os.path.basename(path))
        if parsed is not None:
            out[parsed[0]] = path
    return out


def _version_of(uri: str, txn_uuid: str) -> int:
    for version, path in _manifests(uri).items():
        decoded = manifest_file.decode_manifest(Path(path).read_bytes(), path=path)
        if decoded.manifest.transaction_file.endswith(f"{txn_uuid}.txn"):
            return version
    raise AssertionError(f"no manifest names transaction {txn_uuid}")


def test_pylance_history_has_the_expected_operations(history: History) -> None:
    assert history.kinds == {version: kind for version, kind, _ in EXPECTED_HISTORY}


def test_pylance_transaction_files_round_trip(history: History) -> None:
    files = _transaction_files(history.uri)
    assert len(files) == len(EXPECTED_HISTORY)
    for path in files:
        data = Path(path).read_bytes()
        pb = transaction_pb2.Transaction()
        pb.ParseFromString(data)
        txn = Transaction.from_proto(pb, source=path)
        assert txn.to_proto() == pb, path
        assert os.path.basename(path) == txn.file_name
        reparsed = transaction_pb2.Transaction()
        reparsed.ParseFromString(txn.to_bytes())
        assert reparsed == pb


def test_pylance_inline_transactions_match_the_files(history: History) -> None:
    for version, path in _manifests(history.uri).items():
        decoded = manifest_file.decode_manifest(Path(path).read_bytes(), path=path)
        if decoded.transaction is None:
            continue
        inline = Transaction.from_proto(decoded.transaction)
        assert inline.to_proto() == decoded.transaction
        on_disk = Path(history.uri, "_transactions", decoded.manifest.transaction_file).read_bytes()
        assert inline == Transaction.from_bytes(on_disk), version


def test_pylance_reads_transactions_we_reserialize(history: History, tmp_path: Path) -> None:
    """Every manifest's inline transaction and every .txn file replaced by our
    encoding: pylance reads the same transactions, and its own conflict check
    still sees the Restore."""
    uri = str(tmp_path / "copy.lance")
    shutil.copytree(history.uri, uri)
    for path in _transaction_files(uri):
        Path(path).write_bytes(Transaction.from_bytes(Path(path).read_bytes()).to_bytes())
    for path in _manifests(uri).values():
        decoded = manifest_file.decode_manifest(Path(path).read_bytes(), path=path)
        if decoded.transaction is None:
            continue
        ours = Transaction.from_proto(decoded.transaction).to_proto()
        Path(path).write_bytes(
            manifest_file.encode_manifest(
                decoded.manifest,
                indices=decoded.indices,
                transaction=ours,
                footer_version=(decoded.footer_major, decoded.footer_minor),
            )
        )
    original, copy = lance.dataset(history.uri), lance.dataset(uri)
    for version, _, _ in EXPECTED_HISTORY:
        assert _shown(copy.read_transaction(version)) == _shown(
            original.read_transaction(version)
        ), version

    stale = lance.dataset(uri, version=16)
    with pytest.raises(
        OSError, match="incompatible with concurrent transaction Restore at version 17"
    ):
        stale.insert(pa.table({"a": [5], "b": [1.0]}))
    # ... which is what we say too.
    restore_txn = next(
        Transaction.from_bytes(Path(p).read_bytes())
        for p in _transaction_files(uri)
        if Transaction.from_bytes(Path(p).read_bytes()).kind is OperationKind.RESTORE
    )
    assert classify(Transaction(16, Append()), restore_txn).outcome is Outcome.INCOMPATIBLE


def _shown(obj: object) -> str:
    """repr without object addresses (pylance's BaseOperation has no repr)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(obj))


# pylance's Python binding names some operations differently or not at all.
_PYLANCE_CLASS = {
    OperationKind.RESERVE_FRAGMENTS: "BaseOperation",
    OperationKind.UPDATE_BASES: "BaseOperation",
}


#: Samples Lance decodes but pylance 14's Python binding cannot convert. A
#: protobuf decode failure would read "Invalid user input: ..." instead.
_PYLANCE_BINDING_GAPS: dict[str, tuple[type[Exception], str]] = {
    "update_mem_wal_state": (ValueError, "Unsupported operation: UpdateMemWalState"),
    # The binding builds LanceOperation.RewrittenIndex with too few arguments.
    "rewrite": (TypeError, r"RewrittenIndex.__init__\(\) missing 3 required"),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_pylance_reads_every_operation_we_write(
    history: History, tmp_path: Path, name: str
) -> None:
    """Our encoding of each of the 15 operations, put inline in a manifest,
    decodes in pylance (read_transaction)."""
    uri = str(tmp_path / "inject.lance")
    shutil.copytree(history.uri, uri)
    path = _manifests(uri)[3]
    decoded = manifest_file.decode_manifest(Path(path).read_bytes(), path=path)
    op = SAMPLES[name]
    txn = Transaction(2, op, properties={COMMIT_MESSAGE_KEY: "from lancetx"})
    Path(path).write_bytes(
        manifest_file.encode_manifest(
            decoded.manifest,
            indices=decoded.indices,
            transaction=txn.to_proto(),
            footer_version=(decoded.footer_major, decoded.footer_minor),
        )
    )
    dataset = lance.dataset(uri)
    if name in _PYLANCE_BINDING_GAPS:
        error, message = _PYLANCE_BINDING_GAPS[name]
        with pytest.raises(error, match=message):
            dataset.read_transaction(3)
        return
    read = dataset.read_transaction(3)
    assert read is not None
    assert read.uuid == txn.uuid and read.read_version == 2
    assert type(read.operation).__name__ == _PYLANCE_CLASS.get(op.kind, op.kind.value)
