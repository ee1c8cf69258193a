"""Caps on objects read whole: manifests, transaction files, tags.

An object at such a name is refused with a typed error naming it and its size,
before its body is read: memory stays far below the object's size (measured with
tracemalloc on local disk, where nothing else allocates; on S3 the requests
themselves show it: no GET asks for more than the cap). A server that ignores
``Range`` is read as a stream, keeping only the tail.
"""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from cli_helpers import make_table

import lancetx
import lancetx.aio
from lancetx.commit.engine.effects import GetObject, run_store
from lancetx.commit.errors import (
    ManifestTooLargeError,
    ObjectTooLargeError,
    StorageOptionError,
    TransactionTooLargeError,
)
from lancetx.commit.format import naming
from lancetx.commit.format.transaction_file import read_transaction_file
from lancetx.commit.storage.limits import (
    DEFAULT_MAX_MANIFEST_BYTES,
    TRANSACTION,
    ReadLimits,
)
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
from lancetx.commit.storage.stores import open_object_store
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.errors import CorruptManifestError
from lancetx.ops.cleanup import tagged_versions
from lancetx.ops.table import open_table

MiB = 1 << 20
HUGE = 64 * MiB
CAP = {"lancetx_max_manifest_bytes": "1MiB", "lancetx_max_transaction_bytes": "1MiB"}


