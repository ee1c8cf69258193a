"""Shallow clones (``lancetx.clone``, Lance's Clone operation): a new table whose first
version is a version of another one, reading the source's files through a base path.
pylance reads what lancetx clones and lancetx continues what pylance cloned; writes,
cleanup and gc of a clone never touch the source; what the source's own cleanup does
to a clone is what Lance's does (a tag on the cloned version keeps it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from cli_helpers import age_objects, run_cli
from protocol_helpers import ensure_ddb_table
from table_helpers import Api, api_fixture, ddb_uri

import lancetx
from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table
from lancetx.verbs import cloning


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


def _rows(n: int, start: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "kind": [f"k{i % 3}" for i in range(start, start + n)],
        }
    )


def _ids(table: Any) -> list[int]:
    return sorted(table.to_table(columns=["id"]).column("id").to_pylist())


def _pylance_ids(uri: str, options: dict[str, str], version: int | str | None = None) -> list[int]:
    ds = lance.dataset(uri, version=version, storage_options=options)
    return sorted(ds.to_table(columns=["id"]).column("id").to_pylist())


def _objects(s3: Any, bucket: str, prefix: str) -> dict[str, tuple[str, int]]:
    """Every object under ``prefix``: (ETag, size), to prove nothing there changed."""
    out: dict[str, tuple[str, int]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = (obj["ETag"], obj["Size"])
    return out


def _source(uri: str, options: dict[str, str]) -> lancetx.Table:
    """v1 create, v2 append, v3 delete (a deletion file), v4 index, v5 append."""
    table = lancetx.write_table(uri, _rows(30, 0), storage_options=options)
    table.append(_rows(30, 30))
    table.delete("id % 10 = 0")
    table.create_index("id", "BTREE")
    table.append(_rows(10, 60))
    return table


@pytest.fixture
def ddb(legacy_aws: EmbeddedAws, ddb_table_name: str) -> dict[str, str]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    return options


def test_a_clone_is_the_source_version_read_through_a_base_path_by_lancetx_and_pylance(
    api: Api, s3_client: Any, bucket: str, ddb_table_name: str, ddb: dict[str, str]
) -> None:
    src = ddb_uri(bucket, ddb_table_name, "src.lance")
    source = _source(src, ddb)
    source.tags.create("indexed", 4)
    s3 = s3_client
    before = _objects(s3, bucket, "src.lance/")
    module: Any = lancetx.aio if api.is_async else lancetx

    cases: dict[str, int | str | None] = {"latest": None, "v3": 3, "tag": "indexed"}
    if api.is_async:  # the same code behind another driver: one case is enough
        cases = {"tag": "indexed"}
    for name, version in cases.items():
        dst = ddb_uri(bucket, ddb_table_name, f"{name}.lance")
        clone = api._keep(api.run(module.clone(src, dst, version=version, storage_options=ddb)))
        wanted = source.checkout(version) if version is not None else source
        assert clone.version == 1
        read = api.run(clone.to_table(columns=["id"]))
        assert sorted(read.column("id").to_pylist()) == _ids(wanted)
        assert _pylance_ids(dst, ddb) == _ids(wanted)
        assert [(h.version, h.operation) for h in api.history(clone)] == [(1, "Clone")]
        ds = lance.dataset(dst, storage_options=ddb)
        manifest = (
            clone.sync._state.parent.manifest if api.is_async else clone._state.parent.manifest
        )
        bases = [(b.id, b.path, b.is_dataset_root) for b in manifest.manifest.base_paths]
        assert bases == [(0, f"s3://{bucket}/src.lance", True)]
        txn = manifest.transaction.clone
        assert (txn.is_shallow, txn.ref_version, txn.ref_path) == (
            True,
            wanted.version,
            f"s3://{bucket}/src.lance",
        )
        # the clone has no data of its own: its first version names the source's files
        folders = (f"{name}.lance/_versions/", f"{name}.lance/_transactions/")
        assert all(k.startswith(folders) for k in _objects(s3, bucket, f"{name}.lance/"))
        if wanted.version >= 4:  # the index is the source's, used by a filtered read
            (index,) = ds.list_indices()
            assert index["name"] == "id_idx" and index["base_id"] == 0
            plan = ds.scanner(filter="id = 42").explain_plan()
            assert "ScalarIndexQuery" in plan or "MaterializeIndex" in plan, plan
        assert _pylance_ids(dst, ddb) == _ids(wanted)
    assert _objects(s3, bucket, "src.lance/") == before  # cloning wrote nothing there


def test_writes_to_a_clone_stay_in_the_clone_and_pylance_reads_them(
    legacy_aws: EmbeddedAws, s3_client: Any, bucket: str, ddb_table_name: str, ddb: dict[str, str]
) -> None:
    src = ddb_uri(bucket, ddb_table_name, "src.lance")
    source = _source(src, ddb)
    expected_source = _ids(source)
    dst = ddb_uri(bucket, ddb_table_name, "dst.lance")
    clone = lancetx.clone(src, dst, storage_options=ddb)
    s3 = s3_client
    before = _objects(s3, bucket, "src.lance/")

    clone.append(_rows(5, 100))
    clone.delete("id % 10 = 1")  # fragments whose deletion files are the source's
    clone.update({"kind": "'x'"}, where="id < 5")
    clone.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
        _rows(3, 68)
    )
    clone.compact()
    clone.drop_index("id_idx")  # the source's index, named by the clone
    clone.create_index("id", "BTREE")
    expected = sorted(i for i in [*expected_source, *range(100, 105), 70] if i % 10 != 1)
    assert _ids(clone) == expected
    assert _pylance_ids(dst, ddb) == expected
    assert (
        lance.dataset(dst, storage_options=ddb).to_table(filter="id < 5")["kind"].to_pylist()
        == ["x"] * 3
    )
    assert _objects(s3, bucket, "src.lance/") == before
    assert _ids(source.refresh()) == expected_source
    assert verify_table(open_table(dst, ddb), deep=True, all_versions=True).ok


def test_cleanup_and_gc_of_a_clone_never_delete_the_sources_files(
    legacy_aws: EmbeddedAws, s3_client: Any, bucket: str, ddb_table_name: str, ddb: dict[str, str]
) -> None:
    src = ddb_uri(bucket, ddb_table_name, "src.lance")
    source = _source(src, ddb)
    source.overwrite(_rows(4, 500))  # the cloned version's files are no longer the latest's
    dst = ddb_uri(bucket, ddb_table_name, "dst.lance")
    clone = lancetx.clone(src, dst, version=5, storage_options=ddb)
    clone.delete("id < 20")
    clone.overwrite(_rows(3, 900))  # no later clone version references the source
    s3 = s3_client
    before = _objects(s3, bucket, "src.lance/")
    age_objects(bucket, [*before, *_objects(s3, bucket, "dst.lance/")], timedelta(days=30))
    before = _objects(s3, bucket, "src.lance/")

    ops = open_table(dst, ddb)
    swept_first = collect_garbage(ops, older_than=timedelta(days=7), dry_run=False)
    cleaned = cleanup_versions(ops, keep_versions=1)
    assert cleaned.ok and cleaned.removed_versions == [1, 2]
    swept = collect_garbage(ops, older_than=timedelta(days=7), dry_run=False)
    assert swept_first.ok and swept.ok
    assert not any(k.startswith("src.lance/") for k in [*cleaned.files_deleted])
    assert _objects(s3, bucket, "src.lance/") == before
    assert _ids(lancetx.open(dst, ddb)) == [900, 901, 902]
    assert _ids(source.checkout(5)) == _pylance_ids(src, ddb, 5)
    assert verify_table(ops, deep=True, all_versions=True).ok
    ran = run_cli(legacy_aws, "gc", dst, "--older-than", "7d", "--delete", "--json")
    assert ran.code == 0, ran.stdout + ran.stderr
    assert _objects(s3, bucket, "src.lance/") == before


def test_a_tag_on_the_cloned_version_keeps_the_clone_readable_through_the_sources_cleanup(
    legacy_aws: EmbeddedAws, s3_client: Any, bucket: str, ddb_table_name: str, ddb: dict[str, str]
) -> None:
    """The source does not know its clones (as in Lance): its cleanup removes files
    only an old version referenced. The tag the README asks for keeps them; without
    it the clone loses them, and ``verify --deep`` of the clone says which."""
    src = ddb_uri(bucket, ddb_table_name, "src.lance")
    source = _source(src, ddb)
    kept = ddb_uri(bucket, ddb_table_name, "kept.lance")
    lost = ddb_uri(bucket, ddb_table_name, "lost.lance")
    source.tags.create("clone-base", 3)
    lancetx.clone(src, kept, version="clone-base", storage_options=ddb)
    lancetx.clone(src, lost, version=5, storage_options=ddb)
    expected = {kept: _ids(source.checkout(3)), lost: _ids(source.checkout(5))}
    source.overwrite(_rows(4, 500))  # nothing of versions 1..5 survives in the latest

    report = cleanup_versions(open_table(src, ddb), keep_versions=1)
    assert report.ok and report.removed_versions == [1, 2, 4, 5]
    assert _ids(lancetx.open(kept, ddb)) == expected[kept]
    assert _pylance_ids(kept, ddb) == expected[kept]
    assert verify_table(open_table(kept, ddb), deep=True).ok
    # v5's fragment 2 (its append) went with the source's cleanup: the clone of v5 breaks
    with pytest.raises((OSError, pa.ArrowInvalid), match=r"Not found: src\.lance/data/"):
        lance.dataset(lost, storage_options=ddb).to_table()
    found = verify_table(open_table(lost, ddb), deep=True)
    assert {f.kind for f in found.findings} == {"missing_data_file"}
    assert all("src.lance/data/" in f.detail for f in found.findings)


def test_lancetx_continues_a_clone_pylance_made(
    legacy_aws: EmbeddedAws, s3_client: Any, bucket: str, ddb_table_name: str, ddb: dict[str, str]
) -> None:
    """pylance's shallow_clone starts the clone's history at the source's version
    number and names the source by its ``s3+ddb://`` URI: lancetx reads it, deletes
    rows whose deletion file is the source's, and keeps the source out of cleanup."""
    src = ddb_uri(bucket, ddb_table_name, "src.lance")
    source = _source(src, ddb)
    dst = ddb_uri(bucket, ddb_table_name, "dst.lance")
    lance.dataset(src, storage_options=ddb).shallow_clone(dst, 3)
    s3 = s3_client
    before = _objects(s3, bucket, "src.lance/")

    clone = lancetx.open(dst, ddb)
    assert clone.version == 3 and _ids(clone) == _ids(source.checkout(3))
    clone.delete("id % 10 = 1")
    clone.append(_rows(2, 200))
    expected = sorted([i for i in _ids(source.checkout(3)) if i % 10 != 1] + [200, 201])
    assert _ids(clone) == expected == _pylance_ids(dst, ddb)
    assert [(h.version, h.operation) for h in clone.history()] == [
        (3, "Clone"),
        (4, "Delete"),
        (5, "Append"),
    ]
    assert cleanup_versions(open_table(dst, ddb), keep_versions=1).ok
    assert _objects(s3, bucket, "src.lance/") == before
    assert _ids(lancetx.open(dst, ddb)) == expected


