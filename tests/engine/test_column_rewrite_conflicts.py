"""The lost update: an Update that rewrote columns, committed on top of a
concurrent Delete or row-rewriting Update of the same fragment.

pylance writes everything real here: the table, our column rewrite
(``LanceFragment.update_columns`` gives fragment 0 a new data file holding
column ``b`` and tombstones ``b`` in the old file -- an Update in
``REWRITE_COLUMNS`` mode), and the other writer's commit (pylance's own
``delete`` / ``update``, which commit through pylance). Ours then commits with
lancetx from the version it read.

Merging deletion vectors cannot carry a new data file, so the spec makes this
retryable ("rebasable because it only modified deletion vectors (not data
files)"). Before the fix it was rebased onto the other writer's copy of the
fragment, the new data file was dropped, the commit succeeded, and every live
row kept its old ``b``. Here ours is refused, nothing of it is visible, and
re-planned at the new version it lands with the new values in every live row.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from engine_helpers import EngineTable, make_table

from lancetx.commit.engine.committer import Parent
from lancetx.commit.engine.operations import Transaction, Update, UpdateMode
from lancetx.commit.errors import RetryableConflictError
from lancetx.commit.format.fragments import fragment_from_pylance

NEW_B = 1000  # ours sets b = a + NEW_B


def _column_rewrite(table: EngineTable, parent: Parent) -> Transaction:
    """Ours: b = a + 1000 for every row of every fragment, planned at
    ``parent``, as pylance writes a column rewrite (new data files under data/)."""
    dataset = table.dataset(parent.version)
    updated = []
    fields_modified: set[int] = set()
    for fragment in dataset.get_fragments():
        a = fragment.to_table(columns=["a"])["a"]
        values = pa.table({"a": a, "b": pa.compute.add(a, pa.scalar(NEW_B, pa.int64()))})
        metadata, fields = fragment.update_columns(values, left_on="a", right_on="a")
        updated.append(fragment_from_pylance(metadata))
        fields_modified.update(fields)
    return Transaction(
        read_version=parent.version,
        operation=Update(
            updated_fragments=tuple(updated),
            fields_modified=tuple(sorted(fields_modified)),
            update_mode=UpdateMode.REWRITE_COLUMNS,
        ),
    )


def _pylance_delete(table: EngineTable) -> None:
    table.dataset().delete("a < 3")


def _pylance_row_update(table: EngineTable) -> None:
    table.dataset().update({"b": "b + 500"}, where="a >= 7")


THEIRS: dict[str, tuple[Callable[[EngineTable], None], dict[int, int]]] = {
    # theirs -> (the commit, b of each live row after it: a -> b)
    "delete": (_pylance_delete, {a: a for a in range(3, 10)}),
    "rows-rewriting update": (
        _pylance_row_update,
        {a: (a + 500 if a >= 7 else a) for a in range(10)},
    ),
}


def _live_b(table: EngineTable, version: int | None = None) -> dict[int, int]:
    rows = table.dataset(version).to_table(columns=["a", "b"]).to_pylist()
    return {r["a"]: r["b"] for r in rows}


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    """One fragment: a = 0..9, b = 0..9 (version 1)."""
    return make_table(str(tmp_path / "t.lance"), sizes=(10,))


@pytest.mark.parametrize("how", ["stale-held", "resolved"])
@pytest.mark.parametrize("theirs", sorted(THEIRS))
def test_column_rewrite_on_a_fragment_another_writer_changed_is_retryable(
    table: EngineTable, theirs: str, how: str
) -> None:
    read = table.latest()
    ours = _column_rewrite(table, read)
    (ours_fragment,) = ours.operation.updated_fragments  # type: ignore[attr-defined]
    new_file = ours_fragment.files[-1].path
    assert new_file not in {f.path for f in read.manifest.manifest.fragments[0].files}

    commit_theirs, after_theirs = THEIRS[theirs]
    commit_theirs(table)  # pylance commits v2 itself
    assert table.versions() == [1, 2]
    versions = table.listing("_versions")

    with pytest.raises(RetryableConflictError) as info:
        table.commit(ours, parent=read if how == "stale-held" else None)

    assert info.value.transaction_uuid == ours.uuid
    assert [v for v, _, _ in info.value.conflicts] == [2]
    assert "new data files" in str(info.value)
    # Nothing of ours is visible: no version, the table reads as theirs left it.
    assert table.listing("_versions") == versions
    assert table.versions() == [1, 2]
    assert _live_b(table) == after_theirs

    # Planned again at the new version, the rewrite lands in every live row.
    again = _column_rewrite(table, table.latest())
    done = table.commit(again)
    assert done.version == 3
    live = _live_b(table)
    assert sorted(live) == sorted(after_theirs)
    assert live == {a: a + NEW_B for a in live}
    assert lance.dataset(table.uri).version == 3


def test_column_rewrite_on_an_untouched_fragment_lands_beside_a_delete(tmp_path: Path) -> None:
    """The fix is not a blanket refusal: a delete on another fragment is compatible."""
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))
    read = table.latest()
    dataset = table.dataset(read.version)
    fragment = dataset.get_fragment(0)
    values = pa.table({"a": pa.array(range(10), pa.int64()), "b": pa.array(range(100, 110))})
    metadata, fields = fragment.update_columns(values, left_on="a", right_on="a")
    ours = Transaction(
        read.version,
        Update(
            updated_fragments=(fragment_from_pylance(metadata),),
            fields_modified=tuple(fields),
            update_mode=UpdateMode.REWRITE_COLUMNS,
        ),
    )
    table.dataset().delete("a >= 15")  # fragment 1 only, v3

    done = table.commit(ours, parent=read)

    assert done.version == 4
    live = _live_b(table)
    assert live == {**{a: a + 100 for a in range(10)}, **{a: a - 10 for a in range(10, 15)}}
