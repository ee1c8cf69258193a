"""Batch reads through Spark: partitions sized by rows and bytes (small fragments packed,
large ones split by row ranges), every row exactly once with deletions, pushed filters,
time travel and stable row ids; column pruning through a given schema or ``columns``;
and the read's version pinned against writers and cleanups beside it."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.functions import spark_partition_id
from spark_helpers import lance_ids, spark_options

from lancetx.commit.errors import VersionNotFoundError
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def _pylance_table(uri: str, stable: bool) -> int:
    """1,000 rows in fragments of 400/400/200 plus 12 small appended fragments; rows
    deleted and moved (an update) in later versions. Returns the version to read; the
    versions after it delete and append more."""
    rows = pa.table({"id": np.arange(1_000), "x": np.arange(1_000) * 1.0})
    lance.write_dataset(rows, uri, max_rows_per_file=400, enable_stable_row_ids=stable)
    for i in range(12):
        more = pa.table({"id": np.arange(5) + 1_000 + 5 * i, "x": np.zeros(5)})
        lance.write_dataset(more, uri, mode="append")
    ds = lance.dataset(uri)
    ds.delete("id % 7 = 3")
    ds.update({"x": "x + 0.5"}, where="id >= 200 AND id < 260")
    pinned = int(lance.dataset(uri).version)
    lance.dataset(uri).delete("id < 500")
    lance.write_dataset(
        pa.table({"id": np.arange(5) + 5_000, "x": np.zeros(5)}), uri, mode="append"
    )
    return pinned


@pytest.mark.parametrize("stable", [False, True], ids=["row-addresses", "stable-row-ids"])
def test_every_row_once_with_deletions_filters_time_travel_and_split_fragments(
    spark: Any, tmp_path: Path, stable: bool
) -> None:
    uri = str(tmp_path / "t.lance")
    pinned = _pylance_table(uri, stable)
    at = lance.dataset(uri, version=pinned)
    sizes = [f.count_rows() for f in at.get_fragments()]
    spark.conf.set(PUSHDOWN, "true")
    try:
        # A Lance filter and a pushed-down Spark filter at once: pylance's offset/limit
        # would count filtered rows, so split fragments must be cut by row ids instead.
        for lance_filter, spark_filter in ((None, None), ("x > 100.0", "id >= 300 AND id < 1040")):
            reader = (
                spark.read.format("lancetx")
                .option("version", str(pinned))
                .option("rows_per_partition", "120")
            )
            if lance_filter:
                reader = reader.option("filter", lance_filter)
            df = reader.load(uri)
            if spark_filter:
                df = df.where(spark_filter)
            rows = df.select("id", spark_partition_id().alias("p")).collect()
            ids = [r.id for r in rows]
            where = " AND ".join(f"({w})" for w in (lance_filter, spark_filter) if w) or None
            expected = at.to_table(columns=["id"], filter=where)["id"].to_pylist()
            assert len(ids) == len(set(ids)), where
            assert sorted(ids) == sorted(expected), where
            if not where:  # fragments of 343 live rows split: no partition over the cap
                per_partition = Counter(r.p for r in rows)
                assert max(per_partition.values()) <= 120 < max(sizes), per_partition
    finally:
        spark.conf.unset(PUSHDOWN)


def test_many_small_fragments_give_fewer_partitions_than_fragments(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "small.lance")
    for i in range(24):
        lance.write_dataset(
            pa.table({"id": np.arange(10) + 10 * i}), uri, mode="append" if i else "create"
        )
    for cores in (2, 3):
        df = spark.read.format("lancetx").option("min_partitions", str(cores)).load(uri)
        assert df.rdd.getNumPartitions() == cores  # 24 fragments, packed per core
        assert sorted(r.id for r in df.collect()) == list(range(240))
    # An empty table (every row deleted) reads as no rows.
    lance.dataset(uri).delete("id >= 0")
    assert spark.read.format("lancetx").load(uri).count() == 0


def _wide_table(uri: str) -> None:
    """20,000 rows: an id and a 256-d float32 embedding (~1 KiB per row), one fragment;
    then a column ``extra`` added in data files of its own."""
    n = 20_000
    emb = pa.FixedSizeListArray.from_arrays(
        pa.array(np.random.default_rng(1).random(n * 256, dtype=np.float32)), 256
    )
    lance.write_dataset(pa.table({"id": np.arange(n), "emb": emb}), uri)
    lance.dataset(uri).add_columns({"extra": "id * 2"})


def test_a_projection_reads_only_its_columns_in_fewer_partitions(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "wide.lance")
    _wide_table(uri)

    def read() -> Any:  # a fresh reader each time: option() and schema() change it in place
        return spark.read.format("lancetx").option("max_partition_bytes", str(4 * 1024 * 1024))

    full = read().load(uri)
    assert full.columns == ["id", "emb", "extra"]
    assert full.rdd.getNumPartitions() >= 4  # ~20 MB of embeddings in 4 MiB partitions
    projected = read().schema("id long").load(uri)
    assert projected.columns == ["id"] == read().option("columns", "id").load(uri).columns
    assert projected.rdd.getNumPartitions() == 1  # 160 KB of ids
    # The column not asked for is not fetched: remove its data files and read again.
    ds = lance.dataset(uri)
    for fragment in ds.get_fragments():
        files = fragment.metadata.files
        assert len(files) == 2  # add_columns wrote ``extra`` into a file of its own
        (Path(uri) / "data" / files[1].path).unlink()
    pruned = spark.read.format("lancetx").schema("id long, emb array<float>").load(uri)
    assert pruned.count() == 20_000 and len(pruned.first().emb) == 256
    with pytest.raises(Exception, match=r"(?i)not found|no such file"):
        spark.read.format("lancetx").load(uri).collect()


def test_a_schema_naming_what_the_table_lacks_is_refused_by_name(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "s.lance")
    lance.write_dataset(pa.table({"id": np.arange(3), "name": ["a", "b", "c"]}), uri)
    with pytest.raises(
        Exception, match=r"SparkSchemaError: column 'nope' cannot be read from .*not a column"
    ):
        spark.read.format("lancetx").schema("id long, nope string").load(uri).collect()
    with pytest.raises(Exception, match=r"column 'ID'.*did you mean 'id'"):
        spark.read.format("lancetx").schema("ID long").load(uri).collect()
    with pytest.raises(Exception, match=r"column 'id'.*says string.*reads as bigint"):
        spark.read.format("lancetx").schema("id string").load(uri).collect()


# --------------------------------------------------------------------------- attacks


def test_a_read_stays_on_its_version_while_pylance_appends_and_deletes(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "busy.lance")
    lance.write_dataset(pa.table({"id": np.arange(600)}), uri, max_rows_per_file=200)
    df = spark.read.format("lancetx").option("rows_per_partition", "50").load(uri)
    stop = threading.Event()
    commits: list[int] = []
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set() or i < 4:
                lance.write_dataset(pa.table({"id": [10_000 + i]}), uri, mode="append")
                lance.dataset(uri).delete(f"id = {i * 7}")
                commits.append(i)
                i += 1
        except BaseException as exc:  # reported below
            failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(3):
            assert sorted(r.id for r in df.collect()) == list(range(600))
    finally:
        stop.set()
        thread.join()
    assert not failures and len(commits) >= 4
    latest = spark.read.format("lancetx").load(uri)
    assert sorted(r.id for r in latest.collect()) == lance_ids(uri)


def test_a_cleanup_of_the_pinned_version_fails_the_read_naming_it(
    spark: Any, ddb_uri: str, storage: dict[str, str]
) -> None:
    opts = spark_options(storage)
    spark.range(0, 50, 1, 2).write.format("lancetx").mode("append").options(**opts).save(ddb_uri)
    df = spark.read.format("lancetx").options(**opts).load(ddb_uri)  # pinned on version 1
    spark.range(100, 120, 1, 1).write.format("lancetx").mode("overwrite").options(**opts).save(
        ddb_uri
    )
    report = cleanup_versions(open_table(ddb_uri, storage), keep_versions=1)
    assert report.removed_versions == [1]
    with pytest.raises(Exception, match=r"VersionNotFoundError.*version 1 of table .*cleanup"):
        df.collect()


def test_a_cleanup_between_two_partitions_of_a_read_is_a_typed_error(
    ddb_uri: str, storage: dict[str, str]
) -> None:
    import lancetx
    from pyspark_lancetx.datasource import LanceTxDataSource

    lancetx.write_table(ddb_uri, pa.table({"id": np.arange(100)}), storage_options=storage)
    table = lancetx.open(ddb_uri, storage)
    options = {"path": ddb_uri, "rows_per_partition": "30", **spark_options(storage)}
    source = LanceTxDataSource(options)
    reader = source.reader(source.schema())
    partitions = reader.partitions()
    assert len(partitions) == 4
    first = [i for b in reader.read(partitions[0]) for i in b["id"].to_pylist()]
    assert first == list(range(25))
    table.overwrite(pa.table({"id": np.arange(5)}))
    cleanup_versions(open_table(ddb_uri, storage), keep_versions=1)
    with pytest.raises(VersionNotFoundError, match=r"version 1 of table .*cleanup") as info:
        list(reader.read(partitions[1]))
    assert info.value.version == 1