def test_a_clone_across_buckets_reads_and_deletes_through_the_sources_bucket(
    legacy_aws: EmbeddedAws, s3_client: Any, bucket: str, ddb_table_name: str, ddb: dict[str, str]
) -> None:
    s3 = s3_client
    other = f"{bucket}-clone"
    s3.create_bucket(Bucket=other)
    src = ddb_uri(bucket, ddb_table_name, "src.lance")
    source = _source(src, ddb)
    dst = ddb_uri(other, ddb_table_name, "elsewhere.lance")
    clone = lancetx.clone(src, dst, storage_options=ddb)
    clone.delete("id % 10 = 3")  # reads the source's deletion files from the other bucket
    expected = [i for i in _ids(source) if i % 10 != 3]
    assert _ids(clone) == expected == _pylance_ids(dst, ddb)
    assert cleanup_versions(open_table(dst, ddb), keep_versions=1).ok
    assert _ids(source.refresh()) == _pylance_ids(src, ddb)


def test_a_local_clone_names_its_source_by_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    source = lancetx.write_table("src.lance", _rows(10, 0))
    source.delete("id = 3")
    clone = lancetx.clone("src.lance", str(tmp_path / "dst.lance"))
    (base,) = clone._state.parent.manifest.manifest.base_paths
    assert base.path == str(tmp_path / "src.lance")
    monkeypatch.chdir("/")  # a reader elsewhere still finds the source
    assert _pylance_ids(str(tmp_path / "dst.lance"), {}) == [i for i in range(10) if i != 3]
    assert _ids(lancetx.open(str(tmp_path / "dst.lance"))) == [i for i in range(10) if i != 3]


