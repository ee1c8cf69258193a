"""Errors users see: always a LancetxError, naming the option or the URI they passed."""

from __future__ import annotations

import boto3
import lance
import pyarrow as pa
import pytest

from lancetx.commit.engine.committer import (
    CommitOptions,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import (
    ExpectedVersionMismatchError,
    LancetxError,
    StorageOptionError,
    VersionNotFoundError,
)
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.externalstore.errors import InvalidConfigError

pytestmark = pytest.mark.integration


def _uri(bucket: str, table: str) -> str:
    return f"s3+ddb://{bucket}/dir/t.lance?ddbTableName={table}"


def test_bad_s3_region_option_is_a_lancetx_error_naming_the_option(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = {**aws.pylance_storage_options(), "aws_region": "eu west 1"}
    with pytest.raises(StorageOptionError) as info:
        connect(_uri(bucket, ddb_table_name), options)
    assert "aws_region='eu west 1' is not an AWS region name" in str(info.value)


def test_bad_dynamodb_region_option_is_a_lancetx_error_naming_the_option(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = {**aws.pylance_storage_options(), "dynamodb_region": "us_east/1"}
    with pytest.raises(InvalidConfigError) as info:
        connect(_uri(bucket, ddb_table_name), options)
    assert isinstance(info.value, LancetxError)
    assert "dynamodb_region='us_east/1'" in str(info.value)
    assert "not an AWS region name" in str(info.value)


def test_bad_region_from_the_environment_is_a_lancetx_error(
    aws: EmbeddedAws, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No region option: boto3 takes AWS_DEFAULT_REGION, and botocore's InvalidRegionError
    must not escape from building the client."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "not a region")
    monkeypatch.delenv("AWS_REGION", raising=False)
    options = {k: v for k, v in aws.pylance_storage_options().items() if k not in ("aws_region",)}
    with pytest.raises(LancetxError) as info:
        conn = connect(f"s3://{bucket}/t.lance", options)
        load_parent(conn.handler, conn.base)
    message = str(info.value)
    assert "'not a region' is not an AWS region name" in message and "AWS_REGION" in message


@pytest.fixture
def table(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    """An s3+ddb:// table at version 1."""
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), ddb_table_name)
    uri = _uri(bucket, ddb_table_name)
    lance.write_dataset(pa.table({"x": [1]}), uri, storage_options=aws.pylance_storage_options())
    return uri


def test_missing_version_names_the_s3_ddb_uri(aws: EmbeddedAws, table: str) -> None:
    conn = connect(table, aws.pylance_storage_options())
    with pytest.raises(VersionNotFoundError) as info:
        conn.handler.resolve_version(conn.base, 7)
    assert info.value.uri == table
    assert repr(table) in str(info.value)


def test_commit_errors_name_the_s3_ddb_uri(aws: EmbeddedAws, table: str) -> None:
    options = aws.pylance_storage_options()
    conn = connect(table, options)
    parent = load_parent(conn.handler, conn.base)
    assert parent is not None
    lance.write_dataset(pa.table({"x": [2]}), table, mode="append", storage_options=options)
    files = lance.fragment.write_fragments(
        pa.table({"x": [3]}), conn.data_uri, storage_options=options
    )
    from lancetx.commit.format.fragments import fragment_from_pylance

    txn = Transaction(
        read_version=parent.version,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in files)),
    )
    with pytest.raises(ExpectedVersionMismatchError) as info:
        commit_transaction(
            conn.handler, conn.base, txn, parent=parent, options=CommitOptions(expected_version=1)
        )
    message = str(info.value)
    assert table in message, message
    assert "s3://" not in message, message
