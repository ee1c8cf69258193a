"""``lancetx-sync doctor --role``: a role's credentials are judged against that role's needs.

Each role's policy (from ``iam-policy``) is enforced on the embedded server while
doctor runs (``iam_simulator``): with the right policy every check passes and
nothing is left behind — DynamoDB write probes are conditional writes that cannot
apply, a reader's probes write nothing at all. A probe object that cannot be
deleted is retried, then named, and ``gc`` collects it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cli_helpers import DdbTable, make_table, run_cli
from iam_simulator import access_denied, iam_requests, recording

from lancetx.commit.handlers.probe import PROBE_DIR
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.ops.doctor import run_doctor
from lancetx.ops.gc import collect_garbage
from lancetx.ops.iam_policy import iam_policies
from lancetx.ops.table import open_table

ACCOUNT, REGION = "123456789012", "us-east-1"


@pytest.fixture
def table(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[DdbTable]:
    yield make_table(legacy_aws, bucket, ddb_table_name, "db/t.lance", versions=2)


def _policy(table: DdbTable, role: str) -> dict[str, Any]:
    ops = open_table(table.uri, table.options, validate=False)
    return iam_policies(ops, account=ACCOUNT, region=REGION).policies[role]


def _state(table: DdbTable) -> tuple[list[str], list[dict[str, Any]]]:
    items = table.ddb.scan(TableName=table.ddb_table)["Items"]
    return table.objects(), sorted(items, key=repr)


def _statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


@pytest.mark.parametrize("role", ["writer", "reader"])
def test_doctor_passes_a_role_with_exactly_its_policy_and_leaves_nothing(
    table: DdbTable, role: str
) -> None:
    """Before, a correct writer policy got exit 1 ("grant dynamodb:DeleteItem") and a
    reader policy six failures: doctor judged every role as lancetx-sync."""
    before = _state(table)
    with recording(table.aws, _policy(table, role)) as rec:
        out = run_cli(table.aws, "doctor", table.uri, "--role", role, "--json")
    assert out.code == 0, out.stdout + out.stderr
    statuses = _statuses(out.json)
    assert "denied" not in statuses.values() and "failed" not in statuses.values(), statuses
    assert not rec.denied, "\n".join(map(str, rec.denied))
    assert out.json["role"] == role and out.json["leftovers"] == []
    for action in (
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
        "dynamodb:Query",
        "dynamodb:PutItem",
    ):
        assert statuses[action] == "ok", (action, statuses)
    assert statuses["s3:ListBucket"] == statuses["s3:GetObject"] == statuses["s3:PutObject"] == "ok"
    if role == "writer":
        assert statuses["dynamodb:UpdateItem"] == "ok" and "dynamodb:DeleteItem" not in statuses
        assert statuses["s3:DeleteObject"] == "ok"
        assert statuses["conditional-put"] == "warning"  # a legacy bucket, on DynamoDB
    else:  # a reader writes nothing: no object, no item, not even a probe
        assert "dynamodb:UpdateItem" not in statuses and "s3:DeleteObject" not in statuses
        assert statuses["conditional-put"] == "skipped"
        writes = [r for r in rec.raw if r.service == "s3" and r.method not in ("GET", "HEAD")]
        # One: the finalize probe, a copy from an absent object (S3 answers 404).
        assert [
            (r.method, f"/{PROBE_DIR}/absent-" in r.headers["x-amz-copy-source"]) for r in writes
        ] == [("PUT", True)]
    assert _state(table) == before  # DynamoDB probes wrote nothing; the probe object is gone


def test_each_role_is_judged_by_its_own_needs_and_told_which_role_was_judged(
    table: DdbTable,
) -> None:
    ops = open_table(table.uri, table.options)
    for role in ("operator", "doctor"):
        with recording(table.aws, _policy(table, role)) as rec:
            report = run_doctor(ops, role=role)
        assert report.ok, [c for c in report.checks if c.status in ("denied", "failed")]
        assert not rec.denied, "\n".join(map(str, rec.denied))
    # A writer's credentials judged as the operator (the default): told what and why.
    with recording(table.aws, _policy(table, "writer")):
        report = run_doctor(ops)
    denied = {c.name: c for c in report.checks if c.status == "denied"}
    # The operator deletes items (cleanup) and writes the moved record (migrate).
    assert sorted(denied) == ["dynamodb:DeleteItem", "dynamodb:PutItem", "dynamodb:UpdateItem"]
    assert "__lancetx_moved__/db/t.lance" in denied["dynamodb:PutItem"].detail
    for check in denied.values():
        assert "--role operator" in check.fix and "run doctor with that --role" in check.fix


def test_a_probe_object_that_cannot_be_deleted_is_retried_then_named_and_collected_by_gc(
    table: DdbTable,
) -> None:
    refusals = {"left": 2}

    def refuse_probe_deletes(request: InterceptedRequest) -> InterceptedResponse | None:
        probe = request.method == "DELETE" and f"/{PROBE_DIR}/doctor-" in request.path
        if probe and refusals["left"] != 0:
            refusals["left"] -= 1
            return access_denied(request, iam_requests(request)[0])
        return None

    table.aws.set_interceptor(refuse_probe_deletes)
    try:
        report = run_doctor(open_table(table.uri, table.options), role="writer")
        assert report.ok and report.leftovers == []  # deleted at the third try
        assert not [k for k in table.objects() if PROBE_DIR in k]
        refusals["left"] = -1  # from now on, never
        out = run_cli(table.aws, "doctor", table.uri, "--role", "writer", "--json")
    finally:
        table.aws.set_interceptor(None)
    (left,) = out.json["leftovers"]
    assert left.startswith(f"s3://{table.bucket}/db/t.lance/{PROBE_DIR}/doctor-")
    (cleanup,) = [c for c in out.json["checks"] if c["name"] == "probe-cleanup"]
    assert cleanup["status"] == "warning" and left in cleanup["detail"] and "gc" in cleanup["fix"]
    key = left.removeprefix(f"s3://{table.bucket}/")
    assert key in table.objects()
    later = datetime.now(UTC) + timedelta(days=30)
    swept = collect_garbage(
        open_table(table.uri, table.options), older_than=timedelta(days=1), dry_run=False, now=later
    )
    assert [(c.key, c.kind) for c in swept.candidates] == [(key, "probe_object")]
    assert key not in table.objects()
