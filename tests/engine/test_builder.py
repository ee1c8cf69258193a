"""build_manifest: Lance's manifest-building rules, on synthetic manifests and on
real pylance histories (every version pylance wrote is rebuilt from its previous
version and its transaction, and must come out the same)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import lance
import lance_fixtures
import pyarrow as pa
import pytest
from google.protobuf import any_pb2, unknown_fields
from pyroaring import BitMap

from lancetx.commit.engine.builder import (
    DEFAULT_DATA_STORAGE_VERSION,
    MEM_WAL_INDEX_NAME,
    BuiltManifest,
    InvalidTransactionError,
    UnsupportedTransactionError,
    build_manifest,
    fragment_bitmap,
    serialize_bitmap,
)
from lancetx.commit.errors import CommitError, UnsupportedFeatureError
from lancetx.commit.format import rowids
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.manifest import decode_manifest
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.format.versioning import (
    LIBRARY_NAME,
    library_version,
    split_version,
    writer_version,
)
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.protos import file_pb2, rowids_pb2, table_pb2, transaction_pb2

Txn = transaction_pb2.Transaction
NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
VECTOR_DETAILS = "/lance.table.VectorIndexDetails"
BTREE_DETAILS = "/lance.table.BTreeIndexDetails"

# ---------------------------------------------------------------- synthetic data


def field(fid: int, name: str, parent: int = -1, logical_type: str = "int64") -> file_pb2.Field:
    return file_pb2.Field(
        id=fid, name=name, parent_id=parent, logical_type=logical_type, nullable=True
    )


SCHEMA = [field(0, "a"), field(1, "b")]


def data_file(
    fields: Iterable[int] = (0, 1), path: str | None = None, version: tuple[int, int] = (2, 2)
) -> table_pb2.DataFile:
    fields = list(fields)
    return table_pb2.DataFile(
        path=path or f"{uuid.uuid4().hex}.lance",
        fields=fields,
        column_indices=list(range(len(fields))),
        file_major_version=version[0],
        file_minor_version=version[1],
        file_size_bytes=100,
    )


def frag(
    fid: int, rows: int = 10, *, deleted: int = 0, files: list[table_pb2.DataFile] | None = None
) -> table_pb2.DataFragment:
    out = table_pb2.DataFragment(id=fid, physical_rows=rows)
    out.files.extend(files if files is not None else [data_file()])
    if deleted:
        out.deletion_file.CopyFrom(
            table_pb2.DeletionFile(
                file_type=table_pb2.DeletionFile.ARROW_ARRAY,
                read_version=1,
                id=7,
                num_deleted_rows=deleted,
            )
        )
    return out


def manifest(
    fragments: Iterable[table_pb2.DataFragment] = (),
    *,
    version: int = 3,
    max_fragment_id: int | None = None,
    config: dict[str, str] | None = None,
    fields: list[file_pb2.Field] | None = None,
) -> table_pb2.Manifest:
    m = table_pb2.Manifest(version=version, transaction_file="old.txn", tag="old-tag")
    m.fields.extend(fields if fields is not None else SCHEMA)
    m.schema_metadata["owner"] = b"tests"
    m.fragments.extend(fragments)
    if max_fragment_id is not None:
        m.max_fragment_id = max_fragment_id
    m.writer_version.library = "lance"
    m.writer_version.version = "14.0.2"
    m.data_format.file_format = "lance"
    m.data_format.version = "2.2"
    m.index_section = 1234
    m.inline_transaction_position = 99
    m.timestamp.FromDatetime(datetime(2020, 1, 1))
    for k, v in (config or {}).items():
        m.config[k] = v
    m.table_metadata["team"] = "data"
    if any(f.HasField("deletion_file") for f in m.fragments):
        m.reader_feature_flags |= 1
        m.writer_feature_flags |= 1
    if m.config:
        m.writer_feature_flags |= 8
    return m


def index(
    name: str,
    fields: Iterable[int],
    fragments: Iterable[int] | None,
    *,
    details: str = BTREE_DETAILS,
    version: int = 2,
) -> table_pb2.IndexMetadata:
    out = table_pb2.IndexMetadata(name=name, fields=list(fields), dataset_version=version)
    out.uuid.uuid = uuid.uuid4().bytes
    if fragments is not None:
        out.fragment_bitmap = serialize_bitmap(BitMap(list(fragments)))
    out.index_details.type_url = details
    out.files.add(path="index.idx", size_bytes=10)
    return out


def txn(op: str, read_version: int = 3, **fields: Any) -> Txn:
    t = Txn(read_version=read_version, uuid=str(uuid.uuid4()))
    getattr(t, op).SetInParent()
    for name, value in fields.items():
        target = getattr(getattr(t, op), name)
        if isinstance(value, dict):
            for k, v in value.items():
                target[k] = v
        elif hasattr(target, "CopyFrom"):
            target.CopyFrom(value)
        elif hasattr(target, "extend"):
            target.extend(value)
        else:
            setattr(getattr(t, op), name, value)
    return t


def build(
    previous: table_pb2.Manifest | None,
    t: Txn,
    indices: Iterable[table_pb2.IndexMetadata] = (),
    **kwargs: Any,
) -> BuiltManifest:
    kwargs.setdefault("version", (previous.version + 1) if previous is not None else 1)
    kwargs.setdefault("transaction_file", f"{t.read_version}-{t.uuid}.txn")
    kwargs.setdefault("now", NOW)
    return build_manifest(previous, list(indices), t, **kwargs)


def ids(built: BuiltManifest) -> list[int]:
    return [f.id for f in built.manifest.fragments]


def bitmap_ids(idx: table_pb2.IndexMetadata) -> list[int] | None:
    bm = fragment_bitmap(idx)
    return None if bm is None else list(bm)


def update_map(entries: dict[str, str | None], replace: bool = False) -> Txn.UpdateMap:
    out = Txn.UpdateMap(replace=replace)
    for k, v in entries.items():
        e = out.update_entries.add(key=k)
        if v is not None:
            e.value = v
    return out


# ------------------------------------------------------------ per-version state


def test_new_version_resets_per_version_state_and_names_lancetx() -> None:
    prev = manifest([frag(0)], max_fragment_id=0)
    t = txn("append", fragments=[frag(0)])
    t.tag = "release-1"
    built = build(prev, t)
    m = built.manifest
    assert m.version == 4
    assert m.tag == "release-1"
    assert m.transaction_file == f"3-{t.uuid}.txn"
    assert m.timestamp.ToDatetime(tzinfo=UTC) == NOW
    assert m.writer_version.library == LIBRARY_NAME == "lancetx"
    assert m.writer_version.version == split_version(library_version())[0]
    assert not m.HasField("index_section")
    assert not m.HasField("inline_transaction_position")
    assert not m.HasField("transaction_section")
    # copied forward
    assert dict(m.config) == {} and dict(m.table_metadata) == {"team": "data"}
    assert dict(m.schema_metadata) == {"owner": b"tests"}
    assert m.data_format.version == "2.2"
    assert list(m.fields) == SCHEMA


def test_unknown_fields_of_copied_state_are_carried_forward() -> None:
    prev = manifest([frag(0)], max_fragment_id=0)
    # a field pylance writes that our proto does not declare (number 99, varint 5)
    raw = prev.SerializeToString() + bytes([0x98, 0x06, 0x05])
    prev = table_pb2.Manifest.FromString(raw)
    built = build(prev, txn("append", fragments=[frag(0)]))
    carried = unknown_fields.UnknownFieldSet(built.manifest)
    assert [(carried[i].field_number, carried[i].data) for i in range(len(carried))] == [(99, 5)]


def test_version_must_increase() -> None:
    prev = manifest([frag(0)])
    with pytest.raises(
        InvalidTransactionError, match="must be greater than the previous version 3"
    ):
        build(prev, txn("append", fragments=[frag(0)]), version=3)


# ------------------------------------------------------------------ fragment ids


def test_append_ids_start_after_the_high_water_mark_not_the_max_present_id() -> None:
    prev = manifest([frag(0), frag(2)], max_fragment_id=7)
    built = build(prev, txn("append", fragments=[frag(0, 5), frag(0, 6)]))
    assert ids(built) == [0, 2, 8, 9]
    assert built.manifest.max_fragment_id == 9
    assert [f.physical_rows for f in built.manifest.fragments][2:] == [5, 6]


def test_append_without_stored_high_water_mark_uses_the_max_id() -> None:
    prev = manifest([frag(0), frag(4)])
    built = build(prev, txn("append", fragments=[frag(0)]))
    assert ids(built) == [0, 4, 5]
    assert built.manifest.max_fragment_id == 5


def test_only_id_zero_is_unassigned_and_result_is_sorted() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=1)
    built = build(prev, txn("append", fragments=[frag(20), frag(0)]))
    # 20 is kept as given; the unassigned one gets 2; the list is sorted by id
    assert ids(built) == [0, 1, 2, 20]
    assert built.manifest.max_fragment_id == 20


def test_high_water_mark_survives_deleting_every_fragment() -> None:
    prev = manifest([frag(0), frag(1), frag(2)], max_fragment_id=2)
    deleted = build(prev, txn("delete", deleted_fragment_ids=[0, 1, 2]))
    assert ids(deleted) == []
    assert deleted.manifest.max_fragment_id == 2
    appended = build(deleted.manifest, txn("append", read_version=4, fragments=[frag(0)]))
    assert ids(appended) == [3]


def test_empty_table_without_any_fragment_starts_at_zero() -> None:
    prev = manifest([])
    built = build(prev, txn("append", fragments=[frag(0), frag(0)]))
    assert ids(built) == [0, 1]
    assert built.manifest.max_fragment_id == 1
    nothing = build(prev, txn("update_config", config_updates=update_map({"k": "v"})))
    assert not nothing.manifest.HasField("max_fragment_id")


def test_fragment_ids_beyond_u32_are_refused() -> None:
    prev = manifest([frag(0)])
    with pytest.raises(InvalidTransactionError, match="does not fit max_fragment_id"):
        build(prev, txn("append", fragments=[frag(2**32)]))


def test_duplicate_fragment_ids_in_the_result_are_refused() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=1)
    with pytest.raises(InvalidTransactionError, match=r"fragment id\(s\) \[1\] more than once"):
        build(prev, txn("append", fragments=[frag(1)]))


def test_reserve_fragments_moves_the_high_water_mark() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=1)
    reserved = build(prev, txn("reserve_fragments", num_fragments=5))
    assert ids(reserved) == [0, 1]
    assert reserved.manifest.max_fragment_id == 6
    appended = build(reserved.manifest, txn("append", read_version=4, fragments=[frag(0)]))
    assert ids(appended) == [0, 1, 7]
    # a table that never had a fragment: max_fragment_id.unwrap_or(0) + n
    assert (
        build(manifest([]), txn("reserve_fragments", num_fragments=3)).manifest.max_fragment_id == 3
    )


# ------------------------------------------------------------------ operations


def test_delete_replaces_updated_fragments_and_drops_deleted_ones() -> None:
    prev = manifest([frag(0), frag(1), frag(2)], max_fragment_id=2)
    updated = frag(1, deleted=3)
    built = build(
        prev,
        txn("delete", updated_fragments=[updated], deleted_fragment_ids=[2], predicate="a < 3"),
    )
    assert ids(built) == [0, 1]
    assert built.manifest.fragments[1] == updated
    assert built.manifest.reader_feature_flags == 1 and built.manifest.writer_feature_flags == 1


def test_deletion_flag_is_cleared_when_no_fragment_has_a_deletion_file() -> None:
    prev = manifest([frag(0), frag(1, deleted=2)], max_fragment_id=1)
    assert prev.reader_feature_flags == 1
    built = build(prev, txn("delete", deleted_fragment_ids=[1]))
    assert built.manifest.reader_feature_flags == 0 and built.manifest.writer_feature_flags == 0


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("delete", {"deleted_fragment_ids": [0, 5]}),
        ("delete", {"updated_fragments": [frag(9, deleted=1)]}),
        ("update", {"removed_fragment_ids": [6]}),
        ("update", {"updated_fragments": [frag(7)]}),
        (
            "data_replacement",
            {"replacements": [Txn.DataReplacementGroup(fragment_id=8, new_file=data_file((1,)))]},
        ),
    ],
)
def test_unknown_fragment_ids_are_a_typed_error(op: str, fields: dict[str, Any]) -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=3)
    with pytest.raises(InvalidTransactionError) as info:
        build(prev, txn(op, read_version=2, **fields))
    err = info.value
    assert isinstance(err, CommitError)
    assert err.previous_version == 3 and err.version == 4 and err.read_version == 2
    assert err.fragment_ids and all(i not in (0, 1) for i in err.fragment_ids)
    assert "do not exist in version 3" in str(err) and "read_version 2" in str(err)


def test_rewrite_of_unknown_fragment_is_a_typed_error() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=1)
    group = Txn.Rewrite.RewriteGroup(old_fragments=[frag(0), frag(5)], new_fragments=[frag(0, 20)])
    with pytest.raises(InvalidTransactionError, match=r"\[5\]") as info:
        build(prev, txn("rewrite", groups=[group]))
    assert info.value.fragment_ids == (5,)


def test_operations_other_than_overwrite_need_a_table() -> None:
    with pytest.raises(InvalidTransactionError, match="non-existent dataset"):
        build(None, txn("append", read_version=0, fragments=[frag(0)]))


def test_overwrite_of_existing_table() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=3, config={"keep": "1", "over": "old"})
    new_schema = [field(0, "x", logical_type="string")]
    t = txn(
        "overwrite",
        fragments=[frag(0, 4, files=[data_file((0,))])],
        schema=new_schema,
        schema_metadata={"m": b"1"},
        config_upsert_values={"over": "new", "add": "2"},
    )
    built = build(prev, t, indices=[index("a_idx", [0], [0, 1])])
    m = built.manifest
    # pylance 14: ids continue after the high-water mark on Overwrite too
    assert ids(built) == [4]
    assert m.max_fragment_id == 4
    assert list(m.fields) == new_schema
    assert dict(m.schema_metadata) == {"m": b"1"}
    assert dict(m.config) == {"keep": "1", "over": "new", "add": "2"}
    assert dict(m.table_metadata) == {"team": "data"}
    assert built.indices == []
    assert m.writer_feature_flags == 8


def test_overwrite_creates_a_table() -> None:
    t = txn(
        "overwrite",
        read_version=0,
        fragments=[frag(0, 3, files=[data_file(version=(2, 1))])],
        schema=SCHEMA,
    )
    t.overwrite.config_upsert_values["c"] = "1"
    built = build(None, t)
    m = built.manifest
    assert m.version == 1 and ids(built) == [0] and m.max_fragment_id == 0
    assert m.data_format.file_format == "lance" and m.data_format.version == "2.1"
    assert dict(m.config) == {"c": "1"} and m.writer_feature_flags == 8
    assert not m.HasField("index_section") and built.indices == []


def test_new_table_storage_version() -> None:
    empty = txn("overwrite", read_version=0, schema=SCHEMA)
    assert build(None, empty).manifest.data_format.version == DEFAULT_DATA_STORAGE_VERSION == "2.2"
    assert build(None, empty, data_storage_version="2.0").manifest.data_format.version == "2.0"
    with_files = txn("overwrite", read_version=0, schema=SCHEMA, fragments=[frag(0)])
    with pytest.raises(
        InvalidTransactionError, match=r"requested data storage version \(2.1\) does not match"
    ):
        build(None, with_files, data_storage_version="2.1")
    mixed = txn(
        "overwrite",
        read_version=0,
        schema=SCHEMA,
        fragments=[frag(0), frag(0, files=[data_file(version=(2, 0))])],
    )
    with pytest.raises(InvalidTransactionError, match="All data files must have the same version"):
        build(None, mixed)


def test_files_of_another_storage_version_are_refused() -> None:
    with pytest.raises(InvalidTransactionError, match=r"Detected both 2\.2 and 2\.1"):
        build(
            manifest([frag(0)]),
            txn("append", fragments=[frag(0, files=[data_file(version=(2, 1))])]),
        )
    prev = manifest([])
    with pytest.raises(
        InvalidTransactionError,
        match=r"added files with version 2\.1\. However, the data storage version is 2\.2",
    ):
        build(prev, txn("append", fragments=[frag(0, files=[data_file(version=(2, 1))])]))


def test_overwrite_with_initial_bases() -> None:
    t = txn(
        "overwrite",
        read_version=0,
        schema=SCHEMA,
        initial_bases=[table_pb2.BasePath(id=1, path="s3://b/other", is_dataset_root=True)],
    )
    built = build(None, t)
    assert [b.path for b in built.manifest.base_paths] == ["s3://b/other"]
    assert built.manifest.reader_feature_flags == 16 and built.manifest.writer_feature_flags == 16
    with pytest.raises(InvalidTransactionError, match="OVERWRITE mode cannot register new bases"):
        build(manifest([frag(0)]), t)
    dup = txn(
        "overwrite",
        read_version=0,
        schema=SCHEMA,
        initial_bases=[table_pb2.BasePath(id=1, path="a"), table_pb2.BasePath(id=1, path="b")],
    )
    with pytest.raises(InvalidTransactionError, match="Duplicate base path ID 1"):
        build(None, dup)


def test_update_moves_rows_and_prunes_index_bitmaps_of_modified_fields() -> None:
    prev = manifest([frag(0), frag(1), frag(2)], max_fragment_id=2)
    idx_b = index("b_idx", [1], [0, 1, 2])
    idx_a = index("a_idx", [0], [0, 1, 2])
    t = txn(
        "update",
        removed_fragment_ids=[2],
        updated_fragments=[frag(1, deleted=4)],
        new_fragments=[frag(0, 14)],
        fields_modified=[1],
    )
    built = build(prev, t, indices=[idx_a, idx_b])
    assert ids(built) == [0, 1, 3]
    assert built.manifest.fragments[1].deletion_file.num_deleted_rows == 4
    by_name = {i.name: i for i in built.indices}
    assert bitmap_ids(by_name["b_idx"]) == [0, 2]  # fragment 1 changed field 1
    assert bitmap_ids(by_name["a_idx"]) == [0, 1, 2]


def test_create_index_adds_and_removes_by_uuid() -> None:
    prev = manifest([frag(0)])
    old = index("a_idx", [0], [0])
    other = index("b_idx", [1], [0])
    new = index("a_idx", [0], [0], version=3)
    built = build(
        prev, txn("create_index", new_indices=[new], removed_indices=[old]), indices=[old, other]
    )
    assert [i.uuid.uuid for i in built.indices] == [other.uuid.uuid, new.uuid.uuid]
    dropped = build(prev, txn("create_index", removed_indices=[other]), indices=[old, other])
    assert [i.name for i in dropped.indices] == ["a_idx"]
    # re-listing an index already present replaces it (deduplicated by uuid)
    relisted = build(prev, txn("create_index", new_indices=[old]), indices=[old, other])
    assert [i.name for i in relisted.indices] == ["b_idx", "a_idx"]


def test_rewrite_groups_remap_index_bitmaps_and_swap_rewritten_indices() -> None:
    prev = manifest([frag(0), frag(1), frag(2), frag(3)], max_fragment_id=5)  # 4, 5 reserved
    idx = index("a_idx", [0], [0, 1, 2])
    untouched = index("b_idx", [1], [2])
    group = Txn.Rewrite.RewriteGroup(old_fragments=[frag(0), frag(1)], new_fragments=[frag(4, 20)])
    rewritten = Txn.Rewrite.RewrittenIndex(
        new_index_version=9, new_index_files=[table_pb2.IndexFile(path="new.idx", size_bytes=5)]
    )
    rewritten.old_id.uuid = idx.uuid.uuid
    rewritten.new_id.uuid = uuid.uuid4().bytes
    rewritten.new_index_details.type_url = BTREE_DETAILS
    built = build(
        prev,
        txn("rewrite", groups=[group], rewritten_indices=[rewritten]),
        indices=[idx, untouched],
    )
    assert ids(built) == [2, 3, 4]
    assert built.manifest.max_fragment_id == 5
    new_idx = built.indices[0]
    assert new_idx.uuid.uuid == rewritten.new_id.uuid
    assert bitmap_ids(new_idx) == [2, 4]
    assert [f.path for f in new_idx.files] == ["new.idx"]
    assert bitmap_ids(built.indices[1]) == [2]


def test_rewrite_legacy_flat_lists_and_split_group() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=1)
    built = build(
        prev, txn("rewrite", old_fragments=[frag(0), frag(1)], new_fragments=[frag(0, 20)])
    )
    assert ids(built) == [2]  # unassigned new fragment gets the next id
    idx = index("a_idx", [0], [0])
    group = Txn.Rewrite.RewriteGroup(old_fragments=[frag(0), frag(1)], new_fragments=[frag(0, 20)])
    r = Txn.Rewrite.RewrittenIndex()
    r.old_id.uuid, r.new_id.uuid = idx.uuid.uuid, uuid.uuid4().bytes
    r.new_index_details.type_url = BTREE_DETAILS
    with pytest.raises(InvalidTransactionError, match="split of indexed and non-indexed"):
        build(prev, txn("rewrite", groups=[group], rewritten_indices=[r]), indices=[idx])


def test_merge_replaces_fragments_and_schema() -> None:
    prev = manifest(
        [frag(0, files=[data_file((0,))]), frag(1, files=[data_file((0,))])],
        max_fragment_id=1,
        fields=SCHEMA[:1],
    )
    merged = [frag(i, files=[data_file((0,)), data_file((1,))]) for i in (0, 1)]
    built = build(prev, txn("merge", fragments=merged, schema=SCHEMA))
    assert list(built.manifest.fields) == SCHEMA
    assert list(built.manifest.fragments) == merged
    assert dict(built.manifest.schema_metadata) == {"owner": b"tests"}  # empty in the op: kept
    with pytest.raises(InvalidTransactionError, match="missing original fragments"):
        build(prev, txn("merge", fragments=[*merged[:1], frag(7)], schema=SCHEMA))
    with pytest.raises(InvalidTransactionError, match="changed row count for fragment 1"):
        build(prev, txn("merge", fragments=[merged[0], frag(1, 99)], schema=SCHEMA))


def test_merge_may_add_fragments_above_the_high_water_mark_only() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=4)
    ok = build(prev, txn("merge", fragments=[frag(0), frag(1), frag(5)], schema=SCHEMA))
    assert ids(ok) == [0, 1, 5] and ok.manifest.max_fragment_id == 5
    with pytest.raises(InvalidTransactionError, match="never reused") as info:
        build(prev, txn("merge", fragments=[frag(0), frag(1), frag(3)], schema=SCHEMA))
    assert info.value.fragment_ids == (3,)


def test_project_drops_fields_files_and_indices() -> None:
    f0 = frag(0, files=[data_file((0,)), data_file((1,))])
    prev = manifest([f0], max_fragment_id=0)
    built = build(
        prev,
        txn("project", schema=SCHEMA[:1]),
        indices=[index("a_idx", [0], [0]), index("b_idx", [1], [0])],
    )
    assert list(built.manifest.fields) == SCHEMA[:1]
    assert [list(df.fields) for df in built.manifest.fragments[0].files] == [[0]]
    assert [i.name for i in built.indices] == ["a_idx"]
    assert dict(built.manifest.schema_metadata) == {"owner": b"tests"}


def test_tombstoned_data_files_are_removed() -> None:
    prev = manifest([frag(0, files=[data_file((0,)), data_file((-2,))])], max_fragment_id=0)
    built = build(prev, txn("update_config", config_updates=update_map({"k": "v"})))
    assert [list(df.fields) for df in built.manifest.fragments[0].files] == [[0]]


def test_data_replacement() -> None:
    a_file, b_file = data_file((0,), "a.lance"), data_file((1,), "b.lance")
    prev = manifest([frag(0, files=[a_file, b_file]), frag(1, files=[a_file])], max_fragment_id=1)
    idx = index("b_idx", [1], [0, 1])
    new_b = data_file((1,), "b2.lance")
    new_b.file_size_bytes = 777
    groups = [
        Txn.DataReplacementGroup(fragment_id=0, new_file=new_b),
        Txn.DataReplacementGroup(fragment_id=1, new_file=new_b),
    ]
    built = build(prev, txn("data_replacement", replacements=groups), indices=[idx])
    f0, f1 = built.manifest.fragments
    assert [(df.path, df.file_size_bytes) for df in f0.files] == [
        ("a.lance", 100),
        ("b2.lance", 777),
    ]
    assert [df.path for df in f1.files] == [
        "a.lance",
        "b2.lance",
    ]  # column was all-null: file added
    assert bitmap_ids(built.indices[0]) == []  # both fragments' field 1 replaced
    mismatch = data_file((1,), "b3.lance", version=(2, 1))
    with pytest.raises(InvalidTransactionError, match="no changes were made"):
        build(
            prev,
            txn(
                "data_replacement",
                replacements=[Txn.DataReplacementGroup(fragment_id=0, new_file=mismatch)],
            ),
        )
    with pytest.raises(InvalidTransactionError, match="must have the same fields"):
        build(
            prev,
            txn(
                "data_replacement",
                replacements=[
                    Txn.DataReplacementGroup(fragment_id=0, new_file=new_b),
                    Txn.DataReplacementGroup(fragment_id=1, new_file=data_file((0,))),
                ],
            ),
        )


def test_update_bases() -> None:
    prev = manifest([frag(0)])
    built = build(
        prev,
        txn(
            "update_bases",
            new_bases=[
                table_pb2.BasePath(path="/x", name="x"),
                table_pb2.BasePath(path="/y", name="y"),
            ],
        ),
    )
    assert [(b.id, b.name, b.path) for b in built.manifest.base_paths] == [
        (1, "x", "/x"),
        (2, "y", "/y"),
    ]
    assert built.manifest.reader_feature_flags & 16 and built.manifest.writer_feature_flags & 16
    for bad in (
        table_pb2.BasePath(path="/x", name="other"),
        table_pb2.BasePath(path="/z", name="x"),
        table_pb2.BasePath(id=2, path="/z", name="z"),
    ):
        with pytest.raises(InvalidTransactionError, match="already exists"):
            build(built.manifest, txn("update_bases", read_version=4, new_bases=[bad]))
    # Lance compares optional names: two unnamed bases conflict
    unnamed = build(prev, txn("update_bases", new_bases=[table_pb2.BasePath(path="/u1")]))
    with pytest.raises(InvalidTransactionError, match="already exists"):
        build(
            unnamed.manifest,
            txn("update_bases", read_version=4, new_bases=[table_pb2.BasePath(path="/u2")]),
        )


def test_update_mem_wal_state() -> None:
    prev = manifest([frag(0)])
    region = uuid.uuid4().bytes
    mg = table_pb2.MergedGeneration(generation=3)
    mg.region_id.uuid = region
    first = build(
        prev,
        txn("update_mem_wal_state", merged_generations=[mg]),
        indices=[index("a_idx", [0], [0])],
    )
    mem = [i for i in first.indices if i.name == MEM_WAL_INDEX_NAME]
    assert len(mem) == 1 and mem[0].dataset_version == 4 and not mem[0].fragment_bitmap
    details = table_pb2.MemWalIndexDetails.FromString(mem[0].index_details.value)
    assert [(g.region_id.uuid, g.generation) for g in details.merged_generations] == [(region, 3)]
    lower = table_pb2.MergedGeneration(generation=2)
    lower.region_id.uuid = region
    other = table_pb2.MergedGeneration(generation=1)
    other.region_id.uuid = uuid.uuid4().bytes
    second = build(
        first.manifest,
        txn("update_mem_wal_state", read_version=4, merged_generations=[lower, other]),
        indices=first.indices,
    )
    mem2 = [i for i in second.indices if i.name == MEM_WAL_INDEX_NAME]
    details2 = table_pb2.MemWalIndexDetails.FromString(mem2[0].index_details.value)
    assert [g.generation for g in details2.merged_generations] == [
        3,
        1,
    ]  # the higher generation wins
    assert [i.name for i in second.indices] == ["a_idx", MEM_WAL_INDEX_NAME]


# ---------------------------------------------------------------- UpdateConfig


def test_update_config_maps() -> None:
    prev = manifest([frag(0)], config={"a": "1", "b": "2"})
    t = txn("update_config")
    t.update_config.config_updates.CopyFrom(
        update_map({"a": "10", "b": None, "c": "3", "zz": None})
    )
    t.update_config.table_metadata_updates.CopyFrom(update_map({"x": "1"}, replace=True))
    t.update_config.schema_metadata_updates.CopyFrom(update_map({"owner": None, "s": "v"}))
    t.update_config.field_metadata_updates[1].CopyFrom(update_map({"unit": "m"}))
    m = build(prev, t).manifest
    assert dict(m.config) == {"a": "10", "c": "3"}
    assert dict(m.table_metadata) == {"x": "1"}
    assert dict(m.schema_metadata) == {"s": b"v"}
    assert dict(m.fields[1].metadata) == {"unit": b"m"}
    assert m.writer_feature_flags == 8


def test_update_config_replace_drops_keys_without_values_and_clears_the_flag() -> None:
    prev = manifest([frag(0)], config={"a": "1"})
    t = txn("update_config", config_updates=update_map({"gone": None}, replace=True))
    m = build(prev, t).manifest
    assert dict(m.config) == {} and m.writer_feature_flags == 0


def test_first_config_key_sets_flag_in_the_same_version() -> None:
    m = build(
        manifest([frag(0)]), txn("update_config", config_updates=update_map({"k": "v"}))
    ).manifest
    assert m.writer_feature_flags == 8


def test_update_config_deprecated_fields() -> None:
    prev = manifest([frag(0)], config={"a": "1", "b": "2"})
    t = txn(
        "update_config",
        upsert_values={"c": "3"},
        delete_keys=["a"],
        schema_metadata={"new": "meta"},
    )
    t.update_config.field_metadata[0].metadata["k"] = "v"
    m = build(prev, t).manifest
    assert dict(m.config) == {"b": "2", "c": "3"}
    assert dict(m.schema_metadata) == {"new": b"meta"}  # old style replaced the map
    assert dict(m.fields[0].metadata) == {"k": b"v"}


def test_update_config_errors() -> None:
    prev = manifest([frag(0)])
    mixed = txn("update_config", upsert_values={"a": "1"}, config_updates=update_map({"b": "2"}))
    with pytest.raises(InvalidTransactionError, match="Cannot mix old and new style"):
        build(prev, mixed)
    missing = txn("update_config")
    missing.update_config.field_metadata_updates[42].CopyFrom(update_map({"k": "v"}))
    with pytest.raises(InvalidTransactionError, match="Field with id 42 does not exist"):
        build(prev, missing)


def test_primary_key_via_field_metadata_is_set_once() -> None:
    prev = manifest([frag(0)])
    t = txn("update_config")
    t.update_config.field_metadata_updates[0].CopyFrom(
        update_map({"lance-schema:unenforced-primary-key:position": "1"})
    )
    m = build(prev, t).manifest
    assert m.fields[0].unenforced_primary_key and m.fields[0].unenforced_primary_key_position == 1
    again = txn("update_config", read_version=4)
    again.update_config.field_metadata_updates[1].CopyFrom(
        update_map({"lance-schema:unenforced-primary-key": "true"})
    )
    with pytest.raises(InvalidTransactionError, match="cannot be changed once set"):
        build(m, again)
    bad = txn("update_config")
    bad.update_config.field_metadata_updates[0].CopyFrom(
        update_map({"lance-schema:unenforced-primary-key:position": "x"})
    )
    with pytest.raises(InvalidTransactionError, match="cannot be set to an invalid value"):
        build(prev, bad)


# ------------------------------------------------------------------- restore


def test_restore_takes_the_old_manifest_as_is() -> None:
    old = manifest([frag(0)], version=2, max_fragment_id=0)
    old.writer_version.version = "0.8.0"
    old_indices = [index("a_idx", [0], [0])]
    current = manifest([frag(0), frag(5)], version=6, max_fragment_id=9)
    t = txn("restore", read_version=6, version=2)
    built = build(current, t, restore_source=(old, old_indices))
    m = built.manifest
    assert m.version == 7
    assert ids(built) == [0]
    assert m.max_fragment_id == 9  # never regresses
    assert m.writer_version.version == "0.8.0"  # readers' workarounds key off it
    assert m.transaction_file == f"6-{t.uuid}.txn"
    assert m.timestamp.ToDatetime(tzinfo=UTC) == NOW
    assert not m.HasField("index_section") and not m.HasField("inline_transaction_position")
    assert built.indices == old_indices


def test_restore_needs_the_restored_manifest() -> None:
    current = manifest([frag(0)], version=6)
    with pytest.raises(InvalidTransactionError, match=r"restore_source is required.*version 2"):
        build(current, txn("restore", read_version=6, version=2))
    with pytest.raises(InvalidTransactionError, match="restore_source is version 3"):
        build(
            current,
            txn("restore", read_version=6, version=2),
            restore_source=(manifest([], version=3), []),
        )


def _clone_txn(**fields: Any) -> Txn:
    fields.setdefault("is_shallow", True)
    fields.setdefault("ref_path", "s3://b/src.lance")
    fields.setdefault("ref_version", 3)
    return txn("clone", read_version=0, **fields)


def test_clone_is_the_source_version_reading_its_files_through_a_new_base_path() -> None:
    moved = data_file()
    moved.base_id = 0  # the source is itself a clone: this file is its source's
    source = manifest([frag(0, deleted=2), frag(1, files=[moved])], version=3, config={"k": "v"})
    source.base_paths.add(id=0, is_dataset_root=True, path="s3://b/origin.lance")
    own_index = index("id_idx", [0], [0, 1])
    inherited = index("vec_idx", [1], [0, 1])
    inherited.base_id = 0
    built = build(None, _clone_txn(), clone_source=(source, [own_index, inherited]))
    m = built.manifest
    assert m.version == 1
    assert [(b.id, b.path, b.is_dataset_root) for b in m.base_paths] == [
        (0, "s3://b/origin.lance", True),
        (1, "s3://b/src.lance", True),
    ]
    # the source's own files are read from the source; its inherited one keeps its base
    assert [[f.base_id for f in frag.files] for frag in m.fragments] == [[1], [0]]
    assert m.fragments[0].deletion_file.base_id == 1
    assert [(i.name, i.base_id) for i in built.indices] == [("id_idx", 1), ("vec_idx", 0)]
    assert list(m.fields) == list(source.fields) and dict(m.config) == {"k": "v"}
    assert m.table_metadata["team"] == "data" and m.schema_metadata["owner"] == b"tests"
    assert m.reader_feature_flags == 1 | 16 and m.writer_feature_flags == 1 | 8 | 16
    assert m.tag == "" and m.transaction_file.startswith("0-")
    assert m.timestamp.ToDatetime(tzinfo=UTC) == NOW
    assert m.writer_version.library == "lancetx"
    assert not m.HasField("index_section") and not m.HasField("inline_transaction_position")
    # the inputs are untouched
    assert not source.fragments[0].files[0].HasField("base_id") and len(source.base_paths) == 1


def test_clone_refuses_what_lance_would_not_build() -> None:
    source = manifest([frag(0)], version=3)
    with pytest.raises(InvalidTransactionError, match="clone_source is required"):
        build(None, _clone_txn())
    with pytest.raises(InvalidTransactionError, match="clone_source is version 3, but"):
        build(None, _clone_txn(ref_version=2), clone_source=(source, []))
    with pytest.raises(InvalidTransactionError, match="first operation of a table"):
        build(manifest([frag(0)], version=1), _clone_txn(), clone_source=(source, []))
    with pytest.raises(UnsupportedFeatureError, match="deep clone"):
        build(None, _clone_txn(is_shallow=False), clone_source=(source, []))
    with pytest.raises(UnsupportedFeatureError, match="branch 'dev'"):
        build(None, _clone_txn(branch_name="dev"), clone_source=(source, []))
    external = frag(0)
    external.external_row_ids.path = "rows.bin"
    with pytest.raises(UnsupportedFeatureError, match="external_row_ids"):
        build(None, _clone_txn(), clone_source=(manifest([external], version=3), []))


def test_a_version_naming_an_unregistered_base_is_never_built() -> None:
    elsewhere = data_file()
    elsewhere.base_id = 4
    with pytest.raises(InvalidTransactionError, match=r"stored under base path id 4.*register"):
        build(
            None,
            txn("overwrite", read_version=0, fragments=[frag(0, files=[elsewhere])], schema=SCHEMA),
        )
    current = manifest([frag(0)], version=3)
    current.base_paths.add(id=4, is_dataset_root=False, path="s3://b/archive")
    # registered: appended fine; its deletion file may not live under a non-root base
    done = build(current, txn("append", fragments=[frag(1, files=[elsewhere])]))
    assert [f.base_id for f in done.manifest.fragments[1].files] == [4]
    deleted = frag(0, deleted=1)
    deleted.deletion_file.base_id = 4
    with pytest.raises(InvalidTransactionError, match="not a dataset root"):
        build(current, txn("delete", updated_fragments=[deleted]))


def test_transaction_without_operation_is_refused() -> None:
    with pytest.raises(InvalidTransactionError, match="no operation"):
        build_manifest(
            manifest([frag(0)]), [], Txn(read_version=3, uuid="u"), version=4, transaction_file="x"
        )


# -------------------------------------------------------------- feature flags


def test_unknown_feature_flags_of_the_previous_version_are_refused() -> None:
    prev = manifest([frag(0)])
    prev.reader_feature_flags |= 64
    prev.writer_feature_flags |= 64
    with pytest.raises(UnsupportedTransactionError, match="1<<6") as info:
        build(prev, txn("append", fragments=[frag(0)]))
    assert isinstance(info.value, UnsupportedFeatureError) and info.value.flags == 64


def test_no_transaction_file_sets_writer_flag_32() -> None:
    m = build(manifest([frag(0)]), txn("append", fragments=[frag(0)]), transaction_file="").manifest
    assert m.writer_feature_flags == 32 and m.transaction_file == ""


def test_fragments_with_unknown_proto_fields_are_refused() -> None:
    overlay = table_pb2.DataFragment.FromString(
        frag(0).SerializeToString() + bytes([0x5A, 0x00])
    )  # field 11
    with pytest.raises(UnsupportedTransactionError, match=r"\[11\]"):
        build(manifest([frag(0)]), txn("append", fragments=[overlay]))


def test_empty_vector_index_is_dropped_when_its_fragments_go() -> None:
    prev = manifest([frag(0), frag(1)], max_fragment_id=1)
    vec = index("vec_idx", [1], [1], details=VECTOR_DETAILS)
    scalar = index("a_idx", [0], [1])
    built = build(prev, txn("delete", deleted_fragment_ids=[1]), indices=[vec, scalar])
    assert [i.name for i in built.indices] == ["a_idx"]


# --------------------------------------------------------------- stable row ids


def stable(m: table_pb2.Manifest, next_row_id: int) -> table_pb2.Manifest:
    m.reader_feature_flags |= 2
    m.writer_feature_flags |= 2
    m.next_row_id = next_row_id
    return m


def test_stable_row_ids_on_append() -> None:
    f0 = frag(0, 10)
    f0.inline_row_ids = rowids.encode_row_id_range(0, 10)
    prev = stable(manifest([f0], max_fragment_id=0), 10)
    partial = frag(0, 4)
    partial.inline_row_ids = rowids.encode_row_ids([3, 5])
    built = build(prev, txn("append", fragments=[frag(0, 5), partial]))
    m = built.manifest
    assert m.next_row_id == 17 and m.reader_feature_flags == 2
    assert rowids.decode_row_ids(m.fragments[1].inline_row_ids) == [10, 11, 12, 13, 14]
    seq = rowids_pb2.RowIdSequence.FromString(m.fragments[1].inline_row_ids)
    assert seq.segments[0].WhichOneof("segment") == "range"
    assert rowids.decode_row_ids(m.fragments[2].inline_row_ids) == [3, 5, 15, 16]
    for f in m.fragments[1:]:
        assert rowids.decode_versions(f.inline_created_at_versions) == [4] * f.physical_rows
        assert rowids.decode_versions(f.inline_last_updated_at_versions) == [4] * f.physical_rows


def test_stable_row_ids_for_a_new_table_and_not_for_an_existing_one() -> None:
    t = txn("overwrite", read_version=0, schema=SCHEMA, fragments=[frag(0, 3)])
    m = build(None, t, enable_stable_row_ids=True).manifest
    assert m.next_row_id == 3 and m.reader_feature_flags == 2 and m.writer_feature_flags == 2
    with pytest.raises(
        InvalidTransactionError, match="Cannot enable stable row ids on existing dataset"
    ):
        build(manifest([frag(0)]), txn("append", fragments=[frag(0)]), enable_stable_row_ids=True)
    too_many = frag(0, 1)
    too_many.inline_row_ids = rowids.encode_row_ids([1, 2])
    with pytest.raises(InvalidTransactionError, match="more row IDs"):
        build(
            None,
            txn("overwrite", read_version=0, schema=SCHEMA, fragments=[too_many]),
            enable_stable_row_ids=True,
        )


def test_stable_row_ids_require_row_ids_on_every_fragment() -> None:
    f0 = frag(0, 10)
    f0.inline_row_ids = rowids.encode_row_id_range(0, 10)
    prev = stable(manifest([f0], max_fragment_id=0), 10)
    group = Txn.Rewrite.RewriteGroup(
        old_fragments=[f0], new_fragments=[frag(0, 10)]
    )  # lost its row ids
    with pytest.raises(InvalidTransactionError, match="All fragments must have row ids"):
        build(prev, txn("rewrite", groups=[group]))


def test_stable_row_id_update_keeps_created_at_of_moved_rows() -> None:
    f0 = frag(0, 4)
    f0.inline_row_ids = rowids.encode_row_id_range(0, 4)
    f0.inline_created_at_versions = rowids.encode_versions([1, 1, 2, 2])
    f0.inline_last_updated_at_versions = rowids.encode_versions([1, 1, 2, 2])
    prev = stable(manifest([f0], version=5, max_fragment_id=0), 4)
    moved = frag(0, 3)
    moved.inline_row_ids = rowids.encode_row_ids([1, 2])  # two updated rows + one inserted row
    t = txn(
        "update",
        read_version=5,
        updated_fragments=[frag(0, 4, deleted=2)],
        new_fragments=[moved],
        fields_modified=[1],
    )
    t.update.updated_fragments[0].inline_row_ids = f0.inline_row_ids
    m = build(prev, t).manifest
    new = m.fragments[1]
    assert rowids.decode_row_ids(new.inline_row_ids) == [1, 2, 4]
    assert rowids.decode_versions(new.inline_created_at_versions) == [1, 2, 6]
    assert rowids.decode_versions(new.inline_last_updated_at_versions) == [6, 6, 6]
    assert m.next_row_id == 5


def stable_frag(fid: int, row_ids: list[int], version: int = 1) -> table_pb2.DataFragment:
    f = frag(fid, len(row_ids))
    f.inline_row_ids = rowids.encode_row_ids(row_ids)
    f.inline_created_at_versions = rowids.uniform_versions(len(row_ids), version)
    f.inline_last_updated_at_versions = rowids.uniform_versions(len(row_ids), version)
    return f


def test_stable_row_id_update_registers_pure_rewrites_in_unaffected_indices() -> None:
    f0 = stable_frag(0, [0, 1, 2, 3])
    prev = stable(manifest([f0], version=5, max_fragment_id=0), 4)
    on_a = index("a_idx", [0], [0])
    on_b = index("b_idx", [1], [0])
    moved = frag(0, 2)
    moved.inline_row_ids = rowids.encode_row_ids([1, 2])
    updated = stable_frag(0, [0, 1, 2, 3])
    updated.deletion_file.CopyFrom(table_pb2.DeletionFile(read_version=5, id=1, num_deleted_rows=2))
    t = txn(
        "update",
        read_version=5,
        updated_fragments=[updated],
        new_fragments=[moved],
        fields_modified=[1],
        fields_for_preserving_frag_bitmap=[1],
    )
    built = build(prev, t, indices=[on_a, on_b])
    by_name = {i.name: i for i in built.indices}
    # a is untouched by the update and covered fragment 0: the moved rows stay indexed
    assert bitmap_ids(by_name["a_idx"]) == [0, 1]
    # b was modified: fragment 0 leaves its bitmap and the new fragment is not added
    assert bitmap_ids(by_name["b_idx"]) == []


def test_stable_row_id_rewrite_columns_refreshes_last_updated_of_touched_rows() -> None:
    f0 = stable_frag(0, [0, 1, 2, 3], version=2)
    prev = stable(manifest([f0], version=5, max_fragment_id=0), 4)
    updated = table_pb2.DataFragment()
    updated.CopyFrom(f0)
    updated.files.append(data_file((1,), "b-new.lance"))
    t = txn("update", read_version=5, updated_fragments=[updated], fields_modified=[1])
    t.update.update_mode = Txn.REWRITE_COLUMNS
    t.update.updated_fragment_offsets[0].values.extend([1, 3])
    m = build(prev, t).manifest
    assert rowids.decode_versions(m.fragments[0].inline_last_updated_at_versions) == [2, 6, 2, 6]
    assert rowids.decode_versions(m.fragments[0].inline_created_at_versions) == [2, 2, 2, 2]


def test_stable_row_id_merge_refreshes_versions_of_rewritten_and_new_fragments() -> None:
    f0, f1 = stable_frag(0, [0, 1], version=2), stable_frag(1, [2, 3], version=2)
    prev = stable(manifest([f0, f1], version=5, max_fragment_id=1), 4)
    rewritten = table_pb2.DataFragment()
    rewritten.CopyFrom(f1)
    rewritten.files.append(data_file((1,), "c.lance"))
    brand_new = stable_frag(2, [4, 5])
    brand_new.ClearField("created_at_version_sequence")
    m = build(
        prev, txn("merge", read_version=5, fragments=[f0, rewritten, brand_new], schema=SCHEMA)
    ).manifest
    versions = {
        f.id: (
            rowids.decode_versions(f.inline_created_at_versions),
            rowids.decode_versions(f.inline_last_updated_at_versions),
        )
        for f in m.fragments
    }
    assert versions[0] == ([2, 2], [2, 2])  # untouched
    assert versions[1] == ([2, 2], [6, 6])  # data files changed
    assert versions[2] == ([6, 6], [6, 6])  # new fragment


# ------------------------------------------------------------------ immutability


def _snapshot(msgs: Iterable[Any]) -> list[bytes]:
    return [m.SerializeToString(deterministic=True) for m in msgs]


@pytest.mark.parametrize(
    "make_txn",
    [
        lambda: txn("append", fragments=[frag(0)]),
        lambda: txn("delete", updated_fragments=[frag(1, deleted=1)], deleted_fragment_ids=[0]),
        lambda: txn(
            "overwrite", fragments=[frag(0)], schema=SCHEMA, config_upsert_values={"x": "1"}
        ),
        lambda: txn(
            "update", removed_fragment_ids=[0], new_fragments=[frag(0)], fields_modified=[0]
        ),
        lambda: txn(
            "rewrite",
            groups=[Txn.Rewrite.RewriteGroup(old_fragments=[frag(0)], new_fragments=[frag(0)])],
        ),
        lambda: txn("project", schema=SCHEMA[:1]),
        lambda: txn(
            "update_config", config_updates=update_map({"a": None, "n": "1"}, replace=True)
        ),
        lambda: txn("reserve_fragments", num_fragments=2),
        lambda: txn("merge", fragments=[frag(0), frag(1, deleted=1), frag(5)], schema=SCHEMA),
        lambda: txn("create_index", new_indices=[index("n", [1], [0])]),
        lambda: txn("update_bases", new_bases=[table_pb2.BasePath(path="/p", name="p")]),
        lambda: txn(
            "data_replacement",
            replacements=[
                Txn.DataReplacementGroup(fragment_id=1, new_file=data_file((0, 1), "r.lance"))
            ],
        ),
    ],
)
def test_inputs_are_not_mutated(make_txn: Callable[[], Txn]) -> None:
    prev = manifest([frag(0), frag(1, deleted=1)], max_fragment_id=1, config={"a": "1"})
    indices = [index("a_idx", [0], [0, 1])]
    t = make_txn()
    before = _snapshot([prev, t, *indices])
    built = build(prev, t, indices=indices)
    assert _snapshot([prev, t, *indices]) == before
    # the result shares nothing with the inputs
    built.manifest.fragments[0].id = 999
    for idx in built.indices:
        idx.name = "changed"
    assert _snapshot([prev, t, *indices]) == before


def test_restore_inputs_are_not_mutated() -> None:
    old = manifest([frag(0)], version=2)
    old_indices = [index("a_idx", [0], [0])]
    current = manifest([frag(0)], version=5, max_fragment_id=4)
    before = _snapshot([old, *old_indices, current])
    built = build(
        current, txn("restore", read_version=5, version=2), restore_source=(old, old_indices)
    )
    built.indices[0].name = "x"
    built.manifest.fragments[0].id = 1
    assert _snapshot([old, *old_indices, current]) == before


# --------------------------------------------------------- rowids / versioning


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ([], "range"),
        (list(range(5, 9)), "range"),
        ([*range(0, 100), *range(101, 300)], "range_with_holes"),
        ([v for v in range(0, 400) if v % 3], "range_with_bitmap"),
        ([1, 5000, 90000], "sorted_array"),
        ([2**40, 3, 7], "array"),
    ],
)
def test_row_id_segment_encodings_round_trip(values: list[int], kind: str) -> None:
    data = rowids.encode_row_ids(values)
    seq = rowids_pb2.RowIdSequence.FromString(data)
    assert seq.segments[0].WhichOneof("segment") == kind
    assert rowids.decode_row_ids(data) == values
    assert rowids.row_id_count(data) == len(values)


def test_version_runs() -> None:
    data = rowids.encode_versions([1, 1, 2, 2, 2, 1])
    seq = rowids_pb2.RowDatasetVersionSequence.FromString(data)
    assert [(r.span.range.start, r.span.range.end, r.version) for r in seq.runs] == [
        (0, 2, 1),
        (2, 5, 2),
        (5, 6, 1),
    ]
    assert rowids.decode_versions(data) == [1, 1, 2, 2, 2, 1]
    assert rowids.decode_versions(rowids.uniform_versions(3, 7)) == [7, 7, 7]
    assert rowids.uniform_versions(0, 7) == b""


def test_split_version() -> None:
    assert split_version("0.1.0") == ("0.1.0", None, None)
    assert split_version("1.2rc1+g12ab") == ("1.2.0", "rc1", "g12ab")
    assert split_version("2.0.0-beta.1") == ("2.0.0", "beta.1", None)
    assert split_version("0.1.0.dev3") == ("0.1.0", "dev3", None)
    wv = writer_version()
    assert wv.library == "lancetx" and wv.version.count(".") == 2


def test_serialized_bitmaps_have_no_run_containers() -> None:
    data = serialize_bitmap(BitMap(range(10_000)))
    assert data[:2] == b":0"  # SERIAL_COOKIE_NO_RUNCONTAINER, readable by every roaring-rs
    assert list(BitMap.deserialize(data)) == list(range(10_000))


# -------------------------------------------------- rebuilding pylance histories


def _extended_history(uri: str) -> None:
    """Operations beyond lance_fixtures' histories, all committed by pylance."""
    from lance.dataset import LanceOperation

    lance.write_dataset(lance_fixtures.rows(0, 100, vectors=False), uri, max_rows_per_file=40)

    def ds() -> lance.LanceDataset:
        return lance.dataset(uri)

    ds().create_scalar_index("a", "BTREE")
    ds().update_config({"k1": "v1", "k2": "v2"})
    ds().delete_config_keys(["k1"])
    ds().update_schema_metadata({"s": "1"})
    ds().update_field_metadata({"b": {"unit": "m"}})
    if hasattr(ds(), "update_metadata"):
        ds().update_metadata({"t": "1"})
    new = pa.table({"a": pa.array([1000, 5], pa.int64()), "b": pa.array([1, 2], pa.int64())})
    ds().merge_insert("a").when_matched_update_all().when_not_matched_insert_all().execute(new)
    ds().delete("a >= 90")
    ds().drop_index("a_idx") if hasattr(ds(), "drop_index") else None
    ds().optimize.compact_files(target_rows_per_fragment=1000)
    frags = lance.fragment.write_fragments(lance_fixtures.rows(500, 7, vectors=False), uri)
    lance.LanceDataset.commit(uri, LanceOperation.Append(frags), read_version=ds().version)
    ds().add_bases([lance.DatasetBasePath(str(Path(uri).parent / "other_base"), name="o")])
    ds().alter_columns({"path": "b", "name": "bb"})


