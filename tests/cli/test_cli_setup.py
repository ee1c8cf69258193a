"""``lancetx-sync create-table / doctor / iam-policy / migrate-to-conditional-put`` and the
store layout stamp."""

from __future__ import annotations

import asyncio
import json

import boto3
import pytest
from cli_helpers import access_denied, make_table, read_versions, run_cli
from protocol_helpers import batch, ensure_ddb_table, lancetx_append

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore, clear_validation_cache
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.dynamodb.store_schema import (
    CURRENT_SCHEMA_VERSION,
    MigrationStep,
    _step,
    clear_stamp_cache,
    migrate,
    read_stamp,
    write_stamp,
)
from lancetx.externalstore.errors import StoreSchemaTooNewError, TableMovedError
from lancetx.ops.doctor import run_doctor
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


def test_create_table_provisioned_tagged_with_pitr_waits_active_and_stamps(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    ddb = boto3.client("dynamodb", **aws.client_kwargs())
    dry = run_cli(aws, "create-table", ddb_table_name, "--dry-run", "--json")
    assert dry.code == 0 and dry.json["request"]["BillingMode"] == "PAY_PER_REQUEST"
    assert ddb_table_name not in ddb.list_tables()["TableNames"]

    args = ["--read-capacity", "3", "--write-capacity", "4", "--tag", "team=data", "--pitr"]
    made = run_cli(aws, "create-table", ddb_table_name, *args, "--json")
    assert made.code == 0, made.stdout + made.stderr
    assert made.json["created"] is True and made.json["status"] == "ACTIVE"
    assert made.json["schema_version"] == CURRENT_SCHEMA_VERSION
    table = ddb.describe_table(TableName=ddb_table_name)["Table"]
    assert table["ProvisionedThroughput"]["ReadCapacityUnits"] == 3
    assert table["ProvisionedThroughput"]["WriteCapacityUnits"] == 4
    tags = ddb.list_tags_of_resource(ResourceArn=table["TableArn"])["Tags"]
    assert {"Key": "team", "Value": "data"} in tags
    backups = ddb.describe_continuous_backups(TableName=ddb_table_name)
    pitr = backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]
    assert pitr["PointInTimeRecoveryStatus"] == "ENABLED"
    assert read_stamp(ddb, ddb_table_name) == CURRENT_SCHEMA_VERSION

    again = run_cli(aws, "create-table", ddb_table_name, "--json")
    assert again.code == 0 and again.json["created"] is False


def test_a_store_stamped_by_a_newer_lancetx_is_refused(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    client = make_client(DynamoDBConfig.from_options(options))
    write_stamp(client, ddb_table_name, CURRENT_SCHEMA_VERSION + 1)
    clear_validation_cache()
    clear_stamp_cache()
    with pytest.raises(StoreSchemaTooNewError, match="upgrade lancetx"):
        DynamoDBManifestStore(client, ddb_table_name)
    conn = connect(f"s3+ddb://any/t.lance?ddbTableName={ddb_table_name}", options)
    with pytest.raises(StoreSchemaTooNewError):  # at the connection's first use
        conn.handler.resolve_latest(conn.base)

    async def open_async() -> None:
        config = DynamoDBConfig.from_options(options)
        async with AsyncDynamoDBManifestStore.open(ddb_table_name, config):
            pass

    clear_validation_cache()
    clear_stamp_cache()
    with pytest.raises(StoreSchemaTooNewError, match="upgrade lancetx"):
        asyncio.run(open_async())
    write_stamp(client, ddb_table_name, CURRENT_SCHEMA_VERSION)  # never lowered
    assert read_stamp(client, ddb_table_name) == CURRENT_SCHEMA_VERSION + 1


def test_store_migrations_are_idempotent_steps(aws: EmbeddedAws, ddb_table_name: str) -> None:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)  # made without a stamp, as pylance users do
    client = make_client(DynamoDBConfig.from_options(options))
    assert read_stamp(client, ddb_table_name) is None
    planned = migrate(client, ddb_table_name, dry_run=True)
    assert planned == [MigrationStep(0, 1, planned[0].description)]
    assert read_stamp(client, ddb_table_name) is None
    assert [(s.source, s.target) for s in migrate(client, ddb_table_name)] == [(0, 1)]
    assert read_stamp(client, ddb_table_name) == 1
    assert migrate(client, ddb_table_name) == []
    with pytest.raises(ValueError, match="no migration from store layout 1"):
        _step(1)  # 1 is the newest layout: a new one needs a new arm (and a test)


