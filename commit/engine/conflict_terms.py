"""The terms the conflict rules are written in: outcomes, conditions, rules, the table.

:data:`lancetx.commit.engine.conflicts.RULES` is written in these terms, one spec
section per operation (:meth:`RuleTable.section`); the named conditions it uses
(the spec's "(only if ...)") live in :mod:`lancetx.commit.engine.conflict_conditions`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lancetx.commit.engine.operations import (
    DataFragment,
    IndexMetadata,
    OperationKind,
    Transaction,
)

__all__ = [
    "ALWAYS",
    "APPEND",
    "CLONE",
    "COMPATIBLE",
    "CREATE_INDEX",
    "DATA_REPLACEMENT",
    "DELETE",
    "INCOMPATIBLE",
    "MERGE",
    "OVERWRITE",
    "PROJECT",
    "REBASE",
    "RESERVE_FRAGMENTS",
    "RESTORE",
    "RETRYABLE",
    "REWRITE",
    "UPDATE",
    "UPDATE_BASES",
    "UPDATE_CONFIG",
    "UPDATE_MEM_WAL_STATE",
    "WHAT_THEY_DID",
    "Always",
    "Cases",
    "Condition",
    "ConflictContext",
    "Entry",
    "Finding",
    "Outcome",
    "RebaseKind",
    "RebaseNeeded",
    "Rule",
    "RuleTable",
    "Test",
    "cases",
    "condition",
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


# ------------------------------------------------------------------ the table

#: What each kind of operation did, in words: the reason a verdict gives when
#: no condition says more.
WHAT_THEY_DID: dict[OperationKind, str] = {
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

#: A list entry that holds whatever the two operations hold.
ALWAYS = Condition("always", lambda ours, theirs, ctx: Finding(WHAT_THEY_DID[theirs.kind]))

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


class RuleTable(dict[tuple[OperationKind, OperationKind], Rule]):
    """Every ordered pair of operation kinds (ours, theirs) and its rule, filled
    one spec section at a time."""

    def section(
        self,
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
                if (ours, theirs) in self:
                    raise ValueError(f"{ours} vs {theirs} is listed twice")
                self[(ours, theirs)] = _entry_rule(entry, outcome)
        for theirs in OperationKind:
            self.setdefault((ours, theirs), Always(COMPATIBLE))


def _entry_rule(entry: Entry, outcome: Outcome) -> Rule:
    if isinstance(entry, Rule):
        return entry
    if entry is ALWAYS:
        return Always(outcome)
    return when(entry, outcome)
