"""Fragment ids: checking the fragments a transaction brings and the ids it names,
assigning new ids after the high-water mark, and keeping max_fragment_id."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from google.protobuf.unknown_fields import UnknownFieldSet

from lancetx.commit.engine.builder.common import (
    TOMBSTONE_FIELD,
    U32_MAX,
    UNASSIGNED_FRAGMENT_ID,
    copy_message,
    describe_ids,
    file_version,
    normalize_storage_version,
)
from lancetx.commit.engine.builder.row_ids import assign_row_ids, set_uniform_version_meta
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def new_fragment_lists(state: BuildState) -> list[tuple[str, Sequence[DataFragment]]]:
    """Fragments the transaction brings in (as opposed to ids it names)."""
    op = getattr(state.txn, state.op_key)
    key = state.op_key
    if key in ("append", "overwrite", "merge"):
        return [(f"{key}.fragments", op.fragments)]
    if key == "delete":
        return [("delete.updated_fragments", op.updated_fragments)]
    if key == "update":
        return [
            ("update.updated_fragments", op.updated_fragments),
            ("update.new_fragments", op.new_fragments),
        ]
    if key == "rewrite":
        lists: list[tuple[str, Sequence[DataFragment]]] = [
            ("rewrite.new_fragments", op.new_fragments)
        ]
        for i, group in enumerate(op.groups):
            lists.append((f"rewrite.groups[{i}].new_fragments", group.new_fragments))
        return lists
    return []


def check_new_fragments(state: BuildState) -> None:
    legacy = state.previous is not None and (
        normalize_storage_version(state.previous.data_format.version) == "0.1"
        and state.op_key != "overwrite"
    )
    for where, fragments in new_fragment_lists(state):
        for frag in fragments:
            unknown_set = UnknownFieldSet(frag)
            unknown = [unknown_set[i].field_number for i in range(len(unknown_set))]
            if unknown:
                raise state.unsupported(
                    f"fragment {frag.id} in {where} carries proto field(s) {sorted(set(unknown))} "
                    "unknown to lancetx (for example data overlays, field 11)"
                )
            for data_file in frag.files:
                if not legacy and not data_file.fields:
                    raise state.fail(
                        f"Datafile {data_file.path} does not contain any fields", [frag.id]
                    )
                if file_version(data_file) is None:
                    raise state.fail(
                        f"data file {data_file.path} of fragment {frag.id} has unknown Lance "
                        f"storage version {data_file.file_major_version}.{data_file.file_minor_version}",
                        [frag.id],
                    )
                if data_file.column_indices and len(data_file.column_indices) != len(
                    data_file.fields
                ):
                    raise state.fail(
                        f"Data file '{data_file.path}' (fragment {frag.id}) has "
                        f"{len(data_file.fields)} field ids but {len(data_file.column_indices)} "
                        "column indices. These must be the same length.",
                        [frag.id],
                    )
            if legacy and state.op_key in ("append", "update"):
                present = {fid for df in frag.files for fid in df.fields}
                for schema_field in state.manifest.fields:
                    if schema_field.id not in present:
                        raise state.fail(
                            f"Fragment {frag.id} does not contain field {schema_field.name!r} "
                            f"(id {schema_field.id}); legacy tables need every field in every fragment",
                            [frag.id],
                        )


def assign_ids(state: BuildState, fragments: Iterable[DataFragment]) -> list[DataFragment]:
    """``fragments_with_ids``: copies; id 0 gets the next id, others are kept."""
    out = []
    for frag in fragments:
        copy = copy_message(frag)
        if copy.id == UNASSIGNED_FRAGMENT_ID:
            copy.id = state.next_fragment_id
            state.next_fragment_id += 1
        out.append(copy)
    return out


def existing(state: BuildState) -> list[DataFragment]:
    prev = state.require_previous()
    return [copy_message(f) for f in prev.fragments]


def require_known(state: BuildState, ids: Iterable[int], what: str) -> None:
    missing = sorted({i for i in ids if i not in state.prev_fragments})
    if missing:
        prev = state.require_previous()
        raise state.fail(
            f"{what}: fragment id(s) {describe_ids(missing)} do not exist in version "
            f"{prev.version}, which has {describe_ids(sorted(state.prev_fragments))}; "
            "re-plan the transaction against the latest version",
            missing,
        )


def require_unique(state: BuildState, ids: Sequence[int], what: str) -> None:
    seen: set[int] = set()
    dup: set[int] = set()
    for i in ids:
        if i in seen:
            dup.add(i)
        seen.add(i)
    if dup:
        raise state.fail(f"{what} list fragment id(s) {sorted(dup)} more than once", dup)


def new_data_fragments(state: BuildState, fragments: Iterable[DataFragment]) -> list[DataFragment]:
    """Ids, row ids and version metadata for fragments of brand-new rows (Append, Overwrite)."""
    new = assign_ids(state, fragments)
    if state.next_row_id is not None:
        assign_row_ids(state, new)
        for frag in new:
            set_uniform_version_meta(state, frag, created=True, updated=True)
    return new


def finish_fragments(state: BuildState, fragments: list[DataFragment]) -> None:
    fragments.sort(key=lambda f: f.id)
    ids = [f.id for f in fragments]
    dup = sorted({a for a, b in itertools.pairwise(ids) if a == b})
    if dup:
        raise state.fail(f"the new version would hold fragment id(s) {dup} more than once", dup)
    if ids and ids[-1] > U32_MAX:
        raise state.fail(f"fragment id {ids[-1]} does not fit max_fragment_id (u32)", [ids[-1]])
    for frag in fragments:
        # remove_tombstoned_data_files: files holding only dropped (-2) fields
        keep = [df for df in frag.files if any(fid != TOMBSTONE_FIELD for fid in df.fields)]
        if len(keep) != len(frag.files):
            del frag.files[:]
            frag.files.extend(keep)
    state.manifest.fragments.extend(fragments)


def update_max_fragment_id(state: BuildState) -> None:
    manifest = state.manifest
    if not manifest.fragments:
        return
    top = max(f.id for f in manifest.fragments)
    if not manifest.HasField("max_fragment_id") or top > manifest.max_fragment_id:
        manifest.max_fragment_id = top
