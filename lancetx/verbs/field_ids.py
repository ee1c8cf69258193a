"""Data files written with fresh field ids, mapped onto a table's schema by column path.

A writer that cannot open the table (a Spark executor, a process writing before the
table exists) writes its data files as a new dataset: ``write_fragments(uri,
mode="overwrite")`` numbers the fields of its Arrow schema from 0 in pre-order.
Committing them to an existing table means matching columns by *path* — struct
children by name, a list's item as ``[]`` and a map's entries as ``{}`` whatever their
stored names (Spark says ``element``, pylance ``item``) — and rewriting the ids in
each data file. Column order may differ from the table's; new columns may be added
(nullable, with ids after every id the table ever used).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lancetx.commit.format.schema import max_field_id
from lancetx.errors import ColumnMismatchError
from lancetx.protos import file_pb2, table_pb2


def field_paths(fields: Sequence[file_pb2.Field]) -> dict[int, str]:
    """Field id → column path (``info.a``, ``tags.[]``, ``attrs.{}``)."""
    by_id = {f.id: f for f in fields}
    paths: dict[int, str] = {}
    for f in fields:  # pre-order: a parent comes before its children
        parent = by_id.get(f.parent_id)
        if parent is None:
            paths[f.id] = f.name
            continue
        if parent.logical_type.startswith(("list", "large_list", "fixed_size_list")):
            step = "[]"
        elif parent.logical_type == "map":
            step = "{}"
        else:
            step = f.name
        paths[f.id] = f"{paths[parent.id]}.{step}"
    return paths


def _by_path(fields: Sequence[file_pb2.Field]) -> dict[str, file_pb2.Field]:
    paths = field_paths(fields)
    return {paths[f.id]: f for f in fields}


def match_columns(
    uri: str,
    ours: Sequence[file_pb2.Field],
    table: Sequence[file_pb2.Field],
    *,
    merge_schema: bool,
    null_counts: Mapping[str, int] | None = None,
) -> list[str]:
    """Check the written columns against the table's; return our new top-level columns.

    Types must match exactly, nested fields included. A non-nullable table column
    takes a nullable written one only if no null was written (``null_counts``, per
    top-level column; unknown counts are taken as none). New columns need
    ``merge_schema``; table columns the data lacks are refused. Raises
    ColumnMismatchError naming the first column that differs.
    """
    counts = null_counts or {}
    mine = _by_path(ours)
    theirs = _by_path(table)
    top_ours = [f.name for f in ours if f.parent_id == -1]
    top_theirs = [f.name for f in table if f.parent_id == -1]
    for name in top_theirs:
        if name not in top_ours:
            raise ColumnMismatchError(
                uri, name, f"the table has this column but the data does not {top_ours}"
            )
    new = [name for name in top_ours if name not in top_theirs]
    if new and not merge_schema:
        raise ColumnMismatchError(
            uri,
            new[0],
            f"the data has this column but the table does not {top_theirs}; pass "
            "merge_schema=True (Spark: option merge_schema=true) to add new columns (nullable)",
        )
    for path, field in mine.items():
        if path.split(".", 1)[0] in new:
            continue
        other = theirs.get(path)
        if other is None:
            raise ColumnMismatchError(uri, path, "the table's column has no such nested field")
        if other.logical_type != field.logical_type:
            raise ColumnMismatchError(
                uri,
                path,
                f"the data has type {field.logical_type} but the table has {other.logical_type}",
            )
        if other.parent_id == -1 and not other.nullable and counts.get(path, 0):
            raise ColumnMismatchError(
                uri,
                path,
                f"the table's column is non-nullable, but {counts[path]} null value(s) were "
                "written",
            )
    for path in theirs:
        if path.split(".", 1)[0] in top_ours and path not in mine:
            raise ColumnMismatchError(uri, path, "the data's column lacks this nested field")
    return new


def merged_fields(
    ours: Sequence[file_pb2.Field],
    table: Sequence[file_pb2.Field],
    new: Sequence[str],
    used_id: int = -1,
) -> list[file_pb2.Field]:
    """The table's fields plus our new top-level columns (nullable), numbered after both
    the table's largest id and ``used_id`` (ids of dropped columns may sit in data files)."""
    paths = field_paths(ours)
    next_id = max(max_field_id(table), used_id) + 1
    ids: dict[int, int] = {}
    out = [_copy(f) for f in table]
    for f in ours:
        if paths[f.id].split(".", 1)[0] not in new:
            continue
        copy = _copy(f)
        ids[f.id] = next_id
        copy.id = next_id
        copy.parent_id = ids.get(f.parent_id, -1)
        if f.parent_id == -1:
            copy.nullable = True
        next_id += 1
        out.append(copy)
    return out


def _copy(f: file_pb2.Field) -> file_pb2.Field:
    copy = file_pb2.Field()
    copy.CopyFrom(f)
    return copy


def field_id_map(
    ours: Sequence[file_pb2.Field], target: Sequence[file_pb2.Field]
) -> dict[int, int]:
    """Our field ids → the target schema's, matched by column path."""
    theirs = {path: fid for fid, path in field_paths(target).items()}
    return {fid: theirs[path] for fid, path in field_paths(ours).items() if path in theirs}


def remap_fragments(
    fragments: Sequence[table_pb2.DataFragment], ids: Mapping[int, int], first_id: int
) -> tuple[table_pb2.DataFragment, ...]:
    """Copies whose data files name ``ids[field]``; fragment ids from ``first_id`` (0: all
    unassigned, the commit numbers them)."""
    out = []
    for i, fragment in enumerate(fragments):
        copy = table_pb2.DataFragment()
        copy.CopyFrom(fragment)
        for data_file in copy.files:
            data_file.fields[:] = [ids[f] if f >= 0 else f for f in data_file.fields]
        copy.id = first_id + i if first_id else 0
        out.append(copy)
    return tuple(out)


__all__ = ["field_id_map", "field_paths", "match_columns", "merged_fields", "remap_fragments"]
