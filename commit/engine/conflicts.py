"""Conflict resolution: may a transaction commit on top of one committed since it read?

For the transaction being committed (*ours*, planned against ``read_version``)
and each transaction committed after that version (*theirs*), :func:`classify`
gives one of four outcomes, exactly as the compatibility lists of the Lance
transaction specification of the Lance table format say:

* ``COMPATIBLE`` -- ours applies on top of theirs unchanged;
* ``REBASE`` -- ours must be adjusted first (see :class:`RebaseNeeded`);
* ``RETRYABLE`` -- ours must be planned again against the new table state;
* ``INCOMPATIBLE`` -- ours no longer makes sense; do not retry blindly.

The rules are data: :data:`RULES` maps every ordered pair of operation kinds
(15 x 15) to a :class:`Rule`. It is written below one spec section per
operation, with the section's three lists ("conflict with" = incompatible,
"retryable conflicts", "rebaseable conflicts"); a kind not listed is compatible.
A list entry is either ``ALWAYS`` or a named :class:`Condition` -- the spec's
"(only if ...)" -- and a cell whose answer has several outcomes is a
:func:`cases` rule. Where the spec is silent (it has no UpdateMemWalState list,
and says nothing of merge-insert key filters, MemWAL generations, or a
DataReplacement target that was deleted) the rules follow Lance's
``rust/lance/src/io/commit/conflict_resolver.rs``; those entries are marked.

REBASE is a verdict only: the rebase itself (merging deletion vectors, merging
singleton-index details) happens elsewhere, from what :class:`RebaseNeeded` says.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

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
    "ALWAYS",
    "RULES",
    "Always",
    "Cases",
    "Condition",
    "ConflictContext",
    "Finding",
    "Outcome",
    "RebaseKind",
    "RebaseNeeded",
    "Rule",
    "Verdict",
    "cases",
    "classify",
    "classify_all",
    "compatible_by_kind",
    "when",
]


class Outcome(enum.Enum):
    """How a committed transaction affects the one being committed (mildest first)."""

    COMPATIBLE = "compatible"
    REBASE = "rebase"
    RETRYABLE = "retryable"
    INCOMPATIBLE = "incompatible"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    def __str__(self) -> str:
        return self.value


_SEVERITY = {o: i for i, o in enumerate(Outcome)}
COMPATIBLE = Outcome.COMPATIBLE
REBASE = Outcome.REBASE
RETRYABLE = Outcome.RETRYABLE
INCOMPATIBLE = Outcome.INCOMPATIBLE


@dataclass(frozen=True)
class ConflictContext:
    """What conditional rules need beyond the two transactions.

    ``stable_row_ids``: the table has the stable-row-id feature (then a rewrite
    does not invalidate row ids an index refers to).

    ``affected_rows_known``: the committer knows which rows its Delete/Update
    touched, so deletion vectors can be merged (Lance's ``affected_rows``).
    Without them an overlap with another delete/update is retryable.

    ``read_fragments``: the fragments ours modifies, as they were at its read
    version (Lance's ``initial_fragments``). They tell whether a committed
    operation changed a fragment's data files or deletion file. When a fragment
    is missing the rules assume the worst (it changed), except that a Delete
    (and a row-rewriting Update) keeps the data files it read.
    """

    stable_row_ids: bool = False
    affected_rows_known: bool = True
    read_fragments: Mapping[int, DataFragment] = field(default_factory=dict)


class RebaseKind(enum.Enum):
    """What a REBASE must merge into ours before it can commit."""

    #: Delete/Update vs Delete/Update: reload the latest deletion vectors of
    #: ``fragment_ids``; if they share rows with ours' affected rows the
    #: conflict is RETRYABLE, else write the union as new deletion files
    #: (a fragment whose rows are all deleted becomes a removed fragment) and
    #: move ours' read_version to the committed version.
    MERGE_DELETION_VECTORS = "merge deletion vectors"
    #: CreateIndex/Rewrite vs Rewrite/CreateIndex carrying fragment reuse
    #: indices: fold the committed fragment reuse index (``indices``) into ours.
    MERGE_FRAGMENT_REUSE_INDEX = "merge fragment reuse index"
    #: CreateIndex vs CreateIndex of the same singleton index (``index_names``):
    #: merge the committed index details (``indices``) into ours and remove
    #: the committed one.
    MERGE_SINGLETON_INDEX = "merge singleton index"


@dataclass(frozen=True)
class RebaseNeeded:
    """Everything the rebase step needs to know about one REBASE verdict."""

    kind: RebaseKind
    committed_version: int | None
    fragment_ids: frozenset[int] = frozenset()
    indices: tuple[IndexMetadata, ...] = ()
    index_names: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Finding:
    """Why a condition holds, in words, plus the facts a rebase needs."""

    detail: str
    fragment_ids: frozenset[int] = frozenset()
    indices: tuple[IndexMetadata, ...] = ()
    index_names: frozenset[str] = frozenset()
    rebase: RebaseKind | None = None

    def merged(self, other: Finding) -> Finding:
        return Finding(
            detail=f"{self.detail}; {other.detail}",
            fragment_ids=self.fragment_ids | other.fragment_ids,
            indices=self.indices + other.indices,
            index_names=self.index_names | other.index_names,
            rebase=self.rebase or other.rebase,
        )


Test = Callable[[Transaction, Transaction, ConflictContext], "Finding | None"]


@dataclass(frozen=True)
class Condition:
    """A named predicate over (ours, theirs, context): a Finding when it holds.

    Conditions compose with ``&``, ``|`` and ``~``; ``negated`` is the detail
    a negation reports when the condition does not hold.
    """

    name: str
    test: Test = field(repr=False, compare=False)
    negated: str = ""

    def __call__(
        self, ours: Transaction, theirs: Transaction, ctx: ConflictContext
    ) -> Finding | None:
        return self.test(ours, theirs, ctx)

    def __and__(self, other: Condition) -> Condition:
        def both(ours: Transaction, theirs: Transaction, ctx: ConflictContext) -> Finding | None:
            first = self(ours, theirs, ctx)
            if first is None:
                return None
            second = other(ours, theirs, ctx)
            return None if second is None else first.merged(second)

        return Condition(f"({self.name} and {other.name})", both)

    def __or__(self, other: Condition) -> Condition:
        def either(ours: Transaction, theirs: Transaction, ctx: ConflictContext) -> Finding | None:
            return self(ours, theirs, ctx) or other(ours, theirs, ctx)

        return Condition(f"({self.name} or {other.name})", either)

    def __invert__(self) -> Condition:
        def negation(
            ours: Transaction, theirs: Transaction, ctx: ConflictContext
        ) -> Finding | None:
            if self(ours, theirs, ctx) is not None:
                return None
            return Finding(self.negated or f"not {self.name}")

        return Condition(f"not {self.name}", negation, negated=self.name)


def condition(negated: str = "") -> Callable[[Test], Condition]:
    """Decorator: turn a test function into a Condition named after it."""

    def wrap(test: Test) -> Condition:
        return Condition(test.__name__, test, negated)

    return wrap


class Rule:
    """The answer for one (ours kind, theirs kind) cell."""

    @property
    def name(self) -> str:
        """The rule, in words (``when overlapping_fragments: retryable; else compatible``)."""
        raise NotImplementedError

    def decide(
        self, ours: Transaction, theirs: Transaction, ctx: ConflictContext
    ) -> tuple[Outcome, Finding | None]:
        raise NotImplementedError

    def outcomes(self) -> frozenset[Outcome]:
        """Every outcome this rule can give."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class Always(Rule):
    """The same outcome whatever the operations hold."""

    outcome: Outcome

    @property
    def name(self) -> str:
        return str(self.outcome)

    def decide(
        self, ours: Transaction, theirs: Transaction, ctx: ConflictContext
    ) -> tuple[Outcome, Finding | None]:
        return self.outcome, None

    def outcomes(self) -> frozenset[Outcome]:
        return frozenset({self.outcome})


@dataclass(frozen=True, repr=False)
class Cases(Rule):
    """The outcome of the first condition that holds, else ``otherwise``."""

    cases: tuple[tuple[Condition, Outcome], ...]
    otherwise: Outcome | Rule = COMPATIBLE

    @property
    def name(self) -> str:
        parts = [f"when {c.name}: {o}" for c, o in self.cases]
        tail = self.otherwise if isinstance(self.otherwise, Outcome) else self.otherwise.name
        return "; ".join([*parts, f"else {tail}"])

    def decide(
        self, ours: Transaction, theirs: Transaction, ctx: ConflictContext
    ) -> tuple[Outcome, Finding | None]:
        for cond, outcome in self.cases:
            found = cond(ours, theirs, ctx)
            if found is not None:
                return outcome, found
        if isinstance(self.otherwise, Rule):
            return self.otherwise.decide(ours, theirs, ctx)
        return self.otherwise, None

    def outcomes(self) -> frozenset[Outcome]:
        tail = (
            self.otherwise.outcomes()
            if isinstance(self.otherwise, Rule)
            else frozenset({self.otherwise})
        )
        return frozenset(o for _, o in self.cases) | tail


def cases(*pairs: tuple[Condition, Outcome], else_: Outcome | Rule = COMPATIBLE) -> Cases:
    """First matching ``(condition, outcome)``, else ``else_``."""
    return Cases(tuple(pairs), else_)


def when(cond: Condition, outcome: Outcome, else_: Outcome | Rule = COMPATIBLE) -> Cases:
    """``outcome`` if ``cond`` holds, else ``else_``."""
    return Cases(((cond, outcome),), else_)


# ------------------------------------------------------------------- wording

_WHAT_THEY_DID = {
    OperationKind.APPEND: "it added fragments",
    OperationKind.DELETE: "it deleted rows",
    OperationKind.OVERWRITE: "it replaced the whole table",
    OperationKind.CREATE_INDEX: "it changed indices",
    OperationKind.REWRITE: "it rewrote (compacted) fragments",
    OperationKind.MERGE: "it replaced the fragment list and schema",
    OperationKind.PROJECT: "it changed the schema",
    OperationKind.RESTORE: "it restored an older version",
    OperationKind.RESERVE_FRAGMENTS: "it reserved fragment ids",
    OperationKind.CLONE: "it created the table as a clone",
    OperationKind.UPDATE: "it updated rows",
    OperationKind.UPDATE_CONFIG: "it changed config or metadata",
    OperationKind.DATA_REPLACEMENT: "it replaced column data",
    OperationKind.UPDATE_MEM_WAL_STATE: "it changed the MemWAL merge state",
    OperationKind.UPDATE_BASES: "it added base paths",
}


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


# ===================================================================== RULES

ALWAYS = Condition("always", lambda ours, theirs, ctx: Finding(_WHAT_THEY_DID[theirs.kind]))

(
    APPEND,
    DELETE,
    OVERWRITE,
    CREATE_INDEX,
    REWRITE,
    MERGE,
    PROJECT,
    RESTORE,
    RESERVE_FRAGMENTS,
    CLONE,
    UPDATE,
    UPDATE_CONFIG,
    DATA_REPLACEMENT,
    UPDATE_MEM_WAL_STATE,
    UPDATE_BASES,
) = tuple(OperationKind)

Entry = Condition | Rule

#: Filled by _section below; every ordered pair of kinds has a rule.
RULES: dict[tuple[OperationKind, OperationKind], Rule] = {}


def _entry_rule(entry: Entry, outcome: Outcome) -> Rule:
    if isinstance(entry, Rule):
        return entry
    if entry is ALWAYS:
        return Always(outcome)
    return when(entry, outcome)


def _section(
    ours: OperationKind,
    *,
    conflict_with: Mapping[OperationKind, Entry] | None = None,
    retryable: Mapping[OperationKind, Entry] | None = None,
    rebaseable: Mapping[OperationKind, Entry] | None = None,
) -> None:
    """One "<Op> Compatibility" section of the spec: its three lists; every
    kind not listed is compatible."""
    lists = (
        (conflict_with or {}, INCOMPATIBLE),
        (retryable or {}, RETRYABLE),
        (rebaseable or {}, REBASE),
    )
    for entries, outcome in lists:
        for theirs, entry in entries.items():
            if (ours, theirs) in RULES:
                raise ValueError(f"{ours} vs {theirs} is listed twice")
            RULES[(ours, theirs)] = _entry_rule(entry, outcome)
    for theirs in OperationKind:
        RULES.setdefault((ours, theirs), Always(COMPATIBLE))


# Append Compatibility: "These are the operations that conflict with append".
_section(
    APPEND,
    conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
)

# Delete Compatibility.
_section(
    DELETE,
    conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
    retryable={
        # "Merge (only if there are overlapping fragments)": Merge's list is the
        # table's final fragment list, so dropping or rewriting ours overlaps.
        MERGE: merge_touched_our_fragments,
        REWRITE: overlapping_fragments,
        DATA_REPLACEMENT: overlapping_fragments,
    },
    rebaseable={DELETE: DELETION_VECTOR_REBASE, UPDATE: DELETION_VECTOR_REBASE},
)

# Overwrite Compatibility: "we consider the following to be retryable conflicts".
_section(
    OVERWRITE,
    retryable={UPDATE_CONFIG: same_config_key, OVERWRITE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
)

# CreateIndex Compatibility.
_section(
    CREATE_INDEX,
    conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
    retryable={
        # "Rewrite (only if overlapping fragments, no stable row ids, and no
        # fragment reuse index)". The rebase when both carry the fragment reuse
        # index is the spec's Rebase Mechanism ("Accumulates fragment reuse
        # index updates when concurrent Rewrites change fragment IDs") and Lance
        # check_create_index_txn, which also refuses a mixed FRI commit.
        REWRITE: cases(
            (
                we_carry_frag_reuse_index
                & they_carry_frag_reuse_index
                & we_mix_frag_reuse_with_other_indices,
                INCOMPATIBLE,
            ),
            (we_carry_frag_reuse_index & they_carry_frag_reuse_index, REBASE),
            (
                rewrite_moved_indexed_rows & ~stable_row_ids & ~they_carry_frag_reuse_index,
                RETRYABLE,
            ),
        ),
        # "DataReplacement (only if overlapping fragments and the column being
        # replaced is being indexed)".
        DATA_REPLACEMENT: they_replaced_an_indexed_column,
    },
    # "CreateIndex (only if both operations are modifying the same singleton index)".
    rebaseable={CREATE_INDEX: same_singleton_index},
)

# Rewrite Compatibility.
_section(
    REWRITE,
    conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS},
    retryable={
        MERGE: ALWAYS,
        DATA_REPLACEMENT: overlapping_fragments,
        DELETE: overlapping_fragments,
        UPDATE: overlapping_fragments,
        # "Rewrite (if overlapping fragments or both carry a fragment reuse index)".
        REWRITE: overlapping_fragments | (we_carry_frag_reuse_index & they_carry_frag_reuse_index),
        # "CreateIndex (overlapping fragments and no fragment reuse index or
        # stable row ids)" and, rebaseable, "CreateIndex (if the CreateIndex is
        # writing the fragment reuse index and the Rewrite is carrying a
        # fragment reuse index)". Spec silent, Lance check_rewrite_txn: a mixed
        # FRI commit is incompatible; with our FRI, a rewrite group straddling
        # their index's bitmap is retryable.
        CREATE_INDEX: cases(
            (they_carry_frag_reuse_index & they_mix_frag_reuse_with_other_indices, INCOMPATIBLE),
            (they_carry_frag_reuse_index & we_carry_frag_reuse_index, REBASE),
            (they_carry_frag_reuse_index, COMPATIBLE),
            (we_carry_frag_reuse_index & our_group_straddles_their_index, RETRYABLE),
            (we_carry_frag_reuse_index, COMPATIBLE),
            (their_index_covers_rewritten_fragments & ~stable_row_ids, RETRYABLE),
        ),
    },
)

# Merge Compatibility.
_section(
    MERGE,
    conflict_with={
        OVERWRITE: ALWAYS,
        RESTORE: ALWAYS,
        UPDATE_MEM_WAL_STATE: ALWAYS,
        PROJECT: ALWAYS,
    },
    retryable={
        UPDATE: ALWAYS,
        APPEND: ALWAYS,
        DELETE: ALWAYS,
        MERGE: ALWAYS,
        REWRITE: ALWAYS,
        DATA_REPLACEMENT: ALWAYS,
    },
)

# Project Compatibility.
_section(
    PROJECT,
    conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
    retryable={PROJECT: ALWAYS, MERGE: ALWAYS},
)

# Restore Compatibility.
_section(RESTORE, conflict_with={UPDATE_MEM_WAL_STATE: ALWAYS})

# ReserveFragments Compatibility.
_section(RESERVE_FRAGMENTS, conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS})

# Clone Compatibility: "there is no such thing as a conflict with Clone".
_section(CLONE)

# Update Compatibility.
_section(
    UPDATE,
    conflict_with={
        OVERWRITE: ALWAYS,
        RESTORE: ALWAYS,
        # Not in the spec's Update lists; Lance check_update_txn compares MemWAL
        # merged generations.
        UPDATE_MEM_WAL_STATE: MERGED_GENERATIONS,
    },
    retryable={
        REWRITE: overlapping_fragments,
        DATA_REPLACEMENT: overlapping_fragments,
        MERGE: ALWAYS,
        # Spec silent on merge-insert key filters: Lance check_update_txn.
        APPEND: we_track_inserted_keys,
    },
    rebaseable={
        DELETE: DELETION_VECTOR_REBASE,
        # Key filters first (spec silent; Lance check_update_txn), then as Delete.
        UPDATE: cases((inserted_keys_may_collide, RETRYABLE), else_=DELETION_VECTOR_REBASE),
    },
)

# UpdateConfig Compatibility.
_section(
    UPDATE_CONFIG,
    conflict_with={
        OVERWRITE: ALWAYS,
        # "UpdateConfig (only if the two operations modify the same config)";
        # metadata maps per Lance modifies_same_metadata.
        UPDATE_CONFIG: same_config_key | same_metadata,
    },
)

# DataReplacement Compatibility.
_section(
    DATA_REPLACEMENT,
    conflict_with={
        OVERWRITE: ALWAYS,
        RESTORE: ALWAYS,
        UPDATE_MEM_WAL_STATE: ALWAYS,
        # Not in the spec's lists (a delete only tombstones rows); spec silent on
        # a target fragment that was deleted outright: Lance check_data_replacement_txn.
        DELETE: they_removed_our_fragment,
    },
    retryable={
        DATA_REPLACEMENT: same_field_same_fragment,
        CREATE_INDEX: they_index_a_replaced_column,
        REWRITE: overlapping_fragments,
        UPDATE: overlapping_fragments,
        MERGE: ALWAYS,
    },
)

# UpdateMemWalState: the spec has no compatibility list; Lance
# check_update_mem_wal_state_txn (Clone excepted: the spec says there is no
# conflict with Clone).
_section(
    UPDATE_MEM_WAL_STATE,
    conflict_with={
        APPEND: ALWAYS,
        OVERWRITE: ALWAYS,
        DELETE: ALWAYS,
        DATA_REPLACEMENT: ALWAYS,
        MERGE: ALWAYS,
        RESTORE: ALWAYS,
        PROJECT: ALWAYS,
        UPDATE_MEM_WAL_STATE: MERGED_GENERATIONS,
        UPDATE: MERGED_GENERATIONS,
        CREATE_INDEX: MERGED_GENERATIONS,
    },
)

# UpdateBases Compatibility: "only conflicts with other UpdateBases operations
# and even then only conflicts if the two operations have base paths with the
# same id, name, or path".
_section(UPDATE_BASES, conflict_with={UPDATE_BASES: same_base_path})

assert len(RULES) == len(OperationKind) ** 2


# ================================================================== verdicts


@dataclass(frozen=True)
class Verdict:
    """The classification of ours against one committed transaction."""

    outcome: Outcome
    reason: str
    ours: OperationKind
    theirs: OperationKind
    committed_version: int | None
    rule: str
    rebase: RebaseNeeded | None = None

    @property
    def blocks(self) -> bool:
        """Whether ours cannot commit as planned (retryable or incompatible)."""
        return self.outcome in (RETRYABLE, INCOMPATIBLE)


def _advice(outcome: Outcome, ours: Transaction, where: str) -> str:
    verb = ours.operation.name
    if outcome is COMPATIBLE:
        return "no conflict"
    if outcome is REBASE:
        return f"rebase the {verb} onto {where}"
    if outcome is RETRYABLE:
        return f"re-read the table at {where} or later and retry the {verb}"
    return f"the {verb} cannot be applied on top of it; do not retry it unchanged"


def compatible_by_kind(ours: OperationKind, theirs: OperationKind) -> bool:
    """True when the rules find ours compatible with theirs whatever either holds
    (an ``Always(COMPATIBLE)`` entry, e.g. an Append against an Append): theirs
    need not be read to judge ours against it."""
    rule = RULES[(ours, theirs)]
    return isinstance(rule, Always) and rule.outcome is COMPATIBLE


def classify(
    ours: Transaction,
    theirs: Transaction,
    *,
    context: ConflictContext | None = None,
    committed_version: int | None = None,
) -> Verdict:
    """Classify ours (being committed) against theirs (committed since ours'
    read_version, as ``committed_version`` when known)."""
    ctx = context or ConflictContext()
    rule = RULES[(ours.kind, theirs.kind)]
    outcome, found = rule.decide(ours, theirs, ctx)
    where = f"v{committed_version}" if committed_version is not None else "the new version"
    committed = (
        f"committed as v{committed_version}"
        if committed_version is not None
        else f"committed after v{ours.read_version}"
    )
    detail = found.detail if found is not None else _WHAT_THEY_DID[theirs.kind]
    reason = (
        f"{ours.describe()} vs {theirs.operation.name} {committed}: {detail}; "
        f"{_advice(outcome, ours, where)}"
    )
    rebase = None
    if outcome is REBASE:
        if found is None or found.rebase is None:
            raise AssertionError(f"rule {rule.name} gave REBASE without rebase facts")
        rebase = RebaseNeeded(
            kind=found.rebase,
            committed_version=committed_version,
            fragment_ids=found.fragment_ids,
            indices=found.indices,
            index_names=found.index_names,
        )
    return Verdict(outcome, reason, ours.kind, theirs.kind, committed_version, rule.name, rebase)


def classify_all(
    ours: Transaction,
    committed: Sequence[tuple[int, Transaction]],
    *,
    context: ConflictContext | None = None,
) -> list[Verdict]:
    """Classify ours against each ``(version, transaction)`` committed since its
    read version, in version order, stopping after the first blocking verdict
    (as Lance does: later ones no longer matter)."""
    verdicts = []
    for version, theirs in sorted(committed, key=lambda pair: pair[0]):
        verdict = classify(ours, theirs, context=context, committed_version=version)
        verdicts.append(verdict)
        if verdict.blocks:
            break
    return verdicts
