"""``lancetx-sync doctor``: is this table's setup sound? Each check ok / denied / failed.

* the DynamoDB table exists with Lance's key schema, and its lancetx layout stamp;
* every action lancetx uses, probed for real (a probe item under a reserved
  ``base_uri`` pylance never reads, probe objects under ``_lancetx_probe/``),
  each reported ok or denied;
* a conditional-PUT probe of the bucket: does it honour ``If-None-Match``?
  (the answer decides whether ``s3://`` is safe at all);
* clock skew against the object store's ``Date`` header;
* the same base path of another bucket sharing this DynamoDB table (Lance's
  items do not record the bucket, so two tables collide).

With ``probe_writes=False`` nothing is written: write probes are skipped.
"""

from __future__ import annotations

import email.utils
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from lancetx.commit.errors import LancetxError
from lancetx.commit.format import naming
from lancetx.externalstore.dynamodb import check_table_description, key_of, target_of
from lancetx.externalstore.errors import ACCESS_CODES, TableSchemaError, error_code
from lancetx.externalstore.store_schema import CURRENT_SCHEMA_VERSION, read_stamp
from lancetx.ops.probes import PROBE_DIR, conditional_put_probe
from lancetx.ops.table import OpsTable, s3_client_of

OK = "ok"
DENIED = "denied"
FAILED = "failed"
WARNING = "warning"
SKIPPED = "skipped"

#: Reserved hash key of doctor's probe items (pylance only queries its tables' keys).
PROBE_BASE_URI = "__lancetx_doctor__"
#: Skew beyond which timestamps (cleanup ages, gc thresholds) mislead.
SKEW_WARNING_SECONDS = 60.0
#: Skew beyond which AWS rejects request signatures.
SKEW_FAILED_SECONDS = 900.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class DoctorReport:
    uri: str
    checks: list[Check] = field(default_factory=list)
    conditional_put: bool | None = None
    clock_skew_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return all(c.status in (OK, WARNING, SKIPPED) for c in self.checks)


def _denied(exc: BaseException) -> bool:
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return error_code(exc) in ACCESS_CODES or error_code(exc) == "AccessDenied" or status == 403
    return False


def _probe(name: str, action: Callable[[], Any], resource: str) -> tuple[Check, Any]:
    try:
        result = action()
    except (ClientError, BotoCoreError) as exc:
        if _denied(exc):
            return (
                Check(
                    name,
                    DENIED,
                    f"{name} on {resource} was denied ({error_code(exc)})",
                    f"grant {name} on {resource}; see lancetx-sync iam-policy",
                ),
                None,
            )
        return Check(name, FAILED, f"{name} on {resource} failed: {exc}"), None
    return Check(name, OK, f"{name} on {resource}"), result


def run_doctor(table: OpsTable, *, probe_writes: bool = True) -> DoctorReport:
    """Run every check on ``table``; see the module docstring."""
    checks: list[Check] = []
    skew: float | None = None
    if table.entries is not None and table.ddb_table is not None:
        checks.extend(_dynamodb_checks(table, probe_writes))
    s3_checks, skew = _s3_checks(table, probe_writes)
    checks.extend(s3_checks)
    honoured: bool | None = None
    if probe_writes:
        probe = conditional_put_probe(table)
        honoured = probe.honoured
        if probe.honoured is True:
            checks.append(Check("conditional-put", OK, probe.detail))
        elif probe.honoured is False:
            on_ddb = table.entries is not None
            checks.append(
                Check(
                    "conditional-put",
                    WARNING if on_ddb else FAILED,
                    probe.detail,
                    "keep committing through s3+ddb:// (never plain s3://) on this bucket"
                    if on_ddb
                    else "this s3:// table is unsafe with concurrent writers: commit through "
                    "s3+ddb://bucket/path?ddbTableName=T (lancetx-sync create-table T)",
                )
            )
        else:
            checks.append(Check("conditional-put", FAILED, probe.detail))
    else:
        checks.append(Check("conditional-put", SKIPPED, "needs write probes (no --dry-run)"))
    if table.entries is not None:
        checks.append(_shared_base_uri(table))
    return DoctorReport(table.uri, checks, honoured, skew)


