"""merge_insert: pylance joins and writes (``execute_uncommitted``); lancetx commits.

The builder mirrors pylance's: ``when_matched_update_all`` (upsert),
``when_not_matched_insert_all`` (insert-if-not-exists), and
``when_not_matched_by_source_delete`` (replace a slice of the table). Because a
lost race is answered by planning again against the new version, the source data
must be readable twice: a stream is materialized once into an Arrow table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lancetx.commit.engine.operations import Transaction
from lancetx.committing import PlanContext
from lancetx.convert import to_transaction
from lancetx.data import to_reader
from lancetx.errors import SchemaMismatchError, UnknownColumnError


@dataclass
class MergeSpec:
    """What a merge_insert does; applied to a fresh pylance builder for every plan."""

    on: list[str]
    matched_update: bool = False
    matched_condition: str | None = None
    not_matched_insert: bool = False
    not_matched_by_source_delete: bool = False
    not_matched_by_source_condition: str | None = None
    extra: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.matched_update:
            parts.append("update matched")
        if self.not_matched_insert:
            parts.append("insert not matched")
        if self.not_matched_by_source_delete:
            parts.append("delete not matched by source")
        return f"merge_insert on {self.on}: " + ", ".join(parts or ["no action"])


def materialize(uri: str, data: Any, schema: pa.Schema | None = None) -> pa.Table:
    """The source as an Arrow table (read once), so a re-plan can read it again."""
    if isinstance(data, pa.Table):
        return data
    reader, guard = to_reader(uri, data, schema)
    table = reader.read_all()
    guard.raise_if_failed()
    return table


def plan_merge_insert(spec: MergeSpec, source: pa.Table) -> Callable[[PlanContext], Transaction]:
    def plan(ctx: PlanContext) -> Transaction:
        missing = [c for c in spec.on if ctx.schema.get_field_index(c) < 0]
        if missing:
            raise UnknownColumnError(ctx.uri, missing, ctx.schema.names)
        absent = [c for c in spec.on if source.schema.get_field_index(c) < 0]
        if absent:
            raise SchemaMismatchError(ctx.uri, f"the source has no join column(s) {absent}")
        builder = ctx.dataset.merge_insert(spec.on if len(spec.on) > 1 else spec.on[0])
        if spec.matched_update:
            builder = builder.when_matched_update_all(spec.matched_condition)
        if spec.not_matched_insert:
            builder = builder.when_not_matched_insert_all()
        if spec.not_matched_by_source_delete:
            builder = builder.when_not_matched_by_source_delete(
                spec.not_matched_by_source_condition
            )
        for method, args in spec.extra:
            builder = getattr(builder, method)(*args)
        try:
            pylance_txn, _stats = builder.execute_uncommitted(source)
        except ValueError as exc:  # pylance's "Invalid user input"; I/O errors stay OSError
            raise SchemaMismatchError(ctx.uri, f"pylance refused the merge source ({exc})") from exc
        return to_transaction(ctx.uri, pylance_txn, read_version=ctx.read_version)

    return plan


def join_columns(on: str | Sequence[str]) -> list[str]:
    return [on] if isinstance(on, str) else list(on)


__all__ = ["MergeSpec", "join_columns", "materialize", "plan_merge_insert"]
