"""``committing.new_objects``: the files a verb's commit wrote (deleted only when its claim
provably did not land) are its transaction's files the parent does not reference, found
without naming every file of the parent (a commit on a table of thousands of fragments
names a handful)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import lancetx.committing as committing
from lancetx.commit.engine.operations import Append, Delete, Merge, Transaction
from lancetx.commit.format.deletion import deletion_file_key
from lancetx.commit.format.naming import DATA_DIR, join
from lancetx.protos import table_pb2

BASE = "db/t.lance"
FRAGMENTS = 2000


def fragment(
    fid: int, *paths: str, deletion: tuple[int, int] | None = None
) -> table_pb2.DataFragment:
    frag = table_pb2.DataFragment(id=fid, files=[table_pb2.DataFile(path=p) for p in paths])
    if deletion is not None:
        frag.deletion_file.CopyFrom(
            table_pb2.DeletionFile(read_version=deletion[0], id=deletion[1], num_deleted_rows=1)
        )
    return frag


def parent() -> Any:
    fragments = [fragment(i, f"{i}.lance") for i in range(FRAGMENTS)]
    fragments[7] = fragment(7, "7.lance", deletion=(3, 9))
    manifest = table_pb2.Manifest(fragments=fragments)
    return SimpleNamespace(manifest=SimpleNamespace(manifest=manifest))


def data(path: str) -> str:
    return join(BASE, DATA_DIR, path)


@pytest.fixture
def named(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fragments whose files were named, by id."""
    seen: list[int] = []
    real = committing._fragment_objects

    def counting(base: str, frag: table_pb2.DataFragment) -> set[str]:
        seen.append(frag.id)
        return real(base, frag)

    monkeypatch.setattr(committing, "_fragment_objects", counting)
    return seen


def test_a_delete_names_only_its_own_fragments(named: list[int]) -> None:
    updated = fragment(7, "7.lance", deletion=(5, 11))
    txn = Transaction(read_version=5, operation=Delete(updated_fragments=(updated,)))
    assert committing.new_objects(BASE, txn, parent()) == {
        deletion_file_key(BASE, 7, updated.deletion_file)
    }
    assert len(named) <= 2  # ours and the parent's fragment 7, not the other 1,999


def test_an_append_names_only_its_own_fragments(named: list[int]) -> None:
    txn = Transaction(read_version=5, operation=Append(fragments=(fragment(0, "new.lance"),)))
    assert committing.new_objects(BASE, txn, parent()) == {data("new.lance")}
    assert len(named) <= 2


def test_a_merge_keeps_the_files_the_parent_has() -> None:
    fragments = [fragment(i, f"{i}.lance") for i in range(FRAGMENTS)]
    fragments[3] = fragment(3, "3.lance", "3-new-column.lance")
    fragments[7] = fragment(7, "7.lance", deletion=(3, 9))
    txn = Transaction(read_version=5, operation=Merge(fragments=tuple(fragments)))
    assert committing.new_objects(BASE, txn, parent()) == {data("3-new-column.lance")}


def test_a_file_moved_to_another_fragment_is_still_the_parents() -> None:
    """A data file the parent references under another fragment's id is not new."""
    txn = Transaction(
        read_version=5, operation=Append(fragments=(fragment(0, "42.lance", "brand-new.lance"),))
    )
    assert committing.new_objects(BASE, txn, parent()) == {data("brand-new.lance")}
