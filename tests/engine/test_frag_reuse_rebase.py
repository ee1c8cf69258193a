"""Rebasing onto changes of the fragment reuse index, with pylance's own artifacts.

pylance compacts with ``defer_index_remap=True``: each compaction commits a
Rewrite and a new version of the fragment reuse index (``__lance_frag_reuse``)
instead of remapping the table's indices. Ours is a cleanup of that index (a
CreateIndex replacing it with fewer versions), planned before another
compaction or cleanup committed. The spec rebases it ("Accumulates fragment
reuse index updates when concurrent Rewrites change fragment IDs"; "CreateIndex
(only if both operations are modifying the same singleton index)"): the
committed side's additions are kept and its removals applied, and the index
that is current now is the one replaced. Before, both were refused with
RetryableConflictError ("cannot yet rebase by 'merge fragment reuse index'").

pylance then opens the table, reads the index, and compacts on top of it.
"""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa
import pytest
from engine_helpers import EngineTable
from lance.optimize import Compaction, CompactionOptions

from lancetx.commit.engine.committer import Parent
from lancetx.commit.engine.conflicts import Outcome, RebaseKind, RebaseNeeded, classify
from lancetx.commit.engine.frag_reuse import build_frag_reuse_index, read_versions
from lancetx.commit.engine.operations import (
    FRAG_REUSE_INDEX_NAME,
    CreateIndex,
    IndexMetadata,
    Rewrite,
    Transaction,
)
from lancetx.commit.engine.rebase import rebase_transaction
from lancetx.commit.errors import RetryableConflictError
from lancetx.externalstore.connect import connect

DEFERRED = CompactionOptions(defer_index_remap=True, target_rows_per_fragment=10_000)


class Lake:
    """A pylance table with a btree index and deferred-remap compactions."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.rows = 0
        self.append(4)
        lance.dataset(uri).create_scalar_index("a", "BTREE")
        self.table = EngineTable(uri, None, connect(uri))

    def append(self, fragments: int) -> None:
        """pylance appends ``fragments`` fragments and indexes them (a compaction
        adds a reuse-index version only for fragments an index covers)."""
        for _ in range(fragments):
            data = pa.table({"a": pa.array(range(self.rows, self.rows + 10), pa.int64())})
            lance.write_dataset(data, self.uri, mode="append" if self.rows else "create")
            self.rows += 10
        if fragments and self.rows > 10 * fragments:
            lance.dataset(self.uri).optimize.optimize_indices()

    def compact(self) -> int:
        """pylance plans, executes and commits a compaction that defers remapping."""
        dataset = lance.dataset(self.uri)
        plan = Compaction.plan(dataset, DEFERRED)
        assert plan.tasks, "nothing to compact"
        Compaction.commit(dataset, [task.execute(dataset) for task in plan.tasks], DEFERRED)
        return int(lance.dataset(self.uri).version)

    def fri(self, parent: Parent | None = None) -> IndexMetadata:
        parent = parent or self.table.latest()
        (index,) = [i for i in parent.manifest.indices or [] if i.name == FRAG_REUSE_INDEX_NAME]
        return index

    def fri_versions(self, parent: Parent | None = None) -> list[int]:
        versions = read_versions(self.table.handler.store, self.table.base, self.fri(parent))
        return [v.dataset_version for v in versions]

    def cleanup(self, parent: Parent, keep_from: int) -> Transaction:
        """Our cleanup: replace the index with its versions made at ``keep_from`` or later."""
        current = self.fri(parent)
        store, base = self.table.handler.store, self.table.base
        kept = [v for v in read_versions(store, base, current) if v.dataset_version >= keep_from]
        new = build_frag_reuse_index(
            store, base, kept, dataset_version=parent.version, template=current
        )
        return Transaction(
            parent.version, CreateIndex(new_indices=(new,), removed_indices=(current,))
        )


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    lake = Lake(str(tmp_path / "t.lance"))
    lake.compact()
    lake.append(2)
    lake.compact()
    return lake


def test_a_cleanup_rebases_onto_a_concurrent_deferred_compaction(lake: Lake) -> None:
    read = lake.table.latest()
    first, second = lake.fri_versions(read)
    ours = lake.cleanup(read, keep_from=second)  # drops the first version
    lake.append(2)
    lake.compact()  # pylance commits a Rewrite carrying a third version
    third = lake.fri_versions()[-1]
    assert lake.fri_versions() == [first, second, third]
    theirs_uuid = lake.fri().uuid.uuid

    done = lake.table.commit(ours, parent=read)

    assert done.version == lance.dataset(lake.uri).version
    # One fragment reuse index: ours (a new uuid), with our removal and their addition.
    assert lake.fri_versions() == [second, third]
    merged = lake.fri()
    planned = ours.operation.new_indices[0].uuid.uuid  # type: ignore[attr-defined]
    assert merged.uuid.uuid not in {planned, theirs_uuid}
    assert merged.dataset_version == done.version - 1  # built on the version it rebased onto
    names = sorted(i.name for i in done.manifest.indices or [])
    assert names == sorted([FRAG_REUSE_INDEX_NAME, "a_idx"])
    # pylance reads the table and the index, and keeps compacting on top of it.
    dataset = lance.dataset(lake.uri)
    assert dataset.count_rows() == lake.rows
    assert dataset.to_table(filter="a = 42")["a"].to_pylist() == [42]
    described = {d.name: d for d in dataset.describe_indices()}
    assert FRAG_REUSE_INDEX_NAME in described
    lake.append(2)
    lake.compact()
    assert lake.fri_versions()[:2] == [second, third] and len(lake.fri_versions()) == 3
    assert lance.dataset(lake.uri).count_rows() == lake.rows


def test_two_cleanups_merge(lake: Lake) -> None:
    lake.append(2)
    lake.compact()
    read = lake.table.latest()
    _, second, third = lake.fri_versions(read)
    theirs = lake.cleanup(read, keep_from=third)
    ours = lake.cleanup(read, keep_from=second)
    verdict = classify(ours, theirs, committed_version=read.version + 1)
    assert verdict.outcome is Outcome.REBASE
    assert verdict.rebase is not None
    assert verdict.rebase.kind is RebaseKind.MERGE_SINGLETON_INDEX
    lake.table.commit(theirs, parent=read)

    done = lake.table.commit(ours, parent=read)

    assert done.version == read.version + 2
    assert lake.fri_versions() == [third]  # their removal of the second version holds
    assert [i.name for i in done.manifest.indices or []].count(FRAG_REUSE_INDEX_NAME) == 1
    assert lance.dataset(lake.uri).count_rows() == lake.rows


def test_the_rebase_was_refused_before(lake: Lake) -> None:
    """What the merge replaced: a typed retryable refusal (kept for what is
    still unsupported: a Rewrite carrying its own fragment reuse index)."""
    read = lake.table.latest()
    committed = lake.cleanup(read, keep_from=lake.fri_versions(read)[-1])
    rewrite = Transaction(read.version, Rewrite(frag_reuse_index=lake.fri(read)))
    needed = RebaseNeeded(
        RebaseKind.MERGE_FRAGMENT_REUSE_INDEX,
        read.version + 1,
        indices=committed.operation.new_indices,  # type: ignore[attr-defined]
    )
    with pytest.raises(RetryableConflictError) as info:
        rebase_transaction(
            lake.table.handler.store,
            lake.table.base,
            rewrite,
            [needed],
            read_fragments={},
            latest=read.manifest.manifest,
        )
    assert "a rewrite carrying a fragment reuse index is planned again" in str(info.value)
