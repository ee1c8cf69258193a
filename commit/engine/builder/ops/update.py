"""Update: fragments removed, updated in place or added; row versions refreshed and indices pruned."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import copy_message
from lancetx.commit.engine.builder.fragment_ids import (
    assign_ids,
    existing,
    require_known,
    require_unique,
)
from lancetx.commit.engine.builder.indices import (
    prune_updated_fields_from_indices,
    register_pure_rewrite_rows_fragments,
    retain_relevant_indices,
    update_mem_wal_merged_generations,
)
from lancetx.commit.engine.builder.row_ids import (
    assign_row_ids,
    collect_pure_rewrite_row_fragment_ids,
    refresh_partial_last_updated,
    resolve_update_version_metadata,
)
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2, transaction_pb2

DataFragment = table_pb2.DataFragment
Transaction = transaction_pb2.Transaction


def apply_update(state: BuildState) -> list[DataFragment]:
    op = state.txn.update
    updated_ids = [f.id for f in op.updated_fragments]
    require_unique(state, updated_ids, "Update.updated_fragments")
    require_known(state, list(op.removed_fragment_ids) + updated_ids, "Update")
    removed = set(op.removed_fragment_ids)
    updated = {f.id: f for f in op.updated_fragments}
    prev = state.require_previous()
    out = [
        copy_message(updated[f.id]) if f.id in updated else f
        for f in existing(state)
        if f.id not in removed
    ]

    offsets = {fid: lst.values for fid, lst in op.updated_fragment_offsets.items() if lst.values}
    if (
        state.next_row_id is not None
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
            refresh_partial_last_updated(state, frag, values, prev.version)

    prune_updated_fields_from_indices(state, updated_ids, op.fields_modified)

    new = assign_ids(state, op.new_fragments)
    if state.next_row_id is not None:
        assign_row_ids(state, new)
        resolve_update_version_metadata(state, list(prev.fragments), new)
    if state.use_stable_row_ids and op.update_mode == transaction_pb2.Transaction.REWRITE_ROWS:
        pure = collect_pure_rewrite_row_fragment_ids(state, new)
        original = list(op.removed_fragment_ids) + updated_ids
        register_pure_rewrite_rows_fragments(
            state, pure, original, op.fields_for_preserving_frag_bitmap
        )
    out.extend(new)
    retain_relevant_indices(state, out)
    if op.merged_generations:
        update_mem_wal_merged_generations(state, op.merged_generations)
    return out