def _dynamodb_checks(table: OpsTable, probe_writes: bool) -> list[Check]:
    assert table.entries is not None and table.ddb_table is not None
    client = table.entries.client
    name = table.ddb_table
    target = target_of(client, name)
    resource = target.resource
    checks: list[Check] = []
    check, described = _probe(
        "dynamodb:DescribeTable", lambda: client.describe_table(TableName=name), resource
    )
    checks.append(check)
    if described is not None:
        try:
            check_table_description(described.get("Table", {}), target)
            checks.append(Check("key-schema", OK, "HASH base_uri (S), RANGE version (N)"))
        except TableSchemaError as exc:
            checks.append(
                Check(
                    "key-schema", FAILED, str(exc), "use a table made by lancetx-sync create-table"
                )
            )
    try:
        stamp = read_stamp(client, name)
    except LancetxError as exc:
        checks.append(Check("store-schema", FAILED, f"cannot read the layout stamp: {exc}"))
    else:
        if stamp is None:
            checks.append(
                Check(
                    "store-schema",
                    WARNING,
                    f"table {name!r} has no lancetx layout stamp (made by pylance or by hand)",
                    f"lancetx-sync create-table {name} (stamps an existing table; idempotent)",
                )
            )
        elif stamp > CURRENT_SCHEMA_VERSION:
            checks.append(
                Check(
                    "store-schema",
                    FAILED,
                    f"layout {stamp} is newer than this lancetx ({CURRENT_SCHEMA_VERSION})",
                    "upgrade lancetx",
                )
            )
        else:
            checks.append(Check("store-schema", OK, f"layout {stamp}"))
    probe_key = key_of(f"{PROBE_BASE_URI}/{uuid.uuid4()}", 1)
    checks.append(
        _probe(
            "dynamodb:GetItem",
            lambda: client.get_item(TableName=name, Key=probe_key, ConsistentRead=True),
            resource,
        )[0]
    )
    # A connection's checks (the layout stamp and the moved record) are one
    # BatchGetItem; a policy written before lancetx used it lacks it.
    checks.append(
        _probe(
            "dynamodb:BatchGetItem",
            lambda: client.batch_get_item(
                RequestItems={name: {"Keys": [probe_key], "ConsistentRead": True}}
            ),
            resource,
        )[0]
    )
    checks.append(
        _probe(
            "dynamodb:Query",
            lambda: client.query(
                TableName=name,
                KeyConditionExpression="base_uri = :b",
                ExpressionAttributeValues={":b": probe_key["base_uri"]},
                Limit=1,
                ConsistentRead=True,
            ),
            resource,
        )[0]
    )
    if not probe_writes:
        for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"):
            checks.append(Check(action, SKIPPED, "write probe skipped (--dry-run)"))
        return checks
    item = {**probe_key, "path": {"S": "probe"}, "committer": {"S": "lancetx-sync doctor"}}
    checks.append(
        _probe(
            "dynamodb:PutItem",
            lambda: client.put_item(
                TableName=name,
                Item=item,
                ConditionExpression="attribute_not_exists(base_uri) AND attribute_not_exists(version)",
            ),
            resource,
        )[0]
    )
    # Writers under contention take turns in the table's commit queue (an
    # UpdateItem adding to a counter); without it they back off at random.
    queue_check = _probe(
        "dynamodb:UpdateItem",
        lambda: client.update_item(
            TableName=name,
            Key=probe_key,
            UpdateExpression="ADD #probe :one",
            ExpressionAttributeNames={"#probe": "doctor_probe"},
            ExpressionAttributeValues={":one": {"N": "1"}},
        ),
        resource,
    )[0]
    if queue_check.status == DENIED:
        queue_check = replace(
            queue_check,
            detail=queue_check.detail + "; writers under contention cannot take turns in the "
            "table's commit queue and back off at random instead",
        )
    checks.append(queue_check)
    checks.append(
        _probe(
            "dynamodb:DeleteItem",
            lambda: client.delete_item(TableName=name, Key=probe_key),
            resource,
        )[0]
    )
    return checks


