"""``Table.changes``: what each version did to the rows, the feed the Spark streaming
source follows. Appending versions name the fragments they added (pylance reads
exactly their rows at that version, also for a pylance writer's append); versions
that change no row (compaction, index, config, a delete matching nothing, a dropped
column) say so; versions that delete or change rows say what they did; versions a
cleanup removed are named, never skipped."""

from __future__ import annotations

import asyncio

import boto3
import lance
import pyarrow as pa
import pytest
from table_helpers import ddb_uri

import lancetx
import lancetx.aio
from lancetx.demo.embedded import EmbeddedAws
from lancetx.errors import VersionNotFoundError, VersionsRemovedError
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table


@pytest.fixture
def options(aws: EmbeddedAws) -> dict[str, str]:
    return aws.pylance_storage_options()


@pytest.fixture
def uri(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    return ddb_uri(bucket, ddb_table_name)


def rows(start: int, stop: int) -> pa.Table:
    ids = range(start, stop)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"x{i}" for i in ids]})


def appended_ids(table: lancetx.Table, change: lancetx.VersionChange) -> list[int]:
    """The rows pylance reads from the version's appended fragments, at that version."""
    ds = table.checkout(change.version).dataset
    fragments = [ds.get_fragment(f.id) for f in change.appended]
    scanner = ds.scanner(columns=["id"], fragments=fragments)
    return sorted(scanner.to_table().column("id").to_pylist())


def test_changes_tell_appends_from_row_changes(uri: str, options: dict[str, str]) -> None:
    table = lancetx.write_table(uri, rows(0, 10), storage_options=options)  # 1
    table.append(rows(10, 20), max_rows_per_file=4)  # 2: three fragments
    table.delete("id < 3")  # 3
    table.delete("id > 1000")  # 4: matches nothing
    table.compact()  # 5
    table.merge_insert("id").when_not_matched_insert_all().execute(rows(20, 25))  # 6
    merge = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    merge.execute(rows(24, 27))  # 7
    table.update_config({"owner": "me"})  # 8
    table.create_index("id", "BTREE")  # 9
    table.add_columns({"w": "id * 2"})  # 10
    table.drop_columns(["w"])  # 11
    # 12: a pylance writer beside lancetx, committing itself through DynamoDB
    lance.write_dataset(rows(30, 35), uri, mode="append", storage_options=options)
    table.overwrite(rows(0, 3))  # 13
    table.refresh()

    changes = table.changes(since=0)
    summary = [(c.version, c.operation, bool(c.appended), c.changes_rows) for c in changes]
    assert summary == [
        (1, "Overwrite", True, False),  # the creation: its rows are appended
        (2, "Append", True, False),
        (3, "Delete", False, True),
        (4, "Delete", False, False),
        (5, "Rewrite", False, False),
        (6, "Update", True, False),  # an insert-only merge appends
        (7, "Update", False, True),
        (8, "UpdateConfig", False, False),
        (9, "CreateIndex", False, False),
        (10, "Merge", False, True),
        (11, "Project", False, False),
        (12, "Append", True, False),
        (13, "Overwrite", False, True),
    ]
    by_version = {c.version: c for c in changes}
    assert [f.rows for f in by_version[2].appended] == [4, 4, 2]
    assert by_version[3].deletes_only and "id < 3" in by_version[3].detail
    assert not by_version[7].deletes_only
    assert by_version[10].columns == ("id", "v", "w") and by_version[11].columns == ("id", "v")
    for version, expected in {
        1: range(10),
        2: range(10, 20),
        6: range(20, 25),
        12: range(30, 35),
    }.items():
        change = by_version[version]
        assert appended_ids(table, change) == list(expected), version
        assert change.rows == len(expected)
    assert [c.version for c in table.changes(since=11, until=12)] == [12]
    assert [f.rows for f in table.fragment_rows()] == [3]

    async def through_aio() -> tuple[list[lancetx.VersionChange], list[lancetx.FragmentRows]]:
        async with await lancetx.aio.open(uri, options) as table:
            return await table.changes(since=11), await table.fragment_rows()

    assert asyncio.run(through_aio()) == (changes[11:], table.fragment_rows())

    # A clone's first version creates it: its rows (read from the source's files) are new.
    cloned = lancetx.clone(
        uri, uri.replace("/t.lance?", "/clone.lance?"), version=2, storage_options=options
    )
    (created,) = cloned.changes(since=0)
    assert (created.operation, created.changes_rows) == ("Clone", False)
    assert appended_ids(cloned, created) == list(range(20))


def test_changes_name_the_versions_a_cleanup_removed(uri: str, options: dict[str, str]) -> None:
    table = lancetx.write_table(uri, rows(0, 5), storage_options=options)
    for n in range(1, 6):
        table.append(rows(10 * n, 10 * n + 5))  # versions 2..6
    report = cleanup_versions(open_table(uri, options), keep_versions=2)
    assert report.removed_versions == [1, 2, 3, 4]

    with pytest.raises(VersionsRemovedError) as caught:
        table.changes(since=2)
    assert caught.value.versions == [3, 4] and caught.value.oldest == 5
    assert "version(s) 3-4" in str(caught.value) and "Table.changes(since=4)" in str(caught.value)
    assert isinstance(caught.value, VersionNotFoundError)
    assert [c.version for c in table.changes(since=4)] == [5, 6]
    with pytest.raises(VersionNotFoundError, match="latest version is 6"):
        table.changes(since=4, until=7)
