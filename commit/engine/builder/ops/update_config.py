"""UpdateConfig: fragments unchanged; the config and metadata maps updated."""

from __future__ import annotations

from lancetx.commit.engine.builder.config import apply_config_updates
from lancetx.commit.engine.builder.fragment_ids import existing
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_update_config(state: BuildState) -> list[DataFragment]:
    return existing(state)


def finish_update_config(state: BuildState) -> None:
    apply_config_updates(state)
