"""``lancetx-sync iam-policy``: each role of table A can do its work, and nothing to table B.

The embedded server does not enforce IAM, so the tests do (``iam_simulator``):
every request a workload sends is recorded on the server (pylance's too), turned
into the authorizations AWS would make for it, and evaluated against the policy
``iam-policy`` generated — while the workload runs, so a denied request is answered
403 as AWS would and the workload must succeed anyway. Then every request of table
B's workloads, and the attacks of one table's credentials on another (a moved
record for B, the layout stamp), are evaluated against A's policies: all denied.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from cli_helpers import run_cli
from iam_simulator import IamRequest, allowed, recording, refused_by
from protocol_helpers import ddb_uri, ensure_ddb_table

import lancetx
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws
from lancetx.errors import IamPolicyError
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import clear_validation_cache
from lancetx.externalstore.dynamodb.store_schema import (
    CURRENT_SCHEMA_VERSION,
    clear_stamp_cache,
    read_stamp,
    write_stamp,
)
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.doctor import run_doctor
from lancetx.ops.gc import collect_garbage
from lancetx.ops.iam_policy import iam_literal, iam_policies
from lancetx.ops.migrate import migrate_to_conditional_put
from lancetx.ops.repair import repair_table
from lancetx.ops.status import table_status
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table

ACCOUNT, REGION = "123456789012", "us-east-1"
KMS_KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@dataclass
class Lake:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    options: dict[str, str]

    def uri(self, path: str) -> str:
        return ddb_uri(self.bucket, path, self.ddb_table)

    def policies(self, path: str) -> dict[str, Any]:
        return iam_policies(
            open_table(self.uri(path), self.options, validate=False), account=ACCOUNT, region=REGION
        ).policies

    @property
    def s3(self) -> Any:
        return boto3.client("s3", **self.aws.client_kwargs())

    @property
    def ddb(self) -> Any:
        return boto3.client("dynamodb", **self.aws.client_kwargs())

    def items(self, base: str) -> list[dict[str, Any]]:
        return self.ddb.query(
            TableName=self.ddb_table,
            KeyConditionExpression="base_uri = :b",
            ExpressionAttributeValues={":b": {"S": base}},
            ConsistentRead=True,
        )["Items"]

    def stage_latest(self, base: str) -> str:
        """Leave the newest version as a writer that died after its claim does: the item
        points at a staged manifest, the final one is not written yet."""
        item = max(self.items(base), key=lambda i: int(i["version"]["N"]))
        final = item["path"]["S"]
        staged = f"{final}-{uuid.uuid4()}"
        self.s3.copy_object(
            Bucket=self.bucket, Key=staged, CopySource={"Bucket": self.bucket, "Key": final}
        )
        self.s3.delete_object(Bucket=self.bucket, Key=final)
        item["path"] = {"S": staged}
        self.ddb.put_item(TableName=self.ddb_table, Item=item)
        return staged

    def append_txn(self, uri: str, seq: int) -> Transaction:
        conn = connect(uri, self.options)
        read = int(lance.dataset(uri, storage_options=self.options).version)
        fragments = lance.fragment.write_fragments(
            pa.table({"x": [seq]}), conn.data_uri, storage_options=self.options
        )
        return Transaction(
            read_version=read,
            operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        )


@pytest.fixture
def lake(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Lake]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    write_stamp(make_client(DynamoDBConfig.from_options(options)), ddb_table_name, 1)
    yield Lake(legacy_aws, bucket, ddb_table_name, options)


def _fresh() -> None:
    """Forget what this process checked once, so each workload sends its first-use reads."""
    clear_stamp_cache()
    clear_validation_cache()


def _assert_allowed(recorded: list[IamRequest], policy: Any, what: str) -> None:
    refused = refused_by(policy, recorded)
    assert not refused, f"{what}: " + "\n".join(map(str, refused))
    assert recorded, f"{what} sent nothing"


A, A2, B = "db/a.lance", "db/a2.lance", "db/a.lance-b"


def _touches(request: IamRequest, base: str, bucket: str) -> bool:
    keys = request.context.get("dynamodb:LeadingKeys") or []
    prefix = request.context.get("s3:prefix")
    return (
        request.resource.startswith(f"arn:aws:s3:::{bucket}/{base}/")
        or any(base in key for key in keys)
        or (isinstance(prefix, str) and prefix.startswith(f"{base}/"))
    )


def _writer_workloads(lake: Lake, uri: str) -> None:
    table = lancetx.write_table(uri, pa.table({"x": [1, 2]}), storage_options=lake.options)
    table.append(pa.table({"x": [3]}))
    table.append(pa.table({"x": [4]}), idempotency_key="nightly-1")
    table.append(pa.table({"x": [4]}), idempotency_key="nightly-1")  # found, not committed
    table.delete("x = 1")
    lance.write_dataset(
        pa.table({"x": [5]}), uri, mode="append", storage_options=lake.options
    )  # pylance's own commit through s3+ddb://
    conn = connect(uri, lake.options)
    queue = conn.handler.queue  # the commit queue under contention
    assert queue is not None
    turn = queue.take_ticket(conn.base)
    assert turn is not None
    queue.read_turns(conn.base)
    queue.end_turn(conn.base, turn.issued)


def _reader_workloads(lake: Lake, uri: str) -> None:
    table = lancetx.open(uri, storage_options=lake.options)
    assert table.dataset.to_table().num_rows > 0
    table.history()
    lance.dataset(uri, storage_options=lake.options).to_table()


def test_each_role_of_a_table_does_its_work_and_nothing_to_another_table(lake: Lake) -> None:
    policies = lake.policies(A)
    writer, reader, operator, doctor = (
        policies[r] for r in ("writer", "reader", "operator", "doctor")
    )

    # ---- writer: lancetx (sync), pylance, the commit queue, keys, commit_many.
    _fresh()
    with recording(lake.aws, writer) as rec:
        _writer_workloads(lake, lake.uri(A))
    _assert_allowed(rec.requests, writer, "writer")
    lancetx.write_table(lake.uri(A2), pa.table({"x": [0]}), storage_options=lake.options)
    both = [writer, lake.policies(A2)["writer"]]  # a job committing to both tables
    txns = {
        lake.uri(A): lake.append_txn(lake.uri(A), 7),
        lake.uri(A2): lake.append_txn(lake.uri(A2), 7),
    }
    _fresh()
    with recording(lake.aws, both) as rec:
        lancetx.commit_many(txns, storage_options=lake.options)
    _assert_allowed(rec.requests, both, "commit_many")
    claim = [r for r in rec.requests if r.origin == "TransactWriteItems"]
    assert {r.action for r in claim} == {"dynamodb:PutItem"}  # item by item, no action of its own
    assert [r for r in claim if not allowed(writer, r)]  # A's writer alone cannot claim A2's

    # ---- reader: lancetx and pylance, and both finalizing a version a writer left staged.
    _fresh()
    with recording(lake.aws, reader) as rec:
        _reader_workloads(lake, lake.uri(A))
    _assert_allowed(rec.requests, reader, "reader")
    for finalize in (
        lambda: lancetx.open(lake.uri(A), storage_options=lake.options),
        lambda: lance.dataset(lake.uri(A), storage_options=lake.options),
    ):
        staged = lake.stage_latest(A)
        _fresh()
        with recording(lake.aws, reader) as rec:
            finalize()
        assert not lake.items(A)[-1]["path"]["S"].endswith(staged[-36:])  # finalized
        refused = refused_by(reader, rec.requests)
        # A reader deletes nothing: its try to remove the staged copy is the only refusal
        # (lancetx's, twice: its lean DELETE refused, botocore's then gives the answer).
        delete = ("s3:DeleteObject", f"arn:aws:s3:::{lake.bucket}/{staged}")
        assert [(r.action, r.resource) for r in refused] in ([], [delete], [delete, delete]), (
            "\n".join(map(str, refused))
        )
        assert any(r.action == "s3:PutObject" for r in rec.requests)  # the finalizing copy

    # ---- operator: lancetx-sync's commands, in process (the CLI calls these).
    orphan = lance.fragment.write_fragments(
        pa.table({"x": [9]}),
        connect(lake.uri(A), lake.options).data_uri,
        storage_options=lake.options,
    )  # a failed job's file, for gc
    assert orphan
    later = datetime.now(UTC) + timedelta(days=30)
    lake.stage_latest(A)
    _fresh()
    with recording(lake.aws, operator) as rec:
        table = open_table(lake.uri(A), lake.options)
        table_status(table)
        assert repair_table(table).ok
        verify_table(table, deep=True)
        assert collect_garbage(
            table, older_than=timedelta(days=1), dry_run=False, now=later
        ).deleted
        assert cleanup_versions(
            table, keep_versions=2, items_older_than=timedelta(0), now=later
        ).removed_versions
        assert run_doctor(table, role="operator").ok
    _assert_allowed(rec.requests, operator, "operator")
    assert {"dynamodb:DeleteItem", "s3:DeleteObject"} <= {r.action for r in rec.requests}

    # ---- doctor: its own role.
    _fresh()
    with recording(lake.aws, doctor) as rec:
        assert run_doctor(open_table(lake.uri(A), lake.options), role="doctor").ok
    _assert_allowed(rec.requests, doctor, "doctor")

    # ---- table B's workloads, seen through A's policies: every request touching B is denied.
    _fresh()
    with recording(lake.aws) as rec:
        _writer_workloads(lake, lake.uri(B))
        _reader_workloads(lake, lake.uri(B))
        table = open_table(lake.uri(B), lake.options)
        table_status(table)
        cleanup_versions(table, keep_versions=1, items_older_than=timedelta(0), now=later)
    of_b = [r for r in rec.requests if _touches(r, B, lake.bucket)]
    assert len(of_b) > 30
    for role, policy in (("writer", writer), ("reader", reader), ("operator", operator)):
        leaked = [r for r in of_b if allowed(policy, r)]
        assert not leaked, f"{role} of A may: " + "\n".join(map(str, leaked))

    # ---- the last operator workload: moving A to conditional PUT writes its moved record.
    lake.aws.legacy_s3 = False
    _fresh()
    with recording(lake.aws, operator) as rec:
        assert migrate_to_conditional_put(open_table(lake.uri(A), lake.options)).moved
    _assert_allowed(rec.requests, operator, "migrate-to-conditional-put")


def test_one_tables_credentials_cannot_move_or_lock_out_another_table(lake: Lake) -> None:
    """The attacks of issue 24 (2), sent for real under A's enforced policies: B's
    moved record, the layout stamp, a Scan, B's objects. All refused; B still opens."""
    for path in (A, B):
        lancetx.write_table(lake.uri(path), pa.table({"x": [1]}), storage_options=lake.options)
    ddb, s3, name = lake.ddb, lake.s3, lake.ddb_table

    def moved_record(base: str) -> dict[str, Any]:
        return {
            "base_uri": {"S": f"__lancetx_moved__/{base}"},
            "version": {"N": "0"},
            "path": {"S": f"s3://attacker-bucket/{base}"},
            "committer": {"S": "lancetx-sync migrate-to-conditional-put"},
        }

    stamp = {
        "base_uri": {"S": "__lancetx_schema__"},
        "version": {"N": "0"},
        "path": {"S": "__lancetx_schema__"},
        "schema_version": {"N": "999"},
    }
    b_manifest = next(
        k["Key"]
        for k in s3.list_objects_v2(Bucket=lake.bucket, Prefix=f"{B}/_versions/")["Contents"]
    )
    attacks = {
        "a moved record for B": lambda: ddb.put_item(TableName=name, Item=moved_record(B)),
        "layout 999 in the stamp": lambda: ddb.put_item(TableName=name, Item=stamp),
        "B's items by Scan": lambda: ddb.scan(TableName=name),
        "B's moved record beside A's keys": lambda: ddb.batch_get_item(
            RequestItems={
                name: {
                    "Keys": [
                        {"base_uri": {"S": "__lancetx_schema__"}, "version": {"N": "0"}},
                        {"base_uri": {"S": f"__lancetx_moved__/{B}"}, "version": {"N": "0"}},
                    ]
                }
            }
        ),
        "B's latest manifest deleted": lambda: s3.delete_object(Bucket=lake.bucket, Key=b_manifest),
        "B's versions listed": lambda: s3.list_objects_v2(Bucket=lake.bucket, Prefix=f"{B}/"),
        "a listing of every table": lambda: s3.list_objects_v2(Bucket=lake.bucket),
    }
    reader_only = {
        "A's moved record": lambda: ddb.put_item(TableName=name, Item=moved_record(A)),
        "A's manifest deleted": lambda: s3.delete_object(
            Bucket=lake.bucket, Key=f"{A}/_versions/18446744073709551614.manifest"
        ),
        "A's data written": lambda: s3.put_object(
            Bucket=lake.bucket, Key=f"{A}/data/x.lance", Body=b"x"
        ),
    }
    policies = lake.policies(A)
    for role in ("writer", "reader", "operator", "doctor"):
        cases = dict(attacks)
        if role == "reader":
            cases.update(reader_only)
        if role == "writer":
            cases["A's moved record"] = reader_only["A's moved record"]
        for what, attack in cases.items():
            with (
                recording(lake.aws, policies[role]) as rec,
                pytest.raises(Exception, match="AccessDenied") as refused,
            ):
                attack()
            assert rec.denied, f"{role}: {what} was not refused ({refused.value})"
    # Nothing landed: B opens where it was, the stamp is unchanged.
    assert lancetx.open(lake.uri(B), storage_options=lake.options).version == 1
    assert read_stamp(ddb, name) == 1 == CURRENT_SCHEMA_VERSION


