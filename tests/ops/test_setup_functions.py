"""The maintenance functions behind ``status``, ``create-table`` and
``migrate-to-conditional-put``, called directly (``tests/cli`` runs the commands as
subprocesses): what each reports, what it changes and what it refuses."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from cli_helpers import DdbTable, make_table

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store_schema import CURRENT_SCHEMA_VERSION, read_stamp
from lancetx.externalstore.errors import DynamoDBTableSchemaError, TableMovedError
from lancetx.ops.create_table import create_manifest_table
from lancetx.ops.migrate import migrate_to_conditional_put
from lancetx.ops.status import table_status
from lancetx.ops.table import open_table


def _stage_latest(table: DdbTable) -> str:
    """Leave the newest version unfinalized, as a writer stopped between claim and
    copy does: its item points at a staged copy, its final manifest is gone."""
    finals = sorted(k for k in table.objects("_versions/") if k.endswith(".manifest"))
    final = finals[0]  # V2 names sort newest first
    staged = f"{final}-00000000-0000-4000-8000-000000000000"
    table.s3.copy_object(
        Bucket=table.bucket, Key=staged, CopySource={"Bucket": table.bucket, "Key": final}
    )
    table.s3.delete_object(Bucket=table.bucket, Key=final)
    item = table.items()[-1]
    item["path"] = {"S": staged}
    table.ddb.put_item(TableName=table.ddb_table, Item=item)
    return staged


def test_status_reports_versions_committers_and_an_unfinalized_version(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=3)
    report = table_status(open_table(table.uri, table.options))
    assert report.latest_version == 3 and report.item_count == 3
    assert report.staged_versions == [] and report.manifests_in_store == 3
    assert report.last_operation == "append" and report.moved_to is None
    assert sum(report.committers.values()) == 3

    _stage_latest(table)
    staged = table_status(open_table(table.uri, table.options))
    assert staged.latest_version == 3 and staged.staged_versions == [3]
    assert staged.staged_objects_in_store == 1 and staged.manifests_in_store == 2


def test_create_manifest_table_dry_run_create_and_again(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    ddb: Any = boto3.client("dynamodb", **aws.client_kwargs())
    dry = create_manifest_table(ddb, ddb_table_name, dry_run=True)
    assert dry.dry_run and not dry.created and dry.request["BillingMode"] == "PAY_PER_REQUEST"
    assert ddb_table_name not in ddb.list_tables()["TableNames"]

    made = create_manifest_table(ddb, ddb_table_name, tags={"team": "data"})
    assert made.created and made.status == "ACTIVE" and made.arn
    assert read_stamp(ddb, ddb_table_name) == CURRENT_SCHEMA_VERSION
    keys = ddb.describe_table(TableName=ddb_table_name)["Table"]["KeySchema"]
    assert {(k["AttributeName"], k["KeyType"]) for k in keys} == {
        ("base_uri", "HASH"),
        ("version", "RANGE"),
    }
    again = create_manifest_table(ddb, ddb_table_name)
    assert not again.created and again.status == "ACTIVE"


def test_create_manifest_table_refuses_a_table_of_another_layout(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    ddb: Any = boto3.client("dynamodb", **aws.client_kwargs())
    ddb.create_table(
        TableName=ddb_table_name,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with pytest.raises(DynamoDBTableSchemaError, match="wrong key schema"):
        create_manifest_table(ddb, ddb_table_name)
    assert ddb.scan(TableName=ddb_table_name)["Items"] == []  # not stamped: nothing written


def test_migrate_refuses_a_legacy_store_plans_then_moves_once(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name)
    staged = _stage_latest(table)

    refused = migrate_to_conditional_put(open_table(table.uri, table.options))
    assert refused.conditional_put is False and not refused.moved and not refused.ok
    assert table.items()[-1]["path"]["S"] == staged  # nothing changed

    legacy_aws.legacy_s3 = False
    planned = migrate_to_conditional_put(open_table(table.uri, table.options), dry_run=True)
    assert planned.ok and planned.finalized == [2] and not planned.moved
    assert table.items()[-1]["path"]["S"] == staged

    moved = migrate_to_conditional_put(open_table(table.uri, table.options))
    new_uri = f"s3://{bucket}/{table.path}"
    assert moved.ok and moved.moved and moved.finalized == [2] and moved.new_uri == new_uri
    assert not table.items()[-1]["path"]["S"].endswith("-00000000-0000-4000-8000-000000000000")
    assert table_status(open_table(table.uri, table.options)).moved_to == new_uri

    again = migrate_to_conditional_put(open_table(table.uri, table.options))
    assert again.moved and again.new_uri == new_uri and again.finalized == []

    import lancetx

    with pytest.raises(TableMovedError, match=new_uri):
        lancetx.open(table.uri, table.options)
