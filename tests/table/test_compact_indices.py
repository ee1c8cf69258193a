"""Compaction keeps vector indices useful, on moto over HTTP via DynamoDB.

A 20-fragment table with an IVF_PQ index is compacted through lancetx. Afterwards
``nearest`` queries must still go through the index (the ANN nodes in pylance's
plan, no flat KNN over unindexed rows), every row must be indexed
(``index_stats``), and the results must be those from before — read through
lancetx's Table and through real pylance. Without a remap the index covers only
fragments that no longer exist and every search scans the table.

With ``defer_index_remap=True`` the index is left as it is and a fragment reuse
index (Lance's ``__lance_frag_reuse``) is written, through which pylance still
uses it. Around it: a compaction racing an append (lancetx's or pylance's),
before and after its fragment ids are reserved, and racing a delete of rows it
rewrites (planned again); strict mode; a failing remap leaves nothing behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import boto3
import lance
import numpy as np
import pyarrow as pa
import pytest
from table_helpers import Api, api_fixture, data_files, ddb_uri

import lancetx
from lancetx.commit.engine.operations import FRAG_REUSE_INDEX_NAME
from lancetx.commit.engine.unreferenced import kept_on
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.verbs import maintenance
from lancetx.verbs.maintenance import CompactPlan

DIM = 8
ROWS_PER_FRAGMENT = 15
FRAGMENTS = 20
#: Few partitions and sub-vectors: the index trains in milliseconds.
INDEX = {"num_partitions": 2, "num_sub_vectors": 2}
SEED = 21


@pytest.fixture(autouse=True)
def _quiet_centroids(monkeypatch: pytest.MonkeyPatch) -> None:
    # pylance warns on every index_stats call unless told whether to include them.
    monkeypatch.setenv("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


@pytest.fixture
def options(aws: EmbeddedAws) -> dict[str, str]:
    return aws.pylance_storage_options()


@pytest.fixture
def uri(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    return ddb_uri(bucket, ddb_table_name)


def _vectors(start: int, n: int, offset: float = 0.0) -> pa.Table:
    rng = np.random.default_rng(SEED + start)
    values = rng.standard_normal((n, DIM)).astype("float32") + offset
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), DIM),
        }
    )


QUERIES = [
    np.random.default_rng(SEED * 7 + i).standard_normal(DIM).astype("float32") for i in range(4)
]


def _indexed_table(api: Api, uri: str, options: dict[str, str]) -> Any:
    """20 fragments of 15 rows (PQ trains 256 codes: pylance indexes nothing below 256 rows), an IVF_PQ index over all, then 7 rows deleted (so
    the compaction drops rows the index holds)."""
    table = api.write_table(
        uri,
        _vectors(0, ROWS_PER_FRAGMENT * FRAGMENTS),
        storage_options=options,
        max_rows_per_file=ROWS_PER_FRAGMENT,
    )
    api.run(table.create_index("vec", "IVF_PQ", **INDEX))
    api.run(table.delete("id % 29 = 3"))
    return table


def _search(reader: Any, run: Any = lambda x: x) -> list[list[int]]:
    """Nearest ids for each query (pylance's default nprobes; k=10), read by a
    pylance dataset or a lancetx Table (``run`` awaits the async one's calls)."""
    out = []
    for q in QUERIES:
        nearest = {"column": "vec", "q": q, "k": 10}
        found = run(reader.to_table(nearest=nearest, columns=["id", "_distance"]))
        out.append(found["id"].to_pylist())
    return out


def _plan(reader: Any, run: Any = lambda x: x) -> str:
    scanner = run(reader.scanner(nearest={"column": "vec", "q": QUERIES[0], "k": 10}))
    plan: str = scanner.explain_plan()
    return plan


def _coverage(ds: lance.LanceDataset) -> dict[str, int]:
    stats = ds.stats.index_stats("vec_idx")
    return {k: stats[k] for k in ("num_indexed_rows", "num_unindexed_rows")}


def _uses_the_index(plan: str) -> bool:
    """The ANN nodes are there and no flat KNN over unindexed fragments is."""
    return "ANNIvfPartition" in plan and "ANNSubIndex" in plan and "KNNVectorDistance" not in plan


def _index_dirs(s3: Any, bucket: str) -> set[str]:
    return {key.split("/")[2] for key in data_files(s3, bucket, "t.lance/_indices/")}


def _referenced_index_dirs(uri: str, options: dict[str, str]) -> set[str]:
    """Index uuids some version of the table references."""
    ds = lance.dataset(uri, storage_options=options)
    out: set[str] = set()
    for v in ds.versions():
        for index in lance.dataset(
            uri, version=v["version"], storage_options=options
        ).describe_indices():
            out.update(str(s.uuid) for s in getattr(index, "segments", []))
    return out


def test_compact_remaps_the_vector_index(
    api: Api, uri: str, options: dict[str, str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _indexed_table(api, uri, options)
    before = lance.dataset(uri, storage_options=options)
    live = before.count_rows()
    assert len(before.get_fragments()) == FRAGMENTS
    assert _coverage(before) == {"num_indexed_rows": live, "num_unindexed_rows": 0}
    assert _uses_the_index(_plan(before))
    expected = _search(before)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the scratch table goes
    version = api.run(table.compact(commit_message="tidy", idempotency_key="tidy-1"))
    assert os.listdir(tmp_path) == [], "the scratch table is removed"
    # The key is the Rewrite's (not the reservation's): a retry finds the compaction.
    assert api.run(table.find_idempotency_key("tidy-1")) == version

    after = lance.dataset(uri, version=version, storage_options=options)
    assert len(after.get_fragments()) == 1
    assert after.count_rows() == live
    assert _coverage(after) == {"num_indexed_rows": live, "num_unindexed_rows": 0}
    assert _uses_the_index(_plan(after)), _plan(after)
    assert _search(after) == expected
    # Through lancetx's reader too (its Table reads the version it committed).
    assert table.version == version
    assert _uses_the_index(_plan(table, api.run))
    assert _search(table, api.run) == expected
    dataset = api.run(table.dataset()) if api.is_async else table.dataset
    assert _coverage(dataset) == {"num_indexed_rows": live, "num_unindexed_rows": 0}
    ops = [(h.operation, h.commit_message) for h in api.history(table)[-2:]]
    assert ops == [("ReserveFragments", None), ("Rewrite", "tidy")]
    # The remapped index is a new one (new files), the old one stays for older versions.
    (old,) = before.describe_indices()[0].segments
    (new,) = after.describe_indices()[0].segments
    assert old.uuid != new.uuid
    assert _search(lance.dataset(uri, version=before.version, storage_options=options)) == expected


def test_defer_index_remap_writes_a_fragment_reuse_index(uri: str, options: dict[str, str]) -> None:
    api = Api("sync")
    table = _indexed_table(api, uri, options)
    before = lance.dataset(uri, storage_options=options)
    live = before.count_rows()
    expected = _search(before)
    (old,) = before.describe_indices()[0].segments

    version = table.compact({"defer_index_remap": True})

    after = lance.dataset(uri, version=version, storage_options=options)
    assert len(after.get_fragments()) == 1
    names = sorted(i.name for i in after.describe_indices())
    assert names == [FRAG_REUSE_INDEX_NAME, "vec_idx"]
    (kept,) = next(i for i in after.describe_indices() if i.name == "vec_idx").segments
    assert kept.uuid == old.uuid, "deferred: the vector index itself is not rewritten"
    # pylance reads the index through the fragment reuse index: every row indexed.
    assert _coverage(after) == {"num_indexed_rows": live, "num_unindexed_rows": 0}
    assert _uses_the_index(_plan(after)), _plan(after)
    assert _search(after) == expected
    assert _search(table) == expected
    # A later remap (the index rebuilt) makes it a plain index again.
    table.create_index("vec", "IVF_PQ", replace=True, **INDEX)
    assert _coverage(lance.dataset(uri, storage_options=options))["num_unindexed_rows"] == 0


def test_strict_compaction_reserves_nothing(uri: str, options: dict[str, str]) -> None:
    table = _indexed_table(Api("sync"), uri, options)
    expected = _search(lance.dataset(uri, storage_options=options))
    read = table.version
    version = table.compact(expected_version=read)
    assert version == read + 1, "no ReserveFragments version in strict mode"
    after = lance.dataset(uri, storage_options=options)
    assert _coverage(after)["num_unindexed_rows"] == 0
    assert _search(after) == expected


def test_a_clone_remaps_the_index_it_reads_from_its_source(
    uri: str, options: dict[str, str], aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A shallow clone reads its source's index (under a base path). Compacting the
    clone remaps it into the clone's own folder (pylance reads the old files where
    they are) and the source is untouched. (pylance's own compaction of a clone
    keeps the old base id and leaves an index whose files are not there.)"""
    s3 = boto3.client("s3", **aws.client_kwargs())
    _indexed_table(Api("sync"), uri, options)
    expected = _search(lance.dataset(uri, storage_options=options))
    source_objects = data_files(s3, bucket, "t.lance/")
    target = ddb_uri(bucket, ddb_table_name, "clone.lance")
    clone = lancetx.clone(uri, target, storage_options=options)
    (inherited,) = clone.dataset.describe_indices()[0].segments

    version = clone.compact()

    ds = lance.dataset(target, version=version, storage_options=options)
    assert len(ds.get_fragments()) == 1
    assert _coverage(ds) == {"num_indexed_rows": ds.count_rows(), "num_unindexed_rows": 0}
    assert _uses_the_index(_plan(ds)), _plan(ds)
    assert _search(ds) == expected
    (remapped,) = ds.describe_indices()[0].segments
    assert remapped.uuid != inherited.uuid
    assert any(
        k.startswith(f"clone.lance/_indices/{remapped.uuid}/")
        for k in data_files(s3, bucket, "clone.lance/_indices/")
    )
    assert data_files(s3, bucket, "t.lance/") == source_objects, "the source is untouched"


@pytest.mark.parametrize(
    ("writer", "when"), [("lancetx", "before_reserving"), ("pylance", "after_reserving")]
)
def test_an_append_racing_the_compaction(
    uri: str,
    options: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    when: str,
    writer: str,
) -> None:
    """Another writer appends while the compaction is planned: before its fragment
    ids are reserved (the reservation takes ids after the append's) or after (the
    Rewrite is rebased over the append). The compacted rows stay indexed, the new
    ones are searched without the index, nothing collides."""
    table = _indexed_table(Api("sync"), uri, options)
    compacted = table.count_rows()
    # Far from every query: the nearest results stay those from before.
    extra = _vectors(10_000, 7, offset=100.0)
    expected = _search(lance.dataset(uri, storage_options=options))

    def append() -> None:
        if writer == "lancetx":
            lancetx.open(uri, options).append(extra)
        else:
            lance.write_dataset(extra, uri, mode="append", storage_options=options)

    if when == "before_reserving":
        original = CompactPlan._reserve

        def reserve(self: CompactPlan, ctx: Any, count: int) -> int:
            append()
            return original(self, ctx, count)

        monkeypatch.setattr(CompactPlan, "_reserve", reserve)
    else:
        remap = maintenance.remap_in_scratch

        def remap_then_append(*args: Any, **kwargs: Any) -> Any:
            out = remap(*args, **kwargs)
            append()
            return out

        monkeypatch.setattr(maintenance, "remap_in_scratch", remap_then_append)

    version = table.compact()
    ds = lance.dataset(uri, storage_options=options)
    assert ds.version == version
    assert ds.count_rows() == compacted + 7
    ids = sorted(ds.to_table(columns=["id"])["id"].to_pylist())
    assert ids[-7:] == list(range(10_000, 10_007))
    assert len({f.fragment_id for f in ds.get_fragments()}) == len(ds.get_fragments())
    assert _coverage(ds) == {"num_indexed_rows": compacted, "num_unindexed_rows": 7}
    # The version before the Rewrite holds the same rows (the append's unindexed,
    # so pylance adds an exact scan of them to the index's candidates): the same
    # results, in the same order. And the far-away rows are never among them.
    before = lance.dataset(uri, version=version - 1, storage_options=options)
    assert _search(ds) == _search(before)
    assert [sorted(found) for found in _search(ds)] == [sorted(found) for found in expected]
    ops = [h.operation for h in table.history()]
    assert ops[-1] == "Rewrite" and "ReserveFragments" in ops[-3:]


def test_a_delete_racing_the_compaction_plans_it_again(
    uri: str,
    options: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    aws: EmbeddedAws,
    bucket: str,
) -> None:
    """A delete of rows the compaction rewrites lands first: the Rewrite is a
    retryable conflict, planned again on the new version (a new reservation, a new
    remap); the first attempt's data and index files are removed."""
    s3 = boto3.client("s3", **aws.client_kwargs())
    table = _indexed_table(Api("sync"), uri, options)
    remap = maintenance.remap_in_scratch
    calls: list[int] = []

    def remap_then_delete(*args: Any, **kwargs: Any) -> Any:
        out = remap(*args, **kwargs)
        if not calls:
            lancetx.open(uri, options).delete("id = 0")
        calls.append(1)
        return out

    monkeypatch.setattr(maintenance, "remap_in_scratch", remap_then_delete)
    version = table.compact()
    assert len(calls) == 2 and table.last_commit.plans == 2
    ds = lance.dataset(uri, version=version, storage_options=options)
    live = ds.count_rows()
    assert ds.count_rows("id = 0") == 0
    assert _coverage(ds) == {"num_indexed_rows": live, "num_unindexed_rows": 0}
    assert 0 not in [i for ids in _search(ds) for i in ids]
    # Nothing of the lost attempt is left: every index folder is some version's.
    assert _index_dirs(s3, bucket) <= _referenced_index_dirs(uri, options)


def test_a_pylance_compaction_racing_ours(
    uri: str,
    options: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    aws: EmbeddedAws,
    bucket: str,
) -> None:
    """pylance compacts (and remaps) the same fragments through DynamoDB while ours
    is remapping: ours conflicts, is planned again, finds nothing left to compact,
    and removes everything its first attempt wrote."""
    s3 = boto3.client("s3", **aws.client_kwargs())
    table = _indexed_table(Api("sync"), uri, options)
    expected = _search(lance.dataset(uri, storage_options=options))
    remap = maintenance.remap_in_scratch

    def remap_then_pylance(*args: Any, **kwargs: Any) -> Any:
        out = remap(*args, **kwargs)
        lance.dataset(uri, storage_options=options).optimize.compact_files()
        return out

    monkeypatch.setattr(maintenance, "remap_in_scratch", remap_then_pylance)
    version = table.compact()
    ds = lance.dataset(uri, storage_options=options)
    assert version == ds.version and table.last_commit.plans == 2
    last = table.history()[-1]
    assert (last.operation, last.committer) == ("Rewrite", "lance"), "pylance's compaction holds"
    assert len(ds.get_fragments()) == 1
    assert _coverage(ds) == {"num_indexed_rows": ds.count_rows(), "num_unindexed_rows": 0}
    assert _search(ds) == expected
    # Nothing of ours is left: every data file and index folder is some version's.
    assert _index_dirs(s3, bucket) <= _referenced_index_dirs(uri, options)
    referenced = {
        f"t.lance/data/{f.path}"
        for v in ds.versions()
        for frag in lance.dataset(
            uri, version=v["version"], storage_options=options
        ).get_fragments()
        for f in frag.data_files()
    }
    assert data_files(s3, bucket, "t.lance/data/") <= referenced


@pytest.mark.parametrize("failure", [OSError, KeyboardInterrupt])
def test_a_failing_remap(
    uri: str,
    options: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    aws: EmbeddedAws,
    bucket: str,
    failure: type[BaseException],
) -> None:
    """pylance's scratch commit fails: an error removes the compaction's data files
    (no claim could reference them); an interrupt keeps them and says which, as
    every door does. The reservation stays (a version with no change)."""
    s3 = boto3.client("s3", **aws.client_kwargs())
    table = _indexed_table(Api("sync"), uri, options)
    data_before = data_files(s3, bucket, "t.lance/data/")
    indices_before = _index_dirs(s3, bucket)
    from lance.optimize import Compaction

    def broken(*_: Any, **__: Any) -> Any:
        raise failure("remap failed (injected)")

    monkeypatch.setattr(Compaction, "commit", staticmethod(broken))
    with pytest.raises(failure, match="injected") as info:
        table.compact()
    assert _index_dirs(s3, bucket) == indices_before
    written = data_files(s3, bucket, "t.lance/data/") - data_before
    if failure is OSError:
        assert written == set()
    else:
        assert written, "the compaction wrote files before the interrupt"
        kept = kept_on(info.value)
        assert kept is not None
        assert {k.split("/", 3)[3] for k in kept.files} == written
    ds = lance.dataset(uri, storage_options=options)
    assert [h.operation for h in table.history()][-1] == "ReserveFragments"
    assert len(ds.get_fragments()) == FRAGMENTS
