"""The streaming writer and streamed writes: nothing visible before commit, nothing
left behind by an abort, a close without commit, or a failing iterator."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from table_helpers import Api, WriterFacade, api_fixture, data_files, ddb_uri, ids, pylance_rows

import lancetx
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table


@pytest.fixture
def options(aws: EmbeddedAws) -> dict[str, str]:
    return aws.pylance_storage_options()


@pytest.fixture
def uri(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    return ddb_uri(bucket, ddb_table_name)


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


@pytest.fixture
def table(api: Api, uri: str, options: dict[str, str]) -> Any:
    return api.write_table(uri, ids(2), storage_options=options)


def _writer(api: Api, table: Any, **kwargs: Any) -> WriterFacade:
    return WriterFacade(api, table.writer(**kwargs))


def _files(s3_client: Any, bucket: str) -> set[str]:
    return data_files(s3_client, bucket, "t.lance/data/")


def test_commit_writes_once_and_is_invisible_before(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = _files(s3_client, bucket)
    with _writer(
        api, table, commit_message="stream", properties={"k": "v"}, max_rows_per_file=3
    ) as w:
        for start in range(2, 10, 2):
            w.write(ids(2, start=start).to_batches()[0])
        assert lance.dataset(uri, storage_options=options).version == 1  # nothing visible yet
        version = w.commit()
    assert version == 2 == table.version
    assert pylance_rows(uri, options, 2) == ids(10).to_pydict()
    assert len(_files(s3_client, bucket) - before) == 3  # 8 rows, 3 per file: new paths only
    info = api.history(table)[-1]
    assert (info.operation, info.commit_message, info.properties) == (
        "Append",
        "stream",
        {"k": "v"},
    )
    with pytest.raises(lancetx.WriterClosedError, match="committed"):
        w.write(ids(1).to_batches()[0])


def test_abort_removes_every_file(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = _files(s3_client, bucket)
    w = _writer(api, table, max_rows_per_file=2)
    for start in range(0, 8, 2):
        w.write(ids(2, start=start))
    w.abort()
    assert _files(s3_client, bucket) == before
    assert lance.dataset(uri, storage_options=options).version == 1


def test_leaving_the_block_without_commit_aborts(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = _files(s3_client, bucket)
    with _writer(api, table, max_rows_per_file=2) as w:
        w.write(ids(5))
    assert _files(s3_client, bucket) == before
    assert lance.dataset(uri, storage_options=options).version == 1


def test_an_exception_in_the_block_aborts(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = _files(s3_client, bucket)
    with pytest.raises(RuntimeError, match="upstream failed"), _writer(api, table) as w:
        w.write(ids(5))
        raise RuntimeError("upstream failed")
    with pytest.raises(lancetx.SchemaMismatchError), _writer(api, table) as w2:
        w2.write(ids(1))
        w2.write(pa.table({"other": [1]}))
    assert _files(s3_client, bucket) == before
    assert lance.dataset(uri, storage_options=options).version == 1


def _failing(after: int) -> Iterator[pa.RecordBatch]:
    for start in range(after):
        yield ids(1, start=start).to_batches()[0]
    raise ConnectionError("source went away")


def test_an_iterator_error_leaves_no_manifest_and_no_file(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = _files(s3_client, bucket)
    with pytest.raises(ConnectionError, match="source went away"):
        api.run(table.append(_failing(5), max_rows_per_file=2))
    with pytest.raises(ConnectionError, match="source went away"):
        api.write_table(uri, _failing(3), mode="overwrite", storage_options=options)
    assert _files(s3_client, bucket) == before
    assert lance.dataset(uri, storage_options=options).version == 1


def test_a_key_already_committed_returns_its_version_and_removes_the_writers_files(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    """A streaming writer whose idempotency key an earlier commit holds wrote its files
    for nothing: it returns that version (deduplicated) and deletes them."""
    first = api.run(table.append(ids(2, start=50), idempotency_key="load-7"))
    before = _files(s3_client, bucket)
    w = _writer(api, table, idempotency_key="load-7", max_rows_per_file=2)
    w.write(ids(6, start=200))
    assert w.commit() == first == 2
    assert _files(s3_client, bucket) == before  # no orphan left by the retried load
    assert w.writer.result.deduplicated
    assert lance.dataset(uri, storage_options=options).version == 2


def _writer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "lancetx-writer"}


def test_a_dropped_writer_is_aborted_no_file_no_parked_thread(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    """A writer dropped without with/abort()/close() (e.g. an exception between write
    and commit in code that forgot ``with``) is aborted when it is collected: pylance's
    thread ends and its files are deleted."""
    before = _files(s3_client, bucket)
    threads = _writer_threads()
    writer = table.writer(max_rows_per_file=2)
    for start in range(0, 6, 2):
        api.run(writer.write(ids(2, start=start)))
    (thread,) = _writer_threads() - threads
    del writer
    gc.collect()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the writer's thread is still parked on its queue"
    # The last reference may go in another thread (asyncio.to_thread's worker lets go
    # of the write it ran a moment after returning): the abort runs there, so wait
    # for its outcome (generously), not for a duration.
    deadline = time.monotonic() + 60
    while _files(s3_client, bucket) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _files(s3_client, bucket) == before
    assert lance.dataset(uri, storage_options=options).version == 1


def test_close_aborts_an_uncommitted_writer_and_is_idempotent(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = _files(s3_client, bucket)
    writer = table.writer(max_rows_per_file=2)
    api.run(writer.write(ids(5)))
    api.run(writer.close())
    api.run(writer.close())
    assert _files(s3_client, bucket) == before
    with pytest.raises(lancetx.WriterClosedError, match="aborted"):
        api.run(writer.commit())
    committed = table.writer()
    api.run(committed.write(ids(3, start=10)))
    assert api.run(committed.commit()) == 2
    api.run(committed.close())  # after a commit: nothing to do
    assert pylance_rows(uri, options, 2)["id"] == [0, 1, 10, 11, 12]
