"""``verify`` (and ``repair``, which acts on its findings): a path with nothing in it,
a deleted middle item, and a commit landing half-way through a scan."""

from __future__ import annotations

import threading
import urllib.parse

import pytest
from cli_helpers import make_table, run_cli
from protocol_helpers import batch, lancetx_append

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.connect import connect
from lancetx.ops.onboard import onboard_table
from lancetx.ops.repair import repair_table
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


@pytest.mark.parametrize("where", ["s3+ddb", "local"])
def test_verify_of_a_path_where_nothing_was_committed_exits_non_zero(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, tmp_path: object, where: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)  # the DynamoDB table exists, and a table
    uri = (
        table.uri.replace("/t.lance?", "/typo.lance?")
        if where == "s3+ddb"
        else f"{tmp_path}/never-written.lance"
    )
    done = run_cli(aws, "verify", uri, "--json")
    assert done.code == 1, done.stdout + done.stderr
    (finding,) = done.json["findings"]
    assert finding["kind"] == "no_versions" and finding["severity"] == "error"


def test_verify_finds_a_deleted_middle_item_and_onboard_records_it(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=4)
    table.ddb.delete_item(
        TableName=ddb_table_name, Key={"base_uri": {"S": table.path}, "version": {"N": "2"}}
    )
    ops = open_table(table.uri, table.options)
    report = verify_table(ops)
    assert not report.ok
    assert [(f.kind, f.version) for f in report.findings] == [("missing_item", 2)]
    assert onboard_table(ops).recorded == [2]
    assert verify_table(ops).ok


def _commit_during_first_versions_listing(aws: EmbeddedAws, commit: object) -> list[str]:
    """An interceptor: the first LIST of a ``_versions/`` folder waits until ``commit()``
    (run on another thread, its own requests let through) has landed a version —
    the scan then lists a manifest newer than the items it queried before."""
    fired: list[str] = []
    lock = threading.Lock()

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        query = urllib.parse.parse_qs(request.query)
        if request.method != "GET" or "list-type" not in query:
            return None
        if not query.get("prefix", [""])[0].endswith("/_versions/"):
            return None
        with lock:
            if fired:
                return None
            fired.append(request.query)
        worker = threading.Thread(target=commit)  # type: ignore[arg-type]
        worker.start()
        worker.join(timeout=120)
        return None

    aws.set_interceptor(interceptor)
    return fired


@pytest.mark.parametrize("tool", ["verify", "repair"])
def test_a_commit_landing_during_the_scan_is_no_finding(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, tool: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name, versions=2)
    conn = connect(table.uri, table.options)
    ops = open_table(table.uri, table.options)
    landed: list[int] = []

    def commit() -> None:
        done = lancetx_append(
            conn.handler, conn.base, conn.data_uri, table.options, batch("x", 0, 2)
        )
        landed.append(done.version)

    fired = _commit_during_first_versions_listing(legacy_aws, commit)
    try:
        if tool == "verify":
            report = verify_table(ops)
            findings, ok = report.findings, report.ok
        else:
            repaired = repair_table(ops)
            findings, ok = repaired.unresolved, repaired.ok and not repaired.actions
    finally:
        legacy_aws.set_interceptor(None)
    assert fired and landed == [3]
    assert ok, findings
