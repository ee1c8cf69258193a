"""Interop: pylance's transactions and ours, interleaved on one table.

Forward (pylance commits in between): ours is planned at version 2 (an Append
of a = 100..104, or a Delete of a in (0, 1) = fragment 0, offsets 0 and 1);
pylance then commits one of its operations; then ours is committed, by a writer
holding the version it read (it learns of pylance's commit by losing the race).
The classification must be the table's:

* ``lands`` -- compatible: ours commits unchanged (read_version kept, as Lance);
* ``rebase`` -- ours' deletion vector is merged with pylance's (read_version
  and the new deletion file's read_version = the version it was rebased onto);
* ``retryable`` / ``incompatible`` -- the typed error, no version written.

Where ours lands, pylance reads the result: the version list is linear and the
live rows are exactly pylance's rows with ours applied.

The same interleaving committed by pylance itself (its ``LanceDataset.commit``
of the equivalent operation at read version 2) must be judged alike -- except
that pylance's Python commit API cannot pass the rows a delete touched, so
where we rebase, pylance reports a retryable conflict.

Backward (ours commits in between): a pylance writer holding version 2 commits
after ours, so Lance's own conflict resolver reads our transaction (and, for
a rebase, our deletion file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lance
import pytest
from engine_helpers import (
    EngineTable,
    append_transaction,
    delete_transaction,
    make_table,
    rows,
    snapshot_of,
)
from lance import LanceOperation
from lance.commit import CommitConflictError

from lancetx.commit.engine.operations import Delete, Transaction
from lancetx.commit.errors import (
    CommitConflictError as OurConflictError,
)
from lancetx.commit.errors import (
    IncompatibleConflictError,
    RetryableConflictError,
)

BASE = frozenset(range(20))  # fragment 0: a = 0..9, fragment 1: a = 10..19 (v2)
OURS_APPENDED = frozenset(range(100, 105))
OURS_DELETED = frozenset({0, 1})
PYLANCE_APPENDED = frozenset(range(200, 205))

LANDS, REBASE, RETRYABLE, INCOMPATIBLE = "lands", "rebase", "retryable", "incompatible"
ERRORS: dict[str, type[OurConflictError]] = {
    RETRYABLE: RetryableConflictError,
    INCOMPATIBLE: IncompatibleConflictError,
}


@dataclass(frozen=True)
class PylanceOp:
    """One pylance operation, what it commits, and the verdict for each of ours."""

    name: str
    run: Callable[[lance.LanceDataset], object]
    committed: str  # pylance's operation as its transaction names it
    append: str
    delete: str
    versions: int = 1


def _overwrite(ds: lance.LanceDataset) -> object:
    return lance.write_dataset(rows(300, 3), ds.uri, mode="overwrite")


PYLANCE_OPS = [
    PylanceOp(
        "append",
        lambda ds: lance.write_dataset(rows(200, 5), ds.uri, mode="append"),
        "Append",
        LANDS,
        LANDS,
    ),
    PylanceOp("delete-other-fragment", lambda ds: ds.delete("a = 15"), "Delete", LANDS, LANDS),
    PylanceOp("delete-same-fragment", lambda ds: ds.delete("a = 5"), "Delete", LANDS, REBASE),
    PylanceOp("delete-same-rows", lambda ds: ds.delete("a = 0"), "Delete", LANDS, RETRYABLE),
    PylanceOp(
        "update-other-fragment",
        lambda ds: ds.update({"b": "b + 100"}, where="a = 12"),
        "Update",
        LANDS,
        LANDS,
    ),
    PylanceOp(
        "update-same-fragment",
        lambda ds: ds.update({"b": "b + 100"}, where="a = 5"),
        "Update",
        LANDS,
        REBASE,
    ),
    PylanceOp(
        "update-same-rows",
        lambda ds: ds.update({"b": "b + 100"}, where="a = 1"),
        "Update",
        LANDS,
        RETRYABLE,
    ),
    PylanceOp("overwrite", _overwrite, "Overwrite", INCOMPATIBLE, INCOMPATIBLE),
    PylanceOp("add-columns", lambda ds: ds.add_columns({"c": "a * 2"}), "Merge", LANDS, RETRYABLE),
    PylanceOp("drop-columns", lambda ds: ds.drop_columns(["b"]), "Project", LANDS, LANDS),
    PylanceOp(
        "compact-files",
        lambda ds: ds.optimize.compact_files(),
        "Rewrite",
        LANDS,
        RETRYABLE,
        versions=2,  # pylance 14 reserves fragment ids first
    ),
    PylanceOp(
        "create-scalar-index",
        lambda ds: ds.create_scalar_index("a", "BTREE"),
        "CreateIndex",
        LANDS,
        LANDS,
    ),
    PylanceOp(
        "restore",
        lambda ds: lance.dataset(ds.uri, version=1).restore(),
        "Restore",
        INCOMPATIBLE,
        INCOMPATIBLE,
    ),
    PylanceOp(
        "update-config", lambda ds: ds.update_config({"k": "v"}), "UpdateConfig", LANDS, LANDS
    ),
    PylanceOp(
        "delete-config-keys",
        lambda ds: ds.delete_config_keys(["absent"]),
        "UpdateConfig",
        LANDS,
        LANDS,
    ),
    PylanceOp(
        "update-schema-metadata",
        lambda ds: ds.update_schema_metadata({"k": "v"}),
        "UpdateConfig",
        LANDS,
        LANDS,
    ),
    PylanceOp(
        "update-table-metadata",
        lambda ds: ds.update_metadata({"k": "v"}),
        "UpdateConfig",
        LANDS,
        LANDS,
    ),
]
CASES = [(op, ours) for op in PYLANCE_OPS for ours in ("append", "delete")]
IDS = [f"{ours}-vs-{op.name}" for op, ours in CASES]


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10, 10))


def _ours(table: EngineTable, kind: str) -> Transaction:
    read = table.latest()
    if kind == "append":
        return append_transaction(table, rows(100, 5), read)
    return delete_transaction(table, read, {0: sorted(OURS_DELETED)}, "a in (0, 1)")


def _with_ours(kind: str, values: frozenset[int] | set[int]) -> set[int]:
    return set(values) | OURS_APPENDED if kind == "append" else set(values) - OURS_DELETED


def _last_operation(ds: lance.LanceDataset) -> str:
    (txn,) = ds.get_transactions(1)
    return type(txn.operation).__name__


@pytest.mark.parametrize(("op", "ours_kind"), CASES, ids=IDS)
def test_ours_after_pylance(table: EngineTable, op: PylanceOp, ours_kind: str) -> None:
    read = table.latest()
    ours = _ours(table, ours_kind)
    op.run(table.dataset())
    latest = 2 + op.versions
    assert table.versions() == list(range(1, latest + 1))
    assert _last_operation(table.dataset()) == op.committed
    theirs = table.values()
    versions_files = table.listing("_versions")
    verdict = getattr(op, ours_kind)

    if verdict in ERRORS:
        with pytest.raises(ERRORS[verdict]) as info:
            table.commit(ours, parent=read)
        assert [(v, name) for v, name, _ in info.value.conflicts] == [(latest, op.committed)]
        assert info.value.transaction_uuid == ours.uuid
        assert table.listing("_versions") == versions_files
        assert table.versions() == list(range(1, latest + 1))
        assert table.values() == theirs
        return

    committed = table.commit(ours, parent=read)

    assert committed.version == latest + 1
    assert committed.attempts == 2  # held v2, lost the race, learned of pylance's commit
    if verdict == REBASE:
        assert committed.transaction.read_version == latest
        op_committed = committed.transaction.operation
        assert isinstance(op_committed, Delete)
        (fragment,) = op_committed.updated_fragments
        assert fragment.deletion_file.read_version == latest
        assert sorted(snapshot_of(table, committed).deletion_vector(0)) == sorted(
            OURS_DELETED | {5}
        )
    else:
        assert committed.transaction == ours  # compatible: committed as planned
    assert table.versions() == list(range(1, latest + 2))
    assert table.values() == sorted(_with_ours(ours_kind, set(theirs)))
    ds = table.dataset()
    assert ds.count_rows() == len(_with_ours(ours_kind, set(theirs)))
    assert ds.to_table().num_rows == ds.count_rows()  # every column reads
    assert _last_operation(ds) == ("Append" if ours_kind == "append" else "Delete")
    if op.name == "create-scalar-index":
        probe = 102 if ours_kind == "append" else 1
        expected = [102] if ours_kind == "append" else []
        assert ds.to_table(filter=f"a = {probe}")["a"].to_pylist() == expected


def _pylance_equivalent(table: EngineTable, kind: str) -> LanceOperation.BaseOperation:
    ds = table.dataset()
    if kind == "append":
        return LanceOperation.Append(lance.fragment.write_fragments(rows(100, 5), table.uri))
    fragment = ds.get_fragment(0).delete("a in (0, 1)")
    return LanceOperation.Delete([fragment], [], "a in (0, 1)")


@pytest.mark.parametrize(("op", "ours_kind"), CASES, ids=IDS)
def test_pylance_judges_the_same_interleaving_alike(
    table: EngineTable, op: PylanceOp, ours_kind: str
) -> None:
    equivalent = _pylance_equivalent(table, ours_kind)
    op.run(table.dataset())
    verdict = getattr(op, ours_kind)
    # pylance's Python commit cannot tell which rows a delete touched: no rebase.
    expected = RETRYABLE if verdict == REBASE else verdict

    if expected == LANDS:
        lance.LanceDataset.commit(table.uri, equivalent, read_version=2)
        assert table.versions()[-1] == 3 + op.versions
        return
    with pytest.raises(CommitConflictError) as info:
        lance.LanceDataset.commit(table.uri, equivalent, read_version=2)
    wording = "Retryable commit conflict" if expected == RETRYABLE else "Incompatible transaction"
    assert wording in str(info.value)
    assert f"concurrent transaction {op.committed} at version {2 + op.versions}" in str(info.value)


# ------------------------------------------------------------------ backward


@dataclass(frozen=True)
class StalePylance:
    """A pylance writer holding version 2 commits after ours (v3)."""

    name: str
    run: Callable[[EngineTable, lance.LanceDataset], object]
    #: Live ``a`` values after both, from those after ours; None: pylance refuses.
    effect: Callable[[set[int]], set[int]] | None
    versions: int = 1


def _stale_append(table: EngineTable, stale: lance.LanceDataset) -> object:
    fragments = lance.fragment.write_fragments(rows(200, 5), table.uri)
    return lance.LanceDataset.commit(table.uri, LanceOperation.Append(fragments), read_version=2)


def _stale_overwrite(table: EngineTable, stale: lance.LanceDataset) -> object:
    operation = LanceOperation.Overwrite(stale.schema, [f.metadata for f in stale.get_fragments()])
    return lance.LanceDataset.commit(table.uri, operation, read_version=2)


def _same(values: set[int]) -> set[int]:
    return values


STALE_OPS = [
    StalePylance("append", _stale_append, lambda v: v | PYLANCE_APPENDED),
    StalePylance("delete-same-fragment", lambda t, s: s.delete("a = 5"), lambda v: v - {5}),
    StalePylance("delete-same-rows", lambda t, s: s.delete("a = 0"), lambda v: v - {0}),
    StalePylance(
        "update-same-fragment", lambda t, s: s.update({"b": "b + 1"}, where="a = 5"), _same
    ),
    StalePylance("create-scalar-index", lambda t, s: s.create_scalar_index("a", "BTREE"), _same),
    StalePylance("drop-columns", lambda t, s: s.drop_columns(["b"]), _same),
    StalePylance("update-config", lambda t, s: s.update_config({"k": "v"}), _same),
    StalePylance("overwrite-with-v2-fragments", _stale_overwrite, lambda v: set(BASE)),
    StalePylance("add-columns", lambda t, s: s.add_columns({"c": "a * 2"}), None),
]
STALE_CASES = [(op, ours) for op in STALE_OPS for ours in ("append", "delete")]
STALE_IDS = [f"pylance-{op.name}-after-{ours}" for op, ours in STALE_CASES]


@pytest.mark.parametrize(("op", "ours_kind"), STALE_CASES, ids=STALE_IDS)
def test_pylance_after_ours(table: EngineTable, op: StalePylance, ours_kind: str) -> None:
    stale = table.dataset()  # pylance holds v2
    committed = table.commit(_ours(table, ours_kind))
    assert committed.version == 3
    after_ours = set(table.values())
    assert after_ours == _with_ours(ours_kind, BASE)

    if op.effect is None:
        with pytest.raises(CommitConflictError) as info:
            op.run(table, stale)
        # Lance read our transaction to decide.
        ours_name = "Append" if ours_kind == "append" else "Delete"
        assert f"concurrent transaction {ours_name} at version 3" in str(info.value)
        assert table.versions() == [1, 2, 3]
        return

    op.run(table, stale)

    assert table.versions() == [1, 2, 3, 3 + op.versions]
    assert table.values() == sorted(op.effect(after_ours))
    ds = table.dataset()
    assert ds.to_table().num_rows == ds.count_rows()
