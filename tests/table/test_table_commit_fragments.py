"""``commit_fragments`` for files written as a new dataset (fresh field ids): ids mapped
by column path, new columns added in the same commit, nulls refused where the table
forbids them, and the idempotency look-up bounded by ``idempotency_since``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.fragment import write_fragments

import lancetx
from lancetx.errors import ColumnMismatchError


def _fresh(uri: str, table: pa.Table) -> list[Any]:
    """Fragments written as a new dataset next to the table (as a Spark task writes them)."""
    return list(write_fragments(table, uri, schema=table.schema, mode="overwrite"))


def _rows(uri: str) -> list[dict[str, Any]]:
    return sorted(lance.dataset(uri).to_table().to_pylist(), key=lambda r: r["id"])


def test_fresh_field_ids_map_onto_a_table_whose_ids_moved(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lancetx.write_table(uri, pa.table({"id": [1], "a": ["x"], "b": [10]}))
    table = lancetx.open(uri)
    table.drop_columns(["a"])  # the table's ids are now id=0, b=2
    data = pa.table({"b": [20], "id": [2]})  # other order too: b=0, id=1 in the files
    result = lancetx.commit_fragments(
        uri, _fresh(uri, data), schema=data.schema, fresh_field_ids=True
    )
    assert result.version == 3
    assert _rows(uri) == [{"id": 1, "b": 10}, {"id": 2, "b": 20}]


def test_a_type_mismatch_names_the_column(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lancetx.write_table(uri, pa.table({"id": [1], "info": [{"a": 1}]}))
    data = pa.table({"id": [2], "info": [{"a": "text"}]})
    with pytest.raises(ColumnMismatchError, match=r"column 'info\.a'.*string.*int64") as failed:
        lancetx.commit_fragments(uri, _fresh(uri, data), schema=data.schema, fresh_field_ids=True)
    assert failed.value.column == "info.a"
    assert lance.dataset(uri).version == 1


def test_merge_schema_adds_new_columns_in_the_same_commit(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lancetx.write_table(uri, pa.table({"id": [1]}))
    data = pa.table({"id": [2], "extra": ["new"]})
    fragments = _fresh(uri, data)
    with pytest.raises(ColumnMismatchError, match=r"column 'extra'.*merge_schema"):
        lancetx.commit_fragments(uri, fragments, schema=data.schema, fresh_field_ids=True)
    result = lancetx.commit_fragments(
        uri, fragments, schema=data.schema, fresh_field_ids=True, merge_schema=True
    )
    assert result.version == 2
    assert _rows(uri) == [{"id": 1, "extra": None}, {"id": 2, "extra": "new"}]
    assert lancetx.open(uri).history()[-1].operation == "Merge"
    assert lance.dataset(uri).schema.field("extra").nullable


def test_null_counts_guard_a_non_nullable_column(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    lance.write_dataset(pa.table({"id": [1]}, schema=strict), uri)
    data = pa.table({"id": pa.array([2], pa.int64())})
    fragments = _fresh(uri, data)
    with pytest.raises(ColumnMismatchError, match=r"column 'id'.*non-nullable.*1 null"):
        lancetx.commit_fragments(
            uri, fragments, schema=data.schema, fresh_field_ids=True, null_counts={"id": 1}
        )
    lancetx.commit_fragments(
        uri, fragments, schema=data.schema, fresh_field_ids=True, null_counts={"id": 0}
    )
    assert _rows(uri) == [{"id": 1}, {"id": 2}]


def test_idempotency_since_skips_the_versions_before_it(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    data = pa.table({"id": [1]})

    def commit(since: int) -> lancetx.CommitResult:
        return lancetx.commit_fragments(
            uri,
            _fresh(uri, data),
            schema=data.schema,
            fresh_field_ids=True,
            idempotency_key="job-1",
            idempotency_since=since,
        )

    first = commit(0)
    again = commit(0)
    assert (first.version, again.version, again.deduplicated) == (1, 1, True)
    # A caller that knows the key cannot be in version 1 or before is believed.
    assert commit(1).version == 2


def test_the_async_table_has_every_public_member_of_the_sync_one() -> None:
    import lancetx.aio

    sync = {n for n in dir(lancetx.Table) if not n.startswith("_")}
    asynchronous = {n for n in dir(lancetx.aio.AsyncTable) if not n.startswith("_")}
    assert sync - asynchronous == set()


def test_an_async_table_commits_fragments_creates_the_table_and_walks_history(
    tmp_path: Path,
) -> None:
    import asyncio

    import lancetx.aio

    uri = str(tmp_path / "t.lance")
    data = pa.table({"id": [1, 2]})

    async def main() -> tuple[list[int], list[int], bool, bool]:
        async with await lancetx.aio.open(uri, missing_ok=True) as table:
            existed = table.exists
            table.check_fragment_schema(data.schema)  # nothing to match yet: no error
            first = await table.commit_fragments(
                _fresh(uri, data), schema=data.schema, fresh_field_ids=True, idempotency_key="k1"
            )
            more = pa.table({"id": [3]})
            second = await table.commit_fragments(
                _fresh(uri, more), schema=more.schema, fresh_field_ids=True
            )
            again = await table.commit_fragments(
                _fresh(uri, data), schema=data.schema, fresh_field_ids=True, idempotency_key="k1"
            )
            walked = [info.version async for info in table.walk_history()]
            return (
                [first.version, second.version, again.version],
                walked,
                existed,
                again.deduplicated,
            )

    versions, walked, existed, deduplicated = asyncio.run(main())
    assert not existed
    assert versions == [1, 2, 1] and deduplicated
    assert walked == [2, 1]
    assert _rows(uri) == [{"id": 1}, {"id": 2}, {"id": 3}]
