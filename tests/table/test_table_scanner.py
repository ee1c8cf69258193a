"""``Table.scanner`` is pylance's scanner, as it was before it checked its reads: the
same type, the same errors at the same calls, interrupts untouched, streams that stop
pylance's scan when abandoned. (Reads after a cleanup removed the version:
``tests/ops/test_removed_versions.py``.)"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.dataset
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table

import lancetx
import lancetx.aio
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.state import TableState


def _table(aws: EmbeddedAws, bucket: str, ddb_table: str) -> lancetx.Table:
    """Versions 1..3 (a create and two appends, 3 rows each: 3 fragments)."""
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table)
    table = lancetx.write_table(
        ddb_uri(bucket, "t.lance", ddb_table), batch("w", 0, 3), storage_options=options
    )
    for n in (1, 2):
        table.append(batch("w", n, 3))
    return lancetx.open(table.uri, options)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """The failures a scanner looked into (asked the store whether the version is gone)."""
    seen: list[BaseException] = []
    original = TableState.read_failure

    def recorded(self: TableState, version: int, exc: Exception, *, advice: str) -> Exception:
        seen.append(exc)
        return original(self, version, exc, advice=advice)

    monkeypatch.setattr(TableState, "read_failure", recorded)
    return seen


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The versions asked afresh whether a cleanup removed them (a GetItem and a GET of
    the manifest each)."""
    asked: list[int] = []
    original = TableState.version_gone

    def recorded(self: TableState, version: int) -> bool:
        asked.append(version)
        return original(self, version)

    monkeypatch.setattr(TableState, "version_gone", recorded)
    return asked


def test_a_scanner_is_a_lance_scanner_as_the_one_it_returned_before(
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    tmp_path: Path,
    checks: list[BaseException],
) -> None:
    """Code checked ``isinstance(s, lance.LanceScanner)``, and what takes an Arrow
    scanner as data looks for a ``pyarrow.dataset.Scanner`` (pylance's writers, DuckDB's
    ``FROM scanner``): the wrapper was neither. Every method reads as pylance's does,
    and a whole read looks into nothing (the end of a stream is no failure)."""
    table = _table(legacy_aws, bucket, ddb_table_name)
    scanner = table.scanner(filter="seq > 0", columns=["seq", "i"])
    assert isinstance(scanner, lance.LanceScanner)
    assert isinstance(scanner, pa.dataset.Scanner)
    copied = lance.write_dataset(table.scanner(filter="seq > 1"), str(tmp_path / "c.lance"))
    assert copied.count_rows() == 3
    reference = table.dataset.scanner(filter="seq > 0", columns=["seq", "i"])
    assert scanner.projected_schema == reference.projected_schema
    assert scanner.dataset_schema == reference.dataset_schema
    assert scanner.explain_plan() == reference.explain_plan()
    assert "AnalyzeExec" in scanner.analyze_plan()
    assert scanner.to_table() == reference.to_table()
    assert scanner.count_rows() == 6 and scanner.head(4).num_rows == 4
    assert sum(b.num_rows for b in scanner.to_batches()) == 6
    assert scanner.to_reader().read_all() == reference.to_table()
    assert not checks
    with pytest.raises(NotImplementedError):
        scanner.take([0])  # pylance's, as it is

    async def scanned() -> Any:
        async with await lancetx.aio.open(table.uri, storage_options=table.storage_options) as t:
            return await t.scanner(filter="seq > 0")

    assert isinstance(asyncio.run(scanned()), lance.LanceScanner)


