"""``lancetx-sync iam-policy``: least-privilege IAM policies for one table, per role.

Every request a role's workload sends is allowed, and nothing of another table:

* **S3**: object actions on ``arn:aws:s3:::bucket/<base>/…`` only; ``s3:ListBucket`` on
  the bucket only under the condition ``s3:prefix`` like ``<base>/*`` (never the bare
  ``<base>``, which would also list ``<base>2/``).
* **DynamoDB**: item actions only under ``dynamodb:LeadingKeys`` conditions naming
  exactly the partition keys the role touches (``ForAllValues:StringEquals``, with
  ``Null`` false so a request without partition keys — a Scan — never passes). One
  DynamoDB table holds many lancetx tables; the keys of the table at ``<base>`` are:

  - ``<base>``: its versions (Lance's items);
  - ``<base>#lancetx-commit-queue``: its commit queue (writers under contention);
  - ``<base>#lancetx-keys``: its idempotency-key items;
  - ``__lancetx_moved__/<base>``: the record that it moved to conditional PUT
    (read by every connection, written only by ``migrate-to-conditional-put``);
  - ``__lancetx_schema__``: the store's layout stamp, shared by every table: read by
    all roles, written only by ``create-table`` (the ``admin`` role).

  ``TransactWriteItems`` (``commit_many``) has no IAM action of its own: each of its
  Puts is authorized as ``dynamodb:PutItem`` on its item's key.

Roles:

* ``writer`` (lancetx and pylance writers): read and write the table's objects
  (``s3:AbortMultipartUpload`` for pylance's large uploads); read its keys and the
  stamp and moved record; ``PutItem``/``UpdateItem`` on its versions, queue and keys.
* ``reader`` (lancetx and pylance readers): read objects, the table's versions and
  idempotency keys, the stamp and moved record, and **finalize**:
  a version whose writer stopped between its claim and its copy is finished by the
  first reader (Lance's readers do it; lancetx's too), which needs ``s3:PutObject`` on
  final manifest names (``_versions/*.manifest``) and ``dynamodb:PutItem`` on the
  table's versions. A reader deletes nothing: the staged manifest a finalizing reader
  cannot delete stays (a warning) until ``lancetx-sync gc`` collects it.
* ``operator`` (``lancetx-sync`` status, verify, repair, gc, cleanup, onboard,
  migrate-to-conditional-put): a writer's, plus ``DeleteItem`` on the table's keys
  (cleanup, repair ``--force``) and ``PutItem`` on its moved record (migrate).
* ``doctor`` (``lancetx-sync doctor --role doctor``): reads, the listing, and writes
  and deletes under ``<base>/_lancetx_probe/`` only.
* ``admin`` (``lancetx-sync create-table``): creates, tags and backs up the DynamoDB
  table and writes its layout stamp; one per DynamoDB table, not per lancetx table.

A table path holding ``*``, ``?`` or ``$`` (also percent-encoded in the URI: the key
is decoded first) is written with IAM's escapes ``${*}``, ``${?}``, ``${$}``, so it
never turns into a wildcard or a policy variable (``${aws:username}``). With
``kms_key``, roles that read get ``kms:Decrypt`` and roles that write (a finalizing
reader included: a copy is encrypted again) ``kms:GenerateDataKey`` on that key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from lancetx.commit.handlers.probe import PROBE_DIR
from lancetx.errors import IamPolicyError
from lancetx.externalstore.base import KEYS_SUFFIX
from lancetx.externalstore.dynamodb.commit_queue import QUEUE_SUFFIX
from lancetx.externalstore.dynamodb.store_schema import STAMP_BASE_URI
from lancetx.externalstore.moved import MOVED_PREFIX
from lancetx.ops.table import OpsTable

#: Partition of a table's idempotency-key items (``<base>`` + this suffix): written by
#: writers claiming a commit with a key (beside its version, in one TransactWriteItems),
#: read by every role that asks which version a key landed as, deleted by operators.
IDEMPOTENCY_KEYS_SUFFIX: Final = KEYS_SUFFIX

WRITER, READER, OPERATOR, DOCTOR, ADMIN = "writer", "reader", "operator", "doctor", "admin"
ROLES: Final = (WRITER, READER, OPERATOR, DOCTOR, ADMIN)

# Partition-key kinds of one table (see the module docstring).
VERSIONS, QUEUE, KEYS, MOVED, STAMP = "versions", "queue", "keys", "moved", "stamp"

S3_READ = ("s3:GetObject",)
S3_WRITE = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
DDB_READ = ("dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query")


def partition_keys(base: str) -> dict[str, str]:
    """Kind → the partition key (``base_uri``) of that kind for the table at ``base``."""
    return {
        VERSIONS: base,
        QUEUE: base + QUEUE_SUFFIX,
        KEYS: base + IDEMPOTENCY_KEYS_SUFFIX,
        MOVED: MOVED_PREFIX + base,
        STAMP: STAMP_BASE_URI,
    }


@dataclass(frozen=True)
class Grant:
    """One statement of a role: ``actions`` on the table's objects matching
    ``objects`` (patterns under ``<base>/``), on the bucket listing, on the DynamoDB
    table itself, or on its items under the partition keys of ``keys`` kinds."""

    sid: str
    actions: tuple[str, ...]
    objects: tuple[str, ...] = ()
    listing: bool = False
    table: bool = False
    keys: tuple[str, ...] = ()
    kms: bool = False


_LISTING = Grant("ListTablePrefix", ("s3:ListBucket",), listing=True)
_DESCRIBE = Grant("DescribeDynamoDBTable", ("dynamodb:DescribeTable",), table=True)
_ALL_KEYS = (VERSIONS, QUEUE, KEYS, MOVED, STAMP)

#: What each role needs (the single source for the policies and for doctor's probes).
GRANTS: Final[dict[str, tuple[Grant, ...]]] = {
    WRITER: (
        Grant("TableObjects", S3_WRITE, objects=("*",)),
        _LISTING,
        _DESCRIBE,
        Grant("ReadTableKeys", DDB_READ, keys=_ALL_KEYS),
        Grant(
            "WriteVersionsQueueAndKeys",
            ("dynamodb:PutItem", "dynamodb:UpdateItem"),
            keys=(VERSIONS, QUEUE, KEYS),
        ),
        Grant("EncryptedObjects", ("kms:Decrypt", "kms:GenerateDataKey"), kms=True),
    ),
    READER: (
        Grant("ReadTableObjects", S3_READ, objects=("*",)),
        _LISTING,
        Grant("FinalizeManifests", ("s3:PutObject",), objects=("_versions/*.manifest",)),
        _DESCRIBE,
        # Its idempotency keys too: "did job X land, and as which version?" is a read.
        Grant("ReadTableKeys", DDB_READ, keys=(VERSIONS, KEYS, MOVED, STAMP)),
        Grant("FinalizeVersions", ("dynamodb:PutItem",), keys=(VERSIONS,)),
        Grant("EncryptedObjects", ("kms:Decrypt", "kms:GenerateDataKey"), kms=True),
    ),
    OPERATOR: (
        Grant("TableObjects", S3_WRITE, objects=("*",)),
        _LISTING,
        _DESCRIBE,
        Grant("ReadTableKeys", DDB_READ, keys=_ALL_KEYS),
        Grant(
            "MaintainTableKeys",
            ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
            keys=(VERSIONS, QUEUE, KEYS, MOVED),
        ),
        Grant("EncryptedObjects", ("kms:Decrypt", "kms:GenerateDataKey"), kms=True),
    ),
    DOCTOR: (
        Grant("ReadTableObjects", S3_READ, objects=("*",)),
        _LISTING,
        Grant("ProbeObjects", ("s3:PutObject", "s3:DeleteObject"), objects=(f"{PROBE_DIR}/*",)),
        _DESCRIBE,
        Grant("ReadTableKeys", DDB_READ, keys=(VERSIONS, MOVED, STAMP)),
        Grant("EncryptedObjects", ("kms:Decrypt", "kms:GenerateDataKey"), kms=True),
    ),
    ADMIN: (
        Grant(
            "CreateDynamoDBTable",
            (
                "dynamodb:CreateTable",
                "dynamodb:DescribeTable",
                "dynamodb:UpdateContinuousBackups",
                "dynamodb:TagResource",
            ),
            table=True,
        ),
        Grant("LayoutStamp", ("dynamodb:GetItem", "dynamodb:PutItem"), keys=(STAMP,)),
    ),
}

_ACCOUNT = re.compile(r"^\d{12}$")
_KMS_KEY = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+$")


def iam_literal(text: str) -> str:
    """``text`` for an ARN or a condition value, with IAM's escapes for the characters
    IAM would read as a wildcard (``*``, ``?``) or a policy variable (``$``)."""
    return re.sub(r"[$*?]", lambda m: "${" + m.group(0) + "}", text)


@dataclass(frozen=True)
class IamPolicies:
    """One policy document per role for the table at ``uri``."""

    uri: str
    account: str
    region: str
    kms_key: str | None
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return True


def _check_path(base: str) -> None:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in base):
        raise IamPolicyError(
            f"the table path {base!r} holds control characters, which an IAM policy cannot "
            "match reliably; move the table to a plain path"
        )


def iam_policies(
    table: OpsTable,
    *,
    account: str | None,
    region: str | None,
    any_account: bool = False,
    kms_key: str | None = None,
    partition: str = "aws",
    roles: Sequence[str] = ROLES,
) -> IamPolicies:
    """Least-privilege policies for ``roles`` of ``table``. ``account`` and ``region``
    are required unless ``any_account`` (then ``*`` where not given): a policy for any
    account grants the table's keys in every account's DynamoDB table of that name."""
    if account is None and not any_account:
        raise IamPolicyError(
            "give the AWS account that owns the DynamoDB table (--account 123456789012), "
            "or --any-account to allow that table name in every account"
        )
    if region is None and not any_account:
        raise IamPolicyError("give the DynamoDB table's region (--region eu-west-1)")
    if account is not None and not _ACCOUNT.match(account):
        raise IamPolicyError(f"--account {account!r} is not a 12-digit AWS account id")
    if region is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", region):
        raise IamPolicyError(f"--region {region!r} is not an AWS region name (e.g. eu-west-1)")
    if kms_key is not None and not _KMS_KEY.match(kms_key):
        raise IamPolicyError(
            f"--kms-key {kms_key!r} is not a KMS key ARN "
            "(arn:aws:kms:REGION:ACCOUNT:key/KEY-ID; an alias cannot scope kms:Decrypt)"
        )
    for role in roles:
        if role not in GRANTS:
            raise IamPolicyError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    _check_path(table.base)
    account_part = account or "*"
    region_part = region or "*"
    bucket = table.bucket
    base = table.base
    keys = {kind: iam_literal(key) for kind, key in partition_keys(base).items()}
    prefix = iam_literal(base) + "/" if base else ""
    ddb_arn = (
        f"arn:{partition}:dynamodb:{region_part}:{account_part}:table/{table.ddb_table}"
        if table.ddb_table
        else None
    )

    def statements(role: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for grant in GRANTS[role]:
            statement: dict[str, Any] = {"Sid": grant.sid, "Effect": "Allow"}
            statement["Action"] = sorted(grant.actions)
            if grant.objects:
                if bucket is None:
                    continue
                statement["Resource"] = [
                    f"arn:{partition}:s3:::{bucket}/{prefix}{pattern}" for pattern in grant.objects
                ]
            elif grant.listing:
                if bucket is None:
                    continue
                statement["Resource"] = [f"arn:{partition}:s3:::{bucket}"]
                if prefix:
                    statement["Condition"] = {"StringLike": {"s3:prefix": [f"{prefix}*"]}}
            elif grant.table:
                if ddb_arn is None:
                    continue
                statement["Resource"] = [ddb_arn]
            elif grant.keys:
                if ddb_arn is None:
                    continue
                statement["Resource"] = [ddb_arn]
                statement["Condition"] = {
                    "ForAllValues:StringEquals": {
                        "dynamodb:LeadingKeys": [keys[kind] for kind in grant.keys]
                    },
                    # Without partition keys (a Scan) ForAllValues would hold vacuously.
                    "Null": {"dynamodb:LeadingKeys": "false"},
                }
            elif grant.kms:
                if kms_key is None:
                    continue
                statement["Resource"] = [kms_key]
            out.append(statement)
        return out

    policies = {role: {"Version": "2012-10-17", "Statement": statements(role)} for role in roles}
    return IamPolicies(table.uri, account_part, region_part, kms_key, policies)


__all__ = [
    "ADMIN",
    "DOCTOR",
    "GRANTS",
    "IDEMPOTENCY_KEYS_SUFFIX",
    "OPERATOR",
    "READER",
    "ROLES",
    "WRITER",
    "Grant",
    "IamPolicies",
    "IamPolicyError",
    "iam_literal",
    "iam_policies",
    "partition_keys",
]
