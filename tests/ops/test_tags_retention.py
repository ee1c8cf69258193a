"""``cleanup`` and ``gc`` keep every tagged version and everything it references —
tags lancetx wrote and tags pylance wrote, at several depths — and the operator
commands stay clean afterwards (the CLI as users run it)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import lance
import pytest
from cli_helpers import CliResult, DdbTable, age_objects, run_cli
from protocol_helpers import batch, ddb_uri, ensure_ddb_table

import lancetx
from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops import cleanup as cleanup_module
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.items import ItemChangedError
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
    # the put-back version's item lost its removed mark; the removed ones keep theirs
    items = DdbTable(legacy_aws, bucket, ddb_table_name, "t.lance", uri, options).items()
    assert [int(i["version"]["N"]) for i in items if "removed_at" in i] == [1, 3]
    # and once its tag is gone again, version 3 above it still reads as removed
    table.tags.delete("late")
    assert [v.version for v in lancetx.open(uri, options).history()] == [2, 4]
    assert verify_table(ops, deep=True, all_versions=True).ok


def test_cleanup_interrupted_between_marking_and_deleting_leaves_a_readable_table(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C at the first manifest delete: the items are marked removed but every
    manifest is still there. Readers read them all (a mark counts only when the
    manifest is gone), and the next cleanup finishes the job."""
    uri, options, _ = _tagged_table_setup(legacy_aws, bucket, ddb_table_name)
    ops = open_table(uri, options)

    def interrupted(key: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ops.store, "delete", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cleanup_versions(ops, keep_versions=1)
    monkeypatch.undo()
    items = DdbTable(legacy_aws, bucket, ddb_table_name, "t.lance", uri, options).items()
    assert [int(i["version"]["N"]) for i in items if "removed_at" in i] == [1, 3, 4, 6, 7]
    _agree(uri, options, list(range(1, 9)))
    assert verify_table(ops, deep=True, all_versions=True).ok
    lance.dataset(uri, storage_options=options).tags.delete("five")
    report = cleanup_versions(open_table(uri, options), keep_versions=1)
    assert report.ok and report.removed_versions == [1, 3, 4, 5, 6, 7]
    _agree(uri, options, [2, 8])
    _maintenance_clean(uri, options)


def test_versions_pylance_cleaned_up_are_marked_by_the_next_lancetx_cleanup(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """pylance's ``cleanup_old_versions`` deletes manifests and leaves the items
    unmarked. The next ``lancetx-sync cleanup`` (nothing left for it to remove) marks
    them, so a tag deleted afterwards leaves the table readable and clean."""
    uri, options, before = _tagged_table_setup(legacy_aws, bucket, ddb_table_name)
    ds = lance.dataset(uri, storage_options=options)
    ds.cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)
    _agree(uri, options, [2, 5, 8])
    marking = cleanup_versions(open_table(uri, options), keep_versions=1)
    assert marking.ok and marking.removed_versions == [], marking.errors
    items = DdbTable(legacy_aws, bucket, ddb_table_name, "t.lance", uri, options).items()
    assert [int(i["version"]["N"]) for i in items if "removed_at" in i] == [1, 3, 4, 6, 7]
    lance.dataset(uri, storage_options=options).tags.delete("two")
    _agree(uri, options, [2, 5, 8])
    assert _rows(lancetx.open(uri, options, version=2)) == before[2]
    removed = _maintenance_clean(uri, options)
    assert removed == [2]


def _tagged_table_setup(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> tuple[str, dict[str, str], dict[int, list[int]]]:
    """Versions 1..8 (appends), tag "two" (lancetx) at 2 and "five" (pylance) at 5.
    Returns the URI, the storage options and every version's rows."""
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("w", 0, 2), storage_options=options)
    for n in range(1, 8):
        table.append(batch("w", n, 2))
    table.tags.create("two", 2)
    lance.dataset(uri, storage_options=options).tags.create("five", 5)
    return uri, options, {v: _rows(table.checkout(v)) for v in range(1, 9)}


def _tagged_table_cleaned(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> tuple[str, dict[str, str], dict[int, list[int]]]:
    """Versions 1..8 (appends), tag "two" (lancetx) at 2 and "five" (pylance) at 5,
    then ``lancetx-sync cleanup --keep-versions 1`` as a user runs it: versions 2 and 5
    are kept between removed ones (1, 3, 4, 6, 7). Returns the URI, the storage
    options and every version's rows as they were before the cleanup."""
    uri, options, before = _tagged_table_setup(aws, bucket, ddb_table_name)
    done = run_cli(aws, "cleanup", uri, "--keep-versions", "1", "--json")
    assert done.code == 0, done.stdout + done.stderr
    assert done.json["removed_versions"] == [1, 3, 4, 6, 7]
    return uri, options, before


def _agree(uri: str, options: dict[str, str], versions: list[int]) -> None:
    """lancetx's history, pylance's version list and both readers agree on ``versions``."""
    assert [v.version for v in lancetx.open(uri, options).history()] == versions
    ds = lance.dataset(uri, storage_options=options)
    assert [v["version"] for v in ds.versions()] == versions
    for version in versions:
        ours = lancetx.open(uri, options, version=version).count_rows()
        assert ours == lance.dataset(uri, version=version, storage_options=options).count_rows()
    assert {n: t.version for n, t in lancetx.open(uri, options).tags.list().items()} == {
        n: t["version"] for n, t in ds.tags.list().items()
    }


def _commands_exit_0(aws: EmbeddedAws, uri: str) -> dict[str, CliResult]:
    ran = {}
    for command in (["verify"], ["gc", "--older-than", "7d", "--delete"], ["cleanup"]):
        extra = ["--keep-versions", "1"] if command == ["cleanup"] else []
        done = run_cli(aws, command[0], uri, *command[1:], *extra, "--json")
        assert done.code == 0, (command, done.stdout, done.stderr)
        ran[command[0]] = done
    return ran


def _maintenance_clean(uri: str, options: dict[str, str]) -> list[int]:
    """What ``_commands_exit_0`` runs, through the library (the CLI's own tests are the
    ones above): verify, gc and cleanup all succeed; cleanup's removed versions."""
    ops = open_table(uri, options)
    assert verify_table(ops, deep=True, all_versions=True).ok
    assert collect_garbage(ops, older_than=timedelta(days=7), dry_run=False).ok
    report = cleanup_versions(ops, keep_versions=1)
    assert report.ok, report.errors
    return report.removed_versions


def test_tags_deleted_or_moved_after_cleanup_leave_every_version_readable_and_commands_clean(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """The kept tagged versions sit between removed ones. Deleting or moving their tags
    afterwards (by pylance or lancetx) must not make the removed versions around them
    look missing: history, pylance and every operator command agree, and the next
    cleanup removes the untagged ones."""
    uri, options, before = _tagged_table_cleaned(legacy_aws, bucket, ddb_table_name)
    _agree(uri, options, [2, 5, 8])
    assert lance.dataset(uri, version="five", storage_options=options).count_rows() == 10
    assert _rows(lancetx.open(uri, options, version="two")) == before[2]
    # (verify, gc and cleanup exit 0 here: the test at the top of this file)
    for removed in (1, 3, 6):  # removed, not dangling, below and between the kept ones
        with pytest.raises(lancetx.VersionNotFoundError, match="a cleanup removed it"):
            lancetx.open(uri, options, version=removed)

    # pylance deletes the upper tag: version 5 is untagged above removed 3 and 4 and
    # below removed 6 and 7
    lance.dataset(uri, storage_options=options).tags.delete("five")
    _agree(uri, options, [2, 5, 8])
    assert _rows(lancetx.open(uri, options).checkout(5)) == before[5]
    for version in (6, 7):
        with pytest.raises(lancetx.VersionNotFoundError):
            lancetx.open(uri, options, version=version)
    ran = _commands_exit_0(legacy_aws, uri)
    assert ran["cleanup"].json["removed_versions"] == [5]
    _agree(uri, options, [2, 8])

    # lancetx moves the lower tag to the latest: version 2 is untagged below removed ones
    lancetx.open(uri, options).tags.update("two", 8)
    _agree(uri, options, [2, 8])
    ran = _commands_exit_0(legacy_aws, uri)
    assert ran["cleanup"].json["removed_versions"] == [2]
    _agree(uri, options, [8])
    assert _rows(lancetx.open(uri, options, version="two")) == before[8]


def test_tag_deleted_after_cleanup_by_lancetx_keeps_the_next_commit_and_reads_clean(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """The lower tag deleted by lancetx: every removed version lies above an untagged
    kept one. A commit after that lands above them all, and a cleanup run while the
    tag is gone removes version 2 and keeps the tagged 5."""
    uri, options, before = _tagged_table_cleaned(legacy_aws, bucket, ddb_table_name)
    table = lancetx.open(uri, options)
    table.tags.delete("two")
    _agree(uri, options, [2, 5, 8])
    with pytest.raises(lancetx.VersionNotFoundError, match="a cleanup removed it"):
        table.tags.create("three", 3)
    table.append(batch("w", 8, 2))  # v9
    assert table.version == 9
    _agree(uri, options, [2, 5, 8, 9])
    removed = _maintenance_clean(uri, options)
    assert removed == [2, 8]
    _agree(uri, options, [5, 9])
    assert _rows(lancetx.open(uri, options, version="five")) == before[5]


def test_an_item_that_cannot_be_marked_keeps_its_version_and_every_later_one(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marking version 4's item fails (it changed meanwhile): nothing from version 4 on
    is removed, so the versions removed stay marked and the run reports the item."""
    uri, options, before = _tagged_table_setup(legacy_aws, bucket, ddb_table_name)
    real = cleanup_module.mark_item_removed

    def refuse_4(entries: Any, base: str, version: int, path: str, at_ms: int) -> None:
        if version == 4:
            raise ItemChangedError(f"version {version} changed")
        real(entries, base, version, path, at_ms)

    monkeypatch.setattr(cleanup_module, "mark_item_removed", refuse_4)
    report = cleanup_versions(open_table(uri, options), keep_versions=1)
    monkeypatch.undo()
    assert not report.ok and "item of version 4 changed" in report.errors[0]
    assert report.removed_versions == [1, 3]
    _agree(uri, options, [2, 4, 5, 6, 7, 8])
    lance.dataset(uri, storage_options=options).tags.delete("two")
    _agree(uri, options, [2, 4, 5, 6, 7, 8])
    assert _rows(lancetx.open(uri, options, version=4)) == before[4]
    removed = _maintenance_clean(uri, options)
    assert removed == [2, 4, 6, 7]
