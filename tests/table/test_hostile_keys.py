"""Idempotency keys a hostile (or careless) user passes, at every door that takes one.

* An empty key used to be taken as "no key": ``append(..., idempotency_key="")`` twice
  committed twice (a key read from an unset environment variable loses idempotency
  without a word). A key that is not valid UTF-8 (a lone surrogate) failed with a raw
  ``UnicodeEncodeError``, one too large for a DynamoDB item with a ``ValidationException``
  that blamed the table's key types. All three are refused before anything is written
  (``InvalidIdempotencyKeyError``, a ``ValueError``), the table unchanged, no file left.
* What held: a 10 kB key, a unicode key with a NUL, the same key on two tables of one
  DynamoDB table (independent), and a key reused with other data (by design: the key
  names the commit, the first commit's version comes back, the new data is not written).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import boto3
import lance
import pytest
from table_helpers import data_files, ddb_uri, ids

import lancetx
import lancetx.aio
from lancetx.committing import MAX_IDEMPOTENCY_KEY_BYTES
from lancetx.demo.embedded import EmbeddedAws
from lancetx.errors import InvalidIdempotencyKeyError
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.table import Table

#: Keys every door refuses.
BAD_KEYS = {
    "empty": "",
    "surrogate": "job-\ud800-1",
    "too-large": "k" * (MAX_IDEMPOTENCY_KEY_BYTES + 1),
}


def _append(table: Table, key: str) -> Any:
    return table.append(ids(3, 100), idempotency_key=key)


def _async_append(table: Table, key: str) -> Any:
    async def main() -> int:
        other = await lancetx.aio.open(table.uri, table.storage_options)
        return await other.append(ids(3, 100), idempotency_key=key)

    return asyncio.run(main())


def _writer(table: Table, key: str) -> Any:
    with table.writer(idempotency_key=key) as w:
        w.write(ids(3, 100))
        return w.commit()


def _commit_fragments(table: Table, key: str) -> Any:
    return lancetx.commit_fragments(
        table.uri,
        [],
        schema=ids(1).schema,
        storage_options=table.storage_options,
        idempotency_key=key,
    )


DOORS: dict[str, Callable[[Table, str], Any]] = {
    "append": _append,
    "async-append": _async_append,
    "writer": _writer,
    "commit_fragments": _commit_fragments,
}


@pytest.fixture
def tables(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> tuple[Table, Table]:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    options = aws.pylance_storage_options()
    made = [
        lancetx.write_table(ddb_uri(bucket, ddb_table_name, name), ids(2), storage_options=options)
        for name in ("t.lance", "u.lance")
    ]
    return made[0], made[1]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("bad", BAD_KEYS)
def test_a_bad_key_is_refused_before_anything_is_written(
    door: str, bad: str, tables: tuple[Table, Table], aws: EmbeddedAws, bucket: str
) -> None:
    table = tables[0]
    s3 = boto3.client("s3", **aws.client_kwargs())
    before = data_files(s3, bucket, "t.lance/")
    with pytest.raises(InvalidIdempotencyKeyError) as info:
        DOORS[door](table, BAD_KEYS[bad])
    assert isinstance(info.value, ValueError)
    assert "idempotency key" in str(info.value), str(info.value)
    assert len(str(info.value)) < 1000  # the 64 KiB key is not echoed whole
    assert data_files(s3, bucket, "t.lance/") == before
    assert lance.dataset(table.uri, storage_options=table.storage_options).version == 1


def test_odd_keys_that_are_valid_land_once(tables: tuple[Table, Table]) -> None:
    table, other = tables
    for key in ("k" * 10_000, "ключ-🔑-\u0000-x", " "):
        version = table.append(ids(1, 10), idempotency_key=key)
        assert table.append(ids(1, 20), idempotency_key=key) == version
        assert table.last_commit is not None and table.last_commit.deduplicated
        assert table.find_idempotency_key(key) == version
    # One DynamoDB table, two Lance tables: a key of one says nothing about the other.
    assert table.append(ids(1, 30), idempotency_key="shared") == 5
    assert other.append(ids(1, 30), idempotency_key="shared") == 2
    assert other.last_commit is not None and not other.last_commit.deduplicated
    # A key reused with other data is the same commit (by design): its version back,
    # the new rows not written.
    assert table.append(ids(7, 500), idempotency_key="shared") == 5
    rows = lance.dataset(table.uri, storage_options=table.storage_options).to_table()
    assert rows.num_rows == 2 + 4 and 500 not in rows["id"].to_pylist()
