"""Delete: fragments removed or replaced by their updated copies (new deletion files); indices follow."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import copy_message
from lancetx.commit.engine.builder.fragment_ids import existing, require_known, require_unique
from lancetx.commit.engine.builder.indices import retain_relevant_indices
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_delete(state: BuildState) -> list[DataFragment]:
    op = state.txn.delete
    updated_ids = [f.id for f in op.updated_fragments]
    require_unique(state, updated_ids, "Delete.updated_fragments")
    require_known(state, list(op.deleted_fragment_ids) + updated_ids, "Delete")
    deleted = set(op.deleted_fragment_ids)
    updated = {f.id: f for f in op.updated_fragments}
    out = [
        copy_message(updated[f.id]) if f.id in updated else f
        for f in existing(state)
        if f.id not in deleted
    ]
    retain_relevant_indices(state, out)
    return out
