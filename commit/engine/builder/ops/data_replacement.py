"""DataReplacement: a column's data file swapped (or added) in named fragments."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import VERSION_NUMBERS, copy_message, file_version
from lancetx.commit.engine.builder.fragment_ids import existing, require_known, require_unique
from lancetx.commit.engine.builder.indices import prune_updated_fields_from_indices
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_data_replacement(state: BuildState) -> list[DataFragment]:
    op = state.txn.data_replacement
    groups = list(op.replacements)
    for g in groups:
        if not g.HasField("new_file"):
            raise state.fail(
                f"DataReplacementGroup for fragment {g.fragment_id} must have a new_file"
            )
    field_sets = {tuple(g.new_file.fields) for g in groups}
    if len(field_sets) > 1:
        detail = "".join(f"File {i}: {list(g.new_file.fields)}\n" for i, g in enumerate(groups))
        raise state.fail(
            f"All new data files must have the same fields, but found different fields:\n{detail}"
        )
    ids = [g.fragment_id for g in groups]
    require_unique(state, ids, "DataReplacement")
    require_known(state, ids, "DataReplacement")
    for g in groups:
        if file_version(g.new_file) is None:
            raise state.fail(
                f"new data file {g.new_file.path} has unknown Lance storage version "
                f"{g.new_file.file_major_version}.{g.new_file.file_minor_version}",
                [g.fragment_id],
            )
    replaced_fields = [f for f in groups[0].new_file.fields if f >= 0] if groups else []

    modified: list[DataFragment] = []
    for g in groups:
        original = state.prev_fragments[g.fragment_id]
        frag = copy_message(original)
        new_file = g.new_file
        covered: set[int] = set()
        for df in frag.files:
            if (
                list(df.fields) == list(new_file.fields)
                and df.file_major_version == new_file.file_major_version
                and df.file_minor_version == new_file.file_minor_version
            ):
                df.path = new_file.path
                df.file_size_bytes = new_file.file_size_bytes
            covered.update(df.fields)
        if covered.isdisjoint(new_file.fields):
            # The replaced columns were all-null in this fragment: add the file.
            version_name = file_version(new_file)
            assert version_name is not None
            major, minor = VERSION_NUMBERS[version_name]
            frag.files.add(
                path=new_file.path,
                fields=list(new_file.fields),
                column_indices=list(new_file.column_indices),
                file_major_version=major,
                file_minor_version=minor,
                file_size_bytes=new_file.file_size_bytes,
            )
        if frag == original:
            raise state.fail(
                "Expected to modify the fragment but no changes were made. This means the new "
                "data files does not align with any exiting datafiles. Please check if the schema "
                "of the new data files matches the schema of the old data files including the "
                "file major and minor versions",
                [g.fragment_id],
            )
        modified.append(frag)
    changed = set(ids)
    out = modified + [f for f in existing(state) if f.id not in changed]
    prune_updated_fields_from_indices(state, ids, replaced_fields)
    return out
