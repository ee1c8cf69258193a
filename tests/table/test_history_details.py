"""History a person can read: each version's rows, fragments and data bytes (as
pylance's own ``versions()`` reports them) and the bytes it added and removed;
``lancetx.history(uri)`` lists any table, ``[]`` where nothing was committed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table

import lancetx
import lancetx.aio
from lancetx.demo.embedded import EmbeddedAws


def _details(info: lancetx.VersionInfo) -> tuple[object, ...]:
    return (info.operation, info.rows, info.fragments, info.bytes_added, info.bytes_removed)


def test_each_version_carries_rows_fragments_and_bytes_as_pylance_counts_them(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    table = lancetx.write_table(uri, pa.table({"id": list(range(3))}))  # v1
    table.append(pa.table({"id": [3, 4]}))  # v2
    table.delete("id = 1")  # v3: a deletion file, no data file changes
    table.delete("id >= 3")  # v4: the second fragment goes
    table.compact()  # v5: the first fragment rewritten
    table.overwrite(pa.table({"id": [9]}))  # v6
    history = lancetx.history(uri)
    size = {info.version: info.data_bytes for info in history}
    assert all(isinstance(n, int) and n > 0 for n in size.values()), size
    assert [_details(info) for info in history] == [
        ("Overwrite", 3, 1, size[1], 0),
        ("Append", 5, 2, size[2] - size[1], 0),
        ("Delete", 4, 2, 0, 0),
        ("Delete", 2, 1, 0, size[2] - size[1]),
        ("Rewrite", 2, 1, size[5], size[4]),
        ("Overwrite", 1, 1, size[6], size[5]),
    ]
    # pylance's own summary of each version agrees
    for theirs, ours in zip(lance.dataset(uri).versions(), history, strict=True):
        meta = theirs["metadata"]
        assert theirs["version"] == ours.version
        assert int(meta["total_rows"]) == ours.rows
        assert int(meta["total_fragments"]) == ours.fragments
        assert int(meta["total_files_size"]) == ours.data_bytes
    # the same from a Table, from walking it newest first, and from asyncio
    assert [_details(i) for i in lancetx.open(uri).history()] == [_details(i) for i in history]
    walked = list(lancetx.open(uri).walk_history(since=3))
    assert [_details(i) for i in walked] == [_details(i) for i in reversed(history[3:])]
    assert asyncio.run(lancetx.aio.history(uri)) == history


def test_a_version_whose_predecessor_a_cleanup_removed_has_unknown_changes(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("w", 0, 2), storage_options=options)
    for n in range(1, 4):
        table.append(batch("w", n, 2))  # versions 2..4
    lance.dataset(uri, storage_options=options).cleanup_old_versions(retain_versions=2)
    history = lancetx.history(uri, options)
    assert [(i.version, i.rows, i.fragments) for i in history] == [(3, 6, 3), (4, 8, 4)]
    assert (history[0].bytes_added, history[0].bytes_removed) == (None, None)
    assert history[1].bytes_removed == 0 and history[1].bytes_added is not None
    assert history[1].data_bytes == history[0].data_bytes + history[1].bytes_added  # type: ignore[operator]


def test_history_of_a_path_where_nothing_was_committed_is_empty_and_writes_nothing(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, tmp_path: Path, s3_client: object
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    assert lancetx.history(str(tmp_path / "never.lance")) == []
    assert not (tmp_path / "never.lance").exists()
    assert lancetx.history(f"s3://{bucket}/never.lance", options) == []
    assert lancetx.history(ddb_uri(bucket, "never.lance", ddb_table_name), options) == []
    assert asyncio.run(lancetx.aio.history(str(tmp_path / "never.lance"))) == []
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0  # type: ignore[attr-defined]
    with pytest.raises(lancetx.DatasetNotFoundError):
        lancetx.open(str(tmp_path / "never.lance"))
