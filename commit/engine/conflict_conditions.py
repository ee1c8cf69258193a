"""The named conditions of the conflict rules: the spec's "(only if ...)".

Each is a :class:`~lancetx.commit.engine.conflict_terms.Condition` over (ours,
theirs, context), named after what it asks, that gives a
:class:`~lancetx.commit.engine.conflict_terms.Finding` when it holds: why, in
words (the reason a conflict error reports), plus the facts a rebase needs.
:data:`lancetx.commit.engine.conflicts.RULES` names them in its cells; a cell
whose answer has several outcomes is a ``cases`` rule over them
(:data:`DELETION_VECTOR_REBASE`, :data:`MERGED_GENERATIONS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from lancetx.commit.engine.conflict_terms import (
    INCOMPATIBLE,
    REBASE,
    RETRYABLE,
    ConflictContext,
    Finding,
    RebaseKind,
    cases,
    condition,
)
from lancetx.commit.engine.operations import (
    CreateIndex,
    DataFragment,
    DataReplacement,
    Delete,
    IndexMetadata,
    KeyExistenceFilter,
    Merge,
    MergedGeneration,
    Operation,
    OperationKind,
    Rewrite,
    Transaction,
    Update,
    UpdateBases,
    UpdateConfig,
    UpdateMemWalState,
    index_fragment_ids,
    mem_wal_merged_generations,
)
from lancetx.commit.format.key_existence import (
    BLOOM_NUMBER_OF_ITEMS,
    BLOOM_PROBABILITY,
    blooms_may_share_key,
)

__all__ = [
    "DELETION_VECTOR_REBASE",
    "MERGED_GENERATIONS",
    "affected_rows_unknown",
    "inserted_keys_may_collide",
    "mem_wal_details_unreadable",
    "merge_touched_our_fragments",
    "merged_generation_same_region",
    "merged_generation_superseded",
    "our_group_straddles_their_index",
    "overlapping_fragments",
    "rewrite_moved_indexed_rows",
    "same_base_path",
    "same_config_key",
    "same_field_same_fragment",
    "same_metadata",
    "same_singleton_index",
    "stable_row_ids",
    "their_index_covers_rewritten_fragments",
    "they_carry_frag_reuse_index",
    "they_changed_data_files_of_our_fragment",
    "they_changed_deletions_of_our_fragment",
    "they_index_a_replaced_column",
    "they_mix_frag_reuse_with_other_indices",
    "they_removed_our_fragment",
    "they_replaced_an_indexed_column",
    "we_carry_frag_reuse_index",
    "we_changed_data_files_of_a_fragment_they_modified",
    "we_mix_frag_reuse_with_other_indices",
    "we_removed_a_fragment_they_changed",
    "we_track_inserted_keys",
]


# ------------------------------------------------------------------- wording


def _frags(ids: Iterable[int]) -> str:
    ordered = sorted(ids)
    shown = ", ".join(str(i) for i in ordered[:8]) + (", ..." if len(ordered) > 8 else "")
    return f"fragment{'s' if len(ordered) != 1 else ''} {shown}"


def _frags_were(ids: Iterable[int], participle: str) -> str:
    ordered = list(ids)
    return f"{_frags(ordered)} {'was' if len(ordered) == 1 else 'were'} {participle}"


_WHAT_HAPPENED_TO_FRAGMENTS = {
    OperationKind.DELETE: "modified by the delete",
    OperationKind.UPDATE: "modified by the update",
    OperationKind.REWRITE: "rewritten (compacted)",
    OperationKind.DATA_REPLACEMENT: "given replaced column data",
    OperationKind.MERGE: "rewritten by the merge",
}


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names))


_O = TypeVar("_O", bound=Operation)


def _op(txn: Transaction, cls: type[_O]) -> _O:
    op = txn.operation
    if not isinstance(op, cls):
        raise TypeError(f"rule for {cls.__name__} applied to {op.name}")
    return op


# ------------------------------------------------------------- fragment facts


def _read_data_files(
    ours: Transaction, ctx: ConflictContext, fragment_id: int
) -> list[object] | None:
    """Data files of one of our fragments as read; None when unknown."""
    read = ctx.read_fragments.get(fragment_id)
    if read is not None:
        return list(read.files)
    op = ours.operation
    keeps_files = isinstance(op, Delete) or (isinstance(op, Update) and not op.changes_data_files)
    if keeps_files:
        assert isinstance(op, (Delete, Update))
        for fragment in op.updated_fragments:
            if fragment.id == fragment_id:
                return list(fragment.files)
    return None


def _updated_fragments(op: Operation) -> tuple[DataFragment, ...]:
    return op.updated_fragments if isinstance(op, (Delete, Update)) else ()


@condition()
def overlapping_fragments(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Both modify (change or remove) at least one same existing fragment."""
    shared = ours.operation.modified_fragment_ids & theirs.operation.modified_fragment_ids
    if not shared:
        return None
    happened = _WHAT_HAPPENED_TO_FRAGMENTS.get(theirs.kind, "modified")
    return Finding(
        f"{_frags_were(shared, happened)}, which this {ours.operation.name} modifies too",
        fragment_ids=shared,
    )


