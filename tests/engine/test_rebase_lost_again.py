"""A rebase that wrote merged deletion files and then lost again: the next round
rebases on the new winner and no deletion file of a lost round is referenced."""

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

from lancetx.commit.engine.committer import commit_transaction
from lancetx.commit.engine.operations import Delete
from lancetx.commit.errors import (
    RetryableConflictError,
)
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.manifest import read_manifest
from lancetx.commit.format.naming import NamingScheme

ROWS = 10
V2 = NamingScheme.V2


@pytest.fixture
def engine(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10, 10))


def _deletion_file_id(key: str) -> tuple[int, int]:
    fragment, _, rest = key.rsplit("/", 1)[-1].split("-", 2)
    return int(fragment), int(rest.split(".")[0])


def _referenced_deletion_files(table: EngineTable) -> set[tuple[int, int]]:
    refs = set()
    for loc in list_manifest_locations(table.handler.store, table.base):
        manifest = read_manifest(table.handler.store, loc.key).manifest
        for fragment in manifest.fragments:
            if fragment.HasField("deletion_file"):
                refs.add((fragment.id, fragment.deletion_file.id))
    return refs


@pytest.mark.parametrize("third_overlaps", [False, True])
def test_rebased_then_lost_again(engine: EngineTable, third_overlaps: bool) -> None:
    """Ours (delete rows 5, 6 of fragment 0, read at v2) is rebased onto v3 (a
    winner deleted 0, 1), writes a merged deletion file, then loses v4 to a third
    delete. The second rebase merges against v4; if the third deleted one of
    OUR rows it is a retryable conflict. Either way the first attempt's merged
    file is an orphan no version references, and pylance reads exactly what the
    committed versions say."""
    table = engine
    read = table.latest()
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    v3 = table.latest()
    third_rows = [6, 9] if third_overlaps else [8, 9]
    third = delete_transaction(table, v3, {0: third_rows}, "third")
    files_before = {k for k, _ in table.listing("_deletions")}

    racing = LosingHandler(table.handler, before_commit=lambda v: table.commit(third, parent=v3))
    if third_overlaps:
        with pytest.raises(RetryableConflictError):
            commit_transaction(racing, table.base, ours)
        assert racing.attempts == [4]
        assert table.versions() == [1, 2, 3, 4]
        assert table.values() == [2, 3, 4, 5, 7, 8, *range(10, 20)]
    else:
        done = commit_transaction(racing, table.base, ours)
        assert racing.attempts == [4, 5] and done.version == 5
        op = done.transaction.operation
        assert isinstance(op, Delete)
        assert done.transaction.read_version == 4
        assert sorted(snapshot_of(table, done).deletion_vector(0)) == [0, 1, 5, 6, 8, 9]
        assert table.values() == [2, 3, 4, 7, *range(10, 20)]
    written = {k for k, _ in table.listing("_deletions")} - files_before
    referenced = _referenced_deletion_files(table)
    orphans = [k for k in written if _deletion_file_id(k) not in referenced]
    # The first attempt's merged file (read_version 3) was superseded by the second
    # rebase and removed once the commit landed: no orphan is left.
    assert orphans == []
    # pylance opens every version; the orphan changes nothing it reads.
    for version in table.versions():
        table.dataset(version).count_rows()