def test_doctor_reports_each_permission_and_whether_the_bucket_honours_if_none_match(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name, versions=1)
    legacy_aws.set_interceptor(access_denied("DeleteItem"))
    found = run_cli(legacy_aws, "doctor", table.uri, "--json")
    legacy_aws.set_interceptor(None)
    assert found.code == 1, found.stdout + found.stderr
    checks = {c["name"]: c["status"] for c in found.json["checks"]}
    assert checks["dynamodb:DeleteItem"] == "denied"
    for ok in (
        "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query",
        "dynamodb:PutItem", "dynamodb:UpdateItem",
    ):  # fmt: skip
        assert checks[ok] == "ok", ok
    for ok in ("s3:ListBucket", "s3:PutObject", "s3:GetObject", "s3:DeleteObject", "key-schema"):
        assert checks[ok] == "ok", ok
    assert checks["clock-skew"] == "ok" and checks["shared-base-uri"] == "ok"
    assert checks["store-schema"] == "warning"  # made without a stamp
    assert found.json["conditional_put"] is False and checks["conditional-put"] == "warning"

    legacy_aws.legacy_s3 = False
    healthy = run_cli(legacy_aws, "doctor", table.uri, "--json", via_env=False)
    assert healthy.code == 0, healthy.stdout
    assert healthy.json["conditional_put"] is True
    assert table.objects() == sorted(
        k for k in table.objects() if "_lancetx_probe" not in k
    )  # probes cleaned up


