"""Each operation's effect on the manifest, on its own.

Every test starts a build from a small previous manifest (``start``: the state
``build_manifest`` hands to an operation), calls one ``apply_<op>`` /
``finish_<op>`` of :mod:`lancetx.commit.engine.builder.ops` directly, and checks
what that operation alone did: no sorting, no flags, no data-format check.
The whole pipeline is covered by test_builder (including the byte-exact
rebuild of pylance histories)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from pyroaring import BitMap

from lancetx.commit.engine.builder import (
    FRAG_REUSE_INDEX_NAME,
    MEM_WAL_INDEX_NAME,
    InvalidTransactionError,
    fragment_bitmap,
    serialize_bitmap,
)
from lancetx.commit.engine.builder.driver import start_from_previous
from lancetx.commit.engine.builder.ops import OPERATIONS
from lancetx.commit.engine.builder.ops.append import apply_append
from lancetx.commit.engine.builder.ops.clone import apply_clone
from lancetx.commit.engine.builder.ops.create_index import apply_create_index
from lancetx.commit.engine.builder.ops.data_replacement import apply_data_replacement
from lancetx.commit.engine.builder.ops.delete import apply_delete
from lancetx.commit.engine.builder.ops.merge import apply_merge
from lancetx.commit.engine.builder.ops.overwrite import apply_overwrite, finish_overwrite
from lancetx.commit.engine.builder.ops.project import apply_project
from lancetx.commit.engine.builder.ops.reserve_fragments import (
    apply_reserve_fragments,
    finish_reserve_fragments,
)
from lancetx.commit.engine.builder.ops.restore import apply_restore
from lancetx.commit.engine.builder.ops.rewrite import apply_rewrite
from lancetx.commit.engine.builder.ops.update import apply_update
from lancetx.commit.engine.builder.ops.update_bases import apply_update_bases, finish_update_bases
from lancetx.commit.engine.builder.ops.update_config import (
    apply_update_config,
    finish_update_config,
)
from lancetx.commit.engine.builder.ops.update_mem_wal_state import apply_update_mem_wal_state
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import file_pb2, table_pb2, transaction_pb2

Txn = transaction_pb2.Transaction
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def field(fid: int, name: str) -> file_pb2.Field:
    return file_pb2.Field(id=fid, name=name, parent_id=-1, logical_type="int64", nullable=True)


def data_file(fields: list[int], path: str = "") -> table_pb2.DataFile:
    return table_pb2.DataFile(
        path=path or f"{uuid.uuid4().hex}.lance",
        fields=fields,
        column_indices=list(range(len(fields))),
        file_major_version=2,
        file_minor_version=2,
        file_size_bytes=100,
    )


def frag(fid: int, rows: int = 10, fields: list[int] | None = None) -> table_pb2.DataFragment:
    out = table_pb2.DataFragment(id=fid, physical_rows=rows)
    out.files.append(data_file(fields if fields is not None else [0, 1]))
    return out


def previous(*fids: int, max_fragment_id: int | None = None) -> table_pb2.Manifest:
    """Version 3 of a table with columns a (0), b (1) and the given fragments."""
    m = table_pb2.Manifest(version=3)
    m.fields.extend([field(0, "a"), field(1, "b")])
    m.fragments.extend(frag(f) for f in fids)
    if max_fragment_id is not None:
        m.max_fragment_id = max_fragment_id
    m.data_format.file_format = "lance"
    m.data_format.version = "2.2"
    return m


def index(name: str, fields: list[int], fragments: list[int]) -> table_pb2.IndexMetadata:
    out = table_pb2.IndexMetadata(name=name, fields=fields, dataset_version=3)
    out.uuid.uuid = uuid.uuid4().bytes
    out.fragment_bitmap = serialize_bitmap(BitMap(fragments))
    return out


def start(
    prev: table_pb2.Manifest | None,
    txn: Txn,
    indices: list[table_pb2.IndexMetadata] | None = None,
    **kwargs: object,
) -> BuildState:
    """The state an operation receives from ``build_manifest``."""
    state = BuildState(
        prev,
        indices or [],
        txn,
        version=(prev.version + 1) if prev is not None else 1,
        transaction_file="t.txn",
        restore_source=kwargs.get("restore_source"),  # type: ignore[arg-type]
        clone_source=kwargs.get("clone_source"),  # type: ignore[arg-type]
        now=NOW,
        data_storage_version=None,
        enable_stable_row_ids=False,
        frag_reuse_index=kwargs.get("frag_reuse_index"),  # type: ignore[arg-type]
    )
    if txn.WhichOneof("operation") not in ("restore", "clone"):
        start_from_previous(state)
    return state


def ids(fragments: list[table_pb2.DataFragment]) -> list[int]:
    return sorted(f.id for f in fragments)


def test_every_operation_kind_has_a_module_in_the_dispatch_table() -> None:
    kinds = {f.name for f in Txn.DESCRIPTOR.oneofs_by_name["operation"].fields}
    assert set(OPERATIONS) == kinds - {"restore", "clone"}


def test_append_adds_fragments_with_ids_after_the_high_water_mark() -> None:
    txn = Txn(read_version=3)
    txn.append.fragments.extend([frag(0), frag(0)])
    state = start(previous(0, 1, max_fragment_id=5), txn)
    assert ids(apply_append(state)) == [0, 1, 6, 7]
    assert state.next_fragment_id == 8


def test_delete_drops_deleted_and_replaces_updated_fragments() -> None:
    txn = Txn(read_version=3)
    txn.delete.deleted_fragment_ids.append(0)
    updated = frag(1, rows=10)
    updated.deletion_file.num_deleted_rows = 2
    txn.delete.updated_fragments.append(updated)
    out = apply_delete(start(previous(0, 1, 2), txn))
    assert ids(out) == [1, 2]
    assert next(f for f in out if f.id == 1).deletion_file.num_deleted_rows == 2


def test_delete_of_an_unknown_fragment_is_refused() -> None:
    txn = Txn(read_version=3)
    txn.delete.deleted_fragment_ids.append(9)
    with pytest.raises(InvalidTransactionError, match="9"):
        apply_delete(start(previous(0), txn))


def test_update_removes_rewrites_and_adds_fragments() -> None:
    txn = Txn(read_version=3)
    txn.update.removed_fragment_ids.append(0)
    txn.update.updated_fragments.append(frag(1, fields=[0, 1]))
    txn.update.new_fragments.append(frag(0))
    txn.update.fields_modified.append(1)
    state = start(previous(0, 1), txn, [index("b_idx", [1], [0, 1])])
    assert ids(apply_update(state)) == [1, 2]
    # fragment 1 had column b rewritten: the b index no longer covers it
    (b_idx,) = state.indices
    assert 1 not in (fragment_bitmap(b_idx) or BitMap())


def test_overwrite_replaces_schema_fragments_and_indices() -> None:
    txn = Txn(read_version=3)
    txn.overwrite.schema.append(field(0, "x"))
    txn.overwrite.fragments.append(frag(0, fields=[0]))
    txn.overwrite.config_upsert_values["k"] = "v"
    state = start(previous(0, 1), txn, [index("a_idx", [0], [0, 1])])
    assert ids(apply_overwrite(state)) == [2]
    assert [f.name for f in state.manifest.fields] == ["x"]
    assert state.indices == []
    finish_overwrite(state)
    assert dict(state.manifest.config) == {"k": "v"}


def test_create_index_replaces_indices_by_uuid_and_keeps_fragments() -> None:
    old = index("a_idx", [0], [0])
    new = index("a_idx", [0], [0, 1])
    txn = Txn(read_version=3)
    txn.create_index.removed_indices.append(old)
    txn.create_index.new_indices.append(new)
    state = start(previous(0, 1), txn, [old])
    assert ids(apply_create_index(state)) == [0, 1]
    assert [i.uuid.uuid for i in state.indices] == [new.uuid.uuid]


def test_rewrite_replaces_each_group_with_new_fragments() -> None:
    txn = Txn(read_version=3)
    group = txn.rewrite.groups.add()
    group.old_fragments.extend([frag(0), frag(1)])
    group.new_fragments.append(frag(0, rows=20))
    state = start(previous(0, 1, 2), txn)
    assert ids(apply_rewrite(state)) == [2, 3]


def test_rewrite_with_reserved_ids_swaps_remapped_indices() -> None:
    """A remapping compaction: new fragments carry their reserved ids, and each
    rewritten index gets its new uuid and files (in the table's own folder, even
    when the old ones were under a base path) and covers the new fragments."""
    old = index("v_idx", [1], [0, 1, 2])
    old.base_id = 0  # read from a clone's source: the remapped files are the table's own
    txn = Txn(read_version=3)
    group = txn.rewrite.groups.add()
    group.old_fragments.extend([frag(0), frag(1)])
    group.new_fragments.append(frag(7, rows=20))
    rewritten = txn.rewrite.rewritten_indices.add()
    rewritten.old_id.uuid = old.uuid.uuid
    rewritten.new_id.uuid = uuid.uuid4().bytes
    rewritten.new_index_files.add(path="index.idx", size_bytes=10)
    state = start(previous(0, 1, 2, max_fragment_id=7), txn, [old])
    assert ids(apply_rewrite(state)) == [2, 7]
    (v_idx,) = state.indices
    assert v_idx.uuid.uuid == rewritten.new_id.uuid
    assert [f.path for f in v_idx.files] == ["index.idx"]
    assert fragment_bitmap(v_idx) == BitMap([2, 7])
    assert not v_idx.HasField("base_id")


def test_rewrite_carrying_a_fragment_reuse_index_replaces_the_tables() -> None:
    """A compaction that defers remapping: its fragment reuse index (the table's
    one plus this rewrite's version) replaces the table's; the others stay."""
    current = index(FRAG_REUSE_INDEX_NAME, [], [5])
    vec = index("v_idx", [1], [0, 1])
    carried = index(FRAG_REUSE_INDEX_NAME, [], [5, 7])
    txn = Txn(read_version=3)
    group = txn.rewrite.groups.add()
    group.old_fragments.extend([frag(0), frag(1)])
    group.new_fragments.append(frag(7, rows=20))
    state = start(
        previous(0, 1, 5, max_fragment_id=7), txn, [current, vec], frag_reuse_index=carried
    )
    assert ids(apply_rewrite(state)) == [5, 7]
    assert [(i.name, i.uuid.uuid) for i in state.indices] == [
        ("v_idx", vec.uuid.uuid),
        (FRAG_REUSE_INDEX_NAME, carried.uuid.uuid),
    ]
    assert fragment_bitmap(state.indices[0]) == BitMap([0, 1]), "deferred: not remapped"


def test_merge_keeps_fragments_and_takes_the_new_schema() -> None:
    txn = Txn(read_version=3)
    txn.merge.schema.extend([field(0, "a"), field(1, "b"), field(2, "c")])
    for fid in (0, 1):
        merged = frag(fid)
        merged.files.append(data_file([2]))
        txn.merge.fragments.append(merged)
    state = start(previous(0, 1), txn)
    out = apply_merge(state)
    assert ids(out) == [0, 1] and all(len(f.files) == 2 for f in out)
    assert [f.name for f in state.manifest.fields] == ["a", "b", "c"]


def test_merge_that_changes_a_row_count_is_refused() -> None:
    txn = Txn(read_version=3)
    txn.merge.schema.extend([field(0, "a"), field(1, "b")])
    txn.merge.fragments.append(frag(0, rows=11))
    with pytest.raises(InvalidTransactionError, match="row count"):
        apply_merge(start(previous(0), txn))


def test_project_drops_data_files_without_a_remaining_field() -> None:
    prev = previous()
    two_files = table_pb2.DataFragment(id=0, physical_rows=10)
    two_files.files.extend([data_file([0], "a.lance"), data_file([1], "b.lance")])
    prev.fragments.append(two_files)
    txn = Txn(read_version=3)
    txn.project.schema.append(field(0, "a"))
    state = start(prev, txn)
    out = apply_project(state)
    assert [df.path for df in out[0].files] == ["a.lance"]
    assert [f.name for f in state.manifest.fields] == ["a"]


def test_reserve_fragments_moves_only_the_high_water_mark() -> None:
    txn = Txn(read_version=3)
    txn.reserve_fragments.num_fragments = 4
    state = start(previous(0, 1, max_fragment_id=1), txn)
    assert ids(apply_reserve_fragments(state)) == [0, 1]
    state.manifest.max_fragment_id = 1
    finish_reserve_fragments(state)
    assert state.manifest.max_fragment_id == 5


def test_update_config_upserts_and_deletes_config_keys() -> None:
    prev = previous(0)
    prev.config["old"] = "1"
    prev.config["gone"] = "2"
    txn = Txn(read_version=3)
    entries = txn.update_config.config_updates.update_entries
    entries.add(key="new", value="3")
    entries.add(key="gone")
    state = start(prev, txn)
    assert ids(apply_update_config(state)) == [0]
    finish_update_config(state)
    assert dict(state.manifest.config) == {"old": "1", "new": "3"}


def test_update_bases_registers_new_base_paths_with_fresh_ids() -> None:
    txn = Txn(read_version=3)
    txn.update_bases.new_bases.add(id=0, name="cold", path="s3://cold/t")
    state = start(previous(0), txn)
    assert ids(apply_update_bases(state)) == [0]
    finish_update_bases(state)
    assert [(b.id, b.name) for b in state.manifest.base_paths] == [(1, "cold")]


def test_data_replacement_swaps_the_file_of_the_replaced_columns() -> None:
    prev = previous()
    frag0 = table_pb2.DataFragment(id=0, physical_rows=10)
    frag0.files.extend([data_file([0], "a.lance"), data_file([1], "b-old.lance")])
    prev.fragments.append(frag0)
    txn = Txn(read_version=3)
    txn.data_replacement.replacements.add(fragment_id=0, new_file=data_file([1], "b-new.lance"))
    out = apply_data_replacement(start(prev, txn))
    assert [df.path for df in out[0].files] == ["a.lance", "b-new.lance"]


def test_update_mem_wal_state_records_the_merged_generation() -> None:
    region = uuid.uuid4().bytes
    txn = Txn(read_version=3)
    txn.update_mem_wal_state.merged_generations.add(generation=3).region_id.uuid = region
    state = start(previous(0), txn)
    assert ids(apply_update_mem_wal_state(state)) == [0]
    (mem,) = state.indices
    assert mem.name == MEM_WAL_INDEX_NAME
    details = table_pb2.MemWalIndexDetails.FromString(mem.index_details.value)
    assert [(g.region_id.uuid, g.generation) for g in details.merged_generations] == [(region, 3)]


def test_restore_brings_back_the_old_manifest_at_the_new_version() -> None:
    old = previous(0)
    old.version = 1
    txn = Txn(read_version=3)
    txn.restore.version = 1
    latest = previous(0, 1, 2, max_fragment_id=2)
    built = apply_restore(start(latest, txn, restore_source=(old, [])))
    assert built.manifest.version == 4
    assert [f.id for f in built.manifest.fragments] == [0]
    assert built.manifest.max_fragment_id == 2  # the high-water mark never goes back


def test_clone_is_never_built_from_a_previous_version() -> None:
    txn = Txn(read_version=0)
    txn.clone.is_shallow = True
    txn.clone.ref_path = "s3://b/src.lance"
    txn.clone.ref_version = 3
    with pytest.raises(InvalidTransactionError, match="first operation of a table"):
        apply_clone(start(previous(0), txn, clone_source=(previous(0), [])))
    built = apply_clone(start(None, txn, clone_source=(previous(0, 1), [])))
    assert built.manifest.version == 1
    assert [f.files[0].base_id for f in built.manifest.fragments] == [0, 0]
