"""A DynamoDB endpoint without transactions (dynalite): a keyed commit is refused with
a typed error naming the operation and the endpoint, nothing is claimed, the files it
wrote are removed (the request provably was not applied), and commits without a key
keep working.

On the embedded server the endpoint's answer is dynalite's, sent by the request
interceptor; against ``make test-localstack``'s dynalite it is the real one.
"""

from __future__ import annotations

import json

import boto3
import external_backend
import pyarrow as pa
import pytest

import lancetx
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.errors import InvalidRequestError, OperationNotImplementedError
from lancetx.externalstore.dynamodb.store import create_table

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration


def _answer_like_dynalite(request: InterceptedRequest) -> InterceptedResponse | None:
    if request.service != "dynamodb" or request.target != "TransactWriteItems":
        return None
    body = {"__type": "com.amazon.coral.service#UnknownOperationException"}
    return InterceptedResponse(
        400, json.dumps(body).encode(), [("Content-Type", "application/x-amz-json-1.0")]
    )


def _take_transactions_away(aws: EmbeddedAws) -> None:
    if isinstance(aws, external_backend.ExternalAws):
        if aws.implements_transactions():
            pytest.skip("this run's DynamoDB implements TransactWriteItems")
        return  # dynalite: its own answer
    aws.set_interceptor(_answer_like_dynalite)


def _data_files(s3: object, bucket: str) -> list[str]:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix="t.lance/data/")  # type: ignore[attr-defined]
    return sorted(o["Key"] for o in listing.get("Contents", []))


def test_a_keyed_append_is_refused_typed_and_keeps_no_files(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), ddb_table_name)
    uri = f"s3+ddb://{bucket}/t.lance?ddbTableName={ddb_table_name}"
    options = aws.pylance_storage_options()
    table = lancetx.write_table(uri, pa.table({"id": [1, 2]}), storage_options=options)
    s3 = boto3.client("s3", **aws.client_kwargs())
    files_before = _data_files(s3, bucket)

    try:
        _take_transactions_away(aws)
        with pytest.raises(OperationNotImplementedError) as info:
            table.append(pa.table({"id": [3]}), idempotency_key="batch-1")
        # A plain commit needs no transaction: the table stays writable.
        table.append(pa.table({"id": [4]}))
    finally:
        if not isinstance(aws, external_backend.ExternalAws):
            aws.set_interceptor(None)

    error = info.value
    assert isinstance(error, InvalidRequestError) and not error.retryable
    message = str(error)
    assert "TransactWriteItems" in message and "UnknownOperationException" in message
    assert "idempotency key" in message and "was not applied" in message
    assert aws.client_kwargs("dynamodb")["endpoint_url"] in message
    reopened = lancetx.open(uri, options)
    assert reopened.version == 2
    assert sorted(reopened.to_table()["id"].to_pylist()) == [1, 2, 4]
    # The refused commit's data file is gone; the later append's one is the only new file.
    assert len(_data_files(s3, bucket)) == len(files_before) + 1