@condition()
def merge_touched_our_fragments(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """The Merge's final fragment list drops one of our fragments or lists it
    changed from what we read (unknown read state counts as changed)."""
    merge = _op(theirs, Merge)
    dropped: set[int] = set()
    changed: set[int] = set()
    for fragment_id in ours.operation.modified_fragment_ids:
        theirs_copy = merge.fragment(fragment_id)
        if theirs_copy is None:
            dropped.add(fragment_id)
        elif ctx.read_fragments.get(fragment_id) != theirs_copy:
            changed.add(fragment_id)
    if not dropped and not changed:
        return None
    parts = []
    if changed:
        parts.append(f"the merge rewrote {_frags(changed)}")
    if dropped:
        parts.append(f"the merge's fragment list drops {_frags(dropped)}")
    return Finding(" and ".join(parts), fragment_ids=frozenset(dropped | changed))


@condition()
def they_removed_our_fragment(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """They removed outright a fragment we modify."""
    hit = theirs.operation.dropped_fragment_ids & ours.operation.modified_fragment_ids
    return Finding(_frags_were(hit, "removed entirely"), fragment_ids=hit) if hit else None


@condition()
def we_removed_a_fragment_they_changed(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """We remove outright a fragment whose rows they changed: both touched the same rows."""
    hit = ours.operation.dropped_fragment_ids & frozenset(
        f.id for f in _updated_fragments(theirs.operation)
    )
    if not hit:
        return None
    return Finding(f"this removes {_frags(hit)} whose rows it also changed", fragment_ids=hit)


@condition()
def they_changed_data_files_of_our_fragment(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """They gave one of our fragments different data files than we read."""
    mine = ours.operation.modified_fragment_ids
    hit = frozenset(
        f.id
        for f in _updated_fragments(theirs.operation)
        if f.id in mine and _read_data_files(ours, ctx, f.id) != list(f.files)
    )
    return Finding(f"the data files of {_frags(hit)} changed", fragment_ids=hit) if hit else None


@condition()
def we_changed_data_files_of_a_fragment_they_modified(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """We gave a fragment they also modified different data files than we read
    (an Update in REWRITE_COLUMNS mode writes the rewritten columns to a new
    file). The spec rebases a Delete/Update only when it "only modified
    deletion vectors (not data files)"; merging vectors into either side's copy
    would lose the other side's change, so ours must be planned again."""
    theirs_ids = theirs.operation.modified_fragment_ids
    op = ours.operation
    hit: set[int] = set()
    for fragment in _updated_fragments(op):
        if fragment.id not in theirs_ids:
            continue
        read = ctx.read_fragments.get(fragment.id)
        if read is None:
            # Unknown read state: trust what the operation says it does.
            changed = isinstance(op, Update) and op.changes_data_files
        else:
            changed = list(read.files) != list(fragment.files)
        if changed:
            hit.add(fragment.id)
    if not hit:
        return None
    return Finding(
        f"this gave {_frags(hit)} new data files (a column rewrite) and only deletion "
        "vectors can be merged",
        fragment_ids=frozenset(hit),
    )


@condition()
def affected_rows_unknown(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Overlap, and we cannot tell which rows we touched, so cannot merge."""
    if ctx.affected_rows_known:
        return None
    found = overlapping_fragments(ours, theirs, ctx)
    if found is None:
        return None
    return Finding(
        f"{found.detail} and the rows this transaction touched are unknown",
        fragment_ids=found.fragment_ids,
    )


@condition()
def they_changed_deletions_of_our_fragment(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """They wrote a new deletion file for a fragment we modify."""
    mine = frozenset(f.id for f in _updated_fragments(ours.operation))
    hit: set[int] = set()
    for fragment in _updated_fragments(theirs.operation):
        if fragment.id not in mine:
            continue
        read = ctx.read_fragments.get(fragment.id)
        if (
            read is None
            or read.deletion_file != fragment.deletion_file
            or (read.HasField("deletion_file") != fragment.HasField("deletion_file"))
        ):
            hit.add(fragment.id)
    if not hit:
        return None
    return Finding(
        f"the deletion vectors of {_frags(hit)} changed",
        fragment_ids=frozenset(hit),
        rebase=RebaseKind.MERGE_DELETION_VECTORS,
    )


#: Delete/Update vs Delete/Update (spec: "can potentially be rebased. The
#: deletion masks from the two operations will be merged. However, if both
#: operations modified the same rows, then the conflict becomes a retryable
#: conflict."). Same fragments with only deletion files changed rebase; a
#: fragment removed outright, or data files changed by either side, cannot be
#: merged (the spec's rebasable example: "it only modified deletion vectors
#: (not data files)").
DELETION_VECTOR_REBASE = cases(
    (they_removed_our_fragment, RETRYABLE),
    (we_removed_a_fragment_they_changed, RETRYABLE),
    (they_changed_data_files_of_our_fragment, RETRYABLE),
    (we_changed_data_files_of_a_fragment_they_modified, RETRYABLE),
    (affected_rows_unknown, RETRYABLE),
    (they_changed_deletions_of_our_fragment, REBASE),
)


# ---------------------------------------------------------- merge-insert keys
# The spec's Update message carries `inserted_rows` "used for conflict
# detection" but its lists do not say how: Lance check_update_txn. Lance calls two
# bloom filters intersecting when they share any bit; we ask whether they can
# share a key (a block where every word shares a bit), which is never "no" when
# Lance's answer is "yes" because of a common key, and "no" far more often for
# filters of many keys (fewer needless re-plans).

_BLOOM_DEFAULT_ITEMS = BLOOM_NUMBER_OF_ITEMS
_BLOOM_DEFAULT_PROBABILITY = BLOOM_PROBABILITY


def _keys_may_intersect(a: KeyExistenceFilter, b: KeyExistenceFilter) -> str | None:
    """Why two key filters may share a key; None if they certainly do not."""
    kind_a, kind_b = a.WhichOneof("data"), b.WhichOneof("data")
    if kind_a == "exact" and kind_b == "exact":
        shared = set(a.exact.key_hashes) & set(b.exact.key_hashes)
        return f"both inserted {len(shared)} same key(s)" if shared else None
    if kind_a == "bloom" and kind_b == "bloom":
        items_a = a.bloom.number_of_items or _BLOOM_DEFAULT_ITEMS
        items_b = b.bloom.number_of_items or _BLOOM_DEFAULT_ITEMS
        prob_a = a.bloom.probability or _BLOOM_DEFAULT_PROBABILITY
        prob_b = b.bloom.probability or _BLOOM_DEFAULT_PROBABILITY
        if items_a != items_b or abs(prob_a - prob_b) > 1e-12:
            return "their inserted-key bloom filters are not comparable"
        bits_a, bits_b = a.bloom.bitmap, b.bloom.bitmap
        if len(bits_a) != len(bits_b):
            return "their inserted-key bloom filters differ in size"
        if blooms_may_share_key(bits_a, bits_b):
            return "their inserted-key bloom filters may share a key"
        return None
    return "inserted keys cannot be compared (different filter kinds)"


@condition()
def inserted_keys_may_collide(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Our merge-insert tracks inserted keys and theirs may have inserted the same key."""
    mine = _op(ours, Update).inserted_rows
    if mine is None:
        return None
    other = theirs.operation.inserted_rows if isinstance(theirs.operation, Update) else None
    if other is None:
        return Finding("the committed update did not record which keys it inserted")
    if list(mine.field_ids) != list(other.field_ids):
        return Finding("the two merge-inserts use different key columns")
    why = _keys_may_intersect(mine, other)
    return Finding(why) if why else None


@condition()
def we_track_inserted_keys(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Our merge-insert tracks inserted keys; an append's rows may hold the same keys."""
    if _op(ours, Update).inserted_rows is None:
        return None
    return Finding("this merge-insert checks key uniqueness and the appended keys are unknown")


# --------------------------------------------------------- MemWAL generations
# Spec silent (no UpdateMemWalState list): Lance check_merged_generations_conflict.


def _our_generations(op: Operation) -> tuple[MergedGeneration, ...]:
    if isinstance(op, (Update, UpdateMemWalState)):
        return op.merged_generations
    return ()


def _their_generations(op: Operation) -> tuple[MergedGeneration, ...] | None:
    if isinstance(op, (Update, UpdateMemWalState)):
        return op.merged_generations
    if isinstance(op, CreateIndex) and op.mem_wal_index is not None:
        return mem_wal_merged_generations(op.mem_wal_index)
    return ()


def _same_region_pairs(
    ours: Transaction, theirs: Transaction
) -> list[tuple[MergedGeneration, MergedGeneration]]:
    committed = _their_generations(theirs.operation) or ()
    return [
        (mine, other)
        for mine in _our_generations(ours.operation)
        for other in committed
        if mine.region_id.uuid == other.region_id.uuid
    ]


@condition()
def mem_wal_details_unreadable(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """The committed MemWAL index's details do not decode (Lance fails the commit)."""
    if _their_generations(theirs.operation) is None and _our_generations(ours.operation):
        return Finding("the committed MemWAL index details do not decode")
    return None


@condition()
def merged_generation_superseded(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """A region we mark merged was already merged to the same or a later generation."""
    hit = [(m, o) for m, o in _same_region_pairs(ours, theirs) if o.generation >= m.generation]
    if not hit:
        return None
    mine, other = hit[0]
    return Finding(
        f"a region was already merged up to generation {other.generation} "
        f"(this marks generation {mine.generation})"
    )


@condition()
def merged_generation_same_region(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Both mark generations of the same MemWAL region as merged."""
    pairs = _same_region_pairs(ours, theirs)
    if not pairs:
        return None
    mine, other = pairs[0]
    return Finding(
        f"both mark the same MemWAL region merged (generation {other.generation} committed, "
        f"{mine.generation} here)"
    )


MERGED_GENERATIONS = cases(
    (mem_wal_details_unreadable, INCOMPATIBLE),
    (merged_generation_superseded, INCOMPATIBLE),
    (merged_generation_same_region, RETRYABLE),
)


# ------------------------------------------------------------------ indices


@condition()
def same_singleton_index(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Both modify the same singleton index (fragment reuse or MemWAL)."""
    mine, other = _op(ours, CreateIndex), _op(theirs, CreateIndex)
    shared = mine.singleton_indices_modified & other.singleton_indices_modified
    if not shared:
        return None
    return Finding(
        f"both modify the singleton index {_names(shared)}",
        indices=tuple(i for i in other.new_indices if i.name in shared),
        index_names=shared,
        rebase=RebaseKind.MERGE_SINGLETON_INDEX,
    )


def _covered_and_rewritten(index: CreateIndex, rewrite: Rewrite) -> frozenset[int]:
    covered = index.covered_fragment_ids
    rewritten = rewrite.modified_fragment_ids
    return rewritten if covered is None else covered & rewritten


@condition()
def rewrite_moved_indexed_rows(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """The rewrite replaced fragments our index covers (an index without a
    fragment bitmap covers every fragment)."""
    hit = _covered_and_rewritten(_op(ours, CreateIndex), _op(theirs, Rewrite))
    return (
        Finding(f"{_frags(hit)} covered by the index were rewritten", fragment_ids=hit)
        if hit
        else None
    )


@condition()
def their_index_covers_rewritten_fragments(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Their new index covers fragments we rewrite."""
    hit = _covered_and_rewritten(_op(theirs, CreateIndex), _op(ours, Rewrite))
    if not hit:
        return None
    return Finding(f"the new index covers {_frags(hit)} that this rewrites", fragment_ids=hit)


@condition(negated="the table does not use stable row ids")
def stable_row_ids(ours: Transaction, theirs: Transaction, ctx: ConflictContext) -> Finding | None:
    """The table uses stable row ids (indices survive rewrites)."""
    return Finding("the table uses stable row ids") if ctx.stable_row_ids else None


def _carried_fri(txn: Transaction) -> IndexMetadata | None:
    op = txn.operation
    if isinstance(op, Rewrite):
        return op.frag_reuse_index
    if isinstance(op, CreateIndex):
        return op.frag_reuse_index
    return None


@condition(negated="the rewrite carries no fragment reuse index")
def they_carry_frag_reuse_index(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Theirs carries (Rewrite) or writes (CreateIndex) a fragment reuse index."""
    fri = _carried_fri(theirs)
    if fri is None:
        return None
    return Finding(
        f"it carries the fragment reuse index (v{fri.dataset_version})",
        indices=(fri,),
        index_names=frozenset({fri.name}),
        rebase=RebaseKind.MERGE_FRAGMENT_REUSE_INDEX,
    )


@condition(negated="this carries no fragment reuse index")
def we_carry_frag_reuse_index(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Ours carries (Rewrite) or writes (CreateIndex) a fragment reuse index."""
    return (
        Finding("this carries a fragment reuse index") if _carried_fri(ours) is not None else None
    )


@condition()
def we_mix_frag_reuse_with_other_indices(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Lance: "we don't support committing a mixture of frag_reuse_index and other indices"."""
    if _op(ours, CreateIndex).mixes_frag_reuse_with_other_indices:
        return Finding("this commits the fragment reuse index together with other index changes")
    return None


@condition()
def they_mix_frag_reuse_with_other_indices(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """As above, for the committed CreateIndex."""
    if _op(theirs, CreateIndex).mixes_frag_reuse_with_other_indices:
        return Finding("it committed the fragment reuse index together with other index changes")
    return None


@condition()
def our_group_straddles_their_index(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """A rewrite group of ours mixes fragments their new index covers with ones
    it does not (Lance check_rewrite_txn: the remapped bitmap would be invalid)."""
    rewrite, index = _op(ours, Rewrite), _op(theirs, CreateIndex)
    for new_index in index.new_indices:
        covered = index_fragment_ids(new_index)
        if covered is None:
            return Finding(f"index {new_index.name!r} does not record the fragments it covers")
        for group in rewrite.all_groups:
            ids = {f.id for f in group.old_fragments}
            if ids & covered and ids - covered:
                return Finding(
                    f"a rewrite group mixes {_frags(ids & covered)} indexed by "
                    f"{new_index.name!r} with unindexed {_frags(ids - covered)}",
                    fragment_ids=frozenset(ids),
                )
    return None


@condition()
def they_replaced_an_indexed_column(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """They replaced a column our new index indexes, in a fragment it covers."""
    index, replacement = _op(ours, CreateIndex), _op(theirs, DataReplacement)
    covered = index.covered_fragment_ids
    hit = frozenset(
        fragment_id
        for fragment_id, fields in replacement.replaced_field_ids.items()
        if fields & index.indexed_field_ids and (covered is None or fragment_id in covered)
    )
    if not hit:
        return None
    return Finding(f"an indexed column of {_frags(hit)} was replaced", fragment_ids=hit)


@condition()
def they_index_a_replaced_column(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Their new index indexes a column we replace."""
    shared = (
        _op(theirs, CreateIndex).indexed_field_ids
        & _op(ours, DataReplacement).all_replaced_field_ids
    )
    if not shared:
        return None
    return Finding(f"the new index covers field(s) {sorted(shared)} that this replaces")


@condition()
def same_field_same_fragment(
    ours: Transaction, theirs: Transaction, ctx: ConflictContext
) -> Finding | None:
    """Both replace the same field of the same fragment."""
    mine = _op(ours, DataReplacement).replaced_field_ids
    other = _op(theirs, DataReplacement).replaced_field_ids
    hit = frozenset(fid for fid, fields in mine.items() if fields & other.get(fid, frozenset()))
    if not hit:
        return None
    return Finding(f"both replace the same field of {_frags(hit)}", fragment_ids=hit)


# ------------------------------------------------------------------ config


@condition()
def same_config_key(ours: Transaction, theirs: Transaction, ctx: ConflictContext) -> Finding | None:
    """One sets a table config key the other sets or removes (replacing the
    whole config map touches every key). Two removals of the same key commute
    -- either order leaves it absent -- so they do not conflict (as in Lance's
    ``upsert_key_conflict``; a divergence from the spec's wording, marked in
    the conflict matrix)."""
    mine, other = ours.operation, theirs.operation
    shared = (mine.upserted_config_keys & other.touched_config_keys) | (
        mine.touched_config_keys & other.upserted_config_keys
    )
    if shared:
        return Finding(f"both change config key(s) {_names(shared)}")
    if (mine.replaces_config and other.touched_config_keys) or (
        other.replaces_config and mine.touched_config_keys
    ):
        return Finding("one replaces the whole config map and the other changes config")
    return None


@condition()
def same_metadata(ours: Transaction, theirs: Transaction, ctx: ConflictContext) -> Finding | None:
    """Both change the same table-metadata key, schema metadata, or the same
    field's metadata (spec silent on metadata: Lance modifies_same_metadata)."""
    mine, other = _op(ours, UpdateConfig), _op(theirs, UpdateConfig)
    if mine.table_metadata_updates is not None and other.table_metadata_updates is not None:
        shared = mine.table_metadata_keys & other.table_metadata_keys
        if mine.replaces_table_metadata or other.replaces_table_metadata or shared:
            return Finding(f"both change table metadata {_names(shared)}".rstrip())
    if mine.changes_schema_metadata and other.changes_schema_metadata:
        return Finding("both change the schema metadata")
    fields = mine.field_metadata_field_ids & other.field_metadata_field_ids
    if fields:
        return Finding(f"both change the metadata of field(s) {sorted(fields)}")
    return None


# ------------------------------------------------------------------- bases


@condition()
def same_base_path(ours: Transaction, theirs: Transaction, ctx: ConflictContext) -> Finding | None:
    """A base path of ours has the same id, name or path as one of theirs
    (an id of 0 means "unassigned" and a missing name never clashes, as in Lance)."""
    for mine in _op(ours, UpdateBases).new_bases:
        for other in _op(theirs, UpdateBases).new_bases:
            if mine.id and mine.id == other.id:
                return Finding(f"both add base path id {mine.id}")
            if mine.HasField("name") and other.HasField("name") and mine.name == other.name:
                return Finding(f"both add a base path named {mine.name!r}")
            if mine.path == other.path:
                return Finding(f"both add base path {mine.path!r}")
    return None
