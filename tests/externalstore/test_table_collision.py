"""Two buckets, the same table path, one DynamoDB table.

Lance's DynamoDB key is the path inside the bucket, so both tables' items share
one key. lancetx records the bucket in its items and refuses another bucket's
item with ``TableCollisionError`` naming both buckets, the DynamoDB table and
the fix — at the second table's first open and first commit, before anything
is written. Items pylance wrote (no bucket) are refused when the manifest they
point at is not in our bucket. The first table is left untouched.
"""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import lance
import pytest
from protocol_helpers import (
    batch,
    create_transaction,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.externalstore.errors import TableCollisionError

PATH = "shared/events.lance"


def _state(aws: EmbeddedAws, bucket: str, ddb_table: str) -> tuple[dict[str, str], list[Any]]:
    s3 = boto3.client("s3", **aws.client_kwargs())
    ddb = boto3.client("dynamodb", **aws.client_kwargs())
    objects = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    items = ddb.scan(TableName=ddb_table, ConsistentRead=True)["Items"]
    return objects, sorted(items, key=lambda i: int(i["version"]["N"]))


def _second_bucket(aws: EmbeddedAws) -> str:
    name = f"lancetx-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket=name)
    return name


def _check(error: TableCollisionError, first: str | None, second: str, ddb_table: str) -> None:
    message = str(error)
    assert error.bucket == second and error.other_bucket == first
    assert error.base_uri == PATH and error.dynamodb_table == ddb_table
    for part in (repr(second), repr(ddb_table), "another DynamoDB table", "another path"):
        assert part in message
    if first is not None:
        assert repr(first) in message


@pytest.mark.parametrize("first_writer", ["lancetx", "pylance"])
def test_second_bucket_at_the_same_path_is_refused_and_the_first_untouched(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, first_writer: str
) -> None:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    first_uri = ddb_uri(bucket, PATH, ddb_table_name)
    pylance_create(first_uri, options, batch("first", 0, 5))
    if first_writer == "lancetx":
        first = connect(first_uri, options)
        lancetx_append(first.handler, first.base, first.data_uri, options, batch("first", 1, 3))
    else:
        pylance_append(first_uri, options, batch("first", 1, 3))
    expected_other = bucket if first_writer == "lancetx" else None

    other_bucket = _second_bucket(aws)
    other_uri = ddb_uri(other_bucket, PATH, ddb_table_name)
    before = _state(aws, bucket, ddb_table_name)

    # First open of the second table.
    conn = connect(other_uri, options)
    with pytest.raises(TableCollisionError) as opened:
        load_parent(conn.handler, conn.base)
    _check(opened.value, expected_other, other_bucket, ddb_table_name)

    # First commit of the second table: a create (Overwrite) without a parent in hand.
    with pytest.raises(TableCollisionError) as committed:
        txn = create_transaction(conn.data_uri, options, batch("second", 0, 2))
        commit_transaction(conn.handler, conn.base, txn)
    _check(committed.value, expected_other, other_bucket, ddb_table_name)
    data_files = set(_state(aws, other_bucket, ddb_table_name)[0])
    assert all("/data/" in key for key in data_files)  # only pylance's data files: no commit

    # And an append by the lancetx helper, which opens first.
    with pytest.raises(TableCollisionError):
        lancetx_append(conn.handler, conn.base, conn.data_uri, options, batch("second", 0, 2))

    # Nothing of the first table changed; pylance reads every version of it.
    assert _state(aws, bucket, ddb_table_name) == before
    assert set(_state(aws, other_bucket, ddb_table_name)[0]) - data_files == set()
    ds = lance.dataset(first_uri, storage_options=options)
    assert ds.version == 2
    for version, rows in ((1, 5), (2, 8)):
        assert (
            lance.dataset(first_uri, version=version, storage_options=options).count_rows() == rows
        )


def test_items_record_their_bucket(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> None:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, PATH, ddb_table_name)
    pylance_create(uri, options, batch("first", 0, 5))
    conn = connect(uri, options)
    lancetx_append(conn.handler, conn.base, conn.data_uri, options, batch("first", 1, 3))
    items = _state(aws, bucket, ddb_table_name)[1]
    assert "bucket" not in items[0]  # pylance's
    assert items[1]["bucket"] == {"S": bucket}
    # pylance ignores the attribute: it reads and appends as usual.
    assert pylance_append(uri, options, batch("pylance", 0, 1)) == 3