@pytest.mark.parametrize(
    ("path", "sibling"),
    [
        ("db/a*.lance", "db/ab.lance"),
        ("db/a%2A.lance", "db/ab.lance"),  # percent-encoded in the URI: the key is decoded
        ("db/a%3F.lance", "db/ab.lance"),
        ("team/${aws:username}/t.lance", "team/alice/t.lance"),
    ],
)
def test_iam_special_characters_in_the_table_path_stay_literal(
    lake: Lake, path: str, sibling: str
) -> None:
    from urllib.parse import unquote

    base = unquote(path)
    policies = lake.policies(path)
    for role in ("writer", "reader", "operator"):
        policy = policies[role]
        mine = IamRequest(
            "s3:GetObject",
            f"arn:aws:s3:::{lake.bucket}/{base}/_versions/1.manifest",
            {"aws:username": "alice"},
        )
        other = IamRequest(
            "s3:GetObject",
            f"arn:aws:s3:::{lake.bucket}/{sibling}/_versions/1.manifest",
            {"aws:username": "alice"},
        )
        table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{lake.ddb_table}"
        my_item = IamRequest(
            "dynamodb:Query", table, {"dynamodb:LeadingKeys": [base], "aws:username": "alice"}
        )
        other_item = IamRequest(
            "dynamodb:Query", table, {"dynamodb:LeadingKeys": [sibling], "aws:username": "alice"}
        )
        listing = IamRequest(
            "s3:ListBucket",
            f"arn:aws:s3:::{lake.bucket}",
            {"s3:prefix": f"{sibling}/_versions/", "aws:username": "alice"},
        )
        assert allowed(policy, mine) and allowed(policy, my_item), (role, json.dumps(policy))
        assert not allowed(policy, other), (role, json.dumps(policy))
        assert not allowed(policy, other_item), (role, json.dumps(policy))
        assert not allowed(policy, listing), (role, json.dumps(policy))


