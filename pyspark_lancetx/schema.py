"""Spark schema ↔ Arrow schema ↔ Lance fields, for writing and for reading.

Writing
    Spark converts rows to Arrow with its own rules (timestamps become
    ``timestamp[us, tz=UTC]`` whatever the session time zone, so instants are
    exact; ``timestamp_ntz`` stays naive; decimals, binaries, arrays, maps and
    structs map one to one). :func:`write_schema` starts from that Arrow schema
    and applies the data source's choices:

    * ``vector_columns``: ``emb:128`` stores the array column ``emb`` as
      ``fixed_size_list<float32>[128]`` (Spark has no fixed-size list);
    * nullability: Spark marks many columns non-null (``range()`` ids,
      literals), and a table created with those flags refuses later appends
      that carry nulls, so by default every created column is nullable
      (map keys stay non-null: Arrow requires it). ``nullable=spark`` keeps
      Spark's flags;
    * types with no faithful representation are refused up front, naming the
      column: intervals, ``void`` (NullType) and ``variant``.

Appending
    Executors write data files with fresh field ids (their own schema,
    pre-order from 0); the commit (``lancetx.commit_fragments`` with
    ``fresh_field_ids``) checks the columns against the table's and maps those
    ids onto the table's by column path, so files written before a racing
    creator won still append correctly.

Reading
    :func:`read_spark_schema` maps a table's Arrow schema to Spark's (a
    fixed-size list reads as an array, unsigned integers widen, dictionary
    columns read as their values); :func:`conform_read_batch` casts each
    scanned batch to exactly the Arrow schema Spark expects for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import lancetx
from lancetx.commit.errors import SchemaConversionError
from pyspark_lancetx.errors import SparkSchemaError, UnsupportedSparkTypeError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType


# Spark type names (``DataType.typeName()``) that have no faithful Arrow/Lance form.
_UNSUPPORTED_SPARK = {
    "void": "Spark's void (NullType) has no storable type; cast the column to a concrete type",
    "variant": "variant converts to a lossy struct; serialize it (e.g. to_json) first",
    "interval": "calendar intervals cannot be stored; convert to a number or string first",
}
_INTERVAL_CLASSES = ("YearMonthIntervalType", "DayTimeIntervalType", "CalendarIntervalType")


# ---------------------------------------------------------------------------- writing


def _check_spark_type(dtype: DataType, path: str, uri: str) -> None:
    from pyspark.sql.types import ArrayType, MapType, StructType

    name = type(dtype).__name__
    if name in _INTERVAL_CLASSES:
        raise UnsupportedSparkTypeError(
            uri, path, f"{dtype.simpleString()}: intervals have no Lance type; store a number"
        )
    reason = _UNSUPPORTED_SPARK.get(dtype.typeName())
    if reason is not None:
        raise UnsupportedSparkTypeError(uri, path, f"{dtype.simpleString()}: {reason}")
    if isinstance(dtype, StructType):
        for f in dtype.fields:
            _check_spark_type(f.dataType, f"{path}.{f.name}", uri)
    elif isinstance(dtype, ArrayType):
        _check_spark_type(dtype.elementType, f"{path}[]", uri)
    elif isinstance(dtype, MapType):
        _check_spark_type(dtype.keyType, f"{path}.key", uri)
        _check_spark_type(dtype.valueType, f"{path}.value", uri)


def _all_nullable(dtype: pa.DataType) -> pa.DataType:
    """``dtype`` with every nested field nullable (map keys excepted)."""
    import pyarrow as pa

    if pa.types.is_struct(dtype):
        return pa.struct(
            [pa.field(f.name, _all_nullable(f.type), True, f.metadata) for f in dtype.fields]
        )
    if pa.types.is_list(dtype):
        item = dtype.value_field
        return pa.list_(pa.field(item.name, _all_nullable(item.type), True, item.metadata))
    if pa.types.is_map(dtype):
        return pa.map_(dtype.key_field, pa.field("value", _all_nullable(dtype.item_type), True))
    return dtype


def _vector_type(
    uri: str, name: str, dtype: pa.DataType, dimension: int, nullable: bool
) -> pa.DataType:
    import pyarrow as pa

    if not (pa.types.is_list(dtype) and pa.types.is_floating(dtype.value_type)):
        raise SparkSchemaError(
            uri,
            name,
            f"vector_columns needs an array of float or double, but the column is {dtype}",
        )
    return pa.list_(pa.field("item", pa.float32(), nullable), dimension)


def write_schema(
    spark_schema: StructType,
    uri: str,
    *,
    vector_columns: Mapping[str, int] | None = None,
    keep_spark_nullability: bool = False,
) -> pa.Schema:
    """The Arrow schema the data files of a write get.

    Raises UnsupportedSparkTypeError / SparkSchemaError naming the column.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    vectors = dict(vector_columns or {})
    names = [f.name for f in spark_schema.fields]
    for missing in sorted(set(vectors) - set(names)):
        raise SparkSchemaError(
            uri, missing, f"named in vector_columns, but the DataFrame has no such column {names}"
        )
    fields = []
    for f in spark_schema.fields:
        _check_spark_type(f.dataType, f.name, uri)
        try:
            arrow_type = to_arrow_type(f.dataType, timezone="UTC")
        except Exception as exc:  # Spark's converter raises its own error classes
            raise UnsupportedSparkTypeError(
                uri, f.name, f"{f.dataType.simpleString()}: {exc}"
            ) from None
        nullable = f.nullable or not keep_spark_nullability
        if not keep_spark_nullability:
            arrow_type = _all_nullable(arrow_type)
        if f.name in vectors:
            arrow_type = _vector_type(uri, f.name, arrow_type, vectors[f.name], True)
        fields.append(pa.field(f.name, arrow_type, nullable))
    schema = pa.schema(fields)
    try:
        lancetx.check_schema(schema)
    except SchemaConversionError as exc:
        raise UnsupportedSparkTypeError(uri, exc.field, exc.problem) from None
    return schema


