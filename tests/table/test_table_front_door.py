"""The front door on every kind of location, and races around creation and idempotency."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from lance.fragment import write_fragments
from table_helpers import ddb_uri, ids, pylance_rows

import lancetx
from lancetx.commit.errors import LancetxError
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table


def _race(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run ``jobs`` at once; their results (or exceptions) in order."""
    barrier = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = jobs[i]()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_public_api() -> None:
    assert lancetx.__version__
    assert lancetx.connect is lancetx.open
    for name in ("open", "write_table", "commit_fragments", "Table", "CommitResult", "VersionInfo"):
        assert name in lancetx.__all__ and hasattr(lancetx, name)


def test_local_path(tmp_path: Path) -> None:
    path = str(tmp_path / "t.lance")
    table = lancetx.write_table(path, ids(3), commit_message="local")
    assert table.append(ids(2, start=3)) == 2
    assert table.delete("id = 0") == 3
    assert pylance_rows(path, None, 3)["id"] == [1, 2, 3, 4]
    assert [h.committer for h in lancetx.open(path).history()] == ["lancetx"] * 3
    assert lancetx.open(path, version=1).to_table().num_rows == 3


def test_refresh_after_the_table_was_deleted_and_written_again_reads_the_new_manifest(
    tmp_path: Path,
) -> None:
    """The new table has the held version's number again: its manifest is not the held one."""
    path = str(tmp_path / "t.lance")
    lancetx.write_table(path, pa.table({"a": [1, 2, 3]}))
    table = lancetx.open(path)
    shutil.rmtree(path)
    lancetx.write_table(path, pa.table({"b": ["x"]}))
    assert table.refresh().version == 1
    assert table.schema.names == ["b"]
    table.append(pa.table({"b": ["y"]}))
    assert sorted(table.to_table()["b"].to_pylist()) == ["x", "y"]


def test_s3_with_conditional_put(aws: EmbeddedAws, bucket: str) -> None:
    uri, options = f"s3://{bucket}/t.lance", aws.pylance_storage_options()
    table = lancetx.write_table(uri, ids(3), storage_options=options)
    assert table.update({"name": "'x'"}, where="id = 1") == 2
    assert pylance_rows(uri, options, 2)["name"] == ["n0", "x", "n2"]


def test_plain_s3_on_a_legacy_store_is_refused(aws: EmbeddedAws, bucket: str) -> None:
    options = {**aws.pylance_storage_options(), "lancetx_legacy_s3": "true"}
    with pytest.raises(LancetxError, match=r"s3\+ddb|legacy|conditional"):
        lancetx.write_table(f"s3://{bucket}/t.lance", ids(1), storage_options=options)


@pytest.fixture
def uri(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    return ddb_uri(bucket, ddb_table_name)


def test_racing_creators_one_creates_the_others_append(
    aws: EmbeddedAws, bucket: str, uri: str
) -> None:
    options = aws.pylance_storage_options()
    data_uri = f"s3://{bucket}/t.lance"
    batches = [
        write_fragments(ids(2, start=10 * i), data_uri, storage_options=options) for i in range(4)
    ]
    results = _race(
        [
            lambda f=f: lancetx.commit_fragments(
                uri, f, schema=ids(1).schema, storage_options=options
            )
            for f in batches
        ]
    )
    assert all(isinstance(r, lancetx.CommitResult) for r in results), results
    assert sorted(r.version for r in results) == [1, 2, 3, 4]
    ds = lance.dataset(uri, storage_options=options)
    assert sorted(ds.to_table()["id"].to_pylist()) == sorted(
        i for k in range(4) for i in (10 * k, 10 * k + 1)
    )
    history = lancetx.open(uri, options).history()
    assert [h.operation for h in history] == ["Overwrite", "Append", "Append", "Append"]


def test_write_table_create_race_has_one_winner(aws: EmbeddedAws, uri: str) -> None:
    options = aws.pylance_storage_options()
    results = _race(
        [
            lambda i=i: lancetx.write_table(uri, ids(1, start=i), storage_options=options)
            for i in range(3)
        ]
    )
    winners = [r for r in results if isinstance(r, lancetx.Table)]
    losers = [r for r in results if isinstance(r, lancetx.TableExistsError)]
    assert (len(winners), len(losers)) == (1, 2), results
    assert lance.dataset(uri, storage_options=options).count_rows() == 1


def test_idempotency_key_from_racing_writers_gives_one_version(aws: EmbeddedAws, uri: str) -> None:
    options = aws.pylance_storage_options()
    lancetx.write_table(uri, ids(1), storage_options=options)
    tables = [lancetx.open(uri, options) for _ in range(4)]
    row = pa.table({"id": pa.array([99], pa.int64()), "name": ["once"]})
    results = _race([lambda t=t: t.append(row, idempotency_key="stream-7") for t in tables])
    assert results == [2, 2, 2, 2], results
    ds = lance.dataset(uri, storage_options=options)
    assert ds.version == 2
    assert ds.to_table(filter="id = 99").num_rows == 1
    # and again later, from a fresh process's point of view
    assert lancetx.open(uri, options).append(row, idempotency_key="stream-7") == 2


def test_update_keeps_stable_row_ids(tmp_path: Path) -> None:
    path = str(tmp_path / "t.lance")
    lance.write_dataset(ids(6), path, enable_stable_row_ids=True)
    before = lance.dataset(path).to_table(with_row_id=True)
    version = lancetx.open(path).update({"name": "'u'"}, where="id >= 3")
    after = lance.dataset(path, version=version).to_table(with_row_id=True)
    assert sorted(after["name"].to_pylist()) == ["n0", "n1", "n2", "u", "u", "u"]
    pairs = sorted(zip(after["id"].to_pylist(), after["_rowid"].to_pylist(), strict=True))
    assert pairs == sorted(zip(before["id"].to_pylist(), before["_rowid"].to_pylist(), strict=True))