def test_the_cli_needs_an_account_and_covers_a_kms_key(lake: Lake) -> None:
    uri = lake.uri(A)
    missing = run_cli(lake.aws, "iam-policy", uri, "--role", "writer")
    assert missing.code == 2 and "--account" in missing.stderr
    out = run_cli(
        lake.aws, "iam-policy", uri, "--account", ACCOUNT, "--region", REGION,
        "--kms-key", KMS_KEY, "--json",
    )  # fmt: skip
    assert out.code == 0, out.stderr
    assert (
        out.json["writer"]
        == iam_policies(
            open_table(uri, lake.options, validate=False),
            account=ACCOUNT,
            region=REGION,
            kms_key=KMS_KEY,
        ).policies["writer"]
    )
    decrypt = IamRequest("kms:Decrypt", KMS_KEY)
    generate = IamRequest("kms:GenerateDataKey", KMS_KEY)
    other_key = IamRequest("kms:Decrypt", KMS_KEY.replace("1234abcd", "9999abcd"))
    for role in ("writer", "reader", "operator", "doctor"):
        assert allowed(out.json[role], decrypt) and allowed(out.json[role], generate), role
        assert not allowed(out.json[role], other_key), role
    ops = open_table(uri, lake.options, validate=False)
    anywhere = iam_policies(ops, account=None, region=None, any_account=True)
    assert anywhere.account == "*"
    resources = {r for s in anywhere.policies["writer"]["Statement"] for r in s["Resource"]}
    assert f"arn:aws:dynamodb:*:*:table/{lake.ddb_table}" in resources
    assert not any("kms" in r for r in resources)
    with pytest.raises(IamPolicyError, match="KMS key ARN"):
        iam_policies(ops, account=None, region=None, any_account=True, kms_key="alias/mine")
    with pytest.raises(IamPolicyError, match="--account"):
        iam_policies(ops, account=None, region=REGION)
    assert iam_literal("a*b?c${x}") == "a${*}b${?}c${$}{x}"


