"""The conflict matrix: every ordered pair of the 15 operations, read against the spec.

The data lives in ``conflict_cases.py``; these tests check that
:func:`lancetx.commit.engine.conflicts.classify` answers every cell and variant as the
data says, that the data covers all 225 cells, that every answer is where the
spec's lists allow it (or marked as Lance's, where the spec is silent), and that
Lance's own ``test_conflicts`` tables are reproduced with their divergences marked.
"""

from __future__ import annotations

import pytest
from conflict_cases import (
    LANCE_CONTEXT,
    LANCE_DATA_REPLACEMENT_CASES,
    LANCE_OTHERS,
    LANCE_TEST_CONFLICTS,
    LETTER,
    MATRIX,
    REPRESENTATIVE,
    SPEC,
    SPEC_SILENT_ROWS,
    VARIANTS,
    Variant,
    cell_variants,
    resolve,
    spec_outcomes,
)

from lancetx.commit.engine.conflicts import (
    RULES,
    ConflictContext,
    Outcome,
    RebaseKind,
    classify,
    classify_all,
)
from lancetx.commit.engine.operations import (
    Delete,
    OperationKind,
    Rewrite,
    RewriteGroup,
    Transaction,
)

KINDS = list(OperationKind)
PAIRS = [(ours, theirs) for ours in KINDS for theirs in KINDS]
SOURCES = ("spec:", "lance:", "divergence:")


def _txns(
    variant: Variant, ours_kind: OperationKind, theirs_kind: OperationKind
) -> tuple[Transaction, Transaction]:
    ours_op, theirs_op = resolve(variant, ours_kind, theirs_kind)
    return Transaction(3, ours_op, uuid="ours"), Transaction(3, theirs_op, uuid="theirs")


# ------------------------------------------------------------------ coverage


def test_matrix_covers_all_225_ordered_pairs() -> None:
    assert len(KINDS) == 15
    assert set(MATRIX) == set(PAIRS)
    assert set(RULES) == set(PAIRS)
    assert set(VARIANTS) <= set(PAIRS)


def test_rules_and_matrix_agree_on_possible_outcomes() -> None:
    """A rule's possible outcomes are the cell's letters (no hidden branch)."""
    for pair in PAIRS:
        assert RULES[pair].outcomes() == MATRIX[pair], f"{pair[0]} vs {pair[1]}: {RULES[pair].name}"


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=[f"{o}-vs-{t}" for o, t in PAIRS])
def test_variants_cover_every_letter_of_the_cell(
    ours: OperationKind, theirs: OperationKind
) -> None:
    variants = cell_variants(ours, theirs)
    assert {v.expect for v in variants} == MATRIX[(ours, theirs)]
    for v in variants:
        assert v.source.startswith(SOURCES), v.source


# ------------------------------------------------------------------ the cells


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=[f"{o}-vs-{t}" for o, t in PAIRS])
def test_cell(ours: OperationKind, theirs: OperationKind) -> None:
    for variant in cell_variants(ours, theirs):
        mine, other = _txns(variant, ours, theirs)
        verdict = classify(mine, other, context=variant.context, committed_version=4)
        assert verdict.outcome is variant.expect, (
            f"{ours} vs {theirs} [{variant.name}]: expected {variant.expect}, got "
            f"{verdict.outcome} ({verdict.reason}); rule {verdict.rule}; source {variant.source}"
        )
        assert (verdict.ours, verdict.theirs) == (ours, theirs)
        assert verdict.reason.startswith(
            f"{ours.value} (read v3) vs {theirs.value} committed as v4: "
        )
        assert (verdict.rebase is not None) == (verdict.outcome is Outcome.REBASE)


def test_every_spec_sourced_answer_is_allowed_by_the_spec_lists() -> None:
    """Cells/variants citing the spec (or a divergence, where the spec wins) give
    an outcome the section's lists allow; spec-silent rows cite Lance."""
    for ours, theirs in PAIRS:
        allowed = spec_outcomes(ours, theirs)
        for variant in cell_variants(ours, theirs):
            if variant.source.startswith("lance:"):
                continue
            if allowed is None:
                assert theirs is OperationKind.CLONE, f"{ours} row is spec-silent: {variant.source}"
                continue
            assert variant.expect in allowed, (
                f"{ours} vs {theirs} [{variant.name}] = {variant.expect}, spec allows {sorted(map(str, allowed))}"
            )