def _rebuild_all(uri: Path, enable_stable: bool) -> list[str]:
    store = LocalObjectStore("/")
    base = str(uri).lstrip("/")
    files = {
        loc.version: decode_manifest(store.get(loc.key), path=loc.key)
        for loc in list_manifest_locations(store, base)
    }
    ops = []
    for version in sorted(files):
        mf = files[version]
        t = read_transaction_of(store, base, mf)
        assert t is not None
        op = t.WhichOneof("operation")
        ops.append(str(op))
        prev = files.get(version - 1)
        restore_source = None
        if op == "restore":
            src = files[t.restore.version]
            restore_source = (src.manifest, src.indices or [])
        built = build_manifest(
            prev.manifest if prev else None,
            (prev.indices or []) if prev else [],
            t,
            version=version,
            transaction_file=mf.manifest.transaction_file,
            restore_source=restore_source,
            now=mf.manifest.timestamp.ToDatetime(tzinfo=UTC),
            enable_stable_row_ids=enable_stable and prev is None,
        )
        expected, got = table_pb2.Manifest(), table_pb2.Manifest()
        expected.CopyFrom(mf.manifest)
        got.CopyFrom(built.manifest)
        for m in (expected, got):
            m.ClearField("index_section")
            m.ClearField("timestamp")  # pylance stores nanoseconds, datetime has microseconds
            if op != "restore":
                m.ClearField("writer_version")
            if op == "overwrite":
                # pylance writes Overwrite.schema_metadata empty ("TODO: handle metadata")
                m.ClearField("schema_metadata")
        assert got == expected, f"version {version} ({op}) differs from pylance's"
        assert [i.SerializeToString(deterministic=True) for i in built.indices] == [
            i.SerializeToString(deterministic=True) for i in (mf.indices or [])
        ], f"indices of version {version} ({op}) differ from pylance's"
    return ops


