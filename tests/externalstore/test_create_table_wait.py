"""create_table waits while DynamoDB reports CREATING, and gives up with a typed error.

moto creates tables ACTIVE at once, so the embedded server's interceptor answers
the first DescribeTable calls with a CREATING table, as real DynamoDB does for
several seconds after CreateTable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.externalstore.errors import ExternalStoreError


def _creating(table: str) -> InterceptedResponse:
    body = {
        "Table": {
            "TableName": table,
            "TableStatus": "CREATING",
            "KeySchema": [
                {"AttributeName": "base_uri", "KeyType": "HASH"},
                {"AttributeName": "version", "KeyType": "RANGE"},
            ],
            "AttributeDefinitions": [
                {"AttributeName": "base_uri", "AttributeType": "S"},
                {"AttributeName": "version", "AttributeType": "N"},
            ],
        }
    }
    return InterceptedResponse(
        200, json.dumps(body).encode(), [("Content-Type", "application/x-amz-json-1.0")]
    )


@pytest.fixture
def creating_for(aws: EmbeddedAws) -> Iterator[list[int]]:
    """Answer the first N DescribeTable calls with CREATING; yields [N, calls seen]."""
    state = [0, 0]

    def intercept(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service == "dynamodb" and request.target == "DescribeTable":
            state[1] += 1
            if state[1] <= state[0]:
                return _creating(json.loads(request.body)["TableName"])
        return None

    aws.set_interceptor(intercept)
    try:
        yield state
    finally:
        aws.set_interceptor(None)


def test_create_table_polls_until_active(
    aws: EmbeddedAws, ddb_table_name: str, creating_for: list[int]
) -> None:
    creating_for[0] = 3
    client = boto3.client("dynamodb", **aws.client_kwargs("dynamodb"))
    info = create_table(client, ddb_table_name, timeout=10)
    assert creating_for[1] == 4  # three CREATING answers, then the real ACTIVE table
    assert info.name == ddb_table_name and info.status == "ACTIVE"


def test_create_table_gives_up_after_its_timeout(
    aws: EmbeddedAws, ddb_table_name: str, creating_for: list[int]
) -> None:
    creating_for[0] = 10**6
    client = boto3.client("dynamodb", **aws.client_kwargs("dynamodb"))
    with pytest.raises(ExternalStoreError, match="still CREATING") as info:
        create_table(client, ddb_table_name, timeout=0.2)
    assert "dynamodb:DescribeTable" in str(info.value)
    assert ddb_table_name in str(info.value)
