"""``spark.readStream.format("lancetx")``: each new version's appended rows, once.

Every stream here copies a source table into a second lancetx table through the
``lancetx`` sink with ``Trigger.AvailableNow`` (the query reads up to the version
that was latest when it started, in as many micro-batches as the rate limits make,
and stops: no timing is involved). The source is written with lancetx verbs on the
embedded server; the copy is read back with pylance.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from spark_helpers import (
    STREAM_ATTEMPTS,
    WORKER_DID_NOT_CONNECT,
    lance_ids,
    run_stream,
    spark_options,
)

import lancetx
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table


@pytest.fixture
def uris(ddb_uri: str) -> tuple[str, str]:
    """A source and a copy table (same bucket and DynamoDB table, two paths)."""
    return ddb_uri, ddb_uri.replace("/t.lance?", "/copy.lance?")


def rows(start: int, stop: int) -> pa.Table:
    ids = range(start, stop)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"x{i}" for i in ids]})


def copy(
    spark: Any,
    source: str,
    target: str,
    checkpoint: Path,
    storage: dict[str, str],
    **options: str,
) -> list[int]:
    """Run the copy until it has read everything there was when it started; the
    rows of each micro-batch that read any."""
    opts = spark_options(storage)

    def start() -> Any:
        frame = spark.readStream.format("lancetx").options(**opts).options(**options).load(source)
        return (
            frame.writeStream.format("lancetx")
            .options(**opts)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(target)
        )

    query = run_stream(start)
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def failure(
    spark: Any,
    source: str,
    target: str,
    checkpoint: Path,
    storage: dict[str, str],
    **options: str,
) -> str:
    """The text of the error that stopped the copy (it must stop with one)."""
    with pytest.raises(Exception) as caught:
        copy(spark, source, target, checkpoint, storage, **options)
    return str(caught.value)


def test_each_version_appended_rows_once_and_row_preserving_versions_pass(
    spark: Any, uris: tuple[str, str], storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = uris
    table = lancetx.write_table(source, rows(0, 10), storage_options=storage)
    table.append(rows(10, 20), max_rows_per_file=4)  # fragments of 4, 4 and 2 rows

    # No starting option: the table as it is, in batches of whole fragments.
    batches = copy(spark, source, target, tmp_path / "ck", storage, maxRowsPerTrigger="12")
    assert batches == [10, 10]  # [10] (10 + 4 > 12), then [4, 4, 2]
    assert lance_ids(target, storage) == list(range(20))

    table.compact()  # the same rows in new fragments: not delivered again
    table.create_index("id", "BTREE")
    table.update_config({"owner": "me"})
    table.delete("id < 0")  # matches nothing
    table.merge_insert("id").when_not_matched_insert_all().execute(rows(20, 25))
    table.append(rows(30, 40))
    assert copy(spark, source, target, tmp_path / "ck", storage) == [15]
    assert lance_ids(target, storage) == [*range(25), *range(30, 40)]


def test_a_delete_fails_the_stream_naming_the_option_which_then_skips_it(
    spark: Any, uris: tuple[str, str], storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = uris
    checkpoint = tmp_path / "ck"
    table = lancetx.write_table(source, rows(0, 10), storage_options=storage)  # 1
    table.append(rows(10, 20))  # 2
    table.delete("id < 5")  # 3
    table.append(rows(20, 30))  # 4

    text = failure(spark, source, target, checkpoint, storage, startingVersion="1")
    assert "StreamChangeCommitError" in text
    assert "version 3 of" in text and "is a Delete" in text
    assert "skipChangeCommits=true" in text and "ignoreDeletes=true" in text
    assert lance_ids(target, storage) == list(range(20))  # the versions before it

    copy(spark, source, target, checkpoint, storage, skipChangeCommits="true")
    assert lance_ids(target, storage) == list(range(30))  # 3 skipped, 4 delivered

    # ignoreDeletes passes a delete, not an update.
    table.delete("id = 25")  # 5
    table.update({"v": "'changed'"}, "id = 26")  # 6
    table.append(rows(40, 45))  # 7
    text = failure(spark, source, target, checkpoint, storage, ignoreDeletes="true")
    assert "version 6 of" in text and "is a Update" in text
    assert "skipChangeCommits=true" in text and "ignoreDeletes" not in text
    copy(spark, source, target, checkpoint, storage, skipChangeCommits="true")
    assert lance_ids(target, storage) == [*range(30), *range(40, 45)]


def test_starting_version_and_latest(
    spark: Any, uris: tuple[str, str], storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = uris
    table = lancetx.write_table(source, rows(0, 10), storage_options=storage)
    for n in (1, 2, 3):
        table.append(rows(10 * n, 10 * n + 10))  # versions 2..4

    copy(spark, source, target, tmp_path / "from3", storage, starting_version="3")
    assert lance_ids(target, storage) == list(range(20, 40))

    text = failure(spark, source, target, tmp_path / "from9", storage, startingVersion="9")
    assert "latest version is 4" in text

    later = target.replace("/copy.lance?", "/later.lance?")
    assert copy(spark, source, later, tmp_path / "latest", storage, startingVersion="latest") == []
    table.append(rows(100, 105))
    assert copy(spark, source, later, tmp_path / "latest", storage, startingVersion="latest") == [5]
    assert lance_ids(later, storage) == list(range(100, 105))


def test_starting_timestamp(
    spark: Any, uris: tuple[str, str], storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = uris
    table = lancetx.write_table(source, rows(0, 10), storage_options=storage)
    for n in (1, 2, 3):
        table.append(rows(10 * n, 10 * n + 10))  # versions 2..4
    third = table.history()[2]
    assert third.version == 3 and third.timestamp is not None
    # Truncated to microseconds: at or before version 3's commit, after version 2's.
    when = third.timestamp.replace(tzinfo=None).isoformat() + "Z"

    copy(spark, source, target, tmp_path / "ck", storage, startingTimestamp=when)
    assert lance_ids(target, storage) == list(range(20, 40))

    future = (third.timestamp + datetime.timedelta(days=1)).isoformat()
    text = failure(spark, source, target, tmp_path / "future", storage, startingTimestamp=future)
    assert "startingTimestamp" in text and "startingVersion=latest" in text


def test_rate_limits_split_versions_and_fragments(
    spark: Any, uris: tuple[str, str], storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = uris
    table = lancetx.write_table(source, rows(0, 10), storage_options=storage)
    for n in (1, 2, 3, 4):
        table.append(rows(10 * n, 10 * n + 10))  # versions 2..5: one fragment each
    table.append(rows(50, 80), max_rows_per_file=10)  # version 6: three fragments

    by_versions = copy(
        spark,
        source,
        target,
        tmp_path / "v",
        storage,
        startingVersion="1",
        maxVersionsPerTrigger="2",
    )
    assert by_versions == [20, 20, 40]
    assert lance_ids(target, storage) == list(range(80))

    other = target.replace("/copy.lance?", "/rows.lance?")
    by_rows = copy(
        spark, source, other, tmp_path / "r", storage, startingVersion="1", maxRowsPerTrigger="25"
    )
    assert by_rows == [20, 20, 20, 20]  # version 6 split between two batches
    assert lance_ids(other, storage) == list(range(80))


def test_versions_a_cleanup_removed_before_the_stream_read_them(
    spark: Any, uris: tuple[str, str], storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = uris
    table = lancetx.write_table(source, rows(0, 10), storage_options=storage)
    copy(spark, source, target, tmp_path / "ck", storage, startingVersion="1")
    for n in (1, 2, 3, 4):
        table.append(rows(10 * n, 10 * n + 10))  # versions 2..5
    cleanup_versions(open_table(source, storage), keep_versions=2)  # removes 1..3

    text = failure(spark, source, target, tmp_path / "ck", storage, startingVersion="1")
    assert "VersionsRemovedError" in text and "version(s) 2-3" in text
    assert "startingVersion=4" in text and "new checkpointLocation" in text
    assert lance_ids(target, storage) == list(range(10))


def test_columns_added_later_read_as_null_and_a_dropped_one_stops_the_stream(
    spark: Any, uris: tuple[str, str], storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = uris
    table = lancetx.write_table(source, rows(0, 3), storage_options=storage)  # 1
    table.add_columns({"w": "id * 2"})  # 2: rewrites every fragment
    more = rows(10, 12).append_column("w", pa.array([20, 22], pa.int64()))
    table.append(more)  # 3

    copy(
        spark,
        source,
        target,
        tmp_path / "ck",
        storage,
        startingVersion="1",
        skipChangeCommits="true",
    )
    copied = lancetx.open(target, storage).to_table().sort_by("id").to_pydict()
    assert copied["id"] == [0, 1, 2, 10, 11] and copied["w"] == [None, None, None, 20, 22]

    # A running query took the schema with ``w``; a restarted one would take it anew.
    opts = spark_options(storage)
    for attempt in range(1, STREAM_ATTEMPTS + 1):
        query = (
            spark.readStream.format("lancetx")
            .options(**opts)
            .option("skipChangeCommits", "true")
            .load(source)
            .writeStream.format("lancetx")
            .options(**opts)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start(target)
        )
        try:
            query.processAllAvailable()  # nothing new: it is where the first run stopped
            break
        except Exception as exc:  # see run_stream
            query.stop()
            if WORKER_DID_NOT_CONNECT not in str(exc) or attempt == STREAM_ATTEMPTS:
                raise
    try:
        table.drop_columns(["w"])  # 4
        table.append(rows(20, 22))  # 5
        with pytest.raises(Exception) as caught:
            query.awaitTermination(600)
    finally:
        query.stop()
    text = str(caught.value)
    assert "StreamSchemaChangedError" in text and "version 4 of" in text and "'w'" in text
    assert "Restart the query" in text


def test_stream_options_are_checked(
    spark: Any, uris: tuple[str, str], storage: dict[str, str]
) -> None:
    source, _ = uris
    lancetx.write_table(source, rows(0, 3), storage_options=storage)
    opts = spark_options(storage)

    def load_stream(**options: str) -> None:
        spark.readStream.format("lancetx").options(**opts).options(**options).load(source)

    with pytest.raises(Exception, match=r"'startingversoin'.*did you mean starting_version\?"):
        load_stream(startingVersoin="1")
    with pytest.raises(Exception, match=r"either starting_version or starting_timestamp"):
        load_stream(startingVersion="1", startingTimestamp="2026-01-01")
    with pytest.raises(Exception, match=r"'starting_version'='-1'.*a version"):
        load_stream(startingVersion="-1")
    with pytest.raises(Exception, match=r"'max_rows_per_trigger'='0'.*a positive integer"):
        load_stream(maxRowsPerTrigger="0")
    with pytest.raises(Exception, match=r"it is a streaming read option; did you mean version\?"):
        spark.read.format("lancetx").options(**opts).option("startingVersion", "1").load(
            source
        ).collect()


def test_a_version_a_cleanup_removes_after_its_micro_batch_was_planned_fails_the_read_naming_it(
    uris: tuple[str, str], storage: dict[str, str]
) -> None:
    """A micro-batch is planned on version 2's appended fragment; then a commit lands
    and a cleanup without an age floor removes version 2. Reading the partition (an
    executor's task: pylance only) fails with VersionsRemovedError naming version 2
    and what to do (it failed with pylance's ValueError "Dataset at path
    t.lance/_versions/2.manifest was not found"). No Spark session: the reader's
    methods run as Spark would call them."""
    from lancetx.errors import VersionsRemovedError
    from pyspark_lancetx.datasource import LanceTxDataSource

    source = uris[0]
    table = lancetx.write_table(source, rows(0, 5), storage_options=storage)
    table.append(rows(5, 10))
    reader = LanceTxDataSource({"path": source, **spark_options(storage)}).streamReader(
        LanceTxDataSource({"path": source, **spark_options(storage)}).schema()
    )
    start = reader.initialOffset()
    (partition,) = reader.partitions(start, reader.latestOffset(start, None))
    assert [v for v, _, _ in partition.pieces] == [2]  # the first batch: a snapshot of 2
    table.append(rows(10, 15))
    assert cleanup_versions(open_table(source, storage), keep_versions=1).removed_versions == [1, 2]
    with pytest.raises(VersionsRemovedError, match=r"after this micro-batch was planned") as info:
        list(reader.read(partition))
    assert info.value.versions == [2] and "new query" in str(info.value)


def test_a_snapshot_a_cleanup_removed_before_its_batch_was_planned_again_fails_naming_it(
    uris: tuple[str, str], storage: dict[str, str]
) -> None:
    """The first micro-batch ends at version 2 (its snapshot), and the source worker
    restarts before planning its partitions; meanwhile a commit lands and a cleanup
    without an age floor removes 2. Planning the batch again fails with
    VersionsRemovedError naming version 2 and how to go on (it was VersionNotFoundError
    "version 2 … does not exist (a cleanup removed it; the table has versions 3)", no
    word of the stream). The latest the batch resolved is read from the manifest in
    hand, so a cleanup between resolving and planning does not fail it there."""
    from lancetx.errors import VersionsRemovedError
    from pyspark_lancetx.datasource import LanceTxDataSource

    source = uris[0]
    table = lancetx.write_table(source, rows(0, 5), storage_options=storage)
    table.append(rows(5, 10))
    options = {"path": source, **spark_options(storage)}
    reader = LanceTxDataSource(options).streamReader(LanceTxDataSource(options).schema())
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert end == {"version": 2}
    table.append(rows(10, 15))
    cleanup_versions(open_table(source, storage), keep_versions=1)
    assert len(reader.partitions(start, end)) == 1  # planned from what it holds
    restarted = LanceTxDataSource(options).streamReader(LanceTxDataSource(options).schema())
    with pytest.raises(VersionsRemovedError, match=r"new query") as info:
        restarted.partitions(start, end)
    assert info.value.versions == [2]


def test_a_read_whose_version_cannot_be_probed_keeps_its_own_error(
    uris: tuple[str, str], storage: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition's read fails and probing its version fails too, for another reason
    than "not found" (the store unreachable): the read's own error stands. It is not
    called a removed version (whose message says the rows are lost to the stream and
    to start a new query): a network error is no reason to abandon a checkpoint."""
    import lance

    from pyspark_lancetx.datasource import LanceTxDataSource

    source = uris[0]
    lancetx.write_table(source, rows(0, 5), storage_options=storage)
    options = {"path": source, **spark_options(storage)}
    reader = LanceTxDataSource(options).streamReader(LanceTxDataSource(options).schema())
    failed = OSError("LanceError(IO): connection reset by peer")

    def unreachable(*args: object, **kwargs: object) -> None:
        raise OSError("LanceError(IO): error sending request: connection refused")

    monkeypatch.setattr(lance, "dataset", unreachable)
    assert reader._read_failure(1, failed) is failed