def peak_bytes(action: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """What ``action`` raised and the most memory Python held meanwhile."""
    tracemalloc.start()
    raised: BaseException | None = None
    try:
        action()
    except Exception as exc:
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return raised, peak


def sparse(path: Path, size: int) -> None:
    """A file of ``size`` zero bytes that takes no memory to make (nor disk, mostly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def local_table(tmp_path: Path) -> tuple[str, Path]:
    uri = str(tmp_path / "t.lance")
    lancetx.write_table(uri, pa.table({"a": [1, 2, 3]}))
    (latest,) = sorted((tmp_path / "t.lance" / "_versions").glob("*.manifest"))
    return uri, latest


def test_a_huge_object_at_a_manifest_name_is_refused_on_open_without_reading_it(
    tmp_path: Path,
) -> None:
    uri, latest = local_table(tmp_path)
    sparse(latest, HUGE)
    raised, peak = peak_bytes(lambda: lancetx.open(uri, storage_options=CAP))
    assert isinstance(raised, ManifestTooLargeError), raised
    assert str(latest) in str(raised) and f"{HUGE:,} bytes" in str(raised)
    assert "lancetx_max_manifest_bytes" in str(raised)  # says how to raise the cap
    assert raised.size == HUGE and raised.cap == MiB
    assert peak < 4 * MiB, f"{peak:,} bytes held to refuse a {HUGE:,}-byte manifest"


def test_the_async_door_and_a_manifest_entry_claiming_any_size_are_capped_too(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """An s3+ddb:// table whose latest manifest was replaced by a huge object: the
    item's recorded size (a hint) does not make lancetx read more than the cap, and
    no GET asks for more than the cap (sync and async doors)."""
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    (key,) = [k for k in table.objects("_versions/") if k.endswith(".manifest")]
    s3 = boto3.client("s3", **aws.client_kwargs())
    s3.put_object(Bucket=bucket, Key=key, Body=b"\0" * (4 * MiB))
    item = table.items()[-1]
    item["size"] = {"N": str(4 * MiB)}  # the item now "knows" the big size
    table.ddb.put_item(TableName=ddb_table_name, Item=item)
    asked: list[str] = []

    def record(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.method == "GET" and request.path.endswith(key):
            asked.append(request.headers.get("range", "(whole object)"))
        return None

    options = {**table.options, "lancetx_max_manifest_bytes": "1MiB"}
    aws.set_interceptor(record)
    try:
        # The DynamoDB door explains an unreadable manifest (CorruptManifestError,
        # naming the item); the cause is the cap's typed error.
        with pytest.raises(CorruptManifestError, match=f"{4 * MiB:,} bytes") as sync:
            lancetx.open(table.uri, storage_options=options)

        async def open_async() -> None:
            await lancetx.aio.open(table.uri, storage_options=options)

        with pytest.raises(CorruptManifestError, match=key) as in_async:
            asyncio.run(open_async())
    finally:
        aws.set_interceptor(None)
    for raised in (sync.value, in_async.value):
        assert isinstance(raised.__cause__, ManifestTooLargeError), raised.__cause__
    assert asked, "the manifest was never read"
    for header in asked:
        assert header.startswith("bytes=-"), asked  # a tail, never the whole object
        assert int(header.removeprefix("bytes=-")) <= MiB, asked


def test_a_huge_transaction_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    uri, _ = local_table(tmp_path)
    store, base = open_object_store(uri, CAP)
    name = "0-00000000-0000-4000-8000-000000000000.txn"
    sparse(tmp_path / "t.lance" / "_transactions" / name, HUGE)
    raised, peak = peak_bytes(lambda: read_transaction_file(store, base, name))
    assert isinstance(raised, TransactionTooLargeError), raised
    assert name in str(raised) and f"{HUGE:,}" in str(raised)
    assert peak < 4 * MiB, f"{peak:,} bytes held"
    # The commit loop reads concurrent versions' transaction files as a sans-IO effect.
    key = naming.transaction_key(base, name)
    raised, peak = peak_bytes(lambda: run_store(_get(key), store))
    assert isinstance(raised, TransactionTooLargeError), raised
    assert peak < 4 * MiB, f"{peak:,} bytes held"


def _get(key: str) -> Iterator[Any]:
    data = yield GetObject(key, TRANSACTION)
    return data


def test_a_huge_tag_stops_cleanup_before_it_is_read(tmp_path: Path) -> None:
    uri, _ = local_table(tmp_path)
    sparse(tmp_path / "t.lance" / "_refs" / "tags" / "big.json", HUGE)
    raised, peak = peak_bytes(lambda: tagged_versions(open_table(uri)))
    assert isinstance(raised, ObjectTooLargeError), raised
    assert "big.json" in str(raised) and "lancetx_max_tag_bytes" in str(raised)
    assert peak < 4 * MiB, f"{peak:,} bytes held"


def test_caps_come_from_options_then_the_environment_then_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert ReadLimits().manifest == DEFAULT_MAX_MANIFEST_BYTES == 256 * MiB
    monkeypatch.setenv("LANCETX_MAX_MANIFEST_BYTES", "2KiB")
    store, _ = open_object_store(str(tmp_path / "t.lance"))
    assert store.read_limits == ReadLimits(manifest=2048)
    store, _ = open_object_store(str(tmp_path), {"LANCETX_MAX_MANIFEST_BYTES": "3000"})
    assert store.read_limits is not None and store.read_limits.manifest == 3000
    with pytest.raises(StorageOptionError, match="lancetx_max_tag_bytes"):
        open_object_store(str(tmp_path), {"lancetx_max_tag_bytes": "lots"})


def test_a_server_that_ignores_range_is_streamed_keeping_only_the_tail(
    aws: EmbeddedAws, bucket: str
) -> None:
    """A ranged GET answered with the whole object (200, no Content-Range): the store
    keeps the tail it asked for, never the whole body."""
    body = bytes(range(256)) * (HUGE // 256)

    def whole_object(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.method == "GET" and "range" in request.headers:
            return InterceptedResponse(200, body, [("Content-Type", "binary/octet-stream")])
        return None

    config = S3Config(
        endpoint_url=aws.endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
    )
    store = S3ObjectStore(bucket, config=config)
    store.put("k", b"x")  # the client is built (its service model loaded) before measuring
    aws.set_interceptor(whole_object)
    try:
        raised, peak = peak_bytes(lambda: _check_tail(store.get_tail("k", MiB), body))
    finally:
        aws.set_interceptor(None)
    assert raised is None, raised
    # Client and server share this process: a few MiB of buffers besides the tail.
    assert peak < 16 * MiB, f"{peak:,} bytes held for a 1 MiB tail of {HUGE:,}"


def _check_tail(got: tuple[bytes, int], body: bytes) -> None:
    tail, total = got
    assert total == len(body) and tail == body[-MiB:]


@pytest.fixture(autouse=True)
def _no_env_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("LANCETX_MAX_"):
            monkeypatch.delenv(name)
