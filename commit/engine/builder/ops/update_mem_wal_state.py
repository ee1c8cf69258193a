"""UpdateMemWalState: merged MemWAL generations recorded in the MemWAL index."""

from __future__ import annotations

from lancetx.commit.engine.builder.fragment_ids import existing
from lancetx.commit.engine.builder.indices import update_mem_wal_merged_generations
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_update_mem_wal_state(state: BuildState) -> list[DataFragment]:
    update_mem_wal_merged_generations(state, state.txn.update_mem_wal_state.merged_generations)
    return existing(state)
