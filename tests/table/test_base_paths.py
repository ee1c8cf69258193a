"""Extra base paths (Lance's multi-base tables): data files under a base the table
registers are committed like its own and read back by lancetx and pylance; a file
outside every registered base (an unregistered id, a missing object, a path that
walks up, a base inside the table but outside ``data/``) is still refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.fragment import write_fragments
from protocol_helpers import ensure_ddb_table
from table_helpers import Api, api_fixture, ddb_uri

import lancetx
from lancetx.commit.engine.operations import Append, UpdateBases
from lancetx.convert import to_fragment
from lancetx.demo.embedded import EmbeddedAws
from lancetx.protos import table_pb2


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


def _rows(n: int, start: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64())})


def _ids(table: Any) -> list[int]:
    return sorted(table.to_table(columns=["id"]).column("id").to_pylist())


def _base(base_id: int, name: str, path: str, *, root: bool = False) -> table_pb2.BasePath:
    return table_pb2.BasePath(id=base_id, name=name, path=path, is_dataset_root=root)


def test_fragments_under_registered_bases_are_committed_and_read_back(
    api: Api, legacy_aws: EmbeddedAws, s3_client: Any, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    cold = f"{bucket}-cold"
    s3_client.create_bucket(Bucket=cold)
    uri = ddb_uri(bucket, ddb_table_name, "t.lance")
    api.write_table(uri, _rows(3, 0), storage_options=options)
    table = api.open(uri, options)
    bases = (
        _base(1, "archive", f"s3://{bucket}/archive"),  # a folder of files, same bucket
        _base(2, "cold", f"s3://{cold}/t.lance", root=True),  # a dataset root, another bucket
    )
    api.run(table.commit(UpdateBases(new_bases=bases)))
    sync = table.sync if api.is_async else table
    sync.refresh()

    archived = write_fragments(
        _rows(4, 10), sync.dataset, mode="append", target_bases=["archive"], storage_options=options
    )
    assert [f.base_id for f in archived[0].files] == [1]
    done = api.commit_fragments(uri, archived, schema=sync.schema, storage_options=options)
    assert not done.deduplicated
    coldest = write_fragments(
        _rows(2, 20), sync.dataset, mode="append", target_bases=["cold"], storage_options=options
    )
    api.run(table.commit(Append(fragments=tuple(to_fragment(uri, f) for f in coldest))))

    expected = [0, 1, 2, 10, 11, 12, 13, 20, 21]
    assert _ids(lancetx.open(uri, options)) == expected
    assert _ids(lance.dataset(uri, storage_options=options)) == expected
    assert any(k.startswith("archive/") for k in _keys(s3_client, bucket, "archive/"))
    assert _keys(s3_client, cold, "t.lance/data/")
    # a delete on the archived rows writes the table's own deletion file
    sync.refresh()
    api.run(table.delete("id = 11"))
    assert _ids(lance.dataset(uri, storage_options=options)) == [i for i in expected if i != 11]


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for o in listed.get("Contents", [])]


def test_fragments_outside_every_registered_base_are_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    table = lancetx.write_table(uri, _rows(3, 0))
    table.commit(
        UpdateBases(
            new_bases=(
                _base(1, "archive", str(tmp_path / "archive")),
                _base(2, "inside", str(tmp_path / "t.lance" / "_versions")),
            )
        )
    )
    (written,) = write_fragments(
        _rows(2, 5), table.dataset, mode="append", target_bases=["archive"]
    )
    good = to_fragment(uri, written)

    def variant(**changes: Any) -> table_pb2.DataFragment:
        out = table_pb2.DataFragment()
        out.CopyFrom(good)
        for name, value in changes.items():
            setattr(out.files[0], name, value)
        return out

    cases = {
        "not registered": variant(base_id=7),
        "no object": variant(path="missing.lance"),
        "walks up": variant(path="../t.lance/data/x.lance"),
        "inside the table, not in data/": variant(base_id=2, path=good.files[0].path),
    }
    for what, fragment in cases.items():
        with pytest.raises(lancetx.ForeignFragmentError, match="registers") as caught:
            table.commit_fragments([fragment], schema=table.schema)
        assert caught.value.bases and "archive" in str(caught.value), what
        with pytest.raises(lancetx.ForeignFragmentError):
            table.commit(Append(fragments=(fragment,)))
    assert table.refresh().version == 2 and _ids(table) == [0, 1, 2]
    assert table.commit_fragments([good], schema=table.schema).version == 3
    assert _ids(lance.dataset(uri)) == [0, 1, 2, 5, 6]


def test_write_table_registers_its_initial_bases(tmp_path: Path) -> None:
    """pylance writes the files under the base and names it by id; the new table must
    register it, or no reader could open the table ("base_path id 1 not found")."""
    uri = str(tmp_path / "t.lance")
    hot = lance.DatasetBasePath(path=str(tmp_path / "hot"), name="hot")
    table = lancetx.write_table(uri, _rows(3, 0), initial_bases=[hot], target_bases=["hot"])
    bases = table._state.parent.manifest.manifest.base_paths
    assert [(b.id, b.name, b.path) for b in bases] == [(1, "hot", str(tmp_path / "hot"))]
    assert _ids(lance.dataset(uri)) == [0, 1, 2] == _ids(table)
    assert list((tmp_path / "hot").iterdir())
    table.append(_rows(1, 3), target_bases=["hot"])
    assert _ids(lance.dataset(uri)) == [0, 1, 2, 3]
    with pytest.raises(lancetx.InvalidWriteParamError, match="only when the write creates"):
        lancetx.write_table(uri, _rows(1, 9), mode="overwrite", initial_bases=[hot])
