"""Merge (add columns): the full fragment list with new files; row counts and fragment ids preserved."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import copy_message, high_water_mark, physically_rewritten
from lancetx.commit.engine.builder.fragment_ids import require_unique
from lancetx.commit.engine.builder.indices import (
    prune_merge_rewritten_fields_from_indices,
    retain_relevant_indices,
)
from lancetx.commit.engine.builder.row_ids import refresh_full_last_updated
from lancetx.commit.engine.builder.schema import set_schema
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_merge(state: BuildState) -> list[DataFragment]:
    op = state.txn.merge
    prev = state.require_previous()
    ids = [f.id for f in op.fragments]
    require_unique(state, ids, "Merge.fragments")
    # merge_fragments_valid
    if len(op.fragments) < len(prev.fragments):
        raise state.fail(
            f"Merge operation reduced fragment count from {len(prev.fragments)} to "
            f"{len(op.fragments)}. Merge operations should only add columns, not reduce fragments."
        )
    given = {f.id: f for f in op.fragments}
    missing = [f.id for f in prev.fragments if f.id not in given]
    if missing:
        raise state.fail(
            f"Merge operation is missing original fragments: {missing}. Merge operations "
            "should preserve all original fragments and only add new columns.",
            missing,
        )
    for original in prev.fragments:
        if given[original.id].physical_rows != original.physical_rows:
            raise state.fail(
                f"Merge operation changed row count for fragment {original.id}. Original: "
                f"{original.physical_rows}, New: {given[original.id].physical_rows}.",
                [original.id],
            )
    high = high_water_mark(prev)
    reused = sorted(
        i for i in ids if i not in state.prev_fragments and high is not None and i <= high
    )
    if reused:
        raise state.fail(
            f"Merge names fragment id(s) {reused} that are not in version {prev.version} "
            f"but not above its high-water mark {high}: fragment ids are never reused",
            reused,
        )

    # pylance writes Merge.schema_metadata empty ("TODO: handle metadata"), so an
    # empty map keeps the table's schema metadata; a non-empty one replaces it.
    set_schema(state, op.schema, op.schema_metadata, replace_metadata=bool(op.schema_metadata))
    merged = [copy_message(f) for f in op.fragments]
    if state.next_row_id is not None:
        for frag in merged:
            before = state.prev_fragments.get(frag.id)
            if before is None:
                refresh_full_last_updated(state, frag)
                if frag.HasField("inline_last_updated_at_versions"):
                    frag.inline_created_at_versions = frag.inline_last_updated_at_versions
                elif frag.HasField("external_last_updated_at_versions"):
                    frag.external_created_at_versions.CopyFrom(
                        frag.external_last_updated_at_versions
                    )
                else:
                    frag.ClearField("created_at_version_sequence")
            elif physically_rewritten(before, frag):
                refresh_full_last_updated(state, frag)
    prune_merge_rewritten_fields_from_indices(state, list(prev.fragments), list(op.fragments))
    retain_relevant_indices(state, merged)
    return merged
