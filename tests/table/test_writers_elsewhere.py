"""The front door for writers that write fragments outside lancetx (Spark, worker
processes): a Table of a table that does not exist yet, its commit of fragments, the
schema checks before writing, the history newest first and read lazily, and the
deletion rule for the caller's files (:class:`lancetx.WrittenFiles`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.fragment import write_fragments

import lancetx
import lancetx.version_history
from lancetx.errors import (
    ColumnMismatchError,
    CommitStateUnknownError,
    DatasetNotFoundError,
    SchemaConversionError,
)

SCHEMA = pa.schema([pa.field("id", pa.int64())])


def _fresh(uri: str, ids: range) -> list[Any]:
    data = pa.table({"id": list(ids)}, schema=SCHEMA)
    return list(write_fragments(data, uri, schema=SCHEMA, mode="overwrite"))


def _paths(fragments: list[Any]) -> tuple[str, ...]:
    return tuple(f.path for frag in fragments for f in frag.files)


def _data_files(uri: str) -> set[str]:
    return {p.name for p in (Path(uri) / "data").iterdir()}


def test_a_table_that_does_not_exist_yet_is_created_by_its_commit(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    with pytest.raises(DatasetNotFoundError):
        lancetx.open(uri)
    table = lancetx.open(uri, missing_ok=True)
    assert not table.exists and table.history() == [] and list(table.walk_history()) == []
    assert table.data_uri.rstrip("/").endswith("t.lance")
    with pytest.raises(DatasetNotFoundError):
        table.version  # noqa: B018
    result = table.commit_fragments(_fresh(uri, range(5)), schema=SCHEMA, fresh_field_ids=True)
    assert result.version == 1 and table.exists and table.version == 1
    assert table.last_commit == result
    again = table.commit_fragments(_fresh(uri, range(5, 8)), schema=SCHEMA, fresh_field_ids=True)
    assert again.version == 2 and table.count_rows() == 8
    assert table.data_storage_version == lance.dataset(uri).data_storage_version


def test_schema_checks_before_anything_is_written(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    table = lancetx.write_table(uri, pa.table({"id": [1], "name": ["a"]}))
    table.check_fragment_schema(pa.schema([("name", pa.string()), ("id", pa.int64())]))
    with pytest.raises(ColumnMismatchError, match="'id'"):
        table.check_fragment_schema(pa.schema([("id", pa.string()), ("name", pa.string())]))
    wider = pa.schema([("id", pa.int64()), ("name", pa.string()), ("extra", pa.int32())])
    with pytest.raises(ColumnMismatchError, match="extra"):
        table.check_fragment_schema(wider)
    table.check_fragment_schema(wider, merge_schema=True)
    with pytest.raises(SchemaConversionError):
        lancetx.check_schema(pa.schema([("d", pa.month_day_nano_interval())]))
    lancetx.check_schema(wider)
    assert lancetx.open(uri).version == 1  # nothing was written


def test_walk_history_is_newest_first_and_reads_only_as_far_as_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t.lance")
    table = lancetx.write_table(uri, pa.table({"id": [0]}, schema=SCHEMA))
    for n in range(1, 20):
        table.append(pa.table({"id": [n]}, schema=SCHEMA), properties={"n": str(n)})
    fresh = lancetx.open(uri)
    read: list[int] = []
    real = lancetx.version_history.load_versions

    def counting(handler: Any, base: str, locations: list[Any], **kwargs: Any) -> Any:
        read.extend(loc.version for loc in locations)
        return real(handler, base, locations, **kwargs)

    monkeypatch.setattr(lancetx.version_history, "load_versions", counting)
    newest = next(iter(fresh.walk_history()))
    assert newest.version == 20 and newest.properties["n"] == "19" and newest.rows == 20
    assert len(read) <= lancetx.version_history.HISTORY_PARALLELISM  # one batch, not 20 versions
    assert [v.version for v in fresh.walk_history(since=15)] == [20, 19, 18, 17, 16]
    assert [v.version for v in fresh.history()] == list(range(1, 21))
    assert [v.rows for v in fresh.history()][:3] == [1, 2, 3]


def _written(uri: str, fragments: list[Any], key: str | None = None) -> lancetx.WrittenFiles:
    table = lancetx.open(uri, missing_ok=True)
    return lancetx.WrittenFiles(uri, table.data_uri, _paths(fragments), idempotency_key=key)


def test_written_files_follow_the_deletion_rule(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lancetx.write_table(uri, pa.table({"id": [0]}, schema=SCHEMA))
    before = _data_files(uri)

    refused = _fresh(uri, range(1, 3))
    assert _written(uri, refused).release(ColumnMismatchError(uri, "id", "no")) is True
    assert _data_files(uri) == before  # the claim provably did not land: deleted

    unknown = _fresh(uri, range(3, 5))
    error = CommitStateUnknownError(uri, 2, None, "lost answer")
    assert _written(uri, unknown, key="job-7").release(error) is False
    assert set(_paths(unknown)) <= _data_files(uri)  # kept, and the error says so
    assert "job-7" in str(error) and _paths(unknown)[0] in str(error)

    interrupted = _fresh(uri, range(5, 7))
    stop = KeyboardInterrupt()
    assert _written(uri, interrupted, key="job-8").release(stop) is False
    assert set(_paths(interrupted)) <= _data_files(uri)
    assert any("job-8" in note for note in getattr(stop, "__notes__", []))

    never_sent = _fresh(uri, range(7, 9))
    assert _written(uri, never_sent).delete() == []
    assert not set(_paths(never_sent)) & _data_files(uri)


def test_a_found_commit_keeps_its_own_files_and_drops_the_reruns(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lancetx.write_table(uri, pa.table({"id": [0]}, schema=SCHEMA))
    first = _fresh(uri, range(1, 3))
    table = lancetx.open(uri)
    done = table.commit_fragments(first, schema=SCHEMA, fresh_field_ids=True, idempotency_key="k")
    rerun = _fresh(uri, range(1, 3))
    again = table.commit_fragments(rerun, schema=SCHEMA, fresh_field_ids=True, idempotency_key="k")
    assert again.deduplicated and again.version == done.version
    _written(uri, first, "k").drop_unreferenced(table, done.version)  # its own: all kept
    assert set(_paths(first)) <= _data_files(uri)
    _written(uri, rerun, "k").drop_unreferenced(table, done.version)
    assert not set(_paths(rerun)) & _data_files(uri)
    assert sorted(table.to_table().column("id").to_pylist()) == [0, 1, 2]
