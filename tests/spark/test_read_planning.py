"""Read partitioning as pure planning (no Spark): every live row in exactly one piece,
fragments packed and split by Spark's file-source rules, and the pieces read back
exactly by real pylance with deletion vectors, filters and stable row ids."""

from __future__ import annotations

import itertools
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from pyspark_lancetx.scan import (
    OPEN_COST_BYTES,
    FragmentSize,
    ScanPlan,
    Sizing,
    column_share,
    plan_partitions,
)

MIB = 1024 * 1024


def _covered(partitions: list, fragments: list[FragmentSize]) -> dict[int, list[tuple[int, int]]]:
    """Per fragment, the live-row ranges its pieces cover (sorted)."""
    by_id = {f.fragment_id: f for f in fragments}
    out: dict[int, list[tuple[int, int]]] = {}
    for partition in partitions:
        for piece in partition.pieces:
            end = piece.offset + (
                piece.limit if piece.limit is not None else by_id[piece.fragment_id].rows
            )
            out.setdefault(piece.fragment_id, []).append((piece.offset, end))
    return {k: sorted(v) for k, v in out.items()}


def _assert_exactly_once(partitions: list, fragments: list[FragmentSize]) -> None:
    covered = _covered(partitions, fragments)
    for f in fragments:
        if f.rows == 0:
            assert f.fragment_id not in covered  # nothing to read, no task for it
            continue
        ranges = covered[f.fragment_id]
        assert ranges[0][0] == 0 and ranges[-1][1] == f.rows, (f, ranges)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), ranges


def test_a_fragment_larger_than_a_partition_is_split_into_exact_row_ranges() -> None:
    fragments = [FragmentSize(0, 1_000_003, 1_000 * MIB), FragmentSize(1, 7, 1_000)]
    parts = plan_partitions(fragments, Sizing(max_partition_bytes=128 * MIB, min_partitions=2))
    _assert_exactly_once(parts, fragments)
    assert len(parts) >= 8  # ~1 GB in 128 MiB partitions
    assert max(len(p.pieces) for p in parts) <= 2


def test_small_fragments_are_packed_into_fewer_partitions_spread_over_the_cores() -> None:
    fragments = [FragmentSize(i, 100, 10_000) for i in range(20)]
    for cores in (1, 2, 4):
        parts = plan_partitions(fragments, Sizing(128 * MIB, min_partitions=cores))
        _assert_exactly_once(parts, fragments)
        assert len(parts) == cores  # Spark's maxSplitBytes: total / minPartitionNum
    capped = plan_partitions(fragments, Sizing(128 * MIB, 1, rows_per_partition=1_000))
    assert len(capped) == 2 and all(len(p.pieces) == 10 for p in capped)


def test_empty_fragments_and_an_empty_table_get_no_pieces() -> None:
    fragments = [FragmentSize(0, 0, 0), FragmentSize(1, 10, 100), FragmentSize(2, 0, 0)]
    parts = plan_partitions(fragments, Sizing(128 * MIB, 2))
    _assert_exactly_once(parts, fragments)
    assert [p.fragment_ids for p in parts] == [(1,)]
    assert plan_partitions([FragmentSize(0, 0, 0)], Sizing(128 * MIB, 2)) == []
    assert plan_partitions([], Sizing(128 * MIB, 2)) == []


def test_a_rows_cap_splits_fragments_of_no_size() -> None:
    fragments = [FragmentSize(3, 10, 0)]
    parts = plan_partitions(fragments, Sizing(128 * MIB, 1, rows_per_partition=3))
    _assert_exactly_once(parts, fragments)
    assert [[(p.offset, p.limit) for p in part.pieces] for part in parts] == [
        [(0, 2)],
        [(2, 3)],
        [(5, 2)],
        [(7, 3)],
    ]
    assert OPEN_COST_BYTES == 4 * MIB  # Spark's openCostInBytes


