"""Maintenance never touches another table: an item pointing at another table's
manifest, or a manifest naming a file outside the table, is a finding, never an
action — and nothing is deleted while one is there. Counted on the server."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import lance
import pytest
from cli_helpers import DdbTable, make_table, read_versions, run_cli, wedge_with_pylance
from protocol_helpers import batch, pylance_append, pylance_create

from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import InvalidCommitError, TransactionFileError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.manifest import encode_manifest, read_manifest
from lancetx.commit.format.naming import parse_manifest_name
from lancetx.commit.format.transaction_file import read_transaction_file, write_transaction_file
from lancetx.commit.storage.stores import open_object_store
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.errors import UntrustedReferenceError
from lancetx.externalstore.connect import connect
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.repair import repair_table
from lancetx.ops.status import table_status
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


@dataclass(frozen=True)
class Seen:
    service: str
    method: str
    path: str
    query: str
    body: bytes


class RequestLog:
    """Every request the embedded server receives while installed (whoever sent it)."""

    def __init__(self, aws: EmbeddedAws) -> None:
        self.aws = aws
        self.lock = threading.Lock()
        self.seen: list[Seen] = []

    def __enter__(self) -> RequestLog:
        self.aws.set_interceptor(self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        self.aws.set_interceptor(None)

    def _record(self, request: InterceptedRequest) -> InterceptedResponse | None:
        with self.lock:
            self.seen.append(
                Seen(request.service, request.method, request.path, request.query, request.body)
            )
        return None

    def touching(self, text: str) -> list[Seen]:
        """Requests naming ``text`` in their path, query or body."""
        raw = text.encode()
        with self.lock:
            return [s for s in self.seen if text in s.path or text in s.query or raw in s.body]


def _two_tables(aws: EmbeddedAws, bucket: str, ddb_table: str) -> tuple[DdbTable, DdbTable]:
    a = make_table(aws, bucket, ddb_table, "a.lance", versions=3)
    b = make_table(aws, bucket, ddb_table, "b.lance", versions=2)
    return a, b


def _point_item_at(table: DdbTable, version: int, path: str, size: int) -> None:
    table.ddb.update_item(
        TableName=table.ddb_table,
        Key={"base_uri": {"S": table.path}, "version": {"N": str(version)}},
        UpdateExpression="SET #p = :p, #s = :s",
        ExpressionAttributeNames={"#p": "path", "#s": "size"},
        ExpressionAttributeValues={":p": {"S": path}, ":s": {"N": str(size)}},
    )


def _latest_manifest(table: DdbTable) -> tuple[str, int]:
    finals = [k for k in table.objects("_versions/") if k.endswith(".manifest")]
    key = max(finals, key=lambda k: parse_manifest_name(k.rsplit("/", 1)[1])[0])  # type: ignore[index]
    size = table.s3.head_object(Bucket=table.bucket, Key=key)["ContentLength"]
    return key, int(size)


def test_cleanup_of_a_table_whose_item_points_at_another_tables_manifest_touches_only_its_own(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    a, b = _two_tables(aws, bucket, ddb_table_name)
    b_before = read_versions(b.uri, b.options)
    b_latest, b_size = _latest_manifest(b)
    _point_item_at(a, 1, b_latest, b_size)
    a_objects, a_items = a.objects(), a.items()

    with RequestLog(aws) as log:
        done = run_cli(aws, "cleanup", a.uri, "--keep-versions", "1", "--json")
    assert done.code == 1, done.stdout + done.stderr
    assert "UntrustedReferenceError" in done.stdout  # exit 1 naming the item, whatever the layout
    assert "nothing was deleted" in done.stdout and b_latest in done.stdout
    assert log.seen, "the server saw the cleanup"
    assert log.touching("b.lance") == []
    assert [s for s in log.seen if s.method == "DELETE"] == []
    assert (a.objects(), a.items()) == (a_objects, a_items)
    assert read_versions(b.uri, b.options) == b_before

    with RequestLog(aws) as log:
        ops = open_table(a.uri, a.options)
        with pytest.raises(UntrustedReferenceError):
            collect_garbage(ops, older_than=timedelta(days=7))
        status = table_status(ops)
        verified = verify_table(ops)
    assert log.touching("b.lance") == []
    assert any("not followed" in note for note in status.notes)
    assert [(f.kind, f.version) for f in verified.findings] == [("untrusted_path", 1)]


def test_status_does_not_read_another_tables_manifest_through_the_latest_item(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    a, b = _two_tables(aws, bucket, ddb_table_name)
    b_latest, b_size = _latest_manifest(b)
    _point_item_at(a, 3, b_latest, b_size)
    with RequestLog(aws) as log:
        report = table_status(open_table(a.uri, a.options))
    assert log.touching("b.lance") == []
    assert report.latest_version == 3 and report.last_commit_time is None
    assert any("not followed" in note for note in report.notes)


def _rewrite_data_path(store_root: Path, table: str, version: int, new_path: str) -> None:
    """Make version ``version``'s manifest name its first data file ``new_path``."""
    store, base = open_object_store(str(store_root / table), {})
    key = next(
        m.key
        for m in store.list(f"{base}/_versions/")
        if (p := parse_manifest_name(m.key.rsplit("/", 1)[1])) and p[0] == version
    )
    manifest = read_manifest(store, key)
    manifest.manifest.fragments[0].files[0].path = new_path
    store.put(
        key,
        encode_manifest(
            manifest.manifest, indices=manifest.indices, transaction=manifest.transaction
        ),
    )


