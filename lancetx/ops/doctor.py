"""``lancetx-sync doctor``: is this table's setup sound for a role? Each check ok / denied / failed.

* the DynamoDB table exists with Lance's key schema, and its lancetx layout stamp;
* every action the chosen role needs (``--role writer|reader|operator|doctor``, the
  grants of :mod:`lancetx.ops.iam_policy`), probed for real on the very keys and
  objects that role uses, each reported ok or denied — a role is judged against its
  own needs, not another's;
* a conditional-PUT probe of the bucket: does it honour ``If-None-Match``?
  (the answer decides whether ``s3://`` is safe at all);
* clock skew against the object store's ``Date`` header;
* the same base path of another bucket sharing this DynamoDB table (Lance's
  items do not record the bucket, so two tables collide).

Probes write as little as a role allows:

* DynamoDB write probes (``PutItem``, ``UpdateItem``, ``DeleteItem``) write nothing:
  each carries a condition no item can meet (``version = -1``), so an allowed request
  is answered ``ConditionalCheckFailedException`` and a denied one ``AccessDenied``
  (IAM decides before the condition is read).
* S3 reads probe an absent object (404 allowed, 403 denied); a reader's finalizing
  write is probed as a copy from an absent source (404 allowed, nothing written).
* Roles that may write under ``_lancetx_probe/`` (writer, operator, doctor) put, read
  and delete one probe object there, and the conditional-PUT probe writes there too.
  A probe object is deleted with retries; one that could not be is named in the
  report (``leftovers``) and ``lancetx-sync gc`` collects it (nothing else reads that
  folder).

With ``probe_writes=False`` (``--dry-run``) no write request is sent: write probes
are skipped.
"""

from __future__ import annotations

import email.utils
import functools
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from lancetx.commit.errors import LancetxError
from lancetx.commit.format import naming
from lancetx.externalstore.dynamodb.botocore_errors import error_code
from lancetx.externalstore.dynamodb.config import target_of
from lancetx.externalstore.dynamodb.plans import check_table_description, key_of
from lancetx.externalstore.dynamodb.store_schema import CURRENT_SCHEMA_VERSION, read_stamp
from lancetx.externalstore.errors import ACCESS_CODES, DynamoDBTableSchemaError
from lancetx.ops.iam_policy import (
    DOCTOR,
    GRANTS,
    MOVED,
    OPERATOR,
    QUEUE,
    READER,
    STAMP,
    VERSIONS,
    WRITER,
    Grant,
    partition_keys,
)
from lancetx.ops.probes import PROBE_DIR, conditional_put_probe
from lancetx.ops.table import OpsTable, s3_client_of

OK = "ok"
DENIED = "denied"
FAILED = "failed"
WARNING = "warning"
SKIPPED = "skipped"

#: The roles doctor judges (``admin``, which creates DynamoDB tables, is not probed).
DOCTOR_ROLES = (WRITER, READER, OPERATOR, DOCTOR)
#: The sort key of DynamoDB probes: no write probe can apply (see the module docstring),
#: and reads of it find nothing.
PROBE_VERSION = 9_223_372_036_854_775_783
#: Skew beyond which timestamps (cleanup ages, gc thresholds) mislead.
SKEW_WARNING_SECONDS = 60.0
#: Skew beyond which AWS rejects request signatures.
SKEW_FAILED_SECONDS = 900.0
#: Attempts (and the pauses between them) to delete a probe object.
DELETE_ATTEMPTS = 4
DELETE_PAUSES = (0.2, 0.5, 1.0)

_KEY_NAMES = {
    VERSIONS: "the table's versions",
    QUEUE: "its commit queue",
    "keys": "its idempotency keys",
    MOVED: "its moved record",
    STAMP: "the layout stamp",
}
_NEVER_CONDITION = "#lancetx_v = :lancetx_never"
_NEVER_NAMES = {"#lancetx_v": "version"}
_NEVER_VALUES: dict[str, Any] = {":lancetx_never": {"N": "-1"}}
_NEVER: dict[str, Any] = {
    "ConditionExpression": _NEVER_CONDITION,
    "ExpressionAttributeNames": _NEVER_NAMES,
    "ExpressionAttributeValues": _NEVER_VALUES,
}


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
    #: The role the permissions were judged for.
    role: str = OPERATOR
    #: Probe objects that could not be deleted (``lancetx-sync gc`` collects them).
    leftovers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status in (OK, WARNING, SKIPPED) for c in self.checks)


