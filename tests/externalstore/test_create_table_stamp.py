"""The library's ``create_table`` (sync and asyncio) stamps the store's layout as
``lancetx-sync create-table`` does, so a store made either way is the same; a store
stamped by a newer lancetx is refused by both."""

from __future__ import annotations

import asyncio
from typing import Any

import boto3
import pytest
from protocol_helpers import batch, ddb_uri

import lancetx
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.externalstore.dynamodb.store_async import create_table_async, open_client
from lancetx.externalstore.dynamodb.store_schema import (
    CURRENT_SCHEMA_VERSION,
    clear_stamp_cache,
    read_stamp,
    write_stamp,
)
from lancetx.externalstore.errors import StoreSchemaTooNewError
from lancetx.ops.create_table import create_manifest_table


def _client(aws: EmbeddedAws) -> Any:
    return boto3.client("dynamodb", **aws.client_kwargs())


def test_create_table_stamps_the_store_like_the_cli(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    client = _client(aws)
    create_table(client, ddb_table_name)
    assert read_stamp(client, ddb_table_name) == CURRENT_SCHEMA_VERSION
    stamp_item = client.scan(TableName=ddb_table_name)["Items"]
    cli_name = ddb_table_name + "_cli"
    create_manifest_table(client, cli_name)
    assert stamp_item == client.scan(TableName=cli_name)["Items"]  # the very same item
    # and pylance and lancetx write through it as through any store
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    options = aws.pylance_storage_options()
    lancetx.write_table(uri, batch("w", 0, 2), storage_options=options)
    assert [v.version for v in lancetx.history(uri, options)] == [1]


def test_create_table_stamps_a_table_it_finds_unstamped_and_async_alike(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    client = _client(aws)
    client.create_table(  # Lance's layout, made without lancetx (the AWS CLI, say)
        TableName=ddb_table_name,
        KeySchema=[
            {"AttributeName": "base_uri", "KeyType": "HASH"},
            {"AttributeName": "version", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "base_uri", "AttributeType": "S"},
            {"AttributeName": "version", "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    assert read_stamp(client, ddb_table_name) is None
    create_table(client, ddb_table_name)
    assert read_stamp(client, ddb_table_name) == CURRENT_SCHEMA_VERSION

    other = ddb_table_name + "_async"

    async def make() -> str:
        config = DynamoDBConfig.from_options(aws.pylance_storage_options())
        async with open_client(config) as aclient:
            return str((await create_table_async(aclient, other)).status)

    assert asyncio.run(make()) == "ACTIVE"
    assert read_stamp(client, other) == CURRENT_SCHEMA_VERSION


def test_create_table_refuses_a_store_a_newer_lancetx_stamped(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    client = _client(aws)
    create_table(client, ddb_table_name)
    write_stamp(client, ddb_table_name, CURRENT_SCHEMA_VERSION + 1)
    clear_stamp_cache()
    with pytest.raises(StoreSchemaTooNewError):
        create_table(client, ddb_table_name)
    assert read_stamp(client, ddb_table_name) == CURRENT_SCHEMA_VERSION + 1  # never lowered
    clear_stamp_cache()