def test_doctor_reports_a_policy_without_batch_get_item(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Opening a table reads its checks in one BatchGetItem: doctor probes that action
    too, read-only (it runs under --dry-run), and says how to grant it."""
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    aws.set_interceptor(access_denied("BatchGetItem"))
    found = run_cli(aws, "doctor", table.uri, "--dry-run", "--json")
    aws.set_interceptor(None)
    assert found.code == 1, found.stdout + found.stderr
    (check,) = [c for c in found.json["checks"] if c["name"] == "dynamodb:BatchGetItem"]
    assert check["status"] == "denied"
    assert ddb_table_name in check["detail"] and "iam-policy" in check["fix"]
    checks = {c["name"]: c["status"] for c in found.json["checks"]}
    assert checks["dynamodb:GetItem"] == checks["dynamodb:Query"] == "ok"


def test_doctor_reports_a_writer_policy_without_the_commit_queues_update_item(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Writers under contention take turns through UpdateItem: doctor probes it
    (a write probe, on the probe item it removes) and says what is lost without it."""
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    aws.set_interceptor(access_denied("UpdateItem"))
    found = run_cli(aws, "doctor", table.uri, "--json")
    aws.set_interceptor(None)
    assert found.code == 1, found.stdout + found.stderr
    (check,) = [c for c in found.json["checks"] if c["name"] == "dynamodb:UpdateItem"]
    assert check["status"] == "denied"
    assert "commit queue" in check["detail"] and "iam-policy" in check["fix"]
    skipped = run_cli(aws, "doctor", table.uri, "--dry-run", "--json")
    (check,) = [c for c in skipped.json["checks"] if c["name"] == "dynamodb:UpdateItem"]
    assert check["status"] == "skipped"
    leftovers = boto3.client("dynamodb", **aws.client_kwargs()).scan(TableName=ddb_table_name)
    assert not [i for i in leftovers["Items"] if "doctor_probe" in i]  # the probe item is gone


def test_doctor_finds_another_buckets_table_sharing_the_path_and_dynamodb_table(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    first = make_table(aws, bucket, ddb_table_name, "shared/t.lance")
    before = read_versions(first.uri, first.options)
    other = f"{bucket}-b"
    boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket=other)
    second_uri = first.uri.replace(f"s3+ddb://{bucket}/", f"s3+ddb://{other}/")

    found = run_cli(aws, "doctor", second_uri, "--dry-run", "--json")
    assert found.code == 1
    (check,) = [c for c in found.json["checks"] if c["name"] == "shared-base-uri"]
    assert check["status"] == "failed"
    assert other in check["detail"] and "another bucket" in check["detail"]
    assert "ddbTableName" in check["fix"]
    seen = verify_table(open_table(second_uri, first.options))
    assert [f.kind for f in seen.findings] == ["table_collision"]
    assert run_doctor(open_table(first.uri, first.options), probe_writes=False).ok
    assert read_versions(first.uri, first.options) == before


def test_iam_policy_grants_every_action_lancetx_uses_and_no_more(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Which actions each role gets (the request-level proof, each role's workloads
    under its enforced policy, is tests/cli/test_iam_policies.py)."""
    uri = f"s3+ddb://{bucket}/db/t.lance?ddbTableName={ddb_table_name}"
    out = run_cli(
        aws, "iam-policy", uri, "--account", "123456789012", "--region", "eu-west-1", "--json"
    )
    assert out.code == 0, out.stderr

    def actions(policy: dict) -> set[str]:  # type: ignore[type-arg]
        return {a for s in policy["Statement"] for a in s["Action"]}

    doctor_probes = {
        "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query",
        "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "s3:GetObject", "s3:PutObject",
        "s3:DeleteObject", "s3:ListBucket",
    }  # fmt: skip
    assert doctor_probes <= actions(out.json["operator"])
    assert "dynamodb:UpdateItem" in actions(out.json["writer"])  # the commit queue
    for role in ("writer", "reader"):  # a connection's checks, in one read
        assert "dynamodb:BatchGetItem" in actions(out.json[role]), role
    assert "dynamodb:UpdateItem" not in actions(out.json["reader"])
    assert "dynamodb:DeleteItem" not in actions(out.json["writer"])
    assert "s3:DeleteObject" not in actions(out.json["reader"])  # readers delete nothing
    for role in ("writer", "reader", "operator", "doctor"):
        assert "dynamodb:CreateTable" not in actions(out.json[role]), role
    assert "dynamodb:CreateTable" in actions(out.json["admin"])
    (finalize,) = [s for s in out.json["reader"]["Statement"] if s["Sid"] == "FinalizeManifests"]
    assert finalize["Action"] == ["s3:PutObject"]  # readers finalize staged versions...
    assert finalize["Resource"] == [
        f"arn:aws:s3:::{bucket}/db/t.lance/_versions/*.manifest"
    ]  # ...only at final manifest names
    resources = {r for s in out.json["writer"]["Statement"] for r in s["Resource"]}
    assert resources == {
        f"arn:aws:s3:::{bucket}/db/t.lance/*",
        f"arn:aws:s3:::{bucket}",
        f"arn:aws:dynamodb:eu-west-1:123456789012:table/{ddb_table_name}",
    }
    legacy = run_cli(
        aws,
        "iam-policy",
        uri,
        "--role",
        "cli",
        "--account",
        "123456789012",
        "--region",
        "eu-west-1",
    )  # the old name of the operator role
    assert legacy.code == 0 and json.loads(legacy.stdout) == out.json["operator"]


def test_migrate_to_conditional_put_refuses_a_legacy_store_then_moves_the_table(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name)
    before = read_versions(table.uri, table.options)
    final = sorted(k for k in table.objects("_versions/") if k.endswith(".manifest"))[0]
    staged = f"{final}-00000000-0000-4000-8000-000000000000"  # version 2 left unfinalized
    table.s3.copy_object(Bucket=bucket, Key=staged, CopySource={"Bucket": bucket, "Key": final})
    table.s3.delete_object(Bucket=bucket, Key=final)
    item = table.items()[-1]
    item["path"] = {"S": staged}
    table.ddb.put_item(TableName=ddb_table_name, Item=item)

    refused = run_cli(legacy_aws, "migrate-to-conditional-put", table.uri, "--json")
    assert refused.code == 1
    assert refused.json["conditional_put"] is False and refused.json["moved"] is False
    assert table.items()[-1]["path"]["S"] == staged  # nothing changed

    legacy_aws.legacy_s3 = False
    planned = run_cli(legacy_aws, "migrate-to-conditional-put", table.uri, "--dry-run", "--json")
    assert planned.code == 0 and planned.json["finalized"] == [2] and not planned.json["moved"]
    assert table.items()[-1]["path"]["S"] == staged

    moved = run_cli(legacy_aws, "migrate-to-conditional-put", table.uri, "--json")
    assert moved.code == 0, moved.stdout + moved.stderr
    assert moved.json["finalized"] == [2] and moved.json["moved"] is True
    new_uri = f"s3://{bucket}/{table.path}"
    assert moved.json["new_uri"] == new_uri
    assert any(new_uri in change for change in moved.json["pylance_changes"])

    stale = connect(table.uri, table.options)  # sends nothing yet
    with pytest.raises(TableMovedError, match=new_uri):  # refused at its first use
        stale.handler.resolve_latest(stale.base)
    with pytest.raises(TableMovedError, match=new_uri):  # and at every later one
        lancetx_append(
            stale.handler, stale.base, stale.data_uri, table.options, batch("stale", 0, 2)
        )
    assert read_versions(new_uri, table.options) == before
    conn = connect(new_uri, table.options)  # conditional PUT from here on
    lancetx_append(conn.handler, conn.base, conn.data_uri, table.options, batch("after", 0, 2))
    assert sorted(read_versions(new_uri, table.options)) == [1, 2, 3]
