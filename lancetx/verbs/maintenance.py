"""compact, create_index, restore, and config / metadata updates.

* compact: ``lance.optimize.Compaction.plan`` picks fragments, each task's
  ``execute`` rewrites them (new data files, nothing committed); lancetx commits one
  Rewrite of all groups. pylance's ``Compaction.commit`` would commit itself, so it is
  never called.
* create_index: ``LanceDataset.create_index_uncommitted`` writes one index segment
  over every fragment of the version read; lancetx commits a CreateIndex (replacing
  the segments of an index of the same name when ``replace=True``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lancetx.commit.engine.operations import (
    CreateIndex,
    Restore,
    Rewrite,
    RewriteGroup,
    Transaction,
    UpdateConfig,
    update_map,
)
from lancetx.committing import NothingToDo, PlanContext
from lancetx.convert import to_fragment, to_index
from lancetx.errors import SchemaMismatchError, UnknownColumnError

Plan = Callable[[PlanContext], Transaction]


def plan_compact(options: Mapping[str, Any]) -> Plan:
    def plan(ctx: PlanContext) -> Transaction:
        from lance.optimize import Compaction

        settings: Any = dict(options)
        compaction = Compaction.plan(ctx.dataset, settings)
        if not compaction.tasks:
            raise NothingToDo()
        groups = []
        for task in compaction.tasks:
            # pylance 14 names them original_fragments (its stub says old_fragments).
            result: Any = task.execute(ctx.dataset)
            groups.append(
                RewriteGroup(
                    old_fragments=[
                        _as_read(ctx, to_fragment(ctx.uri, f)) for f in result.original_fragments
                    ],
                    new_fragments=[to_fragment(ctx.uri, f) for f in result.new_fragments],
                )
            )
        return Transaction(read_version=ctx.read_version, operation=Rewrite(groups=tuple(groups)))

    return plan


def _as_read(ctx: PlanContext, fragment: Any) -> Any:
    # The old fragments exactly as the manifest we read has them (conflict checks
    # compare deletion files), not pylance's re-serialization.
    for f in ctx.manifest.fragments:
        if f.id == fragment.id:
            return f
    return fragment


def default_index_name(column: str) -> str:
    return f"{column}_idx"


def plan_create_index(
    column: str, index_type: str, name: str | None, replace: bool, params: Mapping[str, Any]
) -> Plan:
    def plan(ctx: PlanContext) -> Transaction:
        if ctx.schema.get_field_index(column) < 0:
            raise UnknownColumnError(ctx.uri, [column], ctx.schema.names)
        index_name = name or default_index_name(column)
        existing = (
            [i for i in ctx.parent.manifest.indices or [] if i.name == index_name]
            if ctx.parent
            else []
        )
        if existing and not replace:
            raise SchemaMismatchError(
                ctx.uri,
                f"an index named {index_name!r} already exists; pass replace=True to rebuild it",
            )
        fragment_ids = [f.id for f in ctx.manifest.fragments]
        segment = ctx.dataset.create_index_uncommitted(
            column, index_type, name=index_name, fragment_ids=fragment_ids, **params
        )
        return Transaction(
            read_version=ctx.read_version,
            operation=CreateIndex(
                new_indices=(to_index(ctx.uri, segment),), removed_indices=tuple(existing)
            ),
        )

    return plan


def plan_restore(version: int) -> Plan:
    def plan(ctx: PlanContext) -> Transaction:
        return Transaction(read_version=ctx.read_version, operation=Restore(version=version))

    return plan


def plan_update_config(
    *,
    config: Mapping[str, str | None] | None = None,
    table_metadata: Mapping[str, str | None] | None = None,
    schema_metadata: Mapping[str, str | None] | None = None,
    replace: bool = False,
) -> Plan:
    def plan(ctx: PlanContext) -> Transaction:
        return Transaction(
            read_version=ctx.read_version,
            operation=UpdateConfig(
                config_updates=update_map(config, replace=replace) if config is not None else None,
                table_metadata_updates=(
                    update_map(table_metadata, replace=replace)
                    if table_metadata is not None
                    else None
                ),
                schema_metadata_updates=(
                    update_map(schema_metadata, replace=replace)
                    if schema_metadata is not None
                    else None
                ),
            ),
        )

    return plan


__all__ = [
    "default_index_name",
    "plan_compact",
    "plan_create_index",
    "plan_restore",
    "plan_update_config",
]
