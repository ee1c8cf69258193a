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
    The DataFrame must have the table's columns with the same Lance types
    (compared field by field, nested fields included); :func:`match_table`
    names the first column that differs. Executors write data files with
    fresh field ids (their own schema, pre-order from 0); the commit maps those
    ids onto the table's by column path (:func:`field_id_map`), so files
    written before a racing creator won still append correctly.

Reading
    :func:`read_spark_schema` maps a table's Arrow schema to Spark's (a
    fixed-size list reads as an array, unsigned integers widen, dictionary
    columns read as their values); :func:`conform_read_batch` casts each
    scanned batch to exactly the Arrow schema Spark expects for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lancetx.commit.errors import SchemaConversionError
from lancetx.commit.format.schema import arrow_schema_to_fields, max_field_id
from pyspark_lancetx.errors import SparkSchemaError, UnsupportedSparkTypeError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

    from lancetx.protos import file_pb2

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
        arrow_schema_to_fields(schema)
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
    decimals needs 16 and panics otherwise.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.take(column, pa.array(range(len(column)), pa.int64()))


def conform_write_batch(batch: pa.RecordBatch, target: pa.Schema, uri: str) -> pa.RecordBatch:
    """Spark's Arrow batch as ``target`` (vector casts, nullability), checked column by column."""
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


# ---------------------------------------------------------------------------- appending


def field_paths(fields: Sequence[file_pb2.Field]) -> dict[int, str]:
    """Field id → path. Struct children by name; a list's item is ``[]`` and a
    map's entries ``{}`` whatever their stored names (Spark says ``element``,
    pylance ``item``)."""
    by_id = {f.id: f for f in fields}
    paths: dict[int, str] = {}
    for f in fields:  # pre-order: a parent comes before its children
        parent = by_id.get(f.parent_id)
        if parent is None:
            paths[f.id] = f.name
            continue
        if parent.logical_type.startswith(("list", "large_list", "fixed_size_list")):
            step = "[]"
        elif parent.logical_type == "map":
            step = "{}"
        else:
            step = f.name
        paths[f.id] = f"{paths[parent.id]}.{step}"
    return paths


def _by_path(fields: Sequence[file_pb2.Field]) -> dict[str, file_pb2.Field]:
    paths = field_paths(fields)
    return {paths[f.id]: f for f in fields}


def match_table(
    uri: str,
    ours: Sequence[file_pb2.Field],
    table: Sequence[file_pb2.Field],
    *,
    merge_schema: bool,
    null_counts: Mapping[str, int],
) -> list[str]:
    """Check the written columns against the table's; return new top-level columns.

    Types must match exactly (nested fields included). A non-nullable table
    column accepts a nullable DataFrame column only if no null was written
    (``null_counts``, per top-level column). New columns need ``merge_schema``;
    columns the DataFrame lacks are refused. Raises SparkSchemaError naming
    the first column that differs.
    """
    mine = _by_path(ours)
    theirs = _by_path(table)
    top_ours = [f.name for f in ours if f.parent_id == -1]
    top_theirs = [f.name for f in table if f.parent_id == -1]
    for name in top_theirs:
        if name not in top_ours:
            raise SparkSchemaError(
                uri, name, f"the table has this column but the DataFrame does not {top_ours}"
            )
    new = [name for name in top_ours if name not in top_theirs]
    if new and not merge_schema:
        raise SparkSchemaError(
            uri,
            new[0],
            f"the DataFrame has this column but the table does not {top_theirs}; pass "
            "option merge_schema=true to add new columns (nullable)",
        )
    for path, field in mine.items():
        top = path.split(".", 1)[0]
        if top in new:
            continue
        other = theirs.get(path)
        if other is None:
            raise SparkSchemaError(uri, path, "the table's column has no such nested field")
        if other.logical_type != field.logical_type:
            raise SparkSchemaError(
                uri,
                path,
                f"the DataFrame has type {field.logical_type} but the table has "
                f"{other.logical_type}",
            )
        if other.parent_id == -1 and not other.nullable and null_counts.get(path, 0):
            raise SparkSchemaError(
                uri,
                path,
                f"the table's column is non-nullable, but the job wrote "
                f"{null_counts[path]} null value(s)",
            )
    for path in theirs:
        if path.split(".", 1)[0] in top_ours and path not in mine:
            raise SparkSchemaError(uri, path, "the DataFrame's column lacks this nested field")
    return new


def merged_fields(
    ours: Sequence[file_pb2.Field],
    table: Sequence[file_pb2.Field],
    new: Sequence[str],
    used_id: int = -1,
) -> list[file_pb2.Field]:
    """The table's fields plus our new top-level columns (all nullable), with ids after
    both the table's largest and ``used_id``."""
    from lancetx.protos import file_pb2

    paths = field_paths(ours)
    next_id = max(max_field_id(table), used_id) + 1
    ids: dict[int, int] = {}
    out = [_copy(f) for f in table]
    for f in ours:
        if paths[f.id].split(".", 1)[0] not in new:
            continue
        copy = file_pb2.Field()
        copy.CopyFrom(f)
        ids[f.id] = next_id
        copy.id = next_id
        copy.parent_id = ids.get(f.parent_id, -1)
        if f.parent_id == -1:
            copy.nullable = True
        next_id += 1
        out.append(copy)
    return out


def _copy(f: file_pb2.Field) -> file_pb2.Field:
    from lancetx.protos import file_pb2

    copy = file_pb2.Field()
    copy.CopyFrom(f)
    return copy


def field_id_map(
    ours: Sequence[file_pb2.Field], target: Sequence[file_pb2.Field]
) -> dict[int, int]:
    """Our fresh field ids → the target schema's ids, matched by column path."""
    theirs = {path: fid for fid, path in field_paths(target).items()}
    return {fid: theirs[path] for fid, path in field_paths(ours).items() if path in theirs}


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


def lance_fields(schema: pa.Schema) -> list[file_pb2.Field]:
    """Lance fields with fresh ids, as pylance assigns them when it writes ``schema`` anew."""
    return arrow_schema_to_fields(schema)[0]


def null_counts(batch: pa.RecordBatch) -> dict[str, int]:
    """Nulls per top-level column of one batch."""
    return {f.name: batch.column(i).null_count for i, f in enumerate(batch.schema)}
