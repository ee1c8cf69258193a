"""Rewrite (compaction): groups of old fragments replaced by new ones; index bitmaps
moved or remapped; a deferred remap's fragment reuse index put in place."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import (
    FRAG_REUSE_INDEX_NAME,
    copy_message,
    fragment_bitmap,
    set_bitmap,
)
from lancetx.commit.engine.builder.fragment_ids import (
    assign_ids,
    existing,
    require_known,
    require_unique,
)
from lancetx.commit.engine.builder.indices import (
    handle_rewrite_indices,
    recalculate_fragment_bitmap,
)
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_rewrite(state: BuildState) -> list[DataFragment]:
    op = state.txn.rewrite
    groups: list[tuple[list[DataFragment], list[DataFragment]]]
    if op.groups:
        groups = [(list(g.old_fragments), list(g.new_fragments)) for g in op.groups]
    else:
        # Legacy flat lists form a single group (Lance's TryFrom).
        groups = [(list(op.old_fragments), list(op.new_fragments))]
    old_ids = [f.id for old, _ in groups for f in old]
    require_unique(state, old_ids, "Rewrite old_fragments")
    require_known(state, old_ids, "Rewrite old_fragments")

    fragments = existing(state)
    assigned_groups: list[tuple[list[DataFragment], list[DataFragment]]] = []
    for i, (old, new) in enumerate(groups):
        if not old:
            raise state.fail(f"rewrite group {i} has no old fragments")
        new_frags = assign_ids(state, new)
        assigned_groups.append((old, new_frags))
        gone = {f.id for f in old}
        # Contiguous or not, the result is the same once sorted by id.
        fragments = [f for f in fragments if f.id not in gone] + new_frags

    if state.next_row_id is not None:
        # Row ids survive the rewrite, so every index stays valid: its fragment
        # bitmap moves to the new fragments. Indices the rewrite also rebuilt
        # still swap uuid and files (pylance 14 measured; Lance 9 ignored them).
        for index in state.indices:
            bitmap = fragment_bitmap(index)
            if bitmap is not None:
                set_bitmap(index, recalculate_fragment_bitmap(state, bitmap, assigned_groups))
        handle_rewrite_indices(state, op.rewritten_indices, assigned_groups, remap=False)
    else:
        handle_rewrite_indices(state, op.rewritten_indices, assigned_groups, remap=True)
    reuse = state.frag_reuse_index
    if reuse is not None:
        # A compaction that defers remapping: its fragment reuse index (the table's
        # one with this rewrite's version added) replaces the table's.
        if reuse.name != FRAG_REUSE_INDEX_NAME:
            raise state.fail(
                f"the Rewrite's fragment reuse index is named {reuse.name!r}, "
                f"not {FRAG_REUSE_INDEX_NAME!r}"
            )
        state.indices = [i for i in state.indices if i.name != reuse.name]
        state.indices.append(copy_message(reuse))
    return fragments
