"""``lancetx-sync gc / cleanup / onboard`` on tables with the problem each fixes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import lance
import pytest
from cli_helpers import age_objects, make_table, read_versions, run_cli
from protocol_helpers import (
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

from lancetx.commit.engine.committer import load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import LancetxError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.transaction_file import write_transaction_file
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


def test_gc_deletes_failed_task_files_orphans_and_failed_attempts_only(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    before = read_versions(table.uri, table.options)
    committed = set(table.objects())
    # A failed Spark task: data files written, never committed.
    lance.fragment.write_fragments(
        batch("failed", 0, 7), f"s3://{bucket}/{table.path}", storage_options=table.options
    )
    # A writer that crashed before its claim: a staged manifest no item points at.
    final = sorted(k for k in table.objects("_versions/") if k.endswith(".manifest"))[0]
    table.s3.copy_object(
        Bucket=bucket, Key=f"{final}-{uuid.uuid4()}", CopySource={"Bucket": bucket, "Key": final}
    )
    # A lost attempt's transaction file.
    txn = table.objects("_transactions/")[0]
    table.s3.copy_object(
        Bucket=bucket,
        Key=f"{table.path}/_transactions/1-{uuid.uuid4()}.txn",
        CopySource={"Bucket": bucket, "Key": txn},
    )
    planted = set(table.objects()) - committed
    assert {k.split("/")[1] for k in planted} == {"data", "_versions", "_transactions"}

    young = run_cli(aws, "gc", table.uri, "--older-than", "1h", "--json")
    assert young.code == 0 and young.json["candidates"] == []

    age_objects(bucket, sorted(set(table.objects())), timedelta(hours=2))
    dry = run_cli(aws, "gc", table.uri, "--older-than", "1h", "--json")
    assert dry.code == 0 and dry.json["dry_run"] is True
    assert {c["key"] for c in dry.json["candidates"]} == planted
    sizes = {o["Key"]: o["Size"] for o in table.s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert dry.json["bytes_reclaimable"] == sum(sizes[k] for k in planted)
    assert set(table.objects()) == committed | planted

    done = run_cli(aws, "gc", table.uri, "--older-than", "1h", "--delete", "--json")
    assert done.code == 0 and done.json["deleted"] == len(planted)
    assert set(table.objects()) == committed
    report = verify_table(open_table(table.uri, table.options), deep=True, all_versions=True)
    assert report.ok, report.findings
    assert read_versions(table.uri, table.options) == before


def test_cleanup_removes_old_versions_their_files_and_their_items(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)  # v1 create (seq 0), v2 append (seq 1)
    lance.dataset(table.uri, storage_options=table.options).delete("seq = 0")  # v3
    pylance_append(table.uri, table.options, batch("w", 2, 5))  # v4
    before = read_versions(table.uri, table.options)
    assert sorted(before) == [1, 2, 3, 4]
    first_data = {
        k
        for k in table.objects("data/")
        if k not in {f"{table.path}/data/{f.path}" for f in _data_files(table.uri, table.options)}
    }
    assert len(first_data) == 1  # fragment 0's file, which only versions 1 and 2 reference

    objects, items = table.objects(), table.items()
    dry = run_cli(aws, "cleanup", table.uri, "--keep-versions", "2", "--dry-run", "--json")
    assert dry.code == 0 and dry.json["removed_versions"] == [1, 2]
    assert (table.objects(), table.items()) == (objects, items)

    fenced = run_cli(aws, "cleanup", table.uri, "--keep-versions", "2", "--dry-run", "--json")
    assert fenced.json["items_deleted"] == [] and fenced.json["items_kept_as_fence"] == [1, 2]
    done = run_cli(
        aws, "cleanup", table.uri, "--keep-versions", "2", "--items-older-than", "0s", "--json"
    )
    assert done.code == 0, done.stdout + done.stderr
    assert done.json["removed_versions"] == [1, 2] and done.json["items_deleted"] == [1, 2]
    assert first_data <= set(done.json["files_deleted"])
    assert not first_data & set(table.objects())
    assert [int(i["version"]["N"]) for i in table.items()] == [3, 4]
    assert verify_table(open_table(table.uri, table.options), deep=True, all_versions=True).ok
    assert read_versions(table.uri, table.options) == {3: before[3], 4: before[4]}


def _data_files(uri: str, options: dict[str, str]) -> list:  # type: ignore[type-arg]
    ds = lance.dataset(uri, storage_options=options)
    return [f for fragment in ds.get_fragments() for f in fragment.metadata.files]


def test_onboard_records_a_table_written_without_dynamodb(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = aws.pylance_storage_options()
    plain = f"s3://{bucket}/plain.lance"
    pylance_create(plain, options, batch("w", 0, 3))
    for seq in (1, 2):
        pylance_append(plain, options, batch("w", seq, 3))
    before = read_versions(plain, options)
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "plain.lance", ddb_table_name)

    dry = run_cli(aws, "onboard", uri, "--dry-run", "--json")
    assert dry.code == 0 and dry.json["recorded"] == [1, 2, 3]
    ops = open_table(uri, options)
    assert ops.list_entries() == []

    done = run_cli(aws, "onboard", uri, "--json")
    assert done.code == 0
    assert done.json["recorded"] == [1, 2, 3] and done.json["already_recorded"] == 0
    assert [e.version for e in ops.list_entries()] == [1, 2, 3]
    assert verify_table(ops).ok
    assert read_versions(uri, options) == before


def test_cleanup_keeps_young_items_so_a_writer_holding_an_old_parent_cannot_commit_below_latest(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=5)
    conn = connect(table.uri, table.options)
    stale = load_parent(conn.handler, conn.base, 1)  # a writer that read version 1 long ago
    ops = open_table(table.uri, table.options)
    report = cleanup_versions(ops, keep_versions=2)
    assert report.removed_versions == [1, 2, 3]
    assert report.items_deleted == [] and report.items_kept_as_fence == [1, 2, 3]

    # Its claim of version 2 loses to the kept item; it is refused and nothing is written.
    objects = table.objects()
    with pytest.raises(LancetxError):  # refused: a version it must check against is gone
        lancetx_append(
            conn.handler, conn.base, conn.data_uri, table.options, batch("stale", 0, 2), stale
        )
    assert [k for k in table.objects() if "/data/" not in k] == [
        k for k in objects if "/data/" not in k
    ]
    done = lancetx_append(
        conn.handler, conn.base, conn.data_uri, table.options, batch("fresh", 0, 2)
    )
    assert done.version == 6
    assert verify_table(ops, deep=True, all_versions=True).ok


def test_gc_keeps_files_a_young_transaction_file_names(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A writer still committing has written its transaction file: its data files stay,
    however old they are; once that transaction file is old too, both go."""
    table = make_table(aws, bucket, ddb_table_name)
    fragments = lance.fragment.write_fragments(
        batch("slow", 0, 4), f"s3://{bucket}/{table.path}", storage_options=table.options
    )
    data = {f"{table.path}/data/{f.path}" for fragment in fragments for f in fragment.files}
    ops = open_table(table.uri, table.options)
    txn = Transaction(
        read_version=2,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
    ).to_proto()
    txn_key = f"{table.path}/_transactions/{write_transaction_file(ops.store, ops.base, txn)}"
    age_objects(bucket, sorted(data), timedelta(hours=2))

    in_flight = collect_garbage(ops, older_than=timedelta(hours=1))
    assert not data & {c.key for c in in_flight.candidates}

    age_objects(bucket, [txn_key], timedelta(hours=2))
    abandoned = collect_garbage(ops, older_than=timedelta(hours=1))
    assert {c.key for c in abandoned.candidates} == data | {txn_key}
