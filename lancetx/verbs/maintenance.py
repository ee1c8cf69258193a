"""compact, create_index, restore, and config / metadata updates.

* compact: ``lance.optimize.Compaction.plan`` picks fragments, each task's
  ``execute`` rewrites them (new data files, nothing committed); lancetx commits one
  Rewrite of all groups. pylance's ``Compaction.commit``, which commits itself, runs
  only on a scratch copy, to remap vector indices (:mod:`lancetx.verbs.remap`).
* create_index: ``LanceDataset.create_index_uncommitted`` writes one index segment
  over every fragment of the version read; lancetx commits a CreateIndex (replacing
  the segments of an index of the same name when ``replace=True``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from lancetx.commit.engine.builder.common import is_vector_index
from lancetx.commit.engine.committer import CommitOptions, Parent, commit_transaction
from lancetx.commit.engine.operations import (
    SINGLETON_INDEX_NAMES,
    CreateIndex,
    ReserveFragments,
    Restore,
    Rewrite,
    RewriteGroup,
    Transaction,
    UpdateConfig,
    index_fragment_ids,
    update_map,
)
from lancetx.commit.errors import CommitStateUnknownError
from lancetx.commit.format.manifest import FLAG_STABLE_ROW_IDS
from lancetx.commit.format.naming import DATA_DIR, join
from lancetx.committing import NothingToDo, PlanContext, discard
from lancetx.convert import to_fragment, to_index
from lancetx.errors import SchemaMismatchError, UnknownColumnError
from lancetx.verbs.remap import Uploads, remap_in_scratch

Plan = Callable[[PlanContext], Transaction]

log = logging.getLogger(__name__)


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
    """Rewrite the fragments pylance's compaction plan picks, keeping every index
    useful, as Lance's ``compact_files`` does.

    * Vector indices over rewritten fragments are *remapped* (on a table without
      stable row ids, whose indices hold row addresses): pylance rewrites their
      files so their addresses point into the new fragments, and the Rewrite swaps
      them in (its ``rewritten_indices``). pylance only remaps inside its own
      ``Compaction.commit``, so that runs on a scratch copy
      (:mod:`lancetx.verbs.remap`); the new fragments' ids, which the remapped
      addresses name, are reserved first (a ReserveFragments version, as pylance
      commits one too; none in strict mode, where no other commit can take them).
    * With ``defer_index_remap=True`` no index is rewritten: the Rewrite carries the
      fragment reuse index with this compaction's version added (pylance writes it
      in the same scratch commit), which readers apply to the old indices at query
      time; scalar indices are left to it as well.
    * Scalar indices are covered again by :meth:`then`: pylance builds a new segment
      of each over the new fragments, committed by lancetx as a second version
      (CreateIndex); segments left covering no fragment are removed.
    * On a table with stable row ids nothing moves: every index's fragments are
      the new ones, as Lance does.
    """

    def __init__(self, options: Mapping[str, Any], *, strict: bool = False) -> None:
        self.options = dict(options)
        self.strict = strict
        self.read_fragment_ids: frozenset[int] = frozenset()
        self.rewritten_ids: frozenset[int] = frozenset()

    @property
    def defer(self) -> bool:
        return bool(self.options.get("defer_index_remap"))

    def __call__(self, ctx: PlanContext) -> Transaction:
        from lance.optimize import Compaction

        settings: Any = dict(self.options)
        compaction = Compaction.plan(ctx.dataset, settings)
        if not compaction.tasks:
            raise NothingToDo()
        results: list[Any] = []
        try:
            for task in compaction.tasks:
                results.append(task.execute(ctx.dataset))
            # pylance 14 names them original_fragments (its stub says old_fragments).
            old_ids = frozenset(f.id for r in results for f in r.original_fragments)
            self.read_fragment_ids = frozenset(f.id for f in ctx.manifest.fragments)
            self.rewritten_ids = old_ids
            remap = self._indices_to_remap(ctx, old_ids)
            if remap is None:
                return self._plain(ctx, results)
            return self._remapped(ctx, results, remap)
        except BaseException as error:
            # Nothing references what the tasks wrote until the Rewrite is claimed
            # (the rule decides: an interrupt keeps them and says so).
            written = [
                join(ctx.base, DATA_DIR, f.path)
                for r in results
                for frag in r.new_fragments
                for f in frag.files
            ]
            # An ordinary error before that claim proves it never was; an interrupt
            # keeps them, as every door does.
            ordinary = isinstance(error, Exception) and not isinstance(
                error, CommitStateUnknownError
            )
            discard(ctx.store, written, None if ordinary else error)
            raise

    def _indices_to_remap(self, ctx: PlanContext, old_ids: frozenset[int]) -> list[Any] | None:
        """The indices pylance must rewrite in a scratch commit (the fragment reuse
        index when deferring), or None when no scratch commit is needed."""
        indices = list(ctx.parent.manifest.indices or []) if ctx.parent is not None else []
        if self.defer:
            # pylance records a reuse version for the groups some index covers, and
            # adds it to the table's fragment reuse index: it needs them all (their
            # metadata; only the reuse index's own files are read).
            return indices
        if ctx.manifest.reader_feature_flags & FLAG_STABLE_ROW_IDS:
            return None  # row ids survive the rewrite: indices stay valid
        touched = []
        for index in indices:
            if not is_vector_index(index) or index.name in SINGLETON_INDEX_NAMES:
                continue
            covered = index_fragment_ids(index)
            if covered is not None and not covered & old_ids:
                continue
            touched.append(index)
        return touched or None

    def _plain(self, ctx: PlanContext, results: list[Any]) -> Transaction:
        groups = [
            RewriteGroup(
                old_fragments=[
                    _as_read(ctx, to_fragment(ctx.uri, f)) for f in result.original_fragments
                ],
                new_fragments=[to_fragment(ctx.uri, f) for f in result.new_fragments],
            )
            for result in results
        ]
        return Transaction(read_version=ctx.read_version, operation=Rewrite(groups=tuple(groups)))

    def _remapped(self, ctx: PlanContext, results: list[Any], indices: list[Any]) -> Transaction:
        count = sum(len(r.new_fragments) for r in results)
        first_id = self._reserve(ctx, count)
        uploads = Uploads()
        try:
            remapped = remap_in_scratch(
                ctx.store,
                ctx.base,
                ctx.manifest,
                results,
                indices=indices,
                first_id=first_id,
                options=self.options,
                uploads=uploads,
                storage_options=ctx.state.pylance_storage_options(),
            )
        except BaseException as error:
            ordinary = isinstance(error, Exception)
            discard(ctx.store, uploads.keys, None if ordinary else error)
            raise
        groups = tuple(
            RewriteGroup(
                old_fragments=[_as_read(ctx, f) for f in group.old_fragments],
                new_fragments=list(group.new_fragments),
            )
            for group in remapped.groups
        )
        log.info(
            "%s: compaction of %d fragment(s) remaps %s",
            ctx.uri,
            len(self.rewritten_ids),
            ", ".join(repr(i.name) for i in indices)
            if not self.defer
            else "nothing (deferred: fragment reuse index)",
        )
        return Transaction(
            read_version=ctx.read_version,
            operation=Rewrite(
                groups=groups,
                rewritten_indices=remapped.rewritten_indices,
                frag_reuse_index=remapped.frag_reuse_index,
            ),
        )

    def _reserve(self, ctx: PlanContext, count: int) -> int:
        """The first of ``count`` fragment ids no other commit can take: reserved by a
        ReserveFragments version (the commit of the Rewrite then starts from it), or,
        in strict mode, the ids after the read version's high-water mark (a strict
        commit lands only if nothing else did)."""
        manifest = ctx.manifest
        if self.strict or count == 0:  # (no new fragment: nothing to reserve)
            high = manifest.max_fragment_id if manifest.HasField("max_fragment_id") else -1
            return max([high, *(f.id for f in manifest.fragments)]) + 1
        handler = ctx.state.conn.handler
        committed = commit_transaction(
            handler,
            ctx.base,
            Transaction(
                read_version=ctx.read_version, operation=ReserveFragments(num_fragments=count)
            ),
            parent=ctx.parent,
            options=CommitOptions(table_uri=ctx.uri),
        )
        ctx.state.remember(committed)
        ctx.meanwhile = Parent(committed.location, committed.manifest)
        top = committed.manifest.manifest.max_fragment_id
        log.info(
            "%s: version %d reserves fragment ids %d-%d for the compaction",
            ctx.uri,
            committed.version,
            top - count + 1,
            top,
        )
        return top - count + 1

    def then(self, committed: Parent) -> Plan | None:
        """The follow-up plan indexing the new fragments, or None when no index needs it."""
        if self.defer:
            return None  # the fragment reuse index serves every index meanwhile
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


def plan_compact(options: Mapping[str, Any], *, strict: bool = False) -> CompactPlan:
    """The compaction plan; ``strict``: the commit is strict (``expected_version``)."""
    return CompactPlan(options, strict=strict)


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
        # replace: pylance refuses a name in use otherwise (nothing is committed here;
        # the CreateIndex below removes the old segments).
        segment = ctx.dataset.create_index_uncommitted(
            column,
            index_type,
            name=index_name,
            replace=bool(existing),
            fragment_ids=fragment_ids,
            **params,
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
