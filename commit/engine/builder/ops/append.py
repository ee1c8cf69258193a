"""Append: the new fragments join the existing ones with fresh ids (and row ids)."""

from __future__ import annotations

from lancetx.commit.engine.builder.fragment_ids import existing, new_data_fragments
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_append(state: BuildState) -> list[DataFragment]:
    return existing(state) + new_data_fragments(state, state.txn.append.fragments)
