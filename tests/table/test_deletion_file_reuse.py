"""A delete or update in a fragment whose deletion file this process wrote (or read)
does not read that file back (issue 25: a held Table's delete cost one GET more than
pylance's own). Deletion files never change, so the bytes kept are the file's; every
case here checks the rows pylance reads afterwards, including a pylance delete in
between (another writer's file, read once) and a cache that forgot."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import boto3
import lance
import pyarrow as pa
import pytest
from table_helpers import ddb_uri

import lancetx
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.verbs.deletion_cache import DELETION_FILES, DeletionFileCache

ROWS = 100


class DeletionReads:
    """The GETs of deletion files the server answers, by sender (lancetx's botocore
    client or pylance's Rust one, told apart by the User-Agent: botocore names itself
    in every one it builds)."""

    def __init__(self, aws: EmbeddedAws) -> None:
        self.aws = aws
        self._lock = threading.Lock()
        self.lancetx: list[str] = []
        self.pylance: list[str] = []

    def __enter__(self) -> DeletionReads:
        self.aws.set_interceptor(self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        self.aws.set_interceptor(None)

    def _record(self, request: InterceptedRequest) -> None:
        if request.method != "GET" or "/_deletions/" not in request.path:
            return
        agent = {k.lower(): v for k, v in request.headers.items()}.get("user-agent", "").lower()
        with self._lock:
            (self.lancetx if "botocore" in agent else self.pylance).append(request.path)

    def clear(self) -> None:
        with self._lock:
            self.lancetx.clear()
            self.pylance.clear()


@pytest.fixture
def table(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[lancetx.Table]:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    data = pa.table({"id": pa.array(range(ROWS), pa.int64()), "v": pa.array([0.0] * ROWS)})
    DELETION_FILES.clear()
    yield lancetx.write_table(
        ddb_uri(bucket, ddb_table_name), data, storage_options=aws.pylance_storage_options()
    )
    DELETION_FILES.clear()


def _ids(uri: str, options: dict[str, str]) -> list[int]:
    return sorted(lance.dataset(uri, storage_options=options).to_table().column("id").to_pylist())


def test_a_second_delete_in_a_fragment_does_not_read_its_deletion_file(
    aws: EmbeddedAws, table: lancetx.Table
) -> None:
    options = aws.pylance_storage_options()
    with DeletionReads(aws) as reads:
        table.delete("id = 1")
        assert reads.lancetx == []  # no deletion file yet
        for n in (2, 3):
            reads.clear()
            table.delete(f"id = {n}")
            # pylance's scan reads the fragment's file; lancetx kept the bytes it wrote.
            assert reads.lancetx == [], n
    assert _ids(table.uri, options) == [i for i in range(ROWS) if i not in (1, 2, 3)]


def test_an_update_after_a_delete_does_not_read_the_deletion_file(
    aws: EmbeddedAws, table: lancetx.Table
) -> None:
    options = aws.pylance_storage_options()
    table.delete("id = 5")
    with DeletionReads(aws) as reads:
        table.update({"v": "v + 1"}, where="id >= 10 AND id < 20")
        assert reads.lancetx == []
    rows = lance.dataset(table.uri, storage_options=options).to_table().to_pylist()
    assert sorted(r["id"] for r in rows) == [i for i in range(ROWS) if i != 5]
    assert {r["id"]: r["v"] for r in rows if r["v"]} == {i: 1.0 for i in range(10, 20)}


def test_a_deletion_file_pylance_wrote_in_between_is_read_once(
    aws: EmbeddedAws, table: lancetx.Table
) -> None:
    options = aws.pylance_storage_options()
    table.delete("id = 1")
    lance.dataset(table.uri, storage_options=options).delete("id = 2")  # a new file
    table.refresh()
    with DeletionReads(aws) as reads:
        table.delete("id = 3")  # its vector is pylance's file plus row 3
        assert len(reads.lancetx) == 1
        reads.clear()
        table.delete("id = 4")  # its own file now
        assert reads.lancetx == []
    assert _ids(table.uri, options) == [i for i in range(ROWS) if i not in (1, 2, 3, 4)]


def test_a_delete_planned_before_a_pylance_delete_is_rebased_on_its_file(
    aws: EmbeddedAws, table: lancetx.Table
) -> None:
    """The Table still holds the version before pylance's delete: its vector (from the
    bytes it kept) is rebased by the commit on pylance's file, read from the store."""
    options = aws.pylance_storage_options()
    table.delete("id = 1")
    lance.dataset(table.uri, storage_options=options).delete("id = 2")
    table.delete("id = 3")
    table.delete("id = 4")
    assert _ids(table.uri, options) == [i for i in range(ROWS) if i not in (1, 2, 3, 4)]


def test_a_forgotten_file_is_read_from_the_store(aws: EmbeddedAws, table: lancetx.Table) -> None:
    options = aws.pylance_storage_options()
    table.delete("id = 1")
    DELETION_FILES.clear()
    with DeletionReads(aws) as reads:
        table.delete("id = 2")
        assert len(reads.lancetx) == 1
    assert _ids(table.uri, options) == [i for i in range(ROWS) if i not in (1, 2)]


def test_the_cache_is_bounded_by_bytes_least_recently_used_first() -> None:
    cache = DeletionFileCache(capacity=10, largest=6)
    cache.put("a", b"1234")
    cache.put("b", b"5678")
    assert cache.get("a") == b"1234"  # a is now the most recent
    cache.put("c", b"9012")  # 12 bytes > 10: b goes
    assert cache.get("b") is None
    assert cache.get("a") == b"1234" and cache.get("c") == b"9012"
    cache.put("big", b"1234567")  # larger than ``largest``: not kept
    assert cache.get("big") is None
    cache.put("a", b"xy")  # replaced, sizes recounted
    cache.put("d", b"123456")  # 2 + 4 + 6 = 12 > 10: c (least recent) goes
    assert cache.get("c") is None and cache.get("a") == b"xy" and cache.get("d") == b"123456"