def test_the_simulator_follows_iam_evaluation() -> None:
    """The evaluator's semantics that the policies rely on (AWS's documented logic)."""
    table = "arn:aws:dynamodb:us-east-1:123456789012:table/t"
    keys_only = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["dynamodb:GetItem", "dynamodb:Scan"],
                "Resource": [table],
                "Condition": {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["a", "a#q"]}},
            }
        ],
    }
    get = IamRequest("dynamodb:GetItem", table, {"dynamodb:LeadingKeys": ["a"]})
    assert allowed(keys_only, get)
    assert not allowed(
        keys_only, IamRequest("dynamodb:GetItem", table, {"dynamodb:LeadingKeys": ["a", "b"]})
    )
    # ForAllValues holds vacuously without the key: a Scan passes unless Null says otherwise.
    scan = IamRequest("dynamodb:Scan", table, {})
    assert allowed(keys_only, scan)
    keys_only["Statement"][0]["Condition"]["Null"] = {"dynamodb:LeadingKeys": "false"}
    assert not allowed(keys_only, scan) and allowed(keys_only, get)
    # Actions ignore case; resources do not; * spans '/'.
    objects = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "S3:getobject", "Resource": "arn:aws:s3:::b/t/*"},
            {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::b/t/secret/*"},
        ],
    }
    assert allowed(objects, IamRequest("s3:GetObject", "arn:aws:s3:::b/t/x/y/z"))
    assert not allowed(objects, IamRequest("s3:GetObject", "arn:aws:s3:::b/T/x"))
    assert not allowed(
        objects, IamRequest("s3:GetObject", "arn:aws:s3:::b/t/secret/x")
    )  # Deny wins
    assert not allowed(objects, IamRequest("s3:PutObject", "arn:aws:s3:::b/t/x"))
    # Policy variables: the escapes are literals, others take the request's value.
    variables = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": "arn:aws:s3:::b/${*}/${aws:username}/*",
            }
        ],
    }
    assert allowed(
        variables, IamRequest("s3:GetObject", "arn:aws:s3:::b/*/alice/x", {"aws:username": "alice"})
    )
    assert not allowed(
        variables, IamRequest("s3:GetObject", "arn:aws:s3:::b/x/alice/x", {"aws:username": "alice"})
    )
    assert not allowed(variables, IamRequest("s3:GetObject", "arn:aws:s3:::b/*/alice/x", {}))
    listing = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::b",
                "Condition": {"StringLike": {"s3:prefix": ["t/*"]}},
            }
        ],
    }
    assert allowed(
        listing, IamRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "t/_versions/"})
    )
    assert not allowed(listing, IamRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "t2/"}))
    assert not allowed(listing, IamRequest("s3:ListBucket", "arn:aws:s3:::b", {}))  # no prefix: all
