"""Maintenance of tables with extra base paths: gc and cleanup touch only the table's
own folder. Files under a base elsewhere are never deleted (another table's, a
clone's source), files under a base inside the table's ``data/`` are the table's
(kept while referenced), and a base that would make maintenance read or delete in
the wrong place (inside the table but not in ``data/``, a path that walks up, another
table's folder nested in this one) stops gc and cleanup before anything is deleted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import lance
import pyarrow as pa
import pytest
from cli_helpers import age_objects, run_cli
from lance.fragment import write_fragments
from protocol_helpers import ensure_ddb_table
from table_helpers import ddb_uri

import lancetx
from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.commit.engine.operations import Append, Transaction, UpdateBases
from lancetx.convert import to_fragment
from lancetx.demo.embedded import EmbeddedAws
from lancetx.errors import UntrustedReferenceError
from lancetx.externalstore.connect import connect
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table
from lancetx.protos import table_pb2


def _rows(n: int, start: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64())})


def _ids(uri: str, options: dict[str, str]) -> list[int]:
    ds = lance.dataset(uri, storage_options=options)
    return sorted(ds.to_table(columns=["id"]).column("id").to_pylist())


def _keys(s3: Any, bucket: str, prefix: str) -> set[str]:
    out: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.update(o["Key"] for o in page.get("Contents", []))
    return out


@pytest.fixture
def table(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> tuple[str, dict[str, str]]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, ddb_table_name, "t.lance")
    lancetx.write_table(uri, _rows(3, 0), storage_options=options)
    return uri, options


def _register(uri: str, options: dict[str, str], *bases: table_pb2.BasePath) -> lancetx.Table:
    table = lancetx.open(uri, options)
    table.commit(UpdateBases(new_bases=bases))
    return table.refresh()


def _write_under(table: lancetx.Table, base: str, rows: pa.Table) -> int:
    """Rows written by pylance under the registered base ``base``, committed by lancetx."""
    return table.append(rows, target_bases=[base])


def test_gc_and_cleanup_never_delete_files_under_a_base_elsewhere(
    table: tuple[str, dict[str, str]], s3_client: Any, bucket: str
) -> None:
    uri, options = table
    t = _register(
        uri, options, table_pb2.BasePath(id=1, name="shared", path=f"s3://{bucket}/shared")
    )
    _write_under(t, "shared", _rows(2, 10))
    t.refresh().overwrite(_rows(1, 20))  # the shared files are referenced by old versions only
    stray = "shared/not-referenced-by-anyone.lance"
    s3_client.put_object(Bucket=bucket, Key=stray, Body=b"someone else's")
    shared = _keys(s3_client, bucket, "shared/")
    age_objects(bucket, [*shared, *_keys(s3_client, bucket, "t.lance/")], timedelta(days=30))

    ops = open_table(uri, options)
    assert collect_garbage(ops, older_than=timedelta(days=7), dry_run=False).ok
    cleaned = cleanup_versions(ops, keep_versions=1)
    assert cleaned.ok and cleaned.removed_versions == [1, 2, 3]
    assert collect_garbage(ops, older_than=timedelta(days=7), dry_run=False).ok
    assert _keys(s3_client, bucket, "shared/") == shared
    assert _ids(uri, options) == [20]


def test_files_under_a_base_inside_the_tables_data_folder_are_kept_while_referenced(
    table: tuple[str, dict[str, str]], s3_client: Any, bucket: str
) -> None:
    """gc lists ``data/`` whole: the files of a base registered inside it are the
    table's, referenced through their base id, and must count as referenced."""
    uri, options = table
    inside = table_pb2.BasePath(id=1, name="inner", path=f"s3://{bucket}/t.lance/data/inner")
    t = _register(uri, options, inside)
    _write_under(t, "inner", _rows(2, 10))
    inner = _keys(s3_client, bucket, "t.lance/data/inner/")
    assert inner
    age_objects(bucket, list(_keys(s3_client, bucket, "t.lance/")), timedelta(days=30))

    ops = open_table(uri, options)
    swept = collect_garbage(ops, older_than=timedelta(days=7), dry_run=False)
    assert swept.ok and not [c.key for c in swept.candidates if c.key in inner]
    assert _keys(s3_client, bucket, "t.lance/data/inner/") == inner
    assert _ids(uri, options) == [0, 1, 2, 10, 11]
    assert verify_table(ops, deep=True, all_versions=True).ok

    # no longer referenced by any version cleanup keeps: then they are the table's garbage
    lancetx.open(uri, options).overwrite(_rows(1, 30))
    cleaned = cleanup_versions(ops, keep_versions=1)
    assert cleaned.ok and inner <= set(cleaned.files_deleted)
    assert _keys(s3_client, bucket, "t.lance/data/inner/") == set()
    assert _ids(uri, options) == [30]


def _commit_under_hostile_base(uri: str, options: dict[str, str], path: str, root: bool) -> None:
    """A version reading a data file through base ``path``: registered and committed
    below the verbs (as any Lance writer could), the data file a real one."""
    conn = connect(uri, options)
    parent = load_parent(conn.handler, conn.base)
    assert parent is not None
    bases = (table_pb2.BasePath(id=9, name="hostile", path=path, is_dataset_root=root),)
    done = commit_transaction(
        conn.handler,
        conn.base,
        Transaction(read_version=parent.version, operation=UpdateBases(new_bases=bases)),
        parent=parent,
    )
    (written,) = write_fragments(_rows(1, 50), conn.data_uri, storage_options=options)
    fragment = to_fragment(uri, written)
    fragment.files[0].base_id = 9
    commit_transaction(
        conn.handler,
        conn.base,
        Transaction(read_version=done.version, operation=Append(fragments=(fragment,))),
        parent=done,
    )


@pytest.mark.parametrize(
    ("where", "root", "why"),
    [
        ("t.lance/_versions", False, "inside this table but not in data/"),
        ("t.lance/data/nested.lance", True, "a table folder inside this table's"),
        ("shared/../t.lance/_transactions", False, "segment '..'"),
    ],
)
def test_a_base_that_would_send_maintenance_to_the_wrong_place_stops_it_before_any_delete(
    legacy_aws: EmbeddedAws,
    table: tuple[str, dict[str, str]],
    s3_client: Any,
    bucket: str,
    where: str,
    root: bool,
    why: str,
) -> None:
    uri, options = table
    _commit_under_hostile_base(uri, options, f"s3://{bucket}/{where}", root)
    objects = _keys(s3_client, bucket, "")
    age_objects(bucket, list(objects), timedelta(days=30))
    ops = open_table(uri, options)
    with pytest.raises(UntrustedReferenceError, match=why.replace("'", ".")):
        collect_garbage(ops, older_than=timedelta(days=7), dry_run=False)
    with pytest.raises(UntrustedReferenceError):
        cleanup_versions(ops, keep_versions=1)
    found = verify_table(ops)
    assert ("untrusted_file_path", 3) in [(f.kind, f.version) for f in found.findings]
    ran = run_cli(legacy_aws, "gc", uri, "--older-than", "7d", "--delete", "--json")
    assert ran.code == 1 and "UntrustedReferenceError" in ran.stdout, ran.stdout + ran.stderr
    assert _keys(s3_client, bucket, "") == objects
