"""Audit (issue 3, scope 3 and the matrix's "rebased" cells): the conflict rules
answer REBASE for singleton indices (both writers committing the MemWAL index),
but the rebase step only knows how to merge deletion vectors. The commit loop
must then answer with a typed RetryableConflictError and write no version --
never commit ours as if compatible, which would replace the other writer's
index details without merging them. test_conflict_matrix checks the verdict
only; this checks what the commit loop does with it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from conflict_cases import generation, mem_wal_index
from engine_helpers import make_table

from lancetx.commit.engine.conflicts import Outcome, RebaseKind, classify
from lancetx.commit.engine.operations import MEM_WAL_INDEX_NAME, CreateIndex, Transaction
from lancetx.commit.errors import RetryableConflictError


def _mem_wal(*gens):  # type: ignore[no-untyped-def]
    index = mem_wal_index(*gens)
    index.uuid.uuid = uuid.uuid4().bytes  # a distinct index per writer
    return index


def test_singleton_index_rebase_the_engine_cannot_do_is_retryable(tmp_path: Path) -> None:
    table = make_table(str(tmp_path / "t.lance"), sizes=(10,))  # v1
    read = table.latest()
    theirs = Transaction(read.version, CreateIndex(new_indices=(_mem_wal(generation(1, 3)),)))
    ours = Transaction(read.version, CreateIndex(new_indices=(_mem_wal(generation(1, 5)),)))
    verdict = classify(ours, theirs, committed_version=2)
    assert verdict.outcome is Outcome.REBASE  # what the matrix promises
    assert verdict.rebase is not None and verdict.rebase.kind is RebaseKind.MERGE_SINGLETON_INDEX

    won = table.commit(theirs, parent=read)
    assert won.version == 2
    versions = table.listing("_versions")

    with pytest.raises(RetryableConflictError) as info:
        table.commit(ours, parent=read)  # holds v1: loses the race, learns of v2

    assert info.value.retryable and info.value.transaction_uuid == ours.uuid
    assert [v for v, _, _ in info.value.conflicts] == [2]
    assert "cannot yet rebase" in str(info.value)
    assert table.listing("_versions") == versions
    assert table.versions() == [1, 2]
    (index,) = [i for i in table.latest().manifest.indices or [] if i.name == MEM_WAL_INDEX_NAME]
    assert index.uuid.uuid == theirs.operation.new_indices[0].uuid.uuid  # type: ignore[attr-defined]
