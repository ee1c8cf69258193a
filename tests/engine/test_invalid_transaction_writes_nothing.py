"""Audit (issue 3, "Bad input" + "nothing half-written"): a transaction the
builder refuses (it names fragments the table does not have) must leave the
table directory exactly as it was -- no version, and no orphaned
``_transactions/*.txn`` either. Today the commit loop writes the transaction
file before build_manifest validates the transaction.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import EngineTable, delete_transaction, make_table

from lancetx.commit.engine.builder import InvalidTransactionError
from lancetx.commit.engine.committer import CommitOptions
from lancetx.commit.engine.operations import (
    FRAG_REUSE_INDEX_NAME,
    Append,
    Delete,
    Rewrite,
    RewriteGroup,
    Transaction,
    Update,
)
from lancetx.protos import table_pb2


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10, 10))


def _ghost(table: EngineTable) -> table_pb2.DataFragment:
    planned = delete_transaction(table, table.latest(), {0: [1]}, "a = 1")
    ghost = table_pb2.DataFragment()
    ghost.CopyFrom(planned.operation.updated_fragments[0])  # type: ignore[attr-defined]
    ghost.id = 999
    return ghost


def _everything(table: EngineTable) -> dict[str, list[tuple[str, int]]]:
    return {d: table.listing(d) for d in ("_versions", "_transactions", "_deletions", "data")}


@pytest.mark.parametrize("kind", ["delete", "update"])
def test_refused_transaction_writes_no_file(table: EngineTable, kind: str) -> None:
    ghost = _ghost(table)
    operation = (
        Delete(updated_fragments=(ghost,), predicate="x")
        if kind == "delete"
        else Update(updated_fragments=(ghost,), fields_modified=(1,))
    )
    before = _everything(table)
    with pytest.raises(InvalidTransactionError):
        table.commit(Transaction(read_version=2, operation=operation))
    assert _everything(table) == before


def test_strict_commit_that_learns_the_table_moved_by_losing_writes_no_file(
    table: EngineTable,
) -> None:
    """Issue 3: "a strict commit against a table that moved returns the mismatch
    error and writes nothing" -- also when the writer holds a stale parent and
    only learns of the move by losing the race (today a .txn file is left)."""
    from lancetx.commit.errors import ExpectedVersionMismatchError

    read = table.latest()
    ours = delete_transaction(table, read, {0: [5]}, "a = 5")
    table.commit(delete_transaction(table, read, {0: [0]}, "a = 0"), parent=read)  # v3
    before = _everything(table)
    with pytest.raises(ExpectedVersionMismatchError):
        table.commit(ours, parent=read, options=CommitOptions(expected_version=2))
    assert _everything(table) == before


def test_rewrite_carrying_a_misnamed_fragment_reuse_index_is_refused(
    table: EngineTable,
) -> None:
    """The index a deferred-remap compaction carries replaces the table's
    ``__lance_frag_reuse`` by name: any other name is refused before anything
    is written."""
    latest = table.latest()
    old = latest.manifest.manifest.fragments[0]
    new = table_pb2.DataFragment()
    new.CopyFrom(old)
    new.id = 0
    index = table_pb2.IndexMetadata(name="not_" + FRAG_REUSE_INDEX_NAME)
    operation = Rewrite(
        groups=(RewriteGroup(old_fragments=(old,), new_fragments=(new,)),),
        frag_reuse_index=index,
    )
    before = _everything(table)
    with pytest.raises(InvalidTransactionError, match="fragment reuse index is named"):
        table.commit(Transaction(read_version=latest.version, operation=operation))
    assert _everything(table) == before


@pytest.mark.parametrize("read_version", [-5, True, 1.0])
def test_a_transaction_read_at_no_version_is_refused_when_built(read_version: object) -> None:
    with pytest.raises((ValueError, TypeError), match="read_version"):
        Transaction(read_version=read_version, operation=Append(fragments=()))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["", 7])
def test_an_empty_idempotency_key_is_refused_not_taken_for_none(key: object) -> None:
    with pytest.raises(ValueError, match="idempotency_key"):
        CommitOptions(idempotency_key=key)  # type: ignore[arg-type]
