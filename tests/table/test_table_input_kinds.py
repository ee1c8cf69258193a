"""``write_table`` and ``Table.append`` take what pylance's ``write_dataset`` takes:
besides Arrow data and pandas, the kinds pylance coerces itself — another Lance
table (its dataset or a scanner of it, a lancetx Table's scanner too), an Arrow
dataset, a dict of columns, a list of row dicts or pydantic models. Each was refused
with UnsupportedInputError "expected Arrow data (pa.Table, RecordBatchReader)": the
coercion was looked for in the ``lance.dataset()`` *function*, never found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.dataset as pa_dataset
import pyarrow.parquet as pq
import pydantic
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table

import lancetx
from lancetx.demo.embedded import EmbeddedAws

SCHEMA = batch("w", 0, 1).schema


class Row(pydantic.BaseModel):
    writer: str
    seq: int
    i: int


def _source(aws: EmbeddedAws, bucket: str, ddb_table: str) -> lancetx.Table:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table)
    return lancetx.write_table(
        ddb_uri(bucket, "src.lance", ddb_table), batch("src", 0, 4), storage_options=options
    )


def _kinds(source: lancetx.Table, tmp_path: Path) -> dict[str, Any]:
    pq.write_table(batch("parquet", 0, 2), tmp_path / "p.parquet")
    rows = batch("rows", 0, 2).to_pylist()
    return {
        "lance dataset": source.dataset,
        "lance scanner": source.dataset.scanner(filter="i < 2"),
        "lancetx scanner": source.scanner(filter="i >= 2"),
        "arrow dataset": pa_dataset.dataset(tmp_path / "p.parquet"),
        "dict of columns": batch("dict", 0, 2).to_pydict(),
        "list of row dicts": rows,
        "list of pydantic rows": [Row(**row) for row in rows],
    }


def test_every_kind_pylance_coerces_is_appended_and_read_back(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, tmp_path: Path
) -> None:
    source = _source(legacy_aws, bucket, ddb_table_name)
    options = legacy_aws.pylance_storage_options()
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("first", 0, 1), storage_options=options)
    expected = batch("first", 0, 1).to_pylist()
    for name, data in _kinds(source, tmp_path).items():
        before = table.version
        if name == "list of pydantic rows":  # pydantic's ints are int64 as the table's
            table.append(data, schema=SCHEMA)
        else:
            table.append(data)
        assert table.version == before + 1, name
    expected += batch("src", 0, 4).to_pylist()
    expected += batch("src", 0, 2).to_pylist()
    expected += batch("src", 0, 4).to_pylist()[2:]
    expected += batch("parquet", 0, 2).to_pylist()
    expected += batch("dict", 0, 2).to_pylist() + 2 * batch("rows", 0, 2).to_pylist()
    read = lance.dataset(uri, storage_options=options).to_table().to_pylist()
    key = lambda r: (r["writer"], r["seq"], r["i"])  # noqa: E731
    assert sorted(read, key=key) == sorted(expected, key=key)


def test_a_new_table_is_created_from_a_dict_and_from_another_table_and_upserted_from_rows(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    source = _source(legacy_aws, bucket, ddb_table_name)
    options = legacy_aws.pylance_storage_options()
    made = lancetx.write_table(
        ddb_uri(bucket, "d.lance", ddb_table_name),
        {"a": [1, 2, 3], "b": ["x", "y", "z"]},
        storage_options=options,
    )
    assert made.to_table().to_pydict() == {"a": [1, 2, 3], "b": ["x", "y", "z"]}
    copied = lancetx.write_table(
        ddb_uri(bucket, "c.lance", ddb_table_name), source.dataset, storage_options=options
    )
    assert copied.to_table().equals(source.to_table())
    made.merge_insert("a").when_matched_update_all().when_not_matched_insert_all().execute(
        [{"a": 3, "b": "Z"}, {"a": 4, "b": "w"}]
    )
    assert sorted(made.to_table().to_pylist(), key=lambda r: r["a"]) == [
        {"a": 1, "b": "x"},
        {"a": 2, "b": "y"},
        {"a": 3, "b": "Z"},
        {"a": 4, "b": "w"},
    ]


def test_data_pylance_cannot_coerce_either_is_refused_naming_it_and_writes_nothing(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("first", 0, 1), storage_options=options)
    with pytest.raises(lancetx.UnsupportedInputError, match=r"pylance can write"):
        table.append({"writer": ["a", "b"], "seq": [1]})  # columns of unequal length
    with pytest.raises(lancetx.UnsupportedInputError):
        table.append(object())
    assert table.refresh().version == 1
    assert lance.dataset(uri, storage_options=options).count_rows() == 1


def test_an_arrow_table_given_whole_is_not_sent_through_pylances_coercion(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrow tables, batches, readers and iterables of batches stay on lancetx's own
    path (one pass, guarded): only the kinds above go through pylance's."""
    import lance.types

    def refused(*args: Any, **kwargs: Any) -> pa.RecordBatchReader:
        raise AssertionError("pylance's coercion was used")

    monkeypatch.setattr(lance.types, "_coerce_reader", refused)
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("w", 0, 2), storage_options=options)
    table.append(batch("w", 1, 2).to_batches()[0])
    table.append(batch("w", 2, 2).to_reader())
    table.append(iter(batch("w", 3, 2).to_batches()))
    table.append([batch("w", 4, 2)])
    assert table.count_rows() == 10