def test_a_projection_is_sized_by_its_own_columns() -> None:
    schema = pa.schema(
        [("id", pa.int64()), ("name", pa.string()), ("emb", pa.list_(pa.float32(), 128))]
    )
    assert column_share(schema, ["id"]) == pytest.approx(8 / (8 + 32 + 512))
    assert column_share(schema, ["id", "name", "emb"]) == 1.0


@pytest.mark.parametrize("stable", [False, True], ids=["row-addresses", "stable-row-ids"])
def test_pieces_read_every_row_once_with_deletions_and_filters(
    tmp_path: Path, stable: bool
) -> None:
    uri = str(tmp_path / "t.lance")
    n = 3_000
    table = pa.table({"id": np.arange(n), "x": np.arange(n) * 1.0})
    lance.write_dataset(table, uri, max_rows_per_file=1_200, enable_stable_row_ids=stable)
    ds = lance.dataset(uri)
    ds.delete("id % 3 = 0")
    ds.update({"x": "x + 0.5"}, where="id < 400")  # moves rows into a new fragment
    ds = lance.dataset(uri)
    version = ds.version
    lance.dataset(uri).delete("id % 2 = 1")  # a later version: not what the plan reads
    for where in (None, "id % 5 = 1", "x > 2000.0"):
        plan = ScanPlan(
            uri,
            {},
            version,
            ("id", "x"),
            (where,) if where else (),
            rows_per_partition=170,
            min_partitions=2,
        )
        parts = plan.partitions()
        assert sum(not p.whole for part in parts for p in part.pieces) >= 6  # fragments split
        ids = [i for part in parts for b in plan.batches(part.pieces) for i in b["id"].to_pylist()]
        expected = ds.to_table(columns=["id"], filter=where)["id"].to_pylist()
        assert len(ids) == len(set(ids)), where
        assert sorted(ids) == sorted(expected), where


def test_partition_options_take_spark_names_and_refuse_typos() -> None:
    from pyspark_lancetx.errors import SparkOptionError, UnknownSparkOptionError
    from pyspark_lancetx.options import ReadOptions, StreamReadOptions

    parsed = ReadOptions.parse(
        {"path": "/t", "maxpartitionbytes": "1000", "minpartitions": "3", "rowsperpartition": "5"}
    )
    assert (parsed.max_partition_bytes, parsed.min_partitions, parsed.rows_per_partition) == (
        1000,
        3,
        5,
    )
    defaults = ReadOptions.parse({"path": "/t"})
    assert defaults.max_partition_bytes == 128 * MIB and defaults.rows_per_partition is None
    with pytest.raises(UnknownSparkOptionError, match=r"did you mean max_partition_bytes\?"):
        ReadOptions.parse({"path": "/t", "maxpartitionbyte": "1000"})
    with pytest.raises(SparkOptionError, match=r"'min_partitions'='0'.*positive integer"):
        ReadOptions.parse({"path": "/t", "min_partitions": "0"})
    with pytest.raises(UnknownSparkOptionError, match=r"'max_partition_bytes'.*a read option"):
        StreamReadOptions.parse({"path": "/t", "max_partition_bytes": "1000"})


def test_a_read_whose_pinned_version_cannot_be_probed_keeps_its_own_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read fails and probing its pinned version fails for another reason than "not
    found" (the store unreachable): the read's own error stands, not a
    VersionNotFoundError that says a cleanup removed the version (a network error was
    reported as a removed version). A probe that says "not found" still is one."""
    from lancetx.commit.errors import VersionNotFoundError

    plan = ScanPlan("s3://bucket/t.lance", {}, 3, ("id",))
    failed = OSError("LanceError(IO): connection reset by peer")
    said: list[str] = ["LanceError(IO): error sending request: connection refused"]

    def probe(*args: object, **kwargs: object) -> None:
        raise OSError(said[0])

    monkeypatch.setattr(lance, "dataset", probe)
    assert plan.failure(failed) is failed
    said[0] = "Dataset at path t.lance/_versions/3.manifest was not found"
    removed = plan.failure(failed)
    assert isinstance(removed, VersionNotFoundError) and removed.version == 3