def test_clone_refuses_a_target_that_exists_or_nests_and_a_version_that_does_not(
    tmp_path: Path,
) -> None:
    src = str(tmp_path / "src.lance")
    source = lancetx.write_table(src, _rows(3, 0))
    source.tags.create("t", 1)
    other = lancetx.write_table(str(tmp_path / "other.lance"), _rows(1, 0))
    with pytest.raises(lancetx.TableExistsError):
        lancetx.clone(src, other.uri)
    with pytest.raises(lancetx.InvalidUriError, match="is the source"):
        lancetx.clone(src, src)
    with pytest.raises(lancetx.InvalidUriError, match="nested"):
        lancetx.clone(src, str(tmp_path / "src.lance" / "data" / "inner.lance"))
    with pytest.raises(lancetx.InvalidUriError, match="nested"):
        lancetx.clone(src, str(tmp_path))
    with pytest.raises(lancetx.VersionNotFoundError):
        lancetx.clone(src, str(tmp_path / "a.lance"), version=9)
    with pytest.raises(lancetx.TagNotFoundError):
        lancetx.clone(src, str(tmp_path / "a.lance"), version="nope")
    with pytest.raises(lancetx.DatasetNotFoundError):
        lancetx.clone(str(tmp_path / "none.lance"), str(tmp_path / "a.lance"))
    assert not (tmp_path / "a.lance").exists()
    assert lancetx.clone(src, str(tmp_path / "a.lance"), version="t").count_rows() == 3


