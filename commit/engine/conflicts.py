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
(15 x 15) to a :class:`Rule`. It is written below, first thing, one spec
section per operation, with the section's three lists ("conflict with" =
incompatible, "retryable conflicts", "rebaseable conflicts"); a kind not listed
is compatible. A list entry is either ``ALWAYS`` or a named :class:`Condition`
-- the spec's "(only if ...)", each in
:mod:`lancetx.commit.engine.conflict_conditions` -- and a cell whose answer has
several outcomes is a :func:`cases` rule. The terms (outcomes, conditions,
rules) are :mod:`lancetx.commit.engine.conflict_terms`. Where the spec is silent (it has no UpdateMemWalState list,
and says nothing of merge-insert key filters, MemWAL generations, or a
DataReplacement target that was deleted) the rules follow Lance's
``rust/lance/src/io/commit/conflict_resolver.rs``; those entries are marked.

REBASE is a verdict only: the rebase itself (merging deletion vectors, merging
singleton-index details) happens elsewhere, from what :class:`RebaseNeeded` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lancetx.commit.engine.conflict_conditions import (
    DELETION_VECTOR_REBASE,
    MERGED_GENERATIONS,
    inserted_keys_may_collide,
    merge_touched_our_fragments,
    our_group_straddles_their_index,
    overlapping_fragments,
    rewrite_moved_indexed_rows,
    same_base_path,
    same_config_key,
    same_field_same_fragment,
    same_metadata,
    same_singleton_index,
    stable_row_ids,
    their_index_covers_rewritten_fragments,
    they_carry_frag_reuse_index,
    they_index_a_replaced_column,
    they_mix_frag_reuse_with_other_indices,
    they_removed_our_fragment,
    they_replaced_an_indexed_column,
    we_carry_frag_reuse_index,
    we_mix_frag_reuse_with_other_indices,
    we_track_inserted_keys,
)
from lancetx.commit.engine.conflict_terms import (
    ALWAYS,
    APPEND,
    CLONE,
    COMPATIBLE,
    CREATE_INDEX,
    DATA_REPLACEMENT,
    DELETE,
    INCOMPATIBLE,
    MERGE,
    OVERWRITE,
    PROJECT,
    REBASE,
    RESERVE_FRAGMENTS,
    RESTORE,
    RETRYABLE,
    REWRITE,
    UPDATE,
    UPDATE_BASES,
    UPDATE_CONFIG,
    UPDATE_MEM_WAL_STATE,
    WHAT_THEY_DID,
    Always,
    Cases,
    Condition,
    ConflictContext,
    Finding,
    Outcome,
    RebaseKind,
    RebaseNeeded,
    Rule,
    RuleTable,
    cases,
    when,
)
from lancetx.commit.engine.operations import OperationKind, Transaction

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


# ===================================================================== RULES

#: Every ordered pair of operation kinds (ours, theirs) and its rule: one spec
#: section per operation, in the spec's order.
RULES = RuleTable()

# Append Compatibility: "These are the operations that conflict with append".
RULES.section(
    APPEND,
    conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
)

# Delete Compatibility.
RULES.section(
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
RULES.section(
    OVERWRITE,
    retryable={UPDATE_CONFIG: same_config_key, OVERWRITE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
)

# CreateIndex Compatibility.
RULES.section(
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
RULES.section(
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
RULES.section(
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
RULES.section(
    PROJECT,
    conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS, UPDATE_MEM_WAL_STATE: ALWAYS},
    retryable={PROJECT: ALWAYS, MERGE: ALWAYS},
)

# Restore Compatibility.
RULES.section(RESTORE, conflict_with={UPDATE_MEM_WAL_STATE: ALWAYS})

# ReserveFragments Compatibility.
RULES.section(RESERVE_FRAGMENTS, conflict_with={OVERWRITE: ALWAYS, RESTORE: ALWAYS})

# Clone Compatibility: "there is no such thing as a conflict with Clone".
RULES.section(CLONE)

# Update Compatibility.
RULES.section(
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
RULES.section(
    UPDATE_CONFIG,
    conflict_with={
        OVERWRITE: ALWAYS,
        # "UpdateConfig (only if the two operations modify the same config)";
        # metadata maps per Lance modifies_same_metadata.
        UPDATE_CONFIG: same_config_key | same_metadata,
    },
)

# DataReplacement Compatibility.
RULES.section(
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
RULES.section(
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
RULES.section(UPDATE_BASES, conflict_with={UPDATE_BASES: same_base_path})

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
    detail = found.detail if found is not None else WHAT_THEY_DID[theirs.kind]
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
