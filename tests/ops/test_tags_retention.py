"""``cleanup`` and ``gc`` keep every tagged version and everything it references —
tags lancetx wrote and tags pylance wrote, at several depths — and the operator
commands stay clean afterwards (the CLI as users run it)."""

from __future__ import annotations

from datetime import timedelta

import lance
import pytest
from cli_helpers import DdbTable, age_objects, run_cli
from protocol_helpers import batch, ddb_uri, ensure_ddb_table

import lancetx
from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


def _rows(table: lancetx.Table) -> list[int]:
    return sorted(table.to_table(columns=["seq"]).column("seq").to_pylist())


def test_cleanup_keep_versions_1_keeps_tagged_versions_readable_and_every_command_exits_0(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    # Each tagged version references files no later version does: an overwrite
    # after each, and a deletion file at version 5.
    table = lancetx.write_table(uri, batch("w", 0, 3), storage_options=options)  # v1
    table.append(batch("w", 1, 3))  # v2: tagged by lancetx
    table.overwrite(batch("w", 2, 3))  # v3
    table.append(batch("w", 3, 3))  # v4
    table.delete("seq = 3 AND i = 0")  # v5: tagged by pylance
    table.overwrite(batch("w", 6, 3))  # v6
    table.append(batch("w", 7, 3))  # v7 (latest)
    table.tags.create("lancetx-v2", 2)
    lance.dataset(uri, storage_options=options).tags.create("pylance-v5", 5)
    expected = {
        2: lancetx.open(uri, options, version=2).to_table(),
        5: lancetx.open(uri, options, version=5).to_table(),
        7: lancetx.open(uri, options).to_table(),
    }

    done = run_cli(legacy_aws, "cleanup", uri, "--keep-versions", "1", "--json")
    assert done.code == 0, done.stdout + done.stderr
    assert done.json["removed_versions"] == [1, 3, 4, 6]
    assert done.json["tagged_versions"] == [2, 5]

    def readable_everywhere() -> None:
        for version, name in ((2, "lancetx-v2"), (5, "pylance-v5"), (7, None)):
            for ref in (version, name) if name else (version,):
                ours = lancetx.open(uri, options, version=ref).to_table()
                theirs = lance.dataset(uri, version=ref, storage_options=options).to_table()
                assert ours.sort_by([("seq", "ascending"), ("i", "ascending")]).equals(
                    expected[version].sort_by([("seq", "ascending"), ("i", "ascending")])
                ), ref
                assert theirs.sort_by([("seq", "ascending"), ("i", "ascending")]).equals(
                    expected[version].sort_by([("seq", "ascending"), ("i", "ascending")])
                ), ref
        assert lancetx.open(uri, options).checkout("pylance-v5").version == 5
        assert [v.version for v in lancetx.open(uri, options).history()] == [2, 5, 7]

    readable_everywhere()
    status = run_cli(legacy_aws, "status", uri, "--json")
    assert status.code == 0 and status.json["tags"] == {"lancetx-v2": 2, "pylance-v5": 5}
    for command in (["verify"], ["gc", "--older-than", "7d", "--delete"], ["cleanup"]):
        extra = ["--keep-versions", "1"] if command == ["cleanup"] else []
        ran = run_cli(legacy_aws, command[0], uri, *command[1:], *extra, "--json")
        assert ran.code == 0, (command, ran.stdout, ran.stderr)
        if command == ["cleanup"]:
            assert ran.json["removed_versions"] == []

    # Everything looks a month old: gc may then delete whatever no version references
    # (the library's gc; the test below runs it at more depths).
    table_files = DdbTable(legacy_aws, bucket, ddb_table_name, "t.lance", uri, options).objects()
    age_objects(bucket, table_files, timedelta(days=30))
    assert collect_garbage(open_table(uri, options), older_than=timedelta(days=7), dry_run=False).ok
    readable_everywhere()


def test_tags_at_several_depths_keep_their_versions_through_cleanup_and_gc(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Tags at the oldest version, in the middle and one below the latest, moved and
    deleted between cleanups: each cleanup keeps exactly the tagged versions."""
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("w", 0, 2), storage_options=options)
    for n in range(1, 8):  # versions 2..8, an overwrite every third
        (table.overwrite if n % 3 == 0 else table.append)(batch("w", n, 2))
    table.tags.create("oldest", 1)
    lance.dataset(uri, storage_options=options).tags.create("middle", 4)
    table.tags.create("below-latest", 7)
    before = {v: _rows(table.checkout(v)) for v in (1, 4, 7, 8)}

    ops = open_table(uri, options)
    first = cleanup_versions(ops, keep_versions=1)
    assert first.ok and (first.removed_versions, first.tagged_versions) == ([2, 3, 5, 6], [1, 4, 7])
    # moving a tag to a version the cleanup removed is refused by both, nothing moves
    with pytest.raises((OSError, ValueError)):
        lance.dataset(uri, storage_options=options).tags.update("middle", 3)
    with pytest.raises(lancetx.VersionNotFoundError, match="a cleanup removed it"):
        table.tags.update("middle", 5)
    assert table.tags.get_version("middle") == 4
    lance.dataset(uri, storage_options=options).tags.delete("below-latest")
    assert table.tags.get("middle").created_at is not None

    second = cleanup_versions(ops, keep_versions=1)
    assert second.ok and second.removed_versions == [7]
    objects = DdbTable(legacy_aws, bucket, ddb_table_name, "t.lance", uri, options).objects()
    age_objects(bucket, objects, timedelta(days=30))
    swept = collect_garbage(ops, older_than=timedelta(days=7), dry_run=False)
    # every file is a month old: only what a version references (v1's and v4's files
    # only the tagged versions do) may stay
    assert swept.ok and swept.versions_referenced == 3
    assert verify_table(ops, deep=True, all_versions=True).ok
    for ref, version in (("oldest", 1), ("middle", 4)):
        assert _rows(lancetx.open(uri, options).checkout(ref)) == before[version]
        assert lance.dataset(uri, version=ref, storage_options=options).count_rows() == len(
            before[version]
        )
    assert _rows(lancetx.open(uri, options)) == before[8]
    assert [v.version for v in lancetx.open(uri, options).history()] == [1, 4, 8]


def test_a_version_tagged_while_cleanup_removes_it_is_put_back(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other half of the race ``tags.create`` checks for: the tag is written after
    the cleanup read the tags and its creator's check runs before the manifest goes.
    The cleanup reads the tags again after deleting manifests and puts the version
    back (deterministic: the tag is created inside the cleanup's delete)."""
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("w", 0, 2), storage_options=options)
    table.overwrite(batch("w", 1, 2))  # v2: files only v2 references
    table.overwrite(batch("w", 2, 2))  # v3
    table.append(batch("w", 3, 2))  # v4
    expected = _rows(table.checkout(2))
    ops = open_table(uri, options)
    delete = ops.store.delete

    def tag_then_delete(key: str) -> None:
        if "/_versions/" in key and not table.tags.list():
            assert table.tags.create("late", 2).version == 2  # its check passes: still there
        delete(key)

    monkeypatch.setattr(ops.store, "delete", tag_then_delete)
    report = cleanup_versions(ops, keep_versions=1)
    monkeypatch.undo()
    assert report.ok and report.removed_versions == [1, 3]
    assert 2 in report.kept_versions
    assert _rows(lancetx.open(uri, options, version="late")) == expected
    assert lance.dataset(uri, version="late", storage_options=options).count_rows() == 2
    assert verify_table(ops, deep=True, all_versions=True).ok
    assert [v.version for v in lancetx.open(uri, options).history()] == [2, 4]