def test_two_clones_racing_for_one_target_one_wins_the_other_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both plan against an empty target before either claims (a barrier in the plan):
    one claims version 1, the other's claim is refused and it says the table exists."""
    src = str(tmp_path / "src.lance")
    lancetx.write_table(src, _rows(3, 0)).append(_rows(2, 3))
    planned = threading.Barrier(2, timeout=60)
    plan = cloning.ClonePlan.__call__

    def both_planned(self: cloning.ClonePlan, ctx: Any) -> Any:
        txn = plan(self, ctx)
        planned.wait()
        return txn

    monkeypatch.setattr(cloning.ClonePlan, "__call__", both_planned)
    target = str(tmp_path / "dst.lance")
    outcomes: list[object] = []

    def run(version: int) -> None:
        try:
            outcomes.append(lancetx.clone(src, target, version=version).version)
        except lancetx.TableExistsError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=run, args=(v,)) for v in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(map(type, outcomes), key=str) == sorted([int, lancetx.TableExistsError], key=str)
    assert [v.version for v in lancetx.open(target).history()] == [1]
    assert lancetx.open(target).count_rows() in (3, 5)


def test_a_clone_of_the_latest_while_the_source_is_written_is_one_whole_version(
    tmp_path: Path,
) -> None:
    """A writer appends to the source while it is cloned: the clone is exactly the
    version it names (ref_version), and the source's later versions never reach it."""
    src = str(tmp_path / "src.lance")
    source = lancetx.write_table(src, _rows(5, 0))
    landed = threading.Event()
    stop = threading.Event()

    def write() -> None:
        writer = lancetx.open(src)
        n = 1
        while not stop.is_set() and n < 200:
            writer.append(_rows(5, 5 * n))
            n += 1
            landed.set()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        assert landed.wait(60)
        clone = lancetx.clone(src, str(tmp_path / "dst.lance"))
        landed.clear()
        assert landed.wait(60)  # the source moved on after the clone
    finally:
        stop.set()
        thread.join(timeout=120)
    ref = clone._state.parent.manifest.transaction.clone.ref_version
    assert ref >= 2
    assert _ids(clone) == _ids(source.checkout(ref)) == list(range(5 * ref))
    assert _ids(lancetx.open(str(tmp_path / "dst.lance"))) == list(range(5 * ref))
    assert source.refresh().version > ref


def test_a_clone_of_a_clone_reads_each_file_from_the_table_that_wrote_it(tmp_path: Path) -> None:
    """The first clone's files stay named by the base it registered for the original;
    only its own files get the new base. pylance reads the second clone, and an index
    the first clone inherited keeps pointing at the original's folder."""
    original = lancetx.write_table(str(tmp_path / "a.lance"), _rows(10, 0))
    original.delete("id = 0")
    original.create_index("id", "BTREE")
    first = lancetx.clone(original.uri, str(tmp_path / "b.lance"))
    first.append(_rows(3, 100))
    first.delete("id = 101")
    second = lancetx.clone(first.uri, str(tmp_path / "c.lance"))
    manifest = second._state.parent.manifest
    assert [(b.id, b.path) for b in manifest.manifest.base_paths] == [
        (0, str(tmp_path / "a.lance")),
        (1, str(tmp_path / "b.lance")),
    ]
    assert [i.base_id for i in manifest.indices or []] == [0]
    expected = [i for i in [*range(10), 100, 101, 102] if i not in (0, 101)]
    assert _ids(second) == expected == _pylance_ids(second.uri, {})
    ds = lance.dataset(second.uri)
    assert "ScalarIndexQuery" in ds.scanner(filter="id = 4").explain_plan()
    second.delete("id = 5")
    assert _pylance_ids(second.uri, {}) == [i for i in expected if i != 5]
    assert _ids(first.refresh()) == expected and _ids(original.refresh()) == list(range(1, 10))
