"""``lancetx-sync iam-policy``: least-privilege IAM policies for one table.

Actions by role (what the code paths actually call):

* writer: S3 GetObject (manifests, data), PutObject (data, transaction files,
  staged and final manifests; CopyObject is a GetObject + PutObject),
  DeleteObject (its staged manifests, files of failed attempts), ListBucket
  (onboarding, conflict checks); DynamoDB DescribeTable (layout check),
  GetItem, BatchGetItem (a connection's checks: the layout stamp and the moved
  record in one read; without it two GetItems and a warning), Query, PutItem
  (claim and pointer flip).
* reader: as a writer minus data writes: a reader finalizes a version whose
  writer stopped half-way (copy + flip + delete of the staged manifest) and
  records versions written before DynamoDB, so it needs PutObject and
  DeleteObject on ``_versions/`` only, and PutItem.
* cli (``lancetx-sync``): a writer's, plus DeleteItem (cleanup, repair
  --force), CreateTable, UpdateContinuousBackups and TagResource (create-table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lancetx.ops.table import OpsTable

S3_READ = ["s3:GetObject"]
S3_WRITE = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
DDB_READ = [
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
]
DDB_WRITE = [*DDB_READ, "dynamodb:PutItem"]
#: Writers also take turns in the table's commit queue under contention (UpdateItem).
DDB_WRITER = [*DDB_WRITE, "dynamodb:UpdateItem"]
DDB_CLI = [
    *DDB_WRITER,
    "dynamodb:DeleteItem",
    "dynamodb:CreateTable",
    "dynamodb:UpdateContinuousBackups",
    "dynamodb:TagResource",
]


@dataclass(frozen=True)
class IamPolicies:
    uri: str
    writer: dict[str, Any]
    reader: dict[str, Any]
    cli: dict[str, Any]

    @property
    def ok(self) -> bool:
        return True


def _statement(sid: str, actions: list[str], resources: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "Sid": sid,
        "Effect": "Allow",
        "Action": sorted(set(actions)),
        "Resource": resources,
        **extra,
    }


def iam_policies(
    table: OpsTable, *, region: str = "*", account: str = "*", partition: str = "aws"
) -> IamPolicies:
    """Policies for writers, readers and the CLI of ``table``."""
    bucket = table.bucket or "BUCKET"
    base = table.base
    objects = (
        f"arn:{partition}:s3:::{bucket}/{base}/*" if base else f"arn:{partition}:s3:::{bucket}/*"
    )
    versions = f"arn:{partition}:s3:::{bucket}/{base}/_versions/*"
    listing = _statement(
        "ListTable",
        ["s3:ListBucket"],
        [f"arn:{partition}:s3:::{bucket}"],
        Condition={"StringLike": {"s3:prefix": [f"{base}/*", base]}} if base else {},
    )
    if not base:
        listing.pop("Condition")
    ddb: list[str] = []
    if table.ddb_table:
        ddb = [f"arn:{partition}:dynamodb:{region}:{account}:table/{table.ddb_table}"]

    def policy(statements: list[dict[str, Any]]) -> dict[str, Any]:
        return {"Version": "2012-10-17", "Statement": statements}

    writer = [_statement("TableObjects", S3_WRITE, [objects]), listing]
    reader = [
        _statement("TableObjects", S3_READ, [objects]),
        _statement("FinalizeManifests", ["s3:PutObject", "s3:DeleteObject"], [versions]),
        listing,
    ]
    cli = [_statement("TableObjects", S3_WRITE, [objects]), listing]
    if ddb:
        writer.append(_statement("ManifestItems", DDB_WRITER, ddb))
        reader.append(_statement("ManifestItems", DDB_WRITE, ddb))
        cli.append(_statement("ManifestItems", DDB_CLI, ddb))
    return IamPolicies(table.uri, policy(writer), policy(reader), policy(cli))
