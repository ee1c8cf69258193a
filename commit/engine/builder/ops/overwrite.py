"""Overwrite: a new schema and fragment list (and base paths when it creates the table); no index survives."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import copy_message
from lancetx.commit.engine.builder.fragment_ids import new_data_fragments
from lancetx.commit.engine.builder.schema import set_schema
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_overwrite(state: BuildState) -> list[DataFragment]:
    op = state.txn.overwrite
    if op.initial_bases:
        if state.previous is not None:
            raise state.fail(
                "OVERWRITE mode cannot register new bases: initial_bases are only allowed "
                "when the Overwrite creates the table"
            )
        seen: set[int] = set()
        for base in op.initial_bases:
            if base.id in seen:
                raise state.fail(
                    f"Duplicate base path ID {base.id} detected. Base path IDs must be unique."
                )
            seen.add(base.id)
            state.manifest.base_paths.append(copy_message(base))
    set_schema(state, op.schema, op.schema_metadata, replace_metadata=True)
    new = new_data_fragments(state, op.fragments)
    state.indices = []
    return new


def finish_overwrite(state: BuildState) -> None:
    """Overwrite's config upserts, applied to the config it carried over."""
    for key, value in state.txn.overwrite.config_upsert_values.items():
        state.manifest.config[key] = value