def _has_decimal(dtype: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_decimal(dtype):
        return True
    if pa.types.is_struct(dtype) or pa.types.is_map(dtype):
        return any(_has_decimal(dtype.field(i).type) for i in range(dtype.num_fields))
    if pa.types.is_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return _has_decimal(dtype.value_type)
    return False


def _aligned(column: pa.Array) -> pa.Array:
    """A copy in freshly allocated (64-byte aligned) buffers.

    Spark's Arrow stream aligns buffers to 8 bytes; pylance's reader of 128-bit
    decimals needs 16 and panics otherwise. Concatenating one array copies it.
    """
    import pyarrow as pa

    return pa.concat_arrays([column])


def conform_write_batch(batch: pa.RecordBatch, target: pa.Schema, uri: str) -> pa.RecordBatch:
    """Spark's Arrow batch as ``target`` (vector casts, nullability), checked column by column.

    Columns whose type already matches are passed through. A vector column
    (``list<float>`` → ``fixed_size_list<float32>``) without null rows keeps its
    values buffer: Arrow's cast only re-labels it when every list has the right
    length (null rows need placeholder values, hence a copy).
    """
    import pyarrow as pa

    decimals = [_has_decimal(f.type) for f in target]
    if batch.schema.equals(target) and not any(decimals):
        return batch
    columns = []
    for i, field in enumerate(target):
        column = batch.column(i)
        if decimals[i]:
            column = _aligned(column)
        if not field.nullable and column.null_count:
            raise SparkSchemaError(
                uri, field.name, f"{column.null_count} null value(s) in a non-nullable column"
            )
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SparkSchemaError(
                    uri, field.name, f"cannot convert to {field.type}: {exc}"
                ) from None
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=target)


# ---------------------------------------------------------------------------- reading