def test_spec_lists_name_only_real_operations() -> None:
    names = {k.value for k in KINDS}
    for section in SPEC.values():
        for entry in (*section.conflict_with, *section.retryable, *section.rebaseable):
            assert entry.split(" ")[0] in names, entry
    assert set(SPEC) | set(SPEC_SILENT_ROWS) == set(KINDS)


def test_documented_divergences_from_lance_test_conflicts() -> None:
    """The two divergences the issue names are marked in the 225 matrix."""
    marked = {
        (o, t) for o, t in PAIRS for v in cell_variants(o, t) if v.source.startswith("divergence:")
    }
    assert (OperationKind.OVERWRITE, OperationKind.OVERWRITE) in marked
    assert (OperationKind.UPDATE_CONFIG, OperationKind.OVERWRITE) in marked


# ------------------------------------------------------------- rebase facts


def test_delete_vs_delete_rebase_names_the_fragments() -> None:
    (variant,) = [
        v
        for v in VARIANTS[(OperationKind.DELETE, OperationKind.DELETE)]
        if v.expect is Outcome.REBASE
    ]
    mine, other = _txns(variant, OperationKind.DELETE, OperationKind.DELETE)
    verdict = classify(mine, other, context=variant.context, committed_version=9)
    assert verdict.rebase is not None
    assert verdict.rebase.kind is RebaseKind.MERGE_DELETION_VECTORS
    assert verdict.rebase.fragment_ids == frozenset({0})
    assert verdict.rebase.committed_version == 9


def test_singleton_index_rebase_carries_the_committed_index() -> None:
    variants = VARIANTS[(OperationKind.CREATE_INDEX, OperationKind.CREATE_INDEX)]
    for variant in (v for v in variants if v.expect is Outcome.REBASE):
        mine, other = _txns(variant, OperationKind.CREATE_INDEX, OperationKind.CREATE_INDEX)
        verdict = classify(mine, other, context=variant.context)
        assert verdict.rebase is not None
        assert verdict.rebase.kind is RebaseKind.MERGE_SINGLETON_INDEX
        assert len(verdict.rebase.indices) == 1
        assert verdict.rebase.index_names == {verdict.rebase.indices[0].name}


def test_fragment_reuse_rebase_carries_the_committed_fri() -> None:
    for pair in (
        (OperationKind.CREATE_INDEX, OperationKind.REWRITE),
        (OperationKind.REWRITE, OperationKind.CREATE_INDEX),
    ):
        (variant,) = [v for v in VARIANTS[pair] if v.expect is Outcome.REBASE]
        mine, other = _txns(variant, *pair)
        verdict = classify(mine, other, context=variant.context)
        assert (
            verdict.rebase is not None
            and verdict.rebase.kind is RebaseKind.MERGE_FRAGMENT_REUSE_INDEX
        )
        assert verdict.rebase.indices[0].name == "__lance_frag_reuse"


def test_reason_names_operations_versions_and_fragments() -> None:
    ours = Transaction(3, REPRESENTATIVE[OperationKind.DELETE])
    theirs = Transaction(
        4, Rewrite(groups=(RewriteGroup(old_fragments=[ours.operation.updated_fragments[0]]),))
    )  # type: ignore[attr-defined]
    verdict = classify(ours, theirs, committed_version=5)
    assert verdict.outcome is Outcome.RETRYABLE
    assert verdict.reason.startswith("Delete (read v3) vs Rewrite committed as v5: fragment 0 ")
    assert "retry the Delete" in verdict.reason
    unknown_version = classify(ours, theirs)
    assert "committed after v3" in unknown_version.reason


def test_classify_all_stops_at_the_first_blocking_verdict() -> None:
    ours = Transaction(3, REPRESENTATIVE[OperationKind.APPEND])
    committed = [
        (6, Transaction(5, REPRESENTATIVE[OperationKind.RESTORE])),
        (4, Transaction(3, REPRESENTATIVE[OperationKind.DELETE])),
        (5, Transaction(4, REPRESENTATIVE[OperationKind.OVERWRITE])),
    ]
    verdicts = classify_all(ours, committed, context=ConflictContext())
    assert [v.committed_version for v in verdicts] == [4, 5]
    assert [v.outcome for v in verdicts] == [Outcome.COMPATIBLE, Outcome.INCOMPATIBLE]
    assert verdicts[-1].blocks


