"""A DynamoDB client that retries inside botocore is flagged: our loop must see every attempt."""

from __future__ import annotations

import asyncio
import logging

import boto3
import pytest

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore, create_table
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore, open_client

LOGGER = "lancetx.externalstore.dynamodb"


def _config(aws: EmbeddedAws) -> DynamoDBConfig:
    return DynamoDBConfig.from_options(aws.pylance_storage_options())


def test_our_clients_raise_no_warning(
    aws: EmbeddedAws, ddb_table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), ddb_table_name)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        DynamoDBManifestStore(make_client(_config(aws)), ddb_table_name)

        async def main() -> None:
            async with open_client(_config(aws)) as client:
                AsyncDynamoDBManifestStore(client, ddb_table_name, validate=False)

        asyncio.run(main())
    assert "retries inside botocore" not in caplog.text


def test_a_default_boto3_client_is_flagged(
    aws: EmbeddedAws, ddb_table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = boto3.client("dynamodb", **aws.client_kwargs("dynamodb"))  # botocore's default retries
    create_table(client, ddb_table_name)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        DynamoDBManifestStore(client, ddb_table_name)
    assert "retries inside botocore" in caplog.text
    assert "make_client" in caplog.text