def _readable_type(dtype: pa.DataType, path: str, uri: str) -> pa.DataType:
    """An Arrow type Spark can take, for a column the table stores as ``dtype``."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(dtype):
        return _readable_type(dtype.value_type, path, uri)
    if t.is_fixed_size_list(dtype) or t.is_large_list(dtype) or t.is_list(dtype):
        item = dtype.value_field
        return pa.list_(pa.field("element", _readable_type(item.type, f"{path}[]", uri), True))
    if t.is_struct(dtype):
        return pa.struct(
            [
                pa.field(f.name, _readable_type(f.type, f"{path}.{f.name}", uri), f.nullable)
                for f in dtype.fields
            ]
        )
    if t.is_map(dtype):
        return pa.map_(
            _readable_type(dtype.key_type, f"{path}.key", uri),
            _readable_type(dtype.item_type, f"{path}.value", uri),
        )
    widen = {
        pa.uint8(): pa.int16(),
        pa.uint16(): pa.int32(),
        pa.uint32(): pa.int64(),
        pa.uint64(): pa.decimal128(20, 0),
        pa.float16(): pa.float32(),
        pa.large_string(): pa.string(),
        pa.large_binary(): pa.binary(),
        pa.string_view(): pa.string(),
        pa.binary_view(): pa.binary(),
        pa.date64(): pa.date32(),
    }
    if dtype in widen:
        return widen[dtype]
    if t.is_fixed_size_binary(dtype):
        return pa.binary()
    if t.is_timestamp(dtype):
        return pa.timestamp("us", tz="UTC" if dtype.tz else None)
    return dtype


def read_spark_schema(arrow_schema: pa.Schema, uri: str) -> StructType:
    """The Spark schema of a table; raises UnsupportedSparkTypeError naming a column
    Spark cannot represent."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    fields = []
    for f in arrow_schema:
        readable = _readable_type(f.type, f.name, uri)
        try:
            spark_type = from_arrow_type(readable, prefer_timestamp_ntz=True)
        except Exception as exc:  # Spark's converter raises its own error classes
            raise UnsupportedSparkTypeError(
                uri, f.name, f"{f.type} cannot be read by Spark: {exc}"
            ) from None
        fields.append(StructField(f.name, spark_type, True))
    return StructType(fields)


def check_read_schema(uri: str, table: StructType, schema: StructType) -> None:
    """A schema given to a read (``.schema(...)``: the columns to read, Spark's only way
    to prune columns of a Python data source) must name columns of the table, with the
    types the table reads as; raises SparkSchemaError naming the first that does not."""
    by_name = {f.name: f for f in table.fields}
    lower = {f.name.lower(): f.name for f in table.fields}
    for f in schema.fields:
        column = by_name.get(f.name)
        if column is None:
            close = lower.get(f.name.lower())
            hint = f"; did you mean {close!r}? (names are case-sensitive)" if close else ""
            raise SparkSchemaError(
                uri, f.name, f"not a column of the table {sorted(by_name)}{hint}", reading=True
            )
        if column.dataType.simpleString() != f.dataType.simpleString():  # nullability aside
            raise SparkSchemaError(
                uri,
                f.name,
                f"the schema given to the read says {f.dataType.simpleString()}, but the "
                f"table's column reads as {column.dataType.simpleString()}: give that type "
                "(or cast after loading)",
                reading=True,
            )


def spark_arrow_schema(spark_schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from a Python data source for ``spark_schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


def conform_read_batch(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """A scanned batch cast to Spark's Arrow schema (same columns, same order)."""
    import pyarrow as pa

    if batch.schema.equals(target):
        return batch
    columns = [
        batch.column(i) if batch.column(i).type == f.type else batch.column(i).cast(f.type)
        for i, f in enumerate(target)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=target)


def null_counts(batch: pa.RecordBatch) -> dict[str, int]:
    """Nulls per top-level column of one batch."""
    return {f.name: batch.column(i).null_count for i, f in enumerate(batch.schema)}