def test_unknown_read_state_is_assumed_changed() -> None:
    """Without read-version fragments a Delete still merges deletion vectors
    (its own copy proves the data files), but a Merge must be assumed to touch it."""
    ours = Transaction(3, REPRESENTATIVE[OperationKind.DELETE])
    other = Transaction(3, VARIANTS[(OperationKind.DELETE, OperationKind.DELETE)][0].theirs)  # type: ignore[arg-type]
    assert classify(ours, other, context=ConflictContext()).outcome is Outcome.REBASE
    unchanged_merge = VARIANTS[(OperationKind.DELETE, OperationKind.MERGE)][2]
    assert unchanged_merge.expect is Outcome.COMPATIBLE
    merge = Transaction(3, unchanged_merge.theirs)  # type: ignore[arg-type]
    assert classify(ours, merge, context=ConflictContext()).outcome is Outcome.RETRYABLE


def test_deprecated_update_config_fields_count_as_config_changes() -> None:
    from lancetx.commit.engine.operations import UpdateConfig, update_map

    old_style = Transaction(3, UpdateConfig(upsert_values={"k": "1"}))
    new_style = Transaction(3, UpdateConfig(config_updates=update_map({"k": None})))
    assert classify(old_style, new_style).outcome is Outcome.INCOMPATIBLE
    old_delete = Transaction(3, UpdateConfig(delete_keys=("other",)))
    assert classify(old_delete, new_style).outcome is Outcome.COMPATIBLE


def test_delete_removing_a_fragment_another_delete_changed_is_retryable() -> None:
    """Both touched the same rows (ours removes all of them): no mask to merge."""
    from conflict_cases import F, with_deletion

    ours = Transaction(3, Delete(deleted_fragment_ids=(0,)))
    theirs = Transaction(3, Delete(updated_fragments=(with_deletion(F[0], 30),)))
    verdict = classify(ours, theirs, context=ConflictContext(read_fragments=dict(F)))
    assert verdict.outcome is Outcome.RETRYABLE
    assert "removes fragment 0" in verdict.reason


# ------------------------------------------------ Lance's test_conflicts (§5)


def _lance_cells() -> list[tuple[str, str]]:
    return [(row.name, col) for row in LANCE_TEST_CONFLICTS for col, _ in LANCE_OTHERS]


@pytest.mark.parametrize(("row_name", "column"), _lance_cells())
def test_lance_test_conflicts_cell(row_name: str, column: str) -> None:
    row = next(r for r in LANCE_TEST_CONFLICTS if r.name == row_name)
    columns = [name for name, _ in LANCE_OTHERS]
    lance_letters = row.lance.split()
    assert len(lance_letters) == len(columns)
    lance = LETTER[lance_letters[columns.index(column)]]
    other = dict(LANCE_OTHERS)[column]
    if column in row.divergences:
        letter, why = row.divergences[column]
        expected = LETTER[letter]
        assert why.startswith("divergence: Lance test_conflicts says ")
        assert expected is not lance, "a divergence must differ from Lance"
    else:
        expected = lance
    verdict = classify(
        Transaction(0, row.ours), Transaction(0, other), context=LANCE_CONTEXT, committed_version=1
    )
    assert verdict.outcome is expected, f"{row_name} vs {column}: {verdict.reason}"


def test_lance_test_conflicts_divergences_agree_with_the_225_matrix() -> None:
    """Each divergence resolves to what the spec-sourced matrix cell allows."""
    for row in LANCE_TEST_CONFLICTS:
        for column, (letter, _) in row.divergences.items():
            other = dict(LANCE_OTHERS)[column]
            assert LETTER[letter] in MATRIX[(row.ours.kind, other.kind)]
            assert LETTER[letter] in (spec_outcomes(row.ours.kind, other.kind) or set())


@pytest.mark.parametrize("case", LANCE_DATA_REPLACEMENT_CASES, ids=lambda c: c.name)
def test_lance_data_replacement_case(case) -> None:  # type: ignore[no-untyped-def]
    if case.expect is not case.lance:
        assert case.source.startswith("divergence:"), case.source
    else:
        assert case.source.startswith(("spec:", "lance:")), case.source
    verdict = classify(
        Transaction(0, case.ours), Transaction(0, case.theirs), context=LANCE_CONTEXT
    )
    assert verdict.outcome is case.expect, verdict.reason
