"""Upserts keep the key unique: racing merge_inserts of one new key land one row.

Two writers plan ``merge_insert(on=key)`` from the same version, both find the key
absent and both insert it. Lance's rule (and ours) makes the second commit a
retryable conflict when both record the keys they inserted (the ``inserted_rows``
filter of the Update); the verb then plans again on the new version, where the key
exists, and updates instead. The filter is computed by lancetx (pylance's
uncommitted merge does not hand it over) for a key annotated
``lance-schema:unenforced-primary-key`` and for any key with
``.conflict_on_inserted_keys()``. Judged with pylance on the embedded legacy S3 +
DynamoDB.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from table_helpers import Api, api_fixture, ddb_uri

import lancetx
import lancetx.aio
from lancetx.externalstore.dynamodb import create_table
from lancetx.externalstore.embedded import EmbeddedAws

PK = {"lance-schema:unenforced-primary-key": "true"}


def keyed_schema(key_type: pa.DataType = pa.int64(), *, annotated: bool = True) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", key_type, nullable=False, metadata=PK if annotated else None),
            pa.field("name", pa.string()),
        ]
    )


def rows(keys: list[Any], name: str, schema: pa.Schema) -> pa.Table:
    return pa.table({"id": keys, "name": [name] * len(keys)}, schema=schema)


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


@pytest.fixture
def options(legacy_aws: EmbeddedAws) -> dict[str, str]:
    return legacy_aws.pylance_storage_options()


@pytest.fixture
def uri(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **legacy_aws.client_kwargs()), ddb_table_name)
    return ddb_uri(bucket, ddb_table_name)


def pylance_keys(uri: str, options: dict[str, str], column: str = "id") -> list[Any]:
    return sorted(lance.dataset(uri, storage_options=options).to_table()[column].to_pylist())


def race(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run ``jobs`` in threads released together; re-raise the first error."""
    barrier = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = jobs[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def upsert(table: Any, data: pa.Table, on: str | list[str] = "id") -> Any:
    return (
        table.merge_insert(on).when_matched_update_all().when_not_matched_insert_all().execute(data)
    )


def test_racing_upserts_of_one_new_key_land_one_row(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    """The Why bullet: two upserts of one new key planned from the same version."""
    schema = keyed_schema()
    api.write_table(uri, rows([1, 2, 3], "old", schema), storage_options=options)
    # Both Tables know version 1 only: each plans against it, as racing writers do.
    first, second = api.open(uri, options), api.open(uri, options)
    if api.is_async:

        async def both() -> list[int]:
            return list(
                await asyncio.gather(
                    upsert(first, rows([10], "first", schema)),
                    upsert(second, rows([10], "second", schema)),
                )
            )

        versions = api.run(both())
    else:
        versions = race(
            [
                lambda: upsert(first, rows([10], "first", schema)),
                lambda: upsert(second, rows([10], "second", schema)),
            ]
        )
    assert sorted(versions) == [2, 3]
    assert pylance_keys(uri, options) == [1, 2, 3, 10]
    # The loser planned again and updated the winner's row.
    loser = first if first.last_commit.plans == 2 else second
    assert {first.last_commit.plans, second.last_commit.plans} == {1, 2}
    name = "first" if loser is first else "second"
    ds = lance.dataset(uri, storage_options=options)
    assert ds.to_table(filter="id = 10")["name"].to_pylist() == [name]
