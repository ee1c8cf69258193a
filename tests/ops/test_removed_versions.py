"""Versions a cleanup removed are removed, not missing: history, key look-ups, commits
with keys, ``commit_fragments(key)``, Spark jobs with a job id, ``verify``, ``gc``,
``cleanup`` and ``repair`` all go on — also with a version a pylance tag keeps."""

from __future__ import annotations

import asyncio
import inspect
from datetime import timedelta
from typing import Any

import lance
import pyarrow as pa
import pytest
from cli_helpers import DdbTable, age_objects, run_cli
from protocol_helpers import batch, ddb_uri, ensure_ddb_table

import lancetx
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table
from pyspark_lancetx.commit import JobCommit, commit_job, last_commit, table_history
from pyspark_lancetx.write_task import WritePlan, schema_to_ipc, write_task


def _keyed_table(aws: EmbeddedAws, bucket: str, ddb_table: str, appends: int) -> DdbTable:
    """Version 1 (create) and ``appends`` appends, append n with idempotency key ``k{n}``."""
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table)
    uri = ddb_uri(bucket, "t.lance", ddb_table)
    table = lancetx.write_table(uri, batch("w", 0, 3), storage_options=options)
    for n in range(1, appends + 1):
        table.append(batch("w", n, 3), idempotency_key=f"k{n}")
    return DdbTable(aws, bucket, ddb_table, "t.lance", uri, options)


def _job(table: DdbTable, job_id: str) -> JobCommit:
    schema = batch("spark", 0, 1).schema
    plan = WritePlan(
        uri=table.uri,
        data_uri=f"s3://{table.bucket}/{table.path}",
        storage_options=table.options,
        schema_ipc=schema_to_ipc(schema),
    )
    return JobCommit(plan=plan, job_id=job_id, mode="append", timeout=60)


def test_after_cleanup_every_reader_of_history_skips_the_removed_versions(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """The default cleanup keeps removed versions' items (fences) for 7 days: readers of
    history used to follow them to the deleted manifests and fail."""
    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=5)  # versions 1..6
    report = cleanup_versions(open_table(table.uri, table.options), keep_versions=2)
    assert report.removed_versions == [1, 2, 3, 4]
    assert report.items_kept_as_fence == [1, 2, 3, 4]

    opened = lancetx.open(table.uri, table.options)
    assert [v.version for v in opened.history()] == [5, 6]
    assert opened.find_idempotency_key("k5") == 6
    # Its version is gone, not its key item: a retry of k1 is still not committed again.
    assert opened.find_idempotency_key("k1") == 2
    # A commit with a key looks the key up in history first.
    assert opened.append(batch("w", 6, 3), idempotency_key="k6") == 7
    assert opened.append(batch("w", 6, 3), idempotency_key="k6") == 7

    fragments = lance.fragment.write_fragments(
        batch("f", 0, 2), opened.data_uri, storage_options=table.options
    )
    first = lancetx.commit_fragments(
        table.uri, fragments, schema=opened.schema, storage_options=table.options,
        idempotency_key="frag-1",
    )  # fmt: skip
    again = lancetx.commit_fragments(
        table.uri, fragments, schema=opened.schema, storage_options=table.options,
        idempotency_key="frag-1",
    )  # fmt: skip
    assert (first.version, first.deduplicated) == (8, False)
    assert (again.version, again.deduplicated) == (8, True)

    job = _job(table, "job-1")
    output = write_task(iter(batch("spark", 0, 4).to_batches()), job.plan)
    committed = commit_job(job, [output])
    assert (committed.version, committed.deduplicated) == (9, False)
    assert commit_job(job, [output]).deduplicated
    assert last_commit(table.uri, "job-1", table.options) == 9
    assert [r.version for r in table_history(table.uri, table.options)] == [5, 6, 7, 8, 9]

    report = verify_table(open_table(table.uri, table.options), deep=True, all_versions=True)
    assert report.ok, report.findings
    assert sorted(f.version for f in report.findings if f.kind == "cleaned_up_version") == [
        1, 2, 3, 4,
    ]  # fmt: skip


