"""Project (drop columns): a narrower schema; data files with no remaining field dropped."""

from __future__ import annotations

from lancetx.commit.engine.builder.fragment_ids import existing
from lancetx.commit.engine.builder.indices import retain_relevant_indices
from lancetx.commit.engine.builder.schema import set_schema
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_project(state: BuildState) -> list[DataFragment]:
    op = state.txn.project
    prev = state.require_previous()
    set_schema(state, op.schema, prev.schema_metadata, replace_metadata=False)
    remaining = {f.id for f in op.schema}
    out = existing(state)
    for frag in out:
        keep = [df for df in frag.files if any(fid in remaining for fid in df.fields)]
        if len(keep) != len(frag.files):
            del frag.files[:]
            frag.files.extend(keep)
    retain_relevant_indices(state, out)
    return out
