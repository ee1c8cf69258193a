"""A table path that is one of lancetx's own DynamoDB keys is refused.

One DynamoDB table holds many Lance tables, each under its path (``base_uri``), and
lancetx keeps its own items beside them under derived keys: a table's idempotency
keys under ``<path>#lancetx-keys``, its commit queue under
``<path>#lancetx-commit-queue``, the record that it moved under
``__lancetx_moved__/<path>``, the store's layout stamp under ``__lancetx_schema__``.
A table whose path *is* such a key (``#`` written ``%23`` in the URI) used to be
created and written: its versions landed among another table's key items, and
``iam-policy`` granted its writer role the other table's keys — the attacks of issue
24 (moving another table, deleting its idempotency keys, a layout stamp of 999) by
naming a table. Such paths are refused with InvalidUriError before any request.
"""

from __future__ import annotations

import boto3
import pyarrow as pa
import pytest
from cli_helpers import run_cli

import lancetx
from lancetx.commit.errors import InvalidUriError
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.base import KEYS_SUFFIX
from lancetx.externalstore.dynamodb.commit_queue import QUEUE_SUFFIX
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.externalstore.dynamodb.store_schema import STAMP_BASE_URI
from lancetx.externalstore.dynamodb.uri import parse_ddb_uri
from lancetx.externalstore.moved import MOVED_PREFIX
from lancetx.ops.iam_policy import iam_policies
from lancetx.ops.table import open_table

#: Paths (as written in a URI) that are another table's keys, or the stamp's.
RESERVED = {
    "keys": "t.lance%23lancetx-keys",
    "queue": "t.lance%23lancetx-commit-queue",
    "moved": "__lancetx_moved__/t.lance",
    "stamp": "__lancetx_schema__",
}


def _uri(bucket: str, path: str, ddb_table: str) -> str:
    return f"s3+ddb://{bucket}/{path}?ddbTableName={ddb_table}"


def test_every_derived_key_is_covered() -> None:
    bases = {parse_ddb_uri(_uri("b", "t.lance", "T")).base_key}
    derived = {
        "keys": f"t.lance{KEYS_SUFFIX}",
        "queue": f"t.lance{QUEUE_SUFFIX}",
        "moved": f"{MOVED_PREFIX}t.lance",
        "stamp": STAMP_BASE_URI,
    }
    for kind, key in derived.items():
        assert key not in bases
        with pytest.raises(InvalidUriError, match="reserved"):
            parse_ddb_uri(_uri("b", RESERVED[kind], "T"))
    # Lookalikes that are no other table's key stay open to users.
    for path in ("t%23x.lance", "lancetx-keys/t.lance", "x/__lancetx_moved__/t.lance"):
        parse_ddb_uri(_uri("b", path, "T"))


@pytest.mark.parametrize("kind", RESERVED)
def test_a_reserved_path_is_refused_before_any_request(
    kind: str, aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    ddb = boto3.client("dynamodb", **aws.client_kwargs())
    create_table(ddb, ddb_table_name)
    options = aws.pylance_storage_options()
    lancetx.write_table(
        _uri(bucket, "t.lance", ddb_table_name), pa.table({"x": [1]}), storage_options=options
    ).append(pa.table({"x": [2]}), idempotency_key="k")
    before = ddb.scan(TableName=ddb_table_name)["Items"]
    uri = _uri(bucket, RESERVED[kind], ddb_table_name)
    with pytest.raises(InvalidUriError, match="reserved"):
        lancetx.write_table(uri, pa.table({"x": [1]}), storage_options=options)
    with pytest.raises(InvalidUriError, match="reserved"):
        iam_policies(
            open_table(uri, options, validate=False), account="123456789012", region="us-east-1"
        )
    assert ddb.scan(TableName=ddb_table_name)["Items"] == before
    table = lancetx.open(_uri(bucket, "t.lance", ddb_table_name), storage_options=options)
    assert table.find_idempotency_key("k") == 2


def test_the_cli_refuses_a_reserved_path_as_a_usage_error(aws: EmbeddedAws) -> None:
    done = run_cli(
        aws,
        "iam-policy",
        _uri("b", RESERVED["moved"], "T"),
        "--account",
        "123456789012",
        "--region",
        "us-east-1",
    )
    assert done.code == 2, done.stdout + done.stderr
    assert "reserved" in done.stderr and "Statement" not in done.stdout