def test_cleanup_of_a_local_table_naming_a_file_outside_it_refuses_before_deleting_anything(
    aws: EmbeddedAws, tmp_path: Path
) -> None:
    root = tmp_path / "tables"
    uri = str(root / "t.lance")
    pylance_create(uri, None, batch("w", 0, 3))
    for seq in (1, 2):
        pylance_append(uri, None, batch("w", seq, 3))
    victim = root / "victim.txt"
    victim.write_text("another table's file")
    _rewrite_data_path(root, "t.lance", 1, "../../victim.txt")
    files = sorted(str(p) for p in root.rglob("*"))

    done = run_cli(aws, "cleanup", uri, "--keep-versions", "1", "--json")
    assert done.code == 1, done.stdout + done.stderr
    assert "UntrustedReferenceError" in done.stdout and "../../victim.txt" in done.stdout
    assert sorted(str(p) for p in root.rglob("*")) == files
    assert victim.read_text() == "another table's file"

    report = verify_table(open_table(uri))
    assert ("untrusted_file_path", 1) in [(f.kind, f.version) for f in report.findings]
    with pytest.raises(UntrustedReferenceError):
        cleanup_versions(open_table(uri), keep_versions=1)
    assert os.path.exists(victim)


@pytest.mark.parametrize(
    "path", ["../b.lance/data/x.lance", "/etc/passwd", "s3://other/data/x.lance", "a/%2e%2e/x"]
)
def test_commit_transaction_refuses_a_data_file_path_outside_the_table_before_any_request(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, path: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    conn = connect(table.uri, table.options)
    parent = load_parent(conn.handler, conn.base)
    assert parent is not None
    (written,) = lance.fragment.write_fragments(
        batch("x", 0, 2), conn.data_uri, storage_options=table.options
    )
    fragment = fragment_from_pylance(written)
    fragment.files[0].path = path
    txn = Transaction(read_version=1, operation=Append(fragments=(fragment,)))
    with RequestLog(aws) as log, pytest.raises(InvalidCommitError, match="data/ folder"):
        commit_transaction(conn.handler, conn.base, txn, parent=parent)
    assert log.seen == []
    assert [int(i["version"]["N"]) for i in table.items()] == [1]


def test_a_transaction_file_name_outside_transactions_is_not_read(tmp_path: Path) -> None:
    store, base = open_object_store(str(tmp_path / "t.lance"), {})
    (tmp_path / "secret.txn").write_bytes(b"x")
    with pytest.raises(TransactionFileError, match="not read"):
        read_transaction_file(store, base, "../../secret.txn")


def test_repair_of_a_wedged_version_follows_no_item_outside_the_table_and_no_hostile_candidate(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    a, b = _two_tables(legacy_aws, bucket, ddb_table_name)  # a: versions 1..3
    lost, _ = wedge_with_pylance(a)  # version 4: claimed, its staged manifest gone
    b_latest, b_size = _latest_manifest(b)
    _point_item_at(a, 3, b_latest, b_size)
    # A transaction file naming a data file in b: never a usable candidate.
    store, base = open_object_store(f"s3://{bucket}/a.lance", a.options)
    (written,) = lance.fragment.write_fragments(
        batch("h", 0, 1), f"s3://{bucket}/a.lance", storage_options=a.options
    )
    hostile = fragment_from_pylance(written)
    hostile.files[0].path = "../../b.lance/data/x.lance"
    name = write_transaction_file(
        store, base, Transaction(read_version=2, operation=Append(fragments=(hostile,))).to_proto()
    )

    with RequestLog(legacy_aws) as log:
        report = repair_table(open_table(a.uri, a.options), version=4)
    assert log.touching("b.lance") == []
    by_name = {c.name: c for c in report.candidates[4]}
    assert by_name[lost.rsplit("/", 1)[1]].usable
    assert not by_name[name].usable and "../../b.lance" in (by_name[name].problem or "")
    assert report.actions == []
