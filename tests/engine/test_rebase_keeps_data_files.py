"""No rebase loses a data file the rebased transaction added.

A deletion-vector rebase rewrites deletion files only. Two guards keep it from
silently dropping a change ours made to a fragment (the lost update of a
column rewrite): the conflict rules classify a Delete/Update that changed a
shared fragment's data files RETRYABLE, and the rebase step itself refuses a
fragment whose data files are not the ones read, before writing anything.

* a REBASE verdict forced past the rules: the rebase step refuses on its own;
* a hypothesis property over random pairs of Delete / Update shapes (rows
  deleted, fragments removed, rows rewritten to new fragments, columns
  rewritten to new data files) on three fragments with real deletion files on
  disk: whenever ours is rebased, every data file ours referenced is in the
  rebased transaction, on the same fragment.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from lancetx.commit.engine.conflicts import (
    ConflictContext,
    Outcome,
    RebaseKind,
    RebaseNeeded,
    classify,
)
from lancetx.commit.engine.operations import (
    DataFile,
    DataFragment,
    Delete,
    Operation,
    Transaction,
    Update,
    UpdateMode,
)
from lancetx.commit.engine.rebase import rebase_transaction
from lancetx.commit.errors import RetryableConflictError
from lancetx.commit.format.deletion import write_deletion_vector
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.protos import table_pb2

BASE = "t.lance"
ROWS = 16
READ_VERSION = 3
FRAGMENT_IDS = (0, 1, 2)


def _file(path: str, fields: tuple[int, ...]) -> DataFile:
    return DataFile(
        path=path,
        fields=list(fields),
        column_indices=list(range(len(fields))),
        file_major_version=2,
        file_minor_version=0,
    )


def _copy(fragment: DataFragment) -> DataFragment:
    out = DataFragment()
    out.CopyFrom(fragment)
    return out


def _read_state(
    store: LocalObjectStore, deleted: Mapping[int, set[int]]
) -> dict[int, DataFragment]:
    out = {}
    for fid in FRAGMENT_IDS:
        fragment = DataFragment(id=fid, files=[_file(f"f{fid}.lance", (0, 1))], physical_rows=ROWS)
        if deleted.get(fid):
            fragment.deletion_file.CopyFrom(
                write_deletion_vector(store, BASE, fid, READ_VERSION, BitMap(deleted[fid]))
            )
        out[fid] = fragment
    return out


# A side's plan: its kind, and per fragment it touches what it does to it.
ACTIONS = st.sampled_from(["delete rows", "remove", "rewrite columns"])
SIDE = st.tuples(
    st.sampled_from(["delete", "update rows", "update columns"]),
    st.dictionaries(
        st.sampled_from(FRAGMENT_IDS),
        st.tuples(ACTIONS, st.sets(st.integers(0, ROWS - 1), min_size=1, max_size=6)),
        min_size=1,
        max_size=3,
    ),
)


def _plan(
    store: LocalObjectStore,
    side: str,
    shape: tuple[str, dict[int, tuple[str, set[int]]]],
    read: Mapping[int, DataFragment],
    read_deleted: Mapping[int, set[int]],
    version: int,
) -> Operation:
    kind, touches = shape
    updated: list[DataFragment] = []
    removed: list[int] = []
    for fid, (action, rows) in sorted(touches.items()):
        fragment = _copy(read[fid])
        if action == "remove":
            removed.append(fid)
        elif action == "rewrite columns" and kind == "update columns":
            # pylance's update_columns: b tombstoned in the old file, a new file holds it.
            fragment.files[0].fields[:] = [0, -2]
            fragment.files.append(_file(f"{side}-f{fid}-b.lance", (1,)))
            updated.append(fragment)
        else:
            vector = BitMap(read_deleted.get(fid, set())) | BitMap(rows)
            if len(vector) >= ROWS:
                removed.append(fid)
                continue
            fragment.deletion_file.CopyFrom(
                write_deletion_vector(store, BASE, fid, version, vector)
            )
            updated.append(fragment)
    if kind == "delete":
        return Delete(updated_fragments=tuple(updated), deleted_fragment_ids=tuple(removed))
    mode = UpdateMode.REWRITE_COLUMNS if kind == "update columns" else UpdateMode.REWRITE_ROWS
    new = (
        ()
        if mode is UpdateMode.REWRITE_COLUMNS
        else (DataFragment(id=0, files=[_file(f"{side}-moved.lance", (0, 1))], physical_rows=1),)
    )
    return Update(
        updated_fragments=tuple(updated),
        removed_fragment_ids=tuple(removed),
        new_fragments=new,
        fields_modified=(1,),
        update_mode=mode,
    )


def _latest(read: Mapping[int, DataFragment], theirs: Operation) -> table_pb2.Manifest:
    assert isinstance(theirs, Delete | Update)
    updated = {f.id: f for f in theirs.updated_fragments}
    fragments = [
        _copy(updated.get(fid, read[fid]))
        for fid in FRAGMENT_IDS
        if fid not in theirs.dropped_fragment_ids
    ]
    return table_pb2.Manifest(version=READ_VERSION + 1, fragments=fragments)


def _files(op: Operation) -> set[tuple[int | None, str]]:
    """(fragment id, path) of every data file an operation references; new
    fragments have no id yet (None)."""
    assert isinstance(op, Delete | Update)
    out = {(f.id, d.path) for f in op.updated_fragments for d in f.files}
    if isinstance(op, Update):
        out |= {(None, d.path) for f in op.new_fragments for d in f.files}
    return out


def test_a_forced_rebase_of_a_column_rewrite_is_refused_before_writing() -> None:
    """The rebase step's own guard: even told to merge, it will not drop ours' file."""
    with tempfile.TemporaryDirectory() as root:
        store = LocalObjectStore(root)
        read = _read_state(store, {})
        theirs = _plan(store, "theirs", ("delete", {0: ("delete rows", {1, 2})}), read, {}, 3)
        ours_op = _plan(
            store, "ours", ("update columns", {0: ("rewrite columns", {0})}), read, {}, 3
        )
        ours = Transaction(READ_VERSION, ours_op)
        deletions = sorted(m.key for m in store.list(f"{BASE}/_deletions/"))
        needed = RebaseNeeded(RebaseKind.MERGE_DELETION_VECTORS, 4, frozenset({0}))

        with pytest.raises(RetryableConflictError) as info:
            rebase_transaction(
                store, BASE, ours, [needed], read_fragments=read, latest=_latest(read, theirs)
            )

        assert "ours-f0-b.lance" in str(info.value)
        assert sorted(m.key for m in store.list(f"{BASE}/_deletions/")) == deletions


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial=st.dictionaries(
        st.sampled_from(FRAGMENT_IDS), st.sets(st.integers(0, ROWS - 1), max_size=4), max_size=3
    ),
    ours_shape=SIDE,
    theirs_shape=SIDE,
)
def test_no_rebased_transaction_loses_a_data_file_ours_added(
    initial: dict[int, set[int]],
    ours_shape: tuple[str, dict[int, tuple[str, set[int]]]],
    theirs_shape: tuple[str, dict[int, tuple[str, set[int]]]],
) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = LocalObjectStore(root)
        read = _read_state(store, initial)
        theirs = Transaction(READ_VERSION, _plan(store, "theirs", theirs_shape, read, initial, 3))
        ours = Transaction(READ_VERSION, _plan(store, "ours", ours_shape, read, initial, 3))
        read_fragments = {
            fid: f for fid, f in read.items() if fid in ours.operation.modified_fragment_ids
        }
        verdict = classify(
            ours,
            theirs,
            context=ConflictContext(read_fragments=read_fragments),
            committed_version=4,
        )
        if verdict.outcome is not Outcome.REBASE:
            return
        assert verdict.rebase is not None
        try:
            rebased = rebase_transaction(
                store,
                BASE,
                ours,
                [verdict.rebase],
                read_fragments=read_fragments,
                latest=_latest(read, theirs.operation),
            )
        except RetryableConflictError:
            return  # refused: nothing of ours committed, nothing lost

        op = rebased.operation
        assert isinstance(op, Delete | Update)
        emptied = set(op.dropped_fragment_ids) - set(ours.operation.dropped_fragment_ids)
        read_paths = {(fid, d.path) for fid, f in read.items() for d in f.files}
        lost = {
            (fid, path)
            for fid, path in _files(ours.operation) - _files(op)
            # a fragment the merged deletions emptied goes, with the files it was read with
            if not (fid in emptied and (fid, path) in read_paths)
        }
        assert not lost, f"rebase dropped {sorted(lost, key=str)}"