def test_a_copy_of_a_scanner_fails_as_pylances_does(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A copy (or any instance made without ``__init__``) looked ``_scanner`` up through
    ``__getattr__``, which looked it up again: RecursionError, not pylance's TypeError."""
    table = _table(legacy_aws, bucket, ddb_table_name)
    with pytest.raises(TypeError):
        copy.copy(table.dataset.scanner())
    with pytest.raises(TypeError):
        copy.copy(table.scanner())
    bare = lancetx.Scanner.__new__(lancetx.Scanner)
    assert not hasattr(bare, "_wrapped") and not hasattr(bare, "anything")


def test_a_filter_naming_no_column_fails_as_pylances_scanner_does_at_the_same_call(
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    checks: list[BaseException],
    probes: list[int],
) -> None:
    """pylance's ``to_reader()`` plans the scan: a filter naming no column fails there,
    not at the first batch. Each read fails with pylance's ValueError, unchanged, and
    at no request's cost: only a "not found" is looked into (each read asked the store
    whether the version is gone)."""
    table = _table(legacy_aws, bucket, ddb_table_name)
    with pytest.raises(ValueError, match="No field named nope") as pylances:
        table.dataset.scanner(filter="nope = 1").to_reader()
    with pytest.raises(ValueError, match="No field named nope") as ours:
        table.scanner(filter="nope = 1").to_reader()
    assert str(ours.value) == str(pylances.value)
    for read in (lambda s: s.to_table(), lambda s: next(iter(s.to_batches()))):
        with pytest.raises(ValueError, match="No field named nope") as caught:
            read(table.scanner(filter="nope = 1"))
        assert type(caught.value) is ValueError and str(caught.value) == str(pylances.value)
    with pytest.raises(ValueError, match="No field named nope"):
        table.to_table(filter="nope = 1")
    with pytest.raises(OSError, match="No field named nope"):  # pylance's, as it is
        table.count_rows("nope = 1")
    assert len(checks) == 5 and probes == []


def test_a_failed_get_of_a_data_file_is_pylances_error_unchanged(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, probes: list[int]
) -> None:
    """S3 refuses the GETs of data files (403): each read fails as pylance's own scanner
    does, same type, same message, and is not looked into (a denied GET says nothing
    of whether a cleanup removed the version)."""
    table = _table(legacy_aws, bucket, ddb_table_name)

    def refuse_data(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service != "s3" or "/data/" not in request.path:
            return None
        body = b"<Error><Code>AccessDenied</Code><Message>denied</Message></Error>"
        return InterceptedResponse(403, body, [("Content-Type", "application/xml")])

    reads = (
        lambda s: s.to_table(),
        lambda s: list(s.to_batches()),
        lambda s: s.to_reader().read_all(),
    )
    legacy_aws.set_interceptor(refuse_data)
    try:
        for read in reads:
            with pytest.raises(Exception, match="privileges") as pylances:
                read(table.dataset.scanner())
            with pytest.raises(Exception, match="privileges") as ours:
                read(table.scanner())
            assert type(ours.value) is type(pylances.value)
            assert str(ours.value).split(" in ")[0] == str(pylances.value).split(" in ")[0]
    finally:
        legacy_aws.set_interceptor(None)
    assert probes == []


@pytest.fixture
def interrupted_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """pylance's reader yields one batch, then the user's Ctrl-C lands in the next read;
    what it records: that its batches were closed (the stream was let go)."""
    events: list[str] = []
    to_reader = lance.LanceScanner.to_reader

    def interrupted(self: lance.LanceScanner) -> pa.RecordBatchReader:
        reader = to_reader(self)

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield reader.read_next_batch()
                raise KeyboardInterrupt
            finally:
                events.append("closed")

        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    monkeypatch.setattr(lance.LanceScanner, "to_reader", interrupted)
    return events


def test_an_interrupt_inside_a_streamed_read_is_neither_converted_nor_swallowed(
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    interrupted_reads: list[str],
    checks: list[BaseException],
) -> None:
    table = _table(legacy_aws, bucket, ddb_table_name)
    reads = (
        lambda s: s.to_table(),
        lambda s: [b.num_rows for b in s.to_batches()],
        lambda s: s.to_reader().read_all(),
    )
    for read in reads:
        with pytest.raises(KeyboardInterrupt):
            read(table.scanner(batch_size=1))
    assert not checks and interrupted_reads == ["closed"] * 3


def test_a_stream_abandoned_midway_lets_pylances_scan_go(
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    interrupted_reads: list[str],
    checks: list[BaseException],
) -> None:
    """A ``break`` out of ``to_batches`` and a reader dropped after one batch: no hang,
    no error, nothing looked into, pylance's stream closed."""
    table = _table(legacy_aws, bucket, ddb_table_name)
    for b in table.scanner(batch_size=1).to_batches():
        assert b.num_rows == 1
        break
    reader = table.scanner(batch_size=1).to_reader()
    assert reader.read_next_batch().num_rows == 1
    del reader
    assert not checks and interrupted_reads == ["closed"] * 2
