"""ReserveFragments: fragment ids reserved by moving the high-water mark."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import U32_MAX
from lancetx.commit.engine.builder.fragment_ids import existing
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_reserve_fragments(state: BuildState) -> list[DataFragment]:
    """ReserveFragments keeps every fragment; the finish step moves the high-water mark."""
    return existing(state)


def finish_reserve_fragments(state: BuildState) -> None:
    """Move max_fragment_id past the reserved ids (after it took the fragments' ids)."""
    manifest = state.manifest
    current = manifest.max_fragment_id if manifest.HasField("max_fragment_id") else 0
    reserved = current + state.txn.reserve_fragments.num_fragments
    if reserved > U32_MAX:
        raise state.fail(
            f"reserving fragment ids would move max_fragment_id past 2**32-1 ({reserved})"
        )
    manifest.max_fragment_id = reserved