def _denied(exc: BaseException) -> bool:
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return error_code(exc) in ACCESS_CODES or error_code(exc) == "AccessDenied" or status == 403
    return False


def _absent(exc: BaseException) -> bool:
    """A 404 for the probe's absent object: the request was authorized."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status == 404 or error_code(exc) in ("NoSuchKey", "NotFound", "404")
    return False


def _condition_failed(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and error_code(exc) == "ConditionalCheckFailedException"


@dataclass
class _Probe:
    """One action probed on one or more resources; denied if any is."""

    name: str
    role: str
    denied: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)

    def run(
        self,
        resource: str,
        action: Callable[[], Any],
        *,
        authorized: Callable[[BaseException], bool] = lambda exc: False,
    ) -> Any:
        try:
            result = action()
        except (ClientError, BotoCoreError) as exc:
            if _denied(exc):
                self.denied.append(f"{resource} ({error_code(exc)})")
            elif authorized(exc):
                self.allowed.append(resource)
            else:
                self.failed.append(f"{resource}: {exc}")
            return None
        self.allowed.append(resource)
        return result

    def check(self, note: str = "") -> Check:
        if self.denied:
            return Check(
                self.name,
                DENIED,
                f"{self.name} on {', '.join(self.denied)} was denied{note}",
                f"grant {self.name} there to the {self.role} role: lancetx-sync iam-policy "
                f"--role {self.role} prints its policy (if these are another role's "
                "credentials, run doctor with that --role)",
            )
        if self.failed:
            return Check(self.name, FAILED, f"{self.name} failed on {'; '.join(self.failed)}")
        return Check(self.name, OK, f"{self.name} on {', '.join(self.allowed)}")


def _grants(role: str) -> tuple[Grant, ...]:
    return GRANTS[role]


def _actions_on_keys(role: str) -> dict[str, list[str]]:
    """DynamoDB item action → the key kinds ``role`` may use it on."""
    out: dict[str, list[str]] = {}
    for grant in _grants(role):
        for action in grant.actions:
            if grant.keys:
                out.setdefault(action, [])
                out[action] += [k for k in grant.keys if k not in out[action]]
    return out


def _object_grants(role: str) -> dict[str, list[str]]:
    """S3 object action → the object patterns (under the table) ``role`` may use it on."""
    out: dict[str, list[str]] = {}
    for grant in _grants(role):
        for action in grant.actions:
            if grant.objects:
                out.setdefault(action, []).extend(grant.objects)
    return out


def _covers(patterns: Iterable[str], relative: str) -> bool:
    return any(p == "*" or (p.endswith("/*") and relative.startswith(p[:-1])) for p in patterns)


def run_doctor(table: OpsTable, *, probe_writes: bool = True, role: str = OPERATOR) -> DoctorReport:
    """Run every check on ``table`` for ``role``; see the module docstring."""
    if role not in DOCTOR_ROLES:
        raise ValueError(f"doctor judges one of {', '.join(DOCTOR_ROLES)}, not {role!r}")
    checks: list[Check] = []
    leftovers: list[str] = []
    if table.entries is not None and table.ddb_table is not None:
        checks.extend(_dynamodb_checks(table, probe_writes, role))
    s3_checks, skew = _s3_checks(table, probe_writes, role, leftovers)
    checks.extend(s3_checks)
    honoured: bool | None = None
    objects = _object_grants(role)
    may_probe = _covers(objects.get("s3:PutObject", []), f"{PROBE_DIR}/x") and _covers(
        objects.get("s3:DeleteObject", []), f"{PROBE_DIR}/x"
    )
    if not probe_writes:
        checks.append(Check("conditional-put", SKIPPED, "needs write probes (no --dry-run)"))
    elif not may_probe:
        checks.append(
            Check(
                "conditional-put",
                SKIPPED,
                f"the {role} role writes no probe objects; doctor --role writer (with a "
                "writer's credentials) probes the bucket",
            )
        )
    else:
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
    if table.entries is not None:
        checks.append(_shared_base_uri(table))
    if leftovers:
        checks.append(
            Check(
                "probe-cleanup",
                WARNING,
                f"probe object(s) could not be deleted: {', '.join(leftovers)}",
                f"{table.command('gc')} collects them (nothing reads {PROBE_DIR}/)",
            )
        )
    return DoctorReport(table.uri, checks, honoured, skew, role, leftovers)


def _dynamodb_checks(table: OpsTable, probe_writes: bool, role: str) -> list[Check]:
    assert table.entries is not None and table.ddb_table is not None
    client = table.entries.client
    name = table.ddb_table
    target = target_of(client, name)
    resource = target.resource
    keys = partition_keys(table.base)
    checks: list[Check] = []
    describe = _Probe("dynamodb:DescribeTable", role)
    described = describe.run(resource, lambda: client.describe_table(TableName=name))
    checks.append(describe.check())
    if described is not None:
        try:
            check_table_description(described.get("Table", {}), target)
            checks.append(Check("key-schema", OK, "HASH base_uri (S), RANGE version (N)"))
        except DynamoDBTableSchemaError as exc:
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

    def where(kind: str) -> str:
        return f"{resource} key {keys[kind]!r} ({_KEY_NAMES[kind]})"

    actions = _actions_on_keys(role)
    for action in ("dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query"):
        kinds = actions.get(action, [])
        if not kinds:
            continue
        probe = _Probe(action, role)
        if action == "dynamodb:GetItem":
            for kind in kinds:
                probe.run(where(kind), _get(client, name, key_of(keys[kind], PROBE_VERSION)))
        elif action == "dynamodb:BatchGetItem":
            # What a connection's checks read in one request: the stamp and moved record.
            batch = [k for k in (STAMP, MOVED) if k in kinds] or kinds[:1]
            request = {
                name: {
                    "Keys": [key_of(keys[k], PROBE_VERSION) for k in batch],
                    "ConsistentRead": True,
                }
            }
            probe.run(
                ", ".join(where(k) for k in batch),
                functools.partial(client.batch_get_item, RequestItems=request),
            )
        else:
            probe.run(
                where(VERSIONS),
                lambda: client.query(
                    TableName=name,
                    KeyConditionExpression="base_uri = :b",
                    ExpressionAttributeValues={":b": {"S": keys[VERSIONS]}},
                    Limit=1,
                    ConsistentRead=True,
                ),
            )
        checks.append(probe.check())
    for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"):
        kinds = actions.get(action, [])
        if not kinds:
            continue
        if not probe_writes:
            checks.append(Check(action, SKIPPED, "write probe skipped (--dry-run)"))
            continue
        probe = _Probe(action, role)
        for kind in kinds:
            key = key_of(keys[kind], PROBE_VERSION)
            send = _conditional_write(client, name, action, key)
            probe.run(where(kind), send, authorized=_condition_failed)
        note = ""
        if action == "dynamodb:UpdateItem" and any(keys[QUEUE] in d for d in probe.denied):
            note = (
                "; writers under contention cannot take turns in the table's commit queue "
                "and back off at random instead"
            )
        check = probe.check(note)
        if probe.allowed and check.status == OK:
            check = Check(
                check.name,
                OK,
                check.detail + " (nothing written: the probe's condition cannot hold)",
            )
        checks.append(check)
    return checks


def _get(client: Any, name: str, key: dict[str, Any]) -> Callable[[], Any]:
    return lambda: client.get_item(TableName=name, Key=key, ConsistentRead=True)


def _conditional_write(
    client: Any, name: str, action: str, key: dict[str, Any]
) -> Callable[[], Any]:
    """A write that IAM must authorize but whose condition no item meets."""
    if action == "dynamodb:PutItem":
        item = {**key, "path": {"S": "lancetx-sync doctor probe"}}
        return lambda: client.put_item(TableName=name, Item=item, **_NEVER)
    if action == "dynamodb:UpdateItem":
        return lambda: client.update_item(
            TableName=name,
            Key=key,
            UpdateExpression="SET #lancetx_p = :lancetx_one",
            ConditionExpression=_NEVER_CONDITION,
            ExpressionAttributeNames={**_NEVER_NAMES, "#lancetx_p": "probe"},
            ExpressionAttributeValues={**_NEVER_VALUES, ":lancetx_one": {"N": "1"}},
        )
    return lambda: client.delete_item(TableName=name, Key=key, **_NEVER)


def _s3_checks(
    table: OpsTable, probe_writes: bool, role: str, leftovers: list[str]
) -> tuple[list[Check], float | None]:
    client = s3_client_of(table)
    if client is None or table.bucket is None:
        return [Check("object-store", SKIPPED, "a local table")], None
    bucket = table.bucket
    base = table.base
    checks: list[Check] = []
    objects = _object_grants(role)
    prefix = naming.join(base, "_versions") + "/"
    listing = _Probe("s3:ListBucket", role)
    sent = time.time()
    listed = listing.run(
        f"arn:aws:s3:::{bucket} (prefix {prefix})",
        lambda: client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1),
    )
    received = time.time()
    checks.append(listing.check())
    skew = _skew(listed, (sent + received) / 2) if listed is not None else None

    def arn(key: str) -> str:
        return f"arn:aws:s3:::{bucket}/{key}"

    probe_key = naming.join(base, PROBE_DIR, f"doctor-{uuid.uuid4()}")
    absent = naming.join(base, PROBE_DIR, f"absent-{uuid.uuid4()}")
    relative = f"{PROBE_DIR}/doctor"
    writes_probe = _covers(objects.get("s3:PutObject", []), relative)
    if not probe_writes:
        for action in ("s3:PutObject", "s3:DeleteObject"):
            if action in objects:
                checks.append(Check(action, SKIPPED, "write probe skipped (--dry-run)"))
    if probe_writes and writes_probe:
        put = _Probe("s3:PutObject", role)
        sent = time.time()
        response = put.run(
            arn(probe_key),
            lambda: client.put_object(Bucket=bucket, Key=probe_key, Body=b"probe"),
        )
        received = time.time()
        checks.append(put.check())
        if response is not None and skew is None:
            skew = _skew(response, (sent + received) / 2)
        if "s3:GetObject" in objects:
            get = _Probe("s3:GetObject", role)
            get.run(
                arn(probe_key),
                lambda: client.get_object(Bucket=bucket, Key=probe_key)["Body"].read(),
                authorized=_absent,
            )
            checks.append(get.check())
        if response is not None:
            checks.append(_delete_probe(client, bucket, probe_key, role, objects, leftovers))
    elif "s3:GetObject" in objects:
        # Nothing written: a GET of an absent object is 404 if allowed, 403 if not.
        get = _Probe("s3:GetObject", role)
        get.run(
            arn(absent),
            lambda: client.get_object(Bucket=bucket, Key=absent)["Body"].read(),
            authorized=_absent,
        )
        checks.append(get.check())
    if probe_writes and not writes_probe and "s3:PutObject" in objects:
        # A reader writes only final manifests (finalizing a staged one): probed as a
        # copy from an absent source, which S3 authorizes and then answers 404.
        pattern = objects["s3:PutObject"][0]
        target = naming.join(base, pattern.replace("*", "_lancetx_doctor_probe"))
        copy = _Probe("s3:PutObject", role)
        copied = copy.run(
            f"{arn(target)} (a copy from an absent object: nothing written)",
            lambda: client.copy_object(
                Bucket=bucket, Key=target, CopySource={"Bucket": bucket, "Key": absent}
            ),
            authorized=_absent,
        )
        if copied is not None:  # a store that copies what does not exist: report, never hide
            checks.append(
                Check(
                    "s3:PutObject",
                    FAILED,
                    f"a copy from the absent object {absent!r} succeeded and wrote {target!r}: "
                    "this store does not behave as S3",
                    f"delete s3://{bucket}/{target} with an operator's credentials",
                )
            )
        else:
            checks.append(copy.check())
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


def _delete_probe(
    client: Any,
    bucket: str,
    key: str,
    role: str,
    objects: dict[str, list[str]],
    leftovers: list[str],
    pauses: Sequence[float] = DELETE_PAUSES,
) -> Check:
    """Delete the probe object, retrying; a leftover is named (gc collects it)."""
    delete = _Probe("s3:DeleteObject", role)
    resource = f"arn:aws:s3:::{bucket}/{key}"
    for attempt in range(DELETE_ATTEMPTS):
        delete = _Probe("s3:DeleteObject", role)
        delete.run(resource, lambda: client.delete_object(Bucket=bucket, Key=key))
        if delete.allowed:
            return delete.check()
        if attempt < len(pauses):
            time.sleep(pauses[attempt])
    leftovers.append(f"s3://{bucket}/{key}")
    if "s3:DeleteObject" not in objects:
        return Check("s3:DeleteObject", SKIPPED, f"the {role} role deletes nothing")
    return delete.check(f" {DELETE_ATTEMPTS} times")


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
