"""Two operators at once: a ``cleanup`` (or ``gc``) that runs while another ``cleanup``
removes versions.

A cleanup deletes the oldest manifests first. One running beside it lists
``_versions/``, then reads the manifests it listed: those the other removed in
between are gone. Both ``gc`` and ``cleanup`` used to take that for a wedged table
(``WedgedTableError`` … "their repair may need files this would delete. Run
lancetx-sync verify first"), exit 1 and send the operator to repair a table that is
fine. The interleaving is injected (the other cleanup runs, whole, between the
second one's listing and its reads): no timing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import lance
import pytest
from cli_helpers import DdbTable, make_table
from protocol_helpers import batch

from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops import preflight
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table

VERSIONS = 8


@pytest.fixture
def table(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> DdbTable:
    """``VERSIONS`` versions, each an overwrite (every old version has files of its own),
    version 3 tagged."""
    made = make_table(legacy_aws, bucket, ddb_table_name, versions=1)
    for seq in range(1, VERSIONS):
        lance.write_dataset(
            batch("w", seq, 5), made.uri, mode="overwrite", storage_options=made.options
        )
    lance.dataset(made.uri, storage_options=made.options).tags.create("keep", 3)
    return made


def _gc_everything_unreferenced(made: DdbTable) -> None:
    """gc with no age threshold, an hour from now: every unreferenced file is garbage."""
    collect_garbage(
        open_table(made.uri, made.options),
        older_than=timedelta(0),
        dry_run=False,
        now=datetime.now(UTC) + timedelta(hours=1),
        force_unsafe_threshold=True,
    )


def _cleanup_between_listing_and_reads(
    table: DdbTable, monkeypatch: pytest.MonkeyPatch
) -> list[Any]:
    """The next ``check_table`` (the victim's) lists ``_versions/``, then a whole other
    cleanup runs (keep 2, items deleted at once), then the victim reads its manifests."""
    original = preflight.read_manifests
    others: list[Any] = []
    started: list[bool] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if not started:  # the victim's first read; the other cleanup's go straight through
            started.append(True)
            others.append(
                cleanup_versions(
                    open_table(table.uri, table.options),
                    keep_versions=2,
                    items_older_than=timedelta(0),
                )
            )
        return original(*args, **kwargs)

    monkeypatch.setattr(preflight, "read_manifests", racing)
    return others


VICTIMS: dict[str, Callable[[DdbTable], Any]] = {
    "cleanup": lambda t: cleanup_versions(
        open_table(t.uri, t.options), keep_versions=4, items_older_than=timedelta(0)
    ),
    "gc": lambda t: collect_garbage(
        open_table(t.uri, t.options), older_than=timedelta(days=7), dry_run=False
    ),
}


@pytest.mark.parametrize("victim", VICTIMS)
def test_versions_another_cleanup_removes_meanwhile_are_not_a_wedged_table(
    victim: str, table: DdbTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    others = _cleanup_between_listing_and_reads(table, monkeypatch)
    report = VICTIMS[victim](table)
    assert others and others[0].ok and others[0].removed_versions == [1, 2, 4, 5, 6]
    assert report.ok, report
    if victim == "cleanup":
        assert report.removed_versions == [] and report.tagged_versions == [3]
    monkeypatch.undo()
    for version in (3, 7, 8):
        ds = lance.dataset(table.uri, version=version, storage_options=table.options)
        assert ds.to_table().num_rows == 5
    verified = verify_table(open_table(table.uri, table.options))
    assert verified.ok, verified.findings


def test_a_restore_committed_during_a_cleanup_and_cleaned_up_before_it_is_read_keeps_its_files(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cleanup A (keep 1) plans on versions 1..3 to delete version 1's files (only 1
    references them). Meanwhile pylance restores version 1 as 4, which references
    them again. Before A reads the versions committed meanwhile, 5 is appended and
    cleanup B (keep 1) removes 4. A must read 5 (which references version 1's
    files through 4) and keep them: it read only 4, found it gone, and deleted
    them, and the latest version could no longer be read."""
    from lancetx.ops import cleanup

    made = make_table(legacy_aws, bucket, ddb_table_name, versions=1)  # 1: its own files
    for seq in (1, 2):  # 2: an overwrite, 3: an append
        mode = "overwrite" if seq == 1 else "append"
        lance.write_dataset(batch("w", seq, 5), made.uri, mode=mode, storage_options=made.options)
    files_to_drop, read_manifests = cleanup._files_to_drop, preflight.read_manifests
    restored: list[bool] = []
    others: list[Any] = []

    def drop(*args: Any, **kwargs: Any) -> Any:
        found = files_to_drop(*args, **kwargs)
        if not restored:  # A has chosen what to delete; its manifests are still there
            restored.append(True)
            lance.dataset(made.uri, version=1, storage_options=made.options).restore()
        return found

    def read(table: Any, keys: Any, *args: Any) -> Any:
        keys = list(keys)
        if restored and not others and [v for v, _ in keys] == [4]:  # A's, of what came since
            others.append(None)
            lance.write_dataset(
                batch("w", 9, 5), made.uri, mode="append", storage_options=made.options
            )
            others[0] = cleanup_versions(open_table(made.uri, made.options), keep_versions=1)
        return read_manifests(table, keys, *args)

    monkeypatch.setattr(cleanup, "_files_to_drop", drop)
    monkeypatch.setattr(preflight, "read_manifests", read)
    report = cleanup_versions(open_table(made.uri, made.options), keep_versions=1)
    assert report.removed_versions == [1, 2] and others[0].removed_versions == [3, 4]
    monkeypatch.undo()
    latest = lance.dataset(made.uri, storage_options=made.options)
    assert latest.version == 5
    needed = {
        f"{made.path}/data/{f.path}" for fr in latest.get_fragments() for f in fr.data_files()
    }
    assert not needed & set(report.files_deleted), "cleanup deleted files version 5 reads"
    assert latest.to_table().num_rows == 10  # version 1's rows (restored) and 5 appended
    verified = verify_table(open_table(made.uri, made.options), deep=True)
    assert verified.ok, verified.findings


@pytest.mark.parametrize("command", ["cleanup", "gc"])
def test_a_version_committed_meanwhile_whose_manifest_cannot_be_read_stops_every_delete(
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """While a cleanup (or gc) runs, pylance commits a version that references files
    the run has chosen to delete: for cleanup, a restore of version 1 (its files again);
    for gc, an append of fragments written after the scan. Reading that version's
    manifest then fails for another reason than its being gone (a throttled GET here).
    What it references is unknown, so nothing more is deleted: a MaintenanceRaceError
    names the version and says to run again, and the new version reads whole. (Such a
    failure was skipped as if the version did not exist: its files were deleted.)"""
    from lancetx.errors import MaintenanceRaceError
    from lancetx.ops import cleanup, gc

    made = make_table(legacy_aws, bucket, ddb_table_name, versions=1)  # 1: its own files
    lance.write_dataset(batch("w", 1, 5), made.uri, mode="overwrite", storage_options=made.options)
    read_manifests = preflight.read_manifests
    committed: list[int] = []
    failure = "GetObject …: ThrottledError: SlowDown (a fault)"

    def read(table: Any, keys: Any, *args: Any) -> Any:
        keys = list(keys)
        if committed and [v for v, _ in keys] == committed:  # what was committed meanwhile
            return [], {committed[0]: failure}
        return read_manifests(table, keys, *args)

    def meanwhile() -> None:
        if command == "cleanup":
            lance.dataset(made.uri, version=1, storage_options=made.options).restore()
        else:
            data = f"s3://{made.bucket}/{made.path}"
            written = lance.fragment.write_fragments(
                batch("late", 0, 4), data, storage_options=made.options
            )
            lance.LanceDataset.commit(
                made.uri,
                lance.LanceOperation.Append(written),
                read_version=2,
                storage_options=made.options,
            )
        committed.append(lance.dataset(made.uri, storage_options=made.options).version)

    def then_commit(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            found = real(*args, **kwargs)
            if not committed:
                meanwhile()
            return found

        return wrapped

    monkeypatch.setattr(preflight, "read_manifests", read)
    with pytest.raises(MaintenanceRaceError) as caught:
        if command == "cleanup":
            monkeypatch.setattr(cleanup, "_files_to_drop", then_commit(cleanup._files_to_drop))
            cleanup_versions(open_table(made.uri, made.options), keep_versions=1)
        else:
            monkeypatch.setattr(gc, "check_table", then_commit(gc.check_table))
            _gc_everything_unreferenced(made)
    monkeypatch.undo()
    assert caught.value.unread == {3: failure}
    assert "version(s) [3]" in str(caught.value)
    assert f"lancetx-sync {command}" in str(caught.value)
    latest = lance.dataset(made.uri, storage_options=made.options)
    assert latest.version == 3
    assert latest.to_table().num_rows == (5 if command == "cleanup" else 9)
    verified = verify_table(open_table(made.uri, made.options), deep=True)
    assert verified.ok, verified.findings


def test_a_version_committed_meanwhile_whose_item_points_outside_the_table_stops_every_delete(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a gc, pylance appends fragments written after the scan (version 3), and
    version 3's item is then pointed at another table's manifest. The read path refuses
    to follow it, so what version 3 references is unknown: gc deletes nothing and
    raises UntrustedReferenceError naming the item, as it does for the items it scans.
    (The item was skipped as if version 3 did not exist: its data files were deleted.)"""
    from lancetx.errors import UntrustedReferenceError
    from lancetx.ops import gc

    made = make_table(legacy_aws, bucket, ddb_table_name, versions=2)
    other = make_table(legacy_aws, bucket, ddb_table_name, "other.lance", versions=1)
    other_manifest = next(k for k in other.objects("_versions/") if k.endswith(".manifest"))
    other_size = other.s3.head_object(Bucket=bucket, Key=other_manifest)["ContentLength"]
    check_table = gc.check_table
    appended: list[str] = []

    def then_commit(*args: Any, **kwargs: Any) -> Any:
        found = check_table(*args, **kwargs)
        if not appended:
            written = lance.fragment.write_fragments(
                batch("late", 0, 4), f"s3://{bucket}/{made.path}", storage_options=made.options
            )
            lance.LanceDataset.commit(
                made.uri,
                lance.LanceOperation.Append(written),
                read_version=2,
                storage_options=made.options,
            )
            appended.extend(f"{made.path}/data/{f.path}" for w in written for f in w.files)
            made.ddb.update_item(
                TableName=ddb_table_name,
                Key={"base_uri": {"S": made.path}, "version": {"N": "3"}},
                UpdateExpression="SET #p = :p, #s = :s",
                ExpressionAttributeNames={"#p": "path", "#s": "size"},
                ExpressionAttributeValues={
                    ":p": {"S": other_manifest},
                    ":s": {"N": str(other_size)},
                },
            )
        return found

    monkeypatch.setattr(gc, "check_table", then_commit)
    before = set(made.objects("data/"))
    with pytest.raises(UntrustedReferenceError) as caught:
        _gc_everything_unreferenced(made)
    assert other_manifest in str(caught.value) and "nothing was deleted" in str(caught.value)
    assert appended and set(appended) <= set(made.objects("data/"))
    assert before <= set(made.objects("data/"))