@pytest.mark.parametrize(
    ("builder", "stable_ids", "expected_ops"),
    [
        (
            lance_fixtures.build_history_table,
            False,
            {
                "overwrite",
                "append",
                "delete",
                "create_index",
                "update",
                "merge",
                "project",
                "reserve_fragments",
                "rewrite",
                "update_config",
                "restore",
            },
        ),
        (
            lance_fixtures.build_stable_row_id_table,
            True,
            {
                "overwrite",
                "append",
                "delete",
                "update",
                "create_index",
                "reserve_fragments",
                "rewrite",
            },
        ),
        (
            _extended_history,
            False,
            {
                "overwrite",
                "append",
                "delete",
                "create_index",
                "update",
                "update_config",
                "update_bases",
                "rewrite",
                "reserve_fragments",
                "project",
            },
        ),
    ],
    ids=["history", "stable-row-ids", "extended"],
)
def test_rebuilding_pylance_histories_gives_pylance_manifests(
    tmp_path: Path, builder: Callable[[str], Any], stable_ids: bool, expected_ops: set[str]
) -> None:
    uri = tmp_path / "t.lance"
    builder(str(uri))
    ops = _rebuild_all(uri, stable_ids)
    assert expected_ops <= set(ops), f"history lacks {expected_ops - set(ops)}"


def test_any_details_type_url_is_preserved() -> None:
    details = any_pb2.Any(type_url="type.googleapis.com/lance.table.MemWalIndexDetails", value=b"")
    current = index(MEM_WAL_INDEX_NAME, [], None)
    current.index_details.CopyFrom(details)
    mg = table_pb2.MergedGeneration(generation=1)
    mg.region_id.uuid = uuid.uuid4().bytes
    built = build(
        manifest([frag(0)]), txn("update_mem_wal_state", merged_generations=[mg]), indices=[current]
    )
    assert built.indices[0].index_details.type_url == details.type_url
    assert built.indices[0].uuid.uuid != current.uuid.uuid
