"""Rebase for real: two writers delete rows of the same fragment from the same read version.

Disjoint rows: both commits land; the second is rebased (its deletion vector is
merged with the committed one into a new deletion file whose ``read_version``
is the latest version) and pylance reads exactly the rows neither deleted.
Overlapping rows: the second gets RetryableConflictError and no version is
added for it. A merge that deletes every row of a fragment removes the fragment.

Each scenario runs with the loser resolving the latest version itself
(``parent=None``: the winner is known before the first attempt) and with the
loser holding the stale version it read (the first attempt loses the race,
the handler names the winner, the loop loads it and rebases).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import (
    EngineTable,
    LosingHandler,
    delete_transaction,
    make_table,
    snapshot_of,
)

from lancetx.commit.engine.committer import Committed, commit_transaction
from lancetx.commit.engine.operations import Delete, Transaction
from lancetx.commit.errors import RetryableConflictError
from lancetx.protos import table_pb2

PARENTS = ["resolved", "stale-held"]


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    """Fragment 0 holds a = 0..9, fragment 1 holds a = 10..19 (version 2)."""
    return make_table(str(tmp_path / "t.lance"), sizes=(10, 10))


def _commit_second(table: EngineTable, txn: Transaction, how: str, read: object) -> Committed:
    parent = None if how == "resolved" else read
    return table.commit(txn, parent=parent)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", PARENTS)
def test_disjoint_deletes_of_one_fragment_both_land(table: EngineTable, how: str) -> None:
    read = table.latest()
    first = delete_transaction(table, read, {0: [0, 1]}, "a < 2")
    second = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")

    won = table.commit(first, parent=read)
    rebased = _commit_second(table, second, how, read)

    assert (won.version, rebased.version) == (3, 4)
    assert rebased.attempts == (1 if how == "resolved" else 2)
    # The committed transaction is the rebased one: read_version moved to the
    # version it was rebased onto, and a new deletion file holds the union.
    assert rebased.transaction.read_version == 3
    op = rebased.transaction.operation
    assert isinstance(op, Delete)
    (fragment,) = op.updated_fragments
    assert fragment.deletion_file.read_version == 3
    assert fragment.deletion_file.num_deleted_rows == 4
    assert fragment.deletion_file.id not in {
        f.deletion_file.id
        for t in (first, second)
        for f in t.operation.updated_fragments  # type: ignore[attr-defined]
    }
    snap = snapshot_of(table, rebased)
    assert sorted(snap.deletion_vector(0)) == [0, 1, 5, 6]
    assert snap.transaction() == rebased.transaction.to_proto()
    # pylance reads the union of both deletions, and a linear history.
    assert table.versions() == [1, 2, 3, 4]
    assert table.values() == [2, 3, 4, 7, 8, 9, *range(10, 20)]
    assert table.dataset().count_rows() == 16


@pytest.mark.parametrize("how", PARENTS)
def test_overlapping_deletes_second_is_retryable_and_writes_nothing(
    table: EngineTable, how: str
) -> None:
    read = table.latest()
    first = delete_transaction(table, read, {0: [0, 1, 2]}, "a < 3")
    second = delete_transaction(table, read, {0: [2, 3]}, "a in (2, 3)")
    table.commit(first, parent=read)
    versions = table.listing("_versions")
    deletions = table.listing("_deletions")
    transactions = table.listing("_transactions")

    with pytest.raises(RetryableConflictError) as info:
        _commit_second(table, second, how, read)

    assert info.value.retryable
    assert info.value.transaction_uuid == second.uuid
    assert info.value.read_version == 2
    assert [(v, name) for v, name, _ in info.value.conflicts] == [(3, "Delete")]
    assert "rows 2 of fragment 0" in str(info.value)
    # No version, no merged deletion file, no transaction file: the stale-held path
    # wrote one for the attempt that lost the race, and removed it when the
    # conflict surfaced (Lance would leave it behind).
    assert table.listing("_versions") == versions
    assert table.listing("_deletions") == deletions
    assert table.listing("_transactions") == transactions
    assert table.versions() == [1, 2, 3]
    assert table.values() == [*range(3, 20)]


@pytest.mark.parametrize("how", PARENTS)
def test_merge_that_deletes_every_row_removes_the_fragment(table: EngineTable, how: str) -> None:
    read = table.latest()
    first = delete_transaction(table, read, {0: range(0, 6)}, "a < 6")
    second = delete_transaction(table, read, {0: range(6, 10)}, "a >= 6 and a < 10")
    table.commit(first, parent=read)

    rebased = _commit_second(table, second, how, read)

    op = rebased.transaction.operation
    assert isinstance(op, Delete)
    assert op.updated_fragments == ()
    assert op.deleted_fragment_ids == (0,)
    assert [f.id for f in rebased.manifest.manifest.fragments] == [1]
    assert table.versions() == [1, 2, 3, 4]
    assert table.values() == list(range(10, 20))
    assert [f.fragment_id for f in table.dataset().get_fragments()] == [1]


def test_rebase_keeps_fragments_the_other_writer_did_not_touch(table: EngineTable) -> None:
    read = table.latest()
    first = delete_transaction(table, read, {0: [9]}, "a = 9")
    second = delete_transaction(table, read, {0: [0], 1: [0, 9]}, "a in (0, 10, 19)")
    ours_fragment_1 = second.operation.updated_fragments[1]  # type: ignore[attr-defined]
    table.commit(first, parent=read)

    rebased = table.commit(second)

    op = rebased.transaction.operation
    assert isinstance(op, Delete)
    by_id = {f.id: f for f in op.updated_fragments}
    assert by_id[1] == ours_fragment_1  # untouched by the other writer: kept as planned
    assert by_id[0].deletion_file.read_version == 3
    snap = snapshot_of(table, rebased)
    assert sorted(snap.deletion_vector(0)) == [0, 9]
    assert sorted(snap.deletion_vector(1)) == [0, 9]
    assert table.values() == [*range(1, 9), *range(11, 19)]


def test_rebase_onto_several_committed_deletes(table: EngineTable) -> None:
    read = table.latest()
    txns = [delete_transaction(table, read, {0: [i]}, f"a = {i}") for i in (1, 3, 5)]
    ours = delete_transaction(table, read, {0: [7, 8]}, "a in (7, 8)")
    for txn in txns:
        table.commit(txn)  # each rebased onto the previous one

    rebased = table.commit(ours)

    assert rebased.version == 6
    assert rebased.transaction.read_version == 5
    assert sorted(snapshot_of(table, rebased).deletion_vector(0)) == [1, 3, 5, 7, 8]
    assert table.values() == [0, 2, 4, 6, 9, *range(10, 20)]


def test_second_rebase_after_losing_the_race_again(table: EngineTable) -> None:
    """Ours is rebased onto v3, then loses v4 to a third delete: the second
    rebase must compare against what ours was rebased onto, not the rows the
    first winner deleted (which are in ours' merged vector but are not ours)."""
    read = table.latest()
    first = delete_transaction(table, read, {0: [0, 1]}, "a < 2")
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    table.commit(first, parent=read)
    v3 = table.latest()
    third = delete_transaction(table, v3, {0: [8, 9]}, "a in (8, 9)")

    def third_writer_wins(version: int) -> None:
        assert version == 4
        table.commit(third, parent=v3)

    racing = LosingHandler(table.handler, before_commit=third_writer_wins)
    rebased = commit_transaction(racing, table.base, ours)

    assert racing.attempts == [4, 5]
    assert rebased.version == 5
    assert rebased.attempts == 2
    assert rebased.transaction.read_version == 4
    assert sorted(snapshot_of(table, rebased).deletion_vector(0)) == [0, 1, 5, 6, 8, 9]
    assert table.versions() == [1, 2, 3, 4, 5]
    assert table.values() == [2, 3, 4, 7, *range(10, 20)]


def test_rebased_deletion_file_is_what_pylance_reads(table: EngineTable) -> None:
    """pylance's fragment at the new version names our merged deletion file."""
    read = table.latest()
    table.commit(delete_transaction(table, read, {0: [3]}, "a = 3"), parent=read)
    rebased = table.commit(delete_transaction(table, read, {0: [4]}, "a = 4"))

    (ours,) = rebased.transaction.operation.updated_fragments  # type: ignore[attr-defined]
    pylance_fragment = table.dataset().get_fragment(0)
    assert pylance_fragment.count_rows() == 8
    deletion = pylance_fragment.metadata.deletion_file
    assert deletion is not None
    assert (deletion.read_version, deletion.id) == (
        ours.deletion_file.read_version,
        ours.deletion_file.id,
    )
    assert deletion.num_deleted_rows == 2
    assert ours.deletion_file.file_type == table_pb2.DeletionFile.ARROW_ARRAY
