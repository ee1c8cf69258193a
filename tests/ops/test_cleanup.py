"""``cleanup_versions``: what it removes is always the oldest untagged versions, so
every reader tells a removed version from a missing one at every moment."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cli_helpers import make_table
from protocol_helpers import batch, pylance_append, pylance_create

import lancetx
from lancetx.commit.format.manifest import encode_manifest, read_manifest
from lancetx.commit.format.naming import parse_manifest_name
from lancetx.commit.storage.stores import open_object_store
from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


def _set_timestamp(uri: str, version: int, when: datetime) -> None:
    store, base = open_object_store(uri, {})
    key = next(
        m.key
        for m in store.list(f"{base}/_versions/")
        if (p := parse_manifest_name(m.key.rsplit("/", 1)[1])) and p[0] == version
    )
    manifest = read_manifest(store, key)
    manifest.manifest.timestamp.FromDatetime(when)
    store.put(
        key,
        encode_manifest(
            manifest.manifest, indices=manifest.indices, transaction=manifest.transaction
        ),
    )


def test_a_version_kept_by_its_age_keeps_every_later_one_whatever_their_clocks_said(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    pylance_create(uri, None, batch("w", 0, 2))
    for seq in range(1, 5):
        pylance_append(uri, None, batch("w", seq, 2))  # versions 1..5
    now = datetime.now(UTC)
    for version, age in {1: 40, 2: 5, 3: 40, 4: 40, 5: 1}.items():
        _set_timestamp(uri, version, now - timedelta(days=age))  # 3 and 4: a clock behind
    report = cleanup_versions(open_table(uri), older_than=timedelta(days=30), now=now)
    assert report.removed_versions == [1]
    assert report.kept_versions == [2, 3, 4, 5]
    assert verify_table(open_table(uri)).ok


def test_a_version_not_finalized_yet_stops_cleanup_below_it(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=4)
    # Version 2's writer stopped after its claim: its item points at a staged manifest.
    final = next(
        k
        for k in table.objects("_versions/")
        if (p := parse_manifest_name(k.rsplit("/", 1)[1])) and p[0] == 2
    )
    staged = f"{final}-{uuid.uuid4()}"
    table.s3.copy_object(Bucket=bucket, Key=staged, CopySource={"Bucket": bucket, "Key": final})
    table.s3.delete_object(Bucket=bucket, Key=final)
    item = table.items()[1]
    item["path"] = {"S": staged}
    table.ddb.put_item(TableName=ddb_table_name, Item=item)

    report = cleanup_versions(open_table(table.uri, table.options), keep_versions=1)
    assert report.removed_versions == [1]
    assert staged in table.objects("_versions/")
    opened = lancetx.open(table.uri, table.options)
    assert [v.version for v in opened.history()] == [2, 3, 4]
