"""Converting Spark's Arrow batches to the write schema costs no copy where none is needed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pyspark_lancetx.errors import SparkSchemaError
from pyspark_lancetx.schema import conform_write_batch

SPARK_LIST = pa.list_(pa.field("element", pa.float32(), True))
VECTOR = pa.list_(pa.field("item", pa.float32(), True), 4)
TARGET = pa.schema([pa.field("id", pa.int64()), pa.field("emb", VECTOR)])


def _spark_batch(rows: int, lengths: list[int] | None = None) -> pa.RecordBatch:
    """A batch as Spark sends it: ids non-null, the embedding a variable-size list."""
    sizes = lengths or [4] * rows
    offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
    values = pa.array(np.arange(sum(sizes), dtype=np.float32))
    emb = pa.ListArray.from_arrays(offsets, values, type=SPARK_LIST)
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("emb", SPARK_LIST, False)])
    return pa.RecordBatch.from_arrays([pa.array(range(rows), pa.int64()), emb], schema=schema)


def test_a_vector_column_keeps_its_values_buffer() -> None:
    batch = _spark_batch(1000)
    out = conform_write_batch(batch, TARGET, "t.lance")
    assert out.schema == TARGET
    values_in = batch.column(1).values.buffers()[1]
    values_out = out.column(1).values.buffers()[1]
    assert values_out.address == values_in.address  # re-labelled, not copied
    assert out.column(0).buffers()[1].address == batch.column(0).buffers()[1].address
    assert out.column(1)[999].as_py() == [3996.0, 3997.0, 3998.0, 3999.0]


def test_a_batch_already_in_the_write_schema_is_passed_through() -> None:
    batch = conform_write_batch(_spark_batch(10), TARGET, "t.lance")
    assert conform_write_batch(batch, TARGET, "t.lance") is batch


def test_a_vector_of_another_length_names_the_column() -> None:
    with pytest.raises(SparkSchemaError, match=r"column 'emb'.*fixed_size_list"):
        conform_write_batch(_spark_batch(3, [4, 3, 4]), TARGET, "t.lance")


def test_decimals_are_copied_to_aligned_buffers() -> None:
    dtype = pa.decimal128(10, 2)
    target = pa.schema([pa.field("d", dtype)])
    values = pa.array([1, 2, 3], dtype).buffers()[1]
    shifted = pa.py_buffer(b"\0" * 8 + values.to_pybytes()).slice(8)  # as Spark's 8-byte alignment
    column = pa.Array.from_buffers(dtype, 3, [None, shifted])
    assert column.buffers()[1].address % 16 != 0
    batch = pa.RecordBatch.from_arrays([column], schema=target)
    out = conform_write_batch(batch, target, "t.lance")
    assert out.column(0).buffers()[1].address % 16 == 0
    assert out.column(0).to_pylist() == batch.column(0).to_pylist()