def _s3_checks(table: OpsTable, probe_writes: bool) -> tuple[list[Check], float | None]:
    client = s3_client_of(table)
    if client is None or table.bucket is None:
        return [Check("object-store", SKIPPED, "a local table")], None
    bucket = table.bucket
    base = table.base
    checks: list[Check] = []
    prefix = naming.join(base, "_versions") + "/"
    checks.append(
        _probe(
            "s3:ListBucket",
            lambda: client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1),
            f"arn:aws:s3:::{bucket} (prefix {prefix})",
        )[0]
    )
    skew: float | None = None
    if not probe_writes:
        for action in ("s3:PutObject", "s3:GetObject", "s3:DeleteObject"):
            checks.append(Check(action, SKIPPED, "write probe skipped (--dry-run)"))
        return checks, None
    key = naming.join(base, PROBE_DIR, f"doctor-{uuid.uuid4()}")
    resource = f"arn:aws:s3:::{bucket}/{key}"
    sent = time.time()
    put_check, response = _probe(
        "s3:PutObject", lambda: client.put_object(Bucket=bucket, Key=key, Body=b"probe"), resource
    )
    received = time.time()
    checks.append(put_check)
    if response is not None:
        skew = _skew(response, (sent + received) / 2)
    checks.append(
        _probe(
            "s3:GetObject",
            lambda: client.get_object(Bucket=bucket, Key=key)["Body"].read(),
            resource,
        )[0]
    )
    checks.append(
        _probe("s3:DeleteObject", lambda: client.delete_object(Bucket=bucket, Key=key), resource)[0]
    )
    if skew is None:
        checks.append(Check("clock-skew", SKIPPED, "the store sent no Date header"))
    elif abs(skew) >= SKEW_FAILED_SECONDS:
        checks.append(
            Check(
                "clock-skew",
                FAILED,
                f"local clock is {skew:+.0f}s off the store's",
                "sync the clock (NTP)",
            )
        )
    elif abs(skew) >= SKEW_WARNING_SECONDS:
        checks.append(
            Check(
                "clock-skew",
                WARNING,
                f"local clock is {skew:+.0f}s off the store's",
                "sync the clock (NTP); gc/cleanup ages are measured against it",
            )
        )
    else:
        checks.append(Check("clock-skew", OK, f"{skew:+.1f}s (Date header resolution is 1 s)"))
    return checks, skew


def _skew(response: dict[str, Any], local: float) -> float | None:
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    raw = headers.get("date")
    if not raw:
        return None
    try:
        remote = email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError):
        return None
    return local - remote


def _shared_base_uri(table: OpsTable) -> Check:
    """Items under this base_uri that belong to another bucket's table."""
    from lancetx.ops.items import raw_item

    assert table.entries is not None
    name = "shared-base-uri"
    try:
        latest = table.entries.latest(table.base)
    except LancetxError as exc:
        return Check(name, FAILED, f"cannot read the newest item: {exc}")
    if latest is None:
        return Check(name, OK, "no items yet")
    fix = (
        f"the table s3://{table.bucket}/{table.base} and another bucket's table at the same path "
        f"share DynamoDB table {table.ddb_table!r}, whose items do not record the bucket: give "
        "one of them another DynamoDB table (ddbTableName) or another path"
    )
    item = raw_item(table.entries, table.base, latest.version) or {}
    recorded = item.get("bucket", {}).get("S")
    if recorded is not None and recorded != table.bucket:
        return Check(
            name,
            FAILED,
            f"version {latest.version}'s item under {table.base!r} was written for bucket "
            f"{recorded!r}, not {table.bucket!r}",
            fix,
        )
    final_name = latest.path.rsplit("/", 1)[-1].split("-", 1)[0]
    final = naming.join(table.base, "_versions", final_name)
    if table.exists(latest.path) or table.exists(final):
        return Check(name, OK, f"version {latest.version}'s manifest is in bucket {table.bucket!r}")
    any_manifest = next(iter(table.store.list(naming.join(table.base, "_versions") + "/")), None)
    if any_manifest is None:
        return Check(
            name,
            FAILED,
            f"DynamoDB holds versions up to {latest.version} under {table.base!r} but bucket "
            f"{table.bucket!r} has no manifest there: another bucket's table uses this path",
            fix,
        )
    return Check(
        name,
        WARNING,
        f"version {latest.version}'s manifest is not in bucket {table.bucket!r}: a wedged "
        "version or another bucket's table",
        f"lancetx-sync verify '{table.uri}' tells which",
    )
