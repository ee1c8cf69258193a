"""add_columns / drop_columns / alter_columns.

* add_columns with SQL expressions or a batch UDF: pylance computes the new
  columns per fragment (``LanceFragment.merge_columns``, which writes new data
  files and commits nothing); one Merge commits them all.
* add_columns with Arrow fields (all-null columns) and drop_columns / renames /
  nullability: metadata only (Merge with the fragments unchanged, or Project).
* A type change rewrites data and pylance can only do that by committing itself:
  refused, naming the alternative.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from lancetx.commit.engine.operations import Merge, Project, Transaction
from lancetx.commit.format.schema import arrow_schema_to_fields, max_field_id, project_fields
from lancetx.committing import PlanContext
from lancetx.convert import lance_schema_to_fields, to_fragment
from lancetx.errors import (
    InvalidPredicateError,
    PylanceCommitsItselfError,
    SchemaMismatchError,
    UnknownColumnError,
)
from lancetx.protos import file_pb2

Plan = Callable[[PlanContext], Transaction]


def _existing(ctx: PlanContext, names: Sequence[str]) -> None:
    clash = [n for n in names if ctx.schema.get_field_index(n) >= 0]
    if clash:
        raise SchemaMismatchError(ctx.uri, f"column(s) {clash} already exist")


def plan_add_columns(transforms: Any, read_columns: list[str] | None) -> Plan:
    """``transforms``: ``{name: sql_expression}``, a pa.Field / list of fields /
    pa.Schema (all-null columns), or a UDF ``RecordBatch -> RecordBatch``."""

    def plan(ctx: PlanContext) -> Transaction:
        fields = list(ctx.manifest.fields)
        if isinstance(transforms, pa.Field | pa.Schema) or (
            isinstance(transforms, list) and all(isinstance(t, pa.Field) for t in transforms)
        ):
            new = pa.schema([transforms] if isinstance(transforms, pa.Field) else list(transforms))
            _existing(ctx, new.names)
            not_null = [f.name for f in new if not f.nullable]
            if not_null:
                raise SchemaMismatchError(
                    ctx.uri, f"columns added without data must be nullable: {not_null}"
                )
            added, _ = arrow_schema_to_fields(new, start_id=_next_field_id(ctx))
            return Transaction(
                read_version=ctx.read_version,
                operation=Merge(
                    fragments=tuple(ctx.manifest.fragments),
                    schema=tuple(fields + added),
                    schema_metadata=dict(ctx.manifest.schema_metadata),
                ),
            )
        if isinstance(transforms, Mapping):
            _existing(ctx, list(transforms))
        new_fragments = []
        new_fields: list[file_pb2.Field] | None = None
        for fragment in ctx.dataset.get_fragments():
            try:
                metadata, lance_schema = fragment.merge_columns(transforms, read_columns)
            except ValueError as exc:
                if isinstance(transforms, Mapping):
                    raise InvalidPredicateError(
                        ctx.uri,
                        ", ".join(f"{k} = {v}" for k, v in transforms.items()),
                        str(exc).splitlines()[0],
                    ) from None
                raise
            new_fragments.append(to_fragment(ctx.uri, metadata))
            if new_fields is None:
                new_fields = lance_schema_to_fields(ctx.uri, lance_schema)
        if new_fields is None:  # an empty table: pylance had no fragment to ask
            raise SchemaMismatchError(
                ctx.uri, "the table has no rows; add columns with Arrow fields (all null) instead"
            )
        return Transaction(
            read_version=ctx.read_version,
            operation=Merge(
                fragments=tuple(new_fragments),
                schema=tuple(new_fields),
                schema_metadata=dict(ctx.manifest.schema_metadata),
            ),
        )

    return plan


def _next_field_id(ctx: PlanContext) -> int:
    # Data files keep the ids of dropped columns: a new column must never reuse one,
    # or it would read the dropped column's values.
    in_files = (fid for frag in ctx.manifest.fragments for f in frag.files for fid in f.fields)
    return max(max_field_id(ctx.manifest.fields), max(in_files, default=-1)) + 1


def plan_drop_columns(names: Sequence[str]) -> Plan:
    def plan(ctx: PlanContext) -> Transaction:
        unknown = [n for n in names if ctx.schema.get_field_index(n) < 0]
        if unknown:
            raise UnknownColumnError(ctx.uri, unknown, ctx.schema.names)
        keep = [n for n in ctx.schema.names if n not in set(names)]
        if not keep:
            raise SchemaMismatchError(ctx.uri, "cannot drop every column of a table")
        fields = project_fields(list(ctx.manifest.fields), keep)
        return Transaction(read_version=ctx.read_version, operation=Project(schema=tuple(fields)))

    return plan


def plan_alter_columns(alterations: Sequence[Mapping[str, Any]]) -> Plan:
    """Each alteration: ``{"path": "col" | "a.b", "name": new_name?, "nullable": bool?}``."""

    def plan(ctx: PlanContext) -> Transaction:
        fields = [file_pb2.Field() for _ in ctx.manifest.fields]
        for copy, original in zip(fields, ctx.manifest.fields, strict=True):
            copy.CopyFrom(original)
        by_path = _paths(fields)
        for change in alterations:
            path = change.get("path")
            if not isinstance(path, str) or path not in by_path:
                raise UnknownColumnError(ctx.uri, [str(path)], sorted(by_path))
            if change.get("data_type") is not None:
                raise PylanceCommitsItselfError(
                    ctx.uri,
                    f"changing the type of {path!r}",
                    f"add_columns({{'{path}_new': 'CAST({path} AS <type>)'}}), then "
                    f"drop_columns(['{path}']) and alter_columns({{'path': '{path}_new', "
                    f"'name': '{path}'}})",
                )
            field = by_path[path]
            if change.get("name"):
                field.name = str(change["name"])
            if change.get("nullable") is not None:
                nullable = bool(change["nullable"])
                if not nullable and field.nullable:
                    nulls = ctx.dataset.count_rows(filter=f"`{path}` IS NULL")
                    if nulls:
                        raise SchemaMismatchError(
                            ctx.uri,
                            f"column {path!r} has {nulls} null value(s); it cannot become non-nullable",
                        )
                field.nullable = nullable
        siblings: dict[int, list[str]] = {}
        for f in fields:
            siblings.setdefault(f.parent_id, []).append(f.name)
        for names in siblings.values():
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise SchemaMismatchError(
                    ctx.uri, f"column name(s) {sorted(dup)} would appear twice"
                )
        return Transaction(read_version=ctx.read_version, operation=Project(schema=tuple(fields)))

    return plan


def _paths(fields: list[file_pb2.Field]) -> dict[str, file_pb2.Field]:
    by_id = {f.id: f for f in fields}
    out: dict[str, file_pb2.Field] = {}
    for f in fields:
        parts = [f.name]
        parent = f.parent_id
        while parent >= 0 and parent in by_id:
            parts.append(by_id[parent].name)
            parent = by_id[parent].parent_id
        out[".".join(reversed(parts))] = f
    return out


__all__ = ["plan_add_columns", "plan_alter_columns", "plan_drop_columns"]