def _tagged_table(aws: EmbeddedAws, bucket: str, ddb_table: str) -> DdbTable:
    """Versions 1..6, version 2 tagged ``gold`` by pylance."""
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table)
    uri = ddb_uri(bucket, "t.lance", ddb_table)
    table = lancetx.write_table(uri, batch("w", 0, 3), storage_options=options)
    for n in range(1, 6):
        table.append(batch("w", n, 3))
    lance.dataset(uri, storage_options=options).tags.create("gold", 2)
    return DdbTable(aws, bucket, ddb_table, "t.lance", uri, options)


def test_a_tagged_version_is_kept_and_the_removed_ones_above_it_are_not_missing(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = _tagged_table(legacy_aws, bucket, ddb_table_name)
    tag = table.s3.get_object(Bucket=bucket, Key=f"{table.path}/_refs/tags/gold.json")
    assert b'"version": 2' in tag["Body"].read()  # pylance's tag file, as lancetx reads it

    ops = open_table(table.uri, table.options)
    done = cleanup_versions(ops, keep_versions=2)
    assert done.removed_versions == [1, 3, 4] and done.tagged_versions == [2]

    verified = run_cli(legacy_aws, "verify", table.uri, "--json")
    assert verified.code == 0, verified.stdout
    kinds = {(f["kind"], f["version"]) for f in verified.json["findings"]}
    assert kinds == {("cleaned_up_version", v) for v in (1, 3, 4)}
    repaired = run_cli(legacy_aws, "repair", table.uri, "--version", "3")
    assert repaired.code == 0, repaired.stdout + repaired.stderr
    assert collect_garbage(ops, older_than=timedelta(days=7)).ok
    assert cleanup_versions(ops, keep_versions=2).removed_versions == []

    opened = lancetx.open(table.uri, table.options)
    assert [v.version for v in opened.history()] == [2, 5, 6]
    assert lance.dataset(table.uri, version=2, storage_options=table.options).count_rows() == 6


def test_once_the_fences_are_deleted_the_gap_below_the_oldest_kept_version_is_no_finding(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = _tagged_table(legacy_aws, bucket, ddb_table_name)
    ops = open_table(table.uri, table.options)
    report = cleanup_versions(ops, keep_versions=2, items_older_than=timedelta(0))
    # Only the item below the oldest kept version goes: those of 3 and 4, above the
    # tagged 2, are the record that they were removed (once the tag is gone, nothing
    # else tells them from lost versions).
    assert report.removed_versions == [1, 3, 4] and report.items_deleted == [1]
    assert report.items_kept_as_fence == [3, 4]
    assert [int(i["version"]["N"]) for i in table.items()] == [2, 3, 4, 5, 6]

    verified = verify_table(ops)
    assert verified.ok, verified.findings
    age_objects(bucket, table.objects(), timedelta(days=8))
    assert collect_garbage(ops, older_than=timedelta(days=7)).ok
    assert cleanup_versions(ops, keep_versions=2).removed_versions == []
    opened = lancetx.open(table.uri, table.options)
    assert [v.version for v in opened.history()] == [2, 5, 6]
    assert opened.append(pa.table(batch("w", 9, 1))) == 7
    lance.dataset(table.uri, storage_options=table.options).tags.delete("gold")
    assert verify_table(ops).ok
    report = cleanup_versions(ops, keep_versions=2, items_older_than=timedelta(0))
    assert report.ok and report.removed_versions == [2, 5]
    assert report.items_deleted == [2, 3, 4, 5]
    assert [int(i["version"]["N"]) for i in table.items()] == [6, 7]
    assert verify_table(ops).ok


def test_versions_pylances_own_cleanup_removed_are_skipped_too(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """pylance's ``cleanup_old_versions`` deletes manifests and leaves the items."""
    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=3)  # versions 1..4
    ds = lance.dataset(table.uri, storage_options=table.options)
    ds.cleanup_old_versions(older_than=timedelta(0))
    assert [int(i["version"]["N"]) for i in table.items()] == [1, 2, 3, 4]
    opened = lancetx.open(table.uri, table.options)
    assert [v.version for v in opened.history()] == [4]
    assert opened.find_idempotency_key("k3") == 4
    assert opened.find_idempotency_key("k1") == 2  # by its key item: the version is gone
    report = verify_table(open_table(table.uri, table.options))
    assert report.ok, report.findings


def test_versions_pylances_cleanup_removed_above_a_tagged_version_are_removed_not_dangling(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Versions 1..6, 2 tagged; pylance's cleanup removes 1 and 3..5 and leaves their
    items unmarked. Version 4 lies above a kept (tagged) version, yet below the oldest
    untagged one kept: a cleanup removed it. Opening it and a view of it read after
    the cleanup say it was removed (opening said its item dangles, "restore the
    manifest from a backup"; the view gave pylance's own "not found"). A manifest
    deleted by hand above that horizon still dangles."""
    from protocol_helpers import lancetx_append, load_parent

    from lancetx.commit.errors import VersionNotFoundError
    from lancetx.externalstore.connect import connect
    from lancetx.externalstore.errors import DanglingEntryError

    table = _tagged_table(legacy_aws, bucket, ddb_table_name)
    view = lancetx.open(table.uri, table.options, version=4)
    conn = connect(table.uri, table.options)
    parent = load_parent(conn.handler, conn.base, 4)
    ds = lance.dataset(table.uri, storage_options=table.options)
    ds.cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)
    kept = lance.dataset(table.uri, storage_options=table.options).versions()
    assert [v["version"] for v in kept] == [2, 6]

    with pytest.raises(VersionNotFoundError) as opened:
        lancetx.open(table.uri, table.options, version=4)
    assert opened.value.version == 4 and "restore the manifest" not in str(opened.value)
    with pytest.raises(VersionNotFoundError, match=r"cleanup removed it"):
        view.to_table()
    # A writer whose parent it was checks its commit against 5 and 6 by their items'
    # summaries (lancetx wrote them) and lands.
    landed = lancetx_append(
        conn.handler, conn.base, conn.data_uri, table.options, batch("late", 0, 3), parent
    )
    assert landed.version == 7
    assert [v.version for v in lancetx.open(table.uri, table.options).history()] == [2, 6, 7]

    lancetx.open(table.uri, table.options).append(batch("w", 6, 3))  # version 8
    (seven,) = [i["path"]["S"] for i in table.items() if i["version"]["N"] == "7"]
    table.s3.delete_object(Bucket=bucket, Key=seven)  # by hand, above the horizon (6)
    with pytest.raises(DanglingEntryError, match=r"version 7"):
        lancetx.open(table.uri, table.options, version=7)

    # A tag that cannot be read counts none: version 4 is then called dangling, never
    # the other way round (a missing manifest is not taken for a cleanup's).
    table.s3.put_object(Bucket=bucket, Key=f"{table.path}/_refs/tags/gold.json", Body=b"{")
    with pytest.raises(DanglingEntryError, match=r"version 4"):
        lancetx.open(table.uri, table.options, version=4)


def test_a_writer_whose_parent_a_cleanup_removed_is_told_to_plan_again_not_that_items_dangle(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A writer planned at version 2; pylance commits land, and a cleanup (no age floor)
    removes versions 1..4, keeping their items as fences. The writer cannot check its
    commit against 3 and 4 (pylance's items carry no summary to settle them by): it
    stops with "gone (cleaned up?) ... plan again", nothing committed. (It was told the
    item of version 3 dangles, which sends operators to repair a healthy table.) Had
    lancetx written 3 and 4, their summaries would settle them and the commit land."""
    from protocol_helpers import lancetx_append, load_parent

    from lancetx.commit.errors import InvalidCommitError
    from lancetx.externalstore.connect import connect

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=1)  # versions 1, 2
    conn = connect(table.uri, table.options)
    parent = load_parent(conn.handler, conn.base)
    assert parent.version == 2
    for n in range(4):  # versions 3..6, by pylance: items without lancetx's summary
        lance.write_dataset(
            batch("later", n, 3), table.uri, mode="append", storage_options=table.options
        )
    report = cleanup_versions(open_table(table.uri, table.options), keep_versions=2)
    assert report.removed_versions == [1, 2, 3, 4]

    try:
        lancetx_append(
            conn.handler, conn.base, conn.data_uri, table.options, batch("late", 0, 3), parent
        )
    except InvalidCommitError as exc:
        assert "cleaned up?" in str(exc) and "plan the transaction again" in str(exc)
    else:
        raise AssertionError("a commit landed unchecked against versions a cleanup removed")
    assert [v.version for v in lancetx.open(table.uri, table.options).history()] == [5, 6]
    assert lance.dataset(table.uri, storage_options=table.options).version == 6


def _clean_away_the_latest_when_first_read(
    table: DdbTable, monkeypatch: pytest.MonkeyPatch, handler_class: type[Any], target: int
) -> list[int]:
    """Patch ``handler_class.read_manifest`` so that the first read of version ``target``
    happens after pylance commits a newer version and a cleanup (no age floor) removes
    ``target``: the latest a reader resolved is gone by the time it reads it. Returns the
    versions each patched read asked for."""
    original = handler_class.read_manifest
    asked: list[int] = []
    state = {"fired": False}

    def interleave() -> None:
        state["fired"] = True
        lance.write_dataset(
            batch("later", 0, 3), table.uri, mode="append", storage_options=table.options
        )
        report = cleanup_versions(open_table(table.uri, table.options), keep_versions=1)
        assert target in report.removed_versions

    if inspect.iscoroutinefunction(original):

        async def read_async(self: Any, base: str, location: Any, **kwargs: Any) -> Any:
            asked.append(location.version)
            if location.version == target and not state["fired"]:
                await asyncio.to_thread(interleave)
            return await original(self, base, location, **kwargs)

        monkeypatch.setattr(handler_class, "read_manifest", read_async)
    else:

        def read(self: Any, base: str, location: Any, **kwargs: Any) -> Any:
            if not state["fired"]:
                asked.append(location.version)
                if location.version == target:
                    interleave()
            return original(self, base, location, **kwargs)

        monkeypatch.setattr(handler_class, "read_manifest", read)
    return asked


def test_opening_a_table_whose_latest_a_commit_and_cleanup_remove_meanwhile_loads_the_newer(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between resolving the latest version (2) and reading its manifest, pylance
    commits 3 and a cleanup without an age floor removes 2. Opening the table loads 3
    (it stopped with "object not found" for version 2's manifest: a reader, and every
    writer planning on the latest, failed for a race it can settle by reading again)."""
    from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=1)  # versions 1, 2
    asked = _clean_away_the_latest_when_first_read(
        table, monkeypatch, ExternalStoreCommitHandler, target=2
    )
    opened = lancetx.open(table.uri, table.options)
    assert opened.version == 3 and asked[0] == 2
    assert opened.to_table().num_rows == 9
    assert opened.append(batch("after", 0, 3)) == 4
    assert lance.dataset(table.uri, storage_options=table.options).count_rows() == 12


def test_the_asyncio_handler_loads_the_newer_latest_too(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race through the asyncio handler (the steps are shared; the randomized
    histories met it through an asyncio writer planning on the latest version)."""
    from lancetx.commit.engine.parents import load_parent_async
    from lancetx.externalstore.commit_handler import AsyncExternalStoreCommitHandler
    from lancetx.externalstore.connect import connect, open_async_handler
    from lancetx.externalstore.dynamodb.uri import parse_ddb_uri

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=1)
    asked = _clean_away_the_latest_when_first_read(
        table, monkeypatch, AsyncExternalStoreCommitHandler, target=2
    )

    async def scenario() -> int:
        async with open_async_handler(connect(table.uri, table.options)) as handler:
            assert handler is not None
            parent = await load_parent_async(handler, parse_ddb_uri(table.uri).base_key)
            assert parent is not None
            return parent.version

    assert asyncio.run(scenario()) == 3
    assert asked == [2, 3]


def test_a_version_asked_for_by_number_and_cleaned_up_is_not_replaced_by_a_newer_one(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Time travel to a removed version is an error naming it, never the latest."""
    from lancetx.commit.errors import LancetxError

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    cleanup_versions(open_table(table.uri, table.options), keep_versions=1)
    with pytest.raises(LancetxError) as caught:
        lancetx.open(table.uri, table.options, version=2)
    assert "2" in str(caught.value)


def _commit_and_clean_up(table: DdbTable, mode: str) -> None:
    """pylance commits (``mode``), then a cleanup without an age floor keeps only it."""
    lance.write_dataset(batch("later", 0, 3), table.uri, mode=mode, storage_options=table.options)
    cleanup_versions(open_table(table.uri, table.options), keep_versions=1)


def test_reading_a_checked_out_version_a_cleanup_removed_meanwhile_is_an_error_naming_it(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A read-only view of version 2 is taken; then a commit lands and a cleanup removes
    2. Its reads fail naming version 2 and what to do (they failed with pylance's
    ValueError "Dataset at path t.lance/_versions/2.manifest was not found"), and never
    read another version."""
    from lancetx.commit.errors import VersionNotFoundError

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    view = lancetx.open(table.uri, table.options, version=2)
    _commit_and_clean_up(table, "append")
    for read in (view.to_table, view.count_rows, lambda: view.dataset):
        with pytest.raises(VersionNotFoundError, match=r"cleanup removed it") as caught:
            read()
        assert caught.value.version == 2 and "check out a version" in str(caught.value)
        assert "the table has versions 4" in str(caught.value)


def test_a_table_reading_a_version_an_overwrite_and_cleanup_removed_says_to_refresh(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A Table reads the version it knows (3) until refreshed. pylance overwrites the
    table and a cleanup removes 3 with its data files: the read fails naming version 3
    and saying to refresh (it failed with pyarrow's ArrowInvalid "Not found:
    t.lance/data/….lance"); refreshed, it reads version 4."""
    from lancetx.commit.errors import VersionNotFoundError

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    opened = lancetx.open(table.uri, table.options)
    _commit_and_clean_up(table, "overwrite")
    with pytest.raises(VersionNotFoundError, match=r"cleanup removed it") as caught:
        opened.to_table()
    assert caught.value.version == 3 and "refresh()" in str(caught.value)
    assert opened.version == 3  # not moved behind the caller's back
    assert opened.refresh().to_table().num_rows == 3 and opened.version == 4


def test_a_scanner_read_after_an_overwrite_and_cleanup_removed_its_version_says_to_refresh(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Scanners are made on version 3 and read later, as a long job does. Meanwhile
    pylance overwrites the table and a cleanup removes 3 with its data files: every read
    of a scanner — whole, counted, batch by batch, through a reader — fails naming
    version 3 and saying to refresh (each failed with pylance's own "Not found:
    t.lance/data/…"). Refreshed, the scanner reads version 4 each way."""
    from lancetx.commit.errors import VersionNotFoundError

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    opened = lancetx.open(table.uri, table.options)
    scanners = [opened.scanner(filter="writer != 'x'") for _ in range(4)]
    assert isinstance(scanners[0], lancetx.Scanner)
    assert "LanceRead" in scanners[0].explain_plan()  # planning reads no data file
    _commit_and_clean_up(table, "overwrite")
    reads = (
        lambda s: s.to_table().num_rows,
        lambda s: s.count_rows(),
        lambda s: sum(b.num_rows for b in s.to_batches()),
        lambda s: s.to_reader().read_all().num_rows,
    )
    for scanner, read in zip(scanners, reads, strict=True):
        with pytest.raises(VersionNotFoundError, match=r"cleanup removed it") as caught:
            read(scanner)
        assert caught.value.version == 3 and "refresh()" in str(caught.value)
    opened.refresh()
    assert [read(opened.scanner(filter="writer != 'x'")) for read in reads] == [3] * 4


def test_a_scanner_whose_version_was_removed_says_to_make_a_new_one_refreshed_or_not(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """The operator does as told, refresh(), and reads the scanner again: it reads the
    version it was made at, so it fails again. The error says to make a new scanner (it
    said only "refresh() the Table"); a view's scanners, to check out a version that is
    still there and make a scanner of it."""
    from lancetx.commit.errors import VersionNotFoundError

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    opened = lancetx.open(table.uri, table.options)
    scanner = opened.scanner()
    views = [opened.checkout(2), lancetx.open(table.uri, table.options, version=2)]
    pinned = [view.scanner() for view in views]
    _commit_and_clean_up(table, "overwrite")
    assert opened.refresh().version == 4
    for read in (lambda: scanner.to_table(), lambda: list(scanner.to_batches())):
        with pytest.raises(VersionNotFoundError, match=r"cleanup removed it") as caught:
            read()
        assert caught.value.version == 3 and "make a new scanner" in str(caught.value)
    for view_scanner in pinned:
        with pytest.raises(VersionNotFoundError, match=r"cleanup removed it") as caught:
            view_scanner.to_reader().read_all()
        assert caught.value.version == 2
        assert "check out a version that is still there and make a scanner of it" in str(
            caught.value
        )
    assert opened.scanner().count_rows() == 3


def _clean_up_at_the_second_data_get(aws: EmbeddedAws, table: DdbTable) -> list[str]:
    """An interceptor: once a GET of a data file was let through, the next one waits
    until pylance overwrote the table and a cleanup removed everything else (the
    cleanup's own requests let through): it then finds its file gone."""
    data_gets: list[str] = []

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service != "s3" or request.method != "GET" or "/data/" not in request.path:
            return None
        data_gets.append(request.path)
        if len(data_gets) == 2:
            _commit_and_clean_up(table, "overwrite")
        return None

    aws.set_interceptor(interceptor)
    return data_gets


@pytest.mark.parametrize("stream", ["to_batches", "to_reader"])
def test_a_batch_stream_whose_version_a_cleanup_removes_midway_fails_naming_it(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, stream: str
) -> None:
    """A scanner of version 3 streams its batches; between two of its GETs of data files
    pylance overwrites the table and a cleanup removes 3 with its data files. The stream
    fails naming version 3, however far the caller got."""
    from lancetx.commit.errors import VersionNotFoundError

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    opened = lancetx.open(table.uri, table.options)
    scanner = opened.scanner(batch_size=1)
    data_gets = _clean_up_at_the_second_data_get(legacy_aws, table)
    rows = 0
    try:
        with pytest.raises(VersionNotFoundError, match=r"cleanup removed it") as caught:
            batches = scanner.to_batches() if stream == "to_batches" else scanner.to_reader()
            for b in batches:
                rows += b.num_rows
    finally:
        legacy_aws.set_interceptor(None)
    assert caught.value.version == 3 and "refresh()" in str(caught.value)
    assert len(data_gets) >= 2 and rows < 9
    assert opened.refresh().scanner().count_rows() == 3


def test_status_whose_latest_a_commit_and_cleanup_remove_meanwhile_reports_the_newer(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lancetx-sync status`` lists the items (latest: 3); before it reads version 3's
    manifest, pylance commits 4 and a cleanup removes 3. It reports 4 and no note (it
    reported 3 with "the manifest of version 3 cannot be read: … verify explains why",
    a healthy table sent to verify)."""
    from lancetx.ops.status import table_status
    from lancetx.ops.table import OpsTable

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    original = OpsTable.read_manifest_or_none
    asked: list[str] = []

    def read(self: OpsTable, key: str) -> Any:
        if not asked:
            _commit_and_clean_up(table, "append")
        asked.append(key)
        return original(self, key)

    monkeypatch.setattr(OpsTable, "read_manifest_or_none", read)
    report = table_status(open_table(table.uri, table.options))
    assert (report.latest_version, report.notes) == (4, []), report.notes
    assert report.last_operation == "append"
    assert len(asked) == 2 and asked[0] != asked[1]
    # A latest whose manifest is gone and that no newer version replaced is reported.
    monkeypatch.undo()
    table.s3.delete_object(Bucket=bucket, Key=f"{table.path}/_versions/{2**64 - 1 - 4}.manifest")
    broken = table_status(open_table(table.uri, table.options))
    assert broken.latest_version == 4
    assert [n.split(":")[0] for n in broken.notes] == ["the manifest of version 4 cannot be read"]


def _compact_and_clean_up(table: DdbTable, removes: int) -> None:
    """pylance appends and compacts, then a cleanup without an age floor keeps only
    the compacted version: version ``removes`` and the files it read are gone."""
    lance.write_dataset(
        batch("later", 0, 3), table.uri, mode="append", storage_options=table.options
    )
    lance.dataset(table.uri, storage_options=table.options).optimize.compact_files()
    report = cleanup_versions(open_table(table.uri, table.options), keep_versions=1)
    assert removes in report.removed_versions


def test_a_verb_planned_on_a_version_a_compaction_and_cleanup_removed_plans_again_or_says_so(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A Table knows version 3; pylance compacts and a cleanup removes 3 with its data
    files. A delete (a verb that plans again after a retryable conflict) plans again on
    the latest and lands, also through lancetx.aio; add_columns (which does not) fails
    naming version 3 and saying to refresh. Before: the delete failed with
    InvalidPredicateError "cannot use predicate 'i = 0': … Not found: t.lance/data/…;
    write it in Lance's SQL dialect", add_columns with pylance's raw OSError."""
    import lancetx.aio
    from lancetx.commit.errors import VersionNotFoundError

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    opened = lancetx.open(table.uri, table.options)
    _compact_and_clean_up(table, removes=3)
    latest = lance.dataset(table.uri, storage_options=table.options).version
    assert opened.delete("i = 0") == latest + 1
    assert opened.last_commit is not None and opened.last_commit.plans == 2
    assert lance.dataset(table.uri, storage_options=table.options).count_rows() == 8

    stale = lancetx.open(table.uri, table.options)
    _compact_and_clean_up(table, removes=latest + 1)  # the delete's version
    with pytest.raises(VersionNotFoundError, match=r"cleanup removed it") as caught:
        stale.add_columns({"twice": "i * 2"})
    assert caught.value.version == latest + 1 and "refresh()" in str(caught.value)

    async def delete_through_aio() -> int:
        table_async = await lancetx.aio.open(table.uri, table.options)
        await asyncio.to_thread(_compact_and_clean_up, table, table_async.version)
        return await table_async.delete("i = 1")

    assert asyncio.run(delete_through_aio()) > latest + 2
    remaining = lance.dataset(table.uri, storage_options=table.options)
    assert (remaining.count_rows(), remaining.count_rows("i = 1")) == (8, 0)


def test_history_of_a_table_whose_versions_a_commit_and_cleanup_remove_meanwhile_is_the_newer(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lancetx.history(uri)`` resolves the latest (3) and lists versions 1..3; before it
    reads them, pylance commits 4 and a cleanup removes 1..3. It returns version 4's
    history (it returned [], the history of a table that has a version)."""
    from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler

    table = _keyed_table(legacy_aws, bucket, ddb_table_name, appends=2)  # versions 1..3
    original = ExternalStoreCommitHandler.list_versions
    listed: list[int] = []

    def listing(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(self, *args, **kwargs)
        if not listed:
            _commit_and_clean_up(table, "append")
        listed.append(max(loc.version for loc in found))
        return found

    monkeypatch.setattr(ExternalStoreCommitHandler, "list_versions", listing)
    assert [v.version for v in lancetx.history(table.uri, table.options)] == [4]
    assert listed == [3, 4]
