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

from lancetx.commit.engine.committer import Parent
from lancetx.commit.engine.operations import (
    CreateIndex,
    Restore,
    Rewrite,
    RewriteGroup,
    Transaction,
    UpdateConfig,
    index_fragment_ids,
    update_map,
)
from lancetx.committing import NothingToDo, PlanContext
from lancetx.convert import to_fragment, to_index
from lancetx.errors import SchemaMismatchError, UnknownColumnError

Plan = Callable[[PlanContext], Transaction]


#: Scalar index kinds pylance can build a segment of, by their details' type URL.
SCALAR_INDEX_TYPES: Mapping[str, str] = {
    "/lance.table.BTreeIndexDetails": "BTREE",
    "/lance.table.BitmapIndexDetails": "BITMAP",
    "/lance.table.LabelListIndexDetails": "LABEL_LIST",
    "/lance.table.InvertedIndexDetails": "INVERTED",
    "/lance.table.NGramIndexDetails": "NGRAM",
    "/lance.table.ZoneMapIndexDetails": "ZONEMAP",
    "/lance.table.BloomFilterIndexDetails": "BLOOMFILTER",
}


class CompactPlan:
    """Rewrite the fragments pylance's compaction plan picks; then (:meth:`then`)
    index the new fragments for every scalar index that covered the old ones.

    pylance can only remap an index's row addresses inside ``Compaction.commit``,
    which commits by itself; instead the rewritten rows get a new segment of the
    same index, built by pylance over the new fragments and committed by lancetx
    (a second version, CreateIndex). Segments left covering no fragment are removed.
    Vector indices keep answering correctly (the new fragments are searched
    without the index) until ``create_index(..., replace=True)``.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        self.read_fragment_ids: frozenset[int] = frozenset()
        self.rewritten_ids: frozenset[int] = frozenset()

    def __call__(self, ctx: PlanContext) -> Transaction:
        from lance.optimize import Compaction

        settings: Any = dict(self.options)
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
        self.read_fragment_ids = frozenset(f.id for f in ctx.manifest.fragments)
        self.rewritten_ids = frozenset(f.id for g in groups for f in g.old_fragments)
        return Transaction(read_version=ctx.read_version, operation=Rewrite(groups=tuple(groups)))

    def then(self, committed: Parent) -> Plan | None:
        """The follow-up plan indexing the new fragments, or None when no index needs it."""
        new_ids = sorted(
            f.id
            for f in committed.manifest.manifest.fragments
            if f.id not in self.read_fragment_ids
        )
        stale = [
            i
            for i in committed.manifest.indices or []
            if i.index_details.type_url in SCALAR_INDEX_TYPES
            and (index_fragment_ids(i) or frozenset()) & self.rewritten_ids
        ]
        if not new_ids or not stale:
            return None
        return plan_cover_fragments(stale, new_ids)


def plan_cover_fragments(stale: list[Any], fragment_ids: list[int]) -> Plan:
    """New segments of the indices ``stale`` over ``fragment_ids``; drop their segments
    that no longer cover any fragment of the table."""

    def plan(ctx: PlanContext) -> Transaction:
        existing = {f.id for f in ctx.manifest.fragments}
        alive = [f for f in fragment_ids if f in existing]
        names = {i.name for i in stale}
        current = (
            [i for i in ctx.parent.manifest.indices or [] if i.name in names] if ctx.parent else []
        )
        new_segments = []
        done: set[str] = set()
        for index in current:
            if index.name in done or not alive:
                continue
            done.add(index.name)
            segment = ctx.dataset.create_index_uncommitted(
                _field_name(ctx, index.fields[0]),
                SCALAR_INDEX_TYPES[index.index_details.type_url],
                name=index.name,
                replace=True,  # a further segment of the same index, not a new index
                fragment_ids=alive,
            )
            new_segments.append(to_index(ctx.uri, segment))
        dead = [i for i in current if not ((index_fragment_ids(i) or frozenset()) & existing)]
        if not new_segments:
            raise NothingToDo()
        return Transaction(
            read_version=ctx.read_version,
            operation=CreateIndex(new_indices=tuple(new_segments), removed_indices=tuple(dead)),
        )

    return plan


def _field_name(ctx: PlanContext, field_id: int) -> str:
    by_id = {f.id: f for f in ctx.manifest.fields}
    parts = []
    field = by_id[field_id]
    while True:
        parts.append(field.name)
        if field.parent_id < 0:
            break
        field = by_id[field.parent_id]
    return ".".join(reversed(parts))


def plan_compact(options: Mapping[str, Any]) -> CompactPlan:
    return CompactPlan(options)


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


def plan_drop_index(name: str) -> Plan:
    def plan(ctx: PlanContext) -> Transaction:
        segments = (
            [i for i in ctx.parent.manifest.indices or [] if i.name == name] if ctx.parent else []
        )
        if not segments:
            names = (
                sorted({i.name for i in (ctx.parent.manifest.indices or [])}) if ctx.parent else []
            )
            raise SchemaMismatchError(ctx.uri, f"no index named {name!r} (indices: {names})")
        return Transaction(
            read_version=ctx.read_version, operation=CreateIndex(removed_indices=tuple(segments))
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
    "SCALAR_INDEX_TYPES",
    "CompactPlan",
    "default_index_name",
    "plan_compact",
    "plan_create_index",
    "plan_drop_index",
    "plan_restore",
    "plan_update_config",
]
