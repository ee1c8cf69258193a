"""Index carry-forward: which indices survive into the new version and how their
fragment bitmaps and fields follow deletes, updates, merges and rewrites."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Sequence

from pyroaring import BitMap

from lancetx.commit.engine.builder.common import (
    FRAG_REUSE_INDEX_NAME,
    MEM_WAL_INDEX_NAME,
    U32_MAX,
    copy_message,
    field_paths,
    fragment_bitmap,
    is_system_index,
    is_vector_index,
    set_bitmap,
    uuid_str,
)
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2, transaction_pb2

IndexMetadata = table_pb2.IndexMetadata
DataFragment = table_pb2.DataFragment
Transaction = transaction_pb2.Transaction


def retain_relevant_indices(state: BuildState, fragments: Sequence[DataFragment]) -> None:
    """``retain_relevant_indices``: drop indices of removed fields, and empty
    duplicates / empty vector indices."""
    field_ids = {f.id for f in state.manifest.fields}
    indices = [
        i for i in state.indices if all(fid in field_ids for fid in i.fields) or is_system_index(i)
    ]
    existing = BitMap([f.id for f in fragments if f.id <= U32_MAX])

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
                if not is_vector_index(oldest):
                    keep.add(oldest.uuid.uuid)
            else:
                keep.update(i.uuid.uuid for i in non_empty)
        else:
            index = group[0]
            if not is_empty(index) or not is_vector_index(index):
                keep.add(index.uuid.uuid)
    state.indices = [i for i in indices if i.name == FRAG_REUSE_INDEX_NAME or i.uuid.uuid in keep]


def prune_updated_fields_from_indices(
    state: BuildState, fragment_ids: Sequence[int], fields_modified: Sequence[int]
) -> None:
    if not fields_modified:
        return
    modified = set(fields_modified)
    for index in state.indices:
        if any(fid >= 0 and fid in modified for fid in index.fields):
            bitmap = fragment_bitmap(index)
            if bitmap is None:
                continue
            for frag_id in fragment_ids:
                bitmap.discard(frag_id & U32_MAX)
            set_bitmap(index, bitmap)


def prune_merge_rewritten_fields_from_indices(
    state: BuildState, previous: Sequence[DataFragment], merged: Sequence[DataFragment]
) -> None:
    before = {f.id: f for f in previous}
    for frag in merged:
        old = before.get(frag.id)
        if old is None:
            continue
        old_paths = field_paths(old)
        new_paths = field_paths(frag)
        changed = [
            fid for fid, path in old_paths.items() if fid in new_paths and new_paths[fid] != path
        ]
        if changed:
            prune_updated_fields_from_indices(state, [frag.id], changed)


def register_pure_rewrite_rows_fragments(
    state: BuildState,
    pure_ids: Sequence[int],
    original_ids: Sequence[int],
    preserving_fields: Sequence[int],
) -> None:
    if not pure_ids:
        return
    value_fields = set(preserving_fields)
    for index in state.indices:
        if any(fid >= 0 and fid in value_fields for fid in index.fields):
            continue
        bitmap = fragment_bitmap(index)
        if bitmap is None:
            continue
        if all((fid & U32_MAX) in bitmap for fid in original_ids):
            for fid in pure_ids:
                bitmap.add(fid & U32_MAX)
            set_bitmap(index, bitmap)


def recalculate_fragment_bitmap(
    state: BuildState,
    old: BitMap,
    groups: Sequence[tuple[Sequence[DataFragment], Sequence[DataFragment]]],
) -> BitMap:
    new = BitMap(old)
    for old_frags, new_frags in groups:
        inside = [f.id in old for f in old_frags]
        if any(inside):
            if not all(inside):
                raise state.fail(
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
    state: BuildState,
    rewritten: Sequence[transaction_pb2.Transaction.Rewrite.RewrittenIndex],
    groups: Sequence[tuple[Sequence[DataFragment], Sequence[DataFragment]]],
    *,
    remap: bool,
) -> None:
    """``handle_rewrite_indices``: remap the bitmap (when ``remap``), swap uuid and files."""
    seen: set[bytes] = set()
    for item in rewritten:
        if not item.HasField("old_id") or not item.HasField("new_id"):
            raise state.fail("a rewritten index is missing old_id or new_id")
        old_id = item.old_id.uuid
        if old_id in seen:
            raise state.fail(
                "An invalid compaction plan must have been generated because multiple tasks "
                f"modified the same index: {uuid_str(old_id)}"
            )
        seen.add(old_id)
        target = next((i for i in state.indices if i.uuid.uuid == old_id), None)
        if target is None:
            continue  # removed by a concurrent operation
        if remap:
            bitmap = fragment_bitmap(target)
            if bitmap is None:
                raise state.fail(
                    f"Cannot rewrite index {uuid_str(old_id)} which did not store fragment bitmap"
                )
            set_bitmap(target, recalculate_fragment_bitmap(state, bitmap, groups))
        target.uuid.uuid = item.new_id.uuid
        # Lance swaps the uuid and the file list only: details and index
        # version stay those of the index being remapped.
        del target.files[:]
        target.files.extend(copy_message(f) for f in item.new_index_files)
        # The remapped files are written in the table's own _indices/, wherever the
        # old ones were (an index a shallow clone reads from its source). pylance 14
        # keeps the old base id, and the index then names files that are not there.
        target.ClearField("base_id")


def update_mem_wal_merged_generations(
    state: BuildState, merged: Sequence[table_pb2.MergedGeneration]
) -> None:
    """``update_mem_wal_index_merged_generations``: per region, keep the higher generation."""
    if not merged:
        return
    position = next((n for n, i in enumerate(state.indices) if i.name == MEM_WAL_INDEX_NAME), None)
    details = table_pb2.MemWalIndexDetails()
    type_url = "/lance.table.MemWalIndexDetails"
    if position is not None:
        current = state.indices.pop(position)
        if not current.HasField("index_details"):
            raise state.fail("Index details not found for the MemWAL index")
        if not current.index_details.type_url.endswith("MemWalIndexDetails"):
            raise state.fail(
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
            details.merged_generations.append(copy_message(generation))
        elif generation.generation > found.generation:
            found.generation = generation.generation
    index = IndexMetadata(
        name=MEM_WAL_INDEX_NAME,
        dataset_version=state.version,
        index_version=0,
        created_at=int(state.now.timestamp() * 1000),
    )
    index.uuid.uuid = uuidlib.uuid4().bytes
    index.index_details.type_url = type_url
    index.index_details.value = details.SerializeToString()
    state.indices.append(index)
