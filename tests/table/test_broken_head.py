"""Reads that survive a broken head: while the latest version of an ``s3+ddb://`` table
cannot be read (wedged by a lost claim answer, its manifest deleted, or corrupt) and no
finalizing can fix it, every older version stays readable through ``lancetx.open(uri,
version=N)``, ``Table.checkout(N)``, a tag, ``Table.history()`` and
``lancetx.history(uri)``, as pylance reads them; the broken version is reported once (a
warning naming it and the ``lancetx-sync repair`` command), and ``lancetx.open(uri)`` of
the latest still refuses it (nothing may be committed on top of it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import lance
import pytest
from cli_helpers import DdbTable, make_table, wedge_with_pylance
from protocol_helpers import batch

import lancetx
import lancetx.aio
from lancetx.demo.embedded import EmbeddedAws


def _final_manifest_key(table: DdbTable, version: int) -> str:
    item = next(i for i in table.items() if int(i["version"]["N"]) == version)
    path: str = item["path"]["S"]
    assert path.endswith(".manifest")  # finalized: what follows breaks a final manifest
    return path


def _wedge(table: DdbTable) -> None:
    wedge_with_pylance(table)


def _delete_latest_manifest(table: DdbTable) -> None:
    lancetx.open(table.uri, table.options).append(batch("lost", 0, 3))
    table.s3.delete_object(Bucket=table.bucket, Key=_final_manifest_key(table, 5))


def _corrupt_latest_manifest(table: DdbTable) -> None:
    lancetx.open(table.uri, table.options).append(batch("lost", 0, 3))
    key = _final_manifest_key(table, 5)
    size = table.s3.head_object(Bucket=table.bucket, Key=key)["ContentLength"]
    table.s3.put_object(Bucket=table.bucket, Key=key, Body=b"\x00" * size)  # same size


BREAKS: dict[str, tuple[Callable[[DdbTable], None], type[lancetx.LancetxError]]] = {
    "wedged": (_wedge, lancetx.WedgedVersionError),
    "manifest_deleted": (_delete_latest_manifest, lancetx.DanglingEntryError),
    "manifest_corrupt": (_corrupt_latest_manifest, lancetx.CorruptManifestError),
}


def _rows(table: lancetx.Table | lancetx.aio.AsyncTable) -> int:
    if isinstance(table, lancetx.aio.AsyncTable):
        return asyncio.run(table.count_rows())
    return table.count_rows()


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_every_intact_version_reads_while_the_latest_is_broken(
    how: str,
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name, versions=4)  # 5 rows per version
    uri, options = table.uri, table.options
    lancetx.open(uri, options).tags.create("second", 2)
    opened_before = lancetx.open(uri, options)
    expected = {v: 5 * v for v in range(1, 5)}
    history_before = [(v.version, v.rows, v.operation) for v in opened_before.history()]
    assert [v for v, _, _ in history_before] == [1, 2, 3, 4]
    breaks, error = BREAKS[how]
    breaks(table)
    caplog.set_level(logging.WARNING, logger="lancetx")

    with pytest.raises(error):  # the latest itself: nothing may build on it
        lancetx.open(uri, options)
    caplog.clear()
    for version, rows in expected.items():
        view = lancetx.open(uri, options, version=version)
        assert (view.version, _rows(view)) == (version, rows)
        assert lance.dataset(uri, version=version, storage_options=options).count_rows() == rows
        assert _rows(view.checkout(1)) == expected[1]
        assert _rows(asyncio.run(lancetx.aio.open(uri, options, version=version))) == rows
    assert _rows(lancetx.open(uri, options, version="second")) == expected[2]
    assert _rows(opened_before.checkout(3)) == expected[3]
    assert [(v.version, v.rows, v.operation) for v in lancetx.history(uri, options)] == (
        history_before
    )
    assert [v.version for v in asyncio.run(lancetx.aio.history(uri, options))] == [1, 2, 3, 4]
    assert [v.version for v in lancetx.open(uri, options, version=4).history()] == [1, 2, 3, 4]
    assert [v.version for v in opened_before.history()] == [1, 2, 3, 4]

    # reported once, naming the version and the command that repairs it
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    message = warned[0].getMessage()
    assert "latest version (5)" in message and error.__name__ in message
    assert f"lancetx-sync repair '{uri}' --version 5" in message

    with pytest.raises(error):  # the broken version by number: its own error
        lancetx.open(uri, options, version=5)
    with pytest.raises(lancetx.VersionNotFoundError):
        lancetx.open(uri, options, version=9)
    with pytest.raises(lancetx.ReadOnlyTableError):
        lancetx.open(uri, options, version=4).append(batch("w", 9, 1))


def test_a_table_where_nothing_was_committed_has_an_empty_history_and_no_version(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """``open(version=N)`` of a path where nothing was committed is DatasetNotFoundError,
    not a broken head."""
    table = make_table(legacy_aws, bucket, ddb_table_name, versions=1)
    empty = table.uri.replace("/t.lance?", "/empty.lance?")
    with pytest.raises(lancetx.DatasetNotFoundError):
        lancetx.open(empty, table.options, version=1)
    assert lancetx.history(empty, table.options) == []
