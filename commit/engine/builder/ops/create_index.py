"""CreateIndex: indices replaced by uuid; fragments unchanged."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import copy_message
from lancetx.commit.engine.builder.fragment_ids import existing
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_create_index(state: BuildState) -> list[DataFragment]:
    op = state.txn.create_index
    drop = {i.uuid.uuid for i in op.removed_indices} | {i.uuid.uuid for i in op.new_indices}
    state.indices = [i for i in state.indices if i.uuid.uuid not in drop]
    state.indices.extend(copy_message(i) for i in op.new_indices)
    return existing(state)
