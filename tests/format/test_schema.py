"""Arrow schema <-> Lance field list, checked against what pylance writes and reads."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest

from lancetx.commit.errors import SchemaConversionError
from lancetx.commit.format.schema import (
    arrow_schema_to_fields,
    fields_to_arrow_schema,
    max_field_id,
    project_fields,
)
from lancetx.protos import file_pb2, table_pb2


def read_latest_manifest(uri: Path) -> table_pb2.Manifest:
    """Parse the newest manifest the simple way: footer (i64 pos, i16, i16, b"LANC"), u32 len."""
    best: table_pb2.Manifest | None = None
    for path in (uri / "_versions").glob("*.manifest"):
        data = path.read_bytes()
        assert data[-4:] == b"LANC"
        (pos,) = struct.unpack("<q", data[-16:-8])
        (length,) = struct.unpack("<I", data[pos : pos + 4])
        manifest = table_pb2.Manifest.FromString(data[pos + 4 : pos + 4 + length])
        if best is None or manifest.version > best.version:
            best = manifest
    assert best is not None, f"no manifest under {uri}"
    return best


@dataclass
class Case:
    id: str
    schema: pa.Schema
    # What pylance reads back when it normalizes the type (None: unchanged).
    normalized: pa.Schema | None = None
    rows: list[dict[str, Any]] | None = None
    # For types pyarrow cannot build from Python rows or an empty table.
    table: pa.Table | None = None

    def data(self) -> pa.Table:
        if self.table is not None:
            return self.table
        if self.rows is not None:
            return pa.Table.from_pylist(self.rows, schema=self.schema)
        return self.schema.empty_table()


def f(name: str, t: pa.DataType, nullable: bool = True, **meta: str) -> pa.Field:
    return pa.field(name, t, nullable=nullable, metadata=meta or None)


def one(t: pa.DataType, nullable: bool = True, **meta: str) -> pa.Schema:
    return pa.schema([f("c", t, nullable, **meta)])


EMBED = pa.list_(pa.float32(), 128)
CASES: list[Case] = [
    # ---- integers, floats, bool
    *[
        Case(str(t), pa.schema([f("c", t), f("c_nn", t, False)]))
        for t in (
            pa.int8(),
            pa.int16(),
            pa.int32(),
            pa.int64(),
            pa.uint8(),
            pa.uint16(),
            pa.uint32(),
            pa.uint64(),
            pa.float16(),
            pa.float32(),
            pa.float64(),
            pa.bool_(),
        )
    ],
    Case("null", one(pa.null())),
    # ---- strings and binaries
    Case("string", one(pa.string()), rows=[{"c": "a"}, {"c": None}]),
    Case("large_string", one(pa.large_string())),
    Case("binary", one(pa.binary())),
    Case("large_binary", one(pa.large_binary())),
    Case("fixed_size_binary", one(pa.binary(16))),
    # pylance stores view types under the plain type strings and reads them back plain.
    Case("string_view", one(pa.string_view()), normalized=one(pa.string())),
    Case("binary_view", one(pa.binary_view()), normalized=one(pa.binary())),
    # ---- temporal
    Case("date32", one(pa.date32())),
    Case("date64", one(pa.date64())),
    *[Case(f"timestamp_{u}", one(pa.timestamp(u))) for u in ("s", "ms", "us", "ns")],
    *[Case(f"timestamp_{u}_utc", one(pa.timestamp(u, "UTC"))) for u in ("s", "ms", "us", "ns")],
    Case("timestamp_ny", one(pa.timestamp("us", "America/New_York"))),
    # The time zone contains ':' -> "timestamp:us:+05:30".
    Case("timestamp_offset", one(pa.timestamp("us", "+05:30"))),
    Case("time32", pa.schema([f("s", pa.time32("s")), f("ms", pa.time32("ms"))])),
    Case("time64", pa.schema([f("us", pa.time64("us")), f("ns", pa.time64("ns"))])),
    Case("duration", pa.schema([f(u, pa.duration(u)) for u in ("s", "ms", "us", "ns")])),
    # ---- decimals
    Case("decimal128", pa.schema([f("a", pa.decimal128(10, 2)), f("b", pa.decimal128(38, 0))])),
    Case("decimal128_neg_scale", one(pa.decimal128(5, -2))),
    Case("decimal256", one(pa.decimal256(76, 10))),
    # ---- lists
    Case("list", one(pa.list_(pa.int32())), rows=[{"c": [1, 2]}, {"c": None}]),
    Case("large_list", one(pa.large_list(pa.string()))),
    Case("list_named_nonnull_item", one(pa.list_(f("element", pa.int64(), False)))),
    Case("list_item_metadata", one(pa.list_(f("item", pa.int64(), k="v")))),
    Case("list_of_list", one(pa.list_(pa.list_(pa.int8())))),
    # ---- fixed-size lists (embeddings)
    Case("fsl_float", pa.schema([f("emb", EMBED)]), rows=[{"emb": [0.5] * 128}]),
    Case("fsl_halffloat", one(pa.list_(pa.float16(), 4))),
    Case("fsl_int8", one(pa.list_(pa.int8(), 16), nullable=False)),
    Case("fsl_of_fsl", one(pa.list_(pa.list_(pa.float32(), 4), 2))),
    Case("fsl_of_struct", one(pa.list_(pa.struct([f("x", pa.int32()), f("y", pa.string())]), 2))),
    # Lance keeps no child field for an fsl of a primitive: the item comes back
    # as a nullable "item" without metadata.
    Case(
        "fsl_item_normalized",
        one(pa.list_(f("x", pa.float32(), False, k="v"), 3)),
        normalized=one(pa.list_(pa.float32(), 3)),
    ),
    # ---- structs and nesting
    Case("struct", one(pa.struct([f("a", pa.int32()), f("b", pa.string(), False)]))),
    Case("struct_not_null", one(pa.struct([f("a", pa.int32(), False)]), nullable=False)),
    Case("empty_struct", one(pa.struct([]))),
    Case("list_of_struct", one(pa.list_(pa.struct([f("a", pa.int32()), f("b", pa.bool_())])))),
    Case("large_list_of_struct", one(pa.large_list(pa.struct([f("a", pa.int32())])))),
    Case("struct_of_list", one(pa.struct([f("l", pa.list_(pa.string())), f("n", pa.int64())]))),
    Case(
        "fsl_in_struct", one(pa.struct([f("emb", pa.list_(pa.float32(), 8)), f("id", pa.int64())]))
    ),
    Case("list_of_fsl", one(pa.list_(pa.list_(pa.float32(), 2)))),
    Case(
        "deep",
        pa.schema(
            [
                f("id", pa.int64(), False),
                f(
                    "s",
                    pa.struct(
                        [
                            f("a", pa.list_(pa.struct([f("x", pa.int32()), f("v", EMBED)]))),
                            f("b", pa.struct([f("c", pa.large_list(pa.string()))])),
                        ]
                    ),
                ),
                f("t", pa.timestamp("us", "UTC")),
            ]
        ),
        rows=[{"id": 1, "s": {"a": [{"x": 1, "v": [1.0] * 128}], "b": {"c": ["q"]}}, "t": 5}],
    ),
    # ---- maps (Spark MapType)
    Case("map", one(pa.map_(pa.string(), pa.int32())), rows=[{"c": [("a", 1)]}]),
    Case("map_of_list", one(pa.map_(pa.string(), pa.list_(pa.int32())))),
    Case("map_of_struct", one(pa.map_(pa.int64(), pa.struct([f("a", pa.string())])))),
    # Lance stores the key/value names as written; pylance reports key/value.
    Case(
        "map_named",
        one(pa.map_(f("k", pa.string(), False, a="b"), f("v", pa.float64(), False)), k="v"),
        normalized=one(
            pa.map_(f("key", pa.string(), False, a="b"), f("value", pa.float64(), False)), k="v"
        ),
    ),
    # ---- dictionaries
    Case("dict_string", one(pa.dictionary(pa.int32(), pa.string()))),
    Case("dict_u16_int64", one(pa.dictionary(pa.uint16(), pa.int64()))),
    Case("dict_large_string", one(pa.dictionary(pa.int8(), pa.large_string()))),
    Case(
        "dict_with_data",
        one(pa.dictionary(pa.int32(), pa.string())),
        rows=[{"c": "a"}, {"c": "b"}, {"c": "a"}],
    ),
    # Arrow-rs has no "ordered" flag: pylance writes ":false" and reads back unordered.
    Case(
        "dict_ordered",
        one(pa.dictionary(pa.int8(), pa.string(), ordered=True)),
        normalized=one(pa.dictionary(pa.int8(), pa.string())),
    ),
    Case("fsl_of_dict", one(pa.list_(pa.dictionary(pa.int32(), pa.string()), 2))),
    # ---- metadata
    Case(
        "field_and_schema_metadata",
        pa.schema(
            [
                f("a", pa.int32(), k1="v1", k2=""),
                f("s", pa.struct([f("x", pa.string(), unit="m")]), doc="nested"),
                f("l", pa.list_(f("item", pa.int8(), inner="yes")), outer="yes"),
            ],
            metadata={"schema-key": "schema-value", "other": '{"json": true}'},
        ),
    ),
    # pylance consumes lance:field_id and assigns ids in order regardless.
    Case(
        "lance_field_id_metadata",
        pa.schema([f("a", pa.int32(), **{"lance:field_id": "7"}), f("b", pa.int32())]),
        normalized=pa.schema([f("a", pa.int32()), f("b", pa.int32())]),
    ),
    Case(
        "primary_key_legacy_flag",
        pa.schema([f("a", pa.int32(), False, **{"lance-schema:unenforced-primary-key": "true"})]),
    ),
    Case(
        "primary_key_positions",
        pa.schema(
            [
                f("a", pa.int32(), False, **{"lance-schema:unenforced-primary-key:position": "2"}),
                f(
                    "b",
                    pa.string(),
                    False,
                    **{
                        "lance-schema:unenforced-primary-key:position": "+1",
                        "lance-schema:unenforced-clustering-key:position": "1",
                    },
                ),
                f("c", pa.int32(), False, **{"lance-schema:unenforced-primary-key": "no"}),
                f("d", pa.int32(), **{"lance-schema:unenforced-clustering-key:position": "-1"}),
            ]
        ),
    ),
    Case(
        "primary_key_in_struct",
        pa.schema(
            [
                f(
                    "s",
                    pa.struct(
                        [f("k", pa.int64(), False, **{"lance-schema:unenforced-primary-key": "1"})]
                    ),
                    False,
                )
            ]
        ),
    ),
    # ---- Arrow extension types: storage type + ARROW:extension:* metadata
    Case("ext_uuid", one(pa.uuid())),
    Case("ext_bool8", one(pa.bool8())),
    Case("ext_tensor", pa.schema([f("t", pa.fixed_shape_tensor(pa.float32(), [2, 2]), k="v")])),
    # pyarrow cannot build an empty list<uuid> from Python: assemble it.
    Case(
        "ext_in_list",
        one(pa.list_(pa.uuid())),
        table=pa.table(
            {
                "c": pa.ListArray.from_arrays(
                    pa.array([0, 1], pa.int32()),
                    pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"0" * 16], pa.binary(16))),
                )
            }
        ),
    ),
    Case(
        "ext_unregistered_metadata",
        pa.schema(
            [
                f(
                    "a",
                    pa.binary(),
                    **{"ARROW:extension:name": "my.ext", "ARROW:extension:metadata": "p"},
                )
            ]
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_round_trip(case: Case) -> None:
    fields, metadata = arrow_schema_to_fields(case.schema)
    back = fields_to_arrow_schema(fields, metadata)
    expected = case.normalized or case.schema
    assert back.equals(expected, check_metadata=True), f"\n{back}\n!=\n{expected}"
    assert [x.id for x in fields] == list(range(len(fields)))
    # The normalized schema is a fixed point.
    again = fields_to_arrow_schema(*arrow_schema_to_fields(expected))
    assert again.equals(expected, check_metadata=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_pylance(case: Case, tmp_path: Path) -> None:
    uri = tmp_path / "t.lance"
    ds = lance.write_dataset(case.data(), str(uri))
    manifest = read_latest_manifest(uri)
    ours, our_meta = arrow_schema_to_fields(case.schema)
    theirs = [file_pb2.Field.FromString(x.SerializeToString()) for x in manifest.fields]

    for field in theirs:
        if field.logical_type.startswith("dict:") and case.rows:
            # With rows, pylance records an (empty, v2-unused) Dictionary message
            # for dictionary columns; the schema alone cannot know it.
            assert field.HasField("dictionary")
            assert field.dictionary == file_pb2.Dictionary()
            field.ClearField("dictionary")
        else:
            assert not field.HasField("dictionary")

    assert len(ours) == len(theirs), f"{ours}\n!=\n{theirs}"
    for mine, real in zip(ours, theirs, strict=True):
        label = real.name
        assert mine.name == real.name
        assert mine.id == real.id, label
        assert mine.parent_id == real.parent_id, label
        assert mine.logical_type == real.logical_type, label
        assert mine.nullable == real.nullable, label
        assert mine.type == real.type == file_pb2.Field.PARENT, label  # Lance never sets it
        assert dict(mine.metadata) == dict(real.metadata), label
        assert mine.encoding == real.encoding, label
        assert mine.extension_name == real.extension_name, label
        assert mine == real, f"{mine}\n!=\n{real}"
    assert our_meta == dict(manifest.schema_metadata)

    read_back = lance.dataset(str(uri)).schema
    assert ds.schema.equals(read_back, check_metadata=True)
    from_manifest = fields_to_arrow_schema(manifest.fields, manifest.schema_metadata)
    assert from_manifest.equals(read_back, check_metadata=True), (
        f"\n{from_manifest}\n!=\n{read_back}"
    )
    expected = case.normalized or case.schema
    assert read_back.equals(expected, check_metadata=True), "pylance's normalization changed"


# ---------------------------------------------------------------- refused types


@dataclass
class Refused:
    id: str
    schema: pa.Schema
    field: str  # the path our error names
    match: str


REFUSED: list[Refused] = [
    Refused("decimal32", one(pa.decimal32(5, 2)), "c", "not supported"),
    Refused("decimal64", one(pa.decimal64(12, 2)), "c", "not supported"),
    Refused("interval", one(pa.month_day_nano_interval()), "c", "not supported"),
    Refused("list_view", one(pa.list_view(pa.int32())), "c", "not supported"),
    Refused("dense_union", one(pa.dense_union([f("a", pa.int32())])), "c", "not supported"),
    Refused(
        "map_sorted", one(pa.map_(pa.string(), pa.int32(), keys_sorted=True)), "c", "keys_sorted"
    ),
    Refused("fsl_of_list", one(pa.list_(pa.list_(pa.int32()), 2)), "c", "fixed_size_list of"),
    Refused("fsl_dim_0", one(pa.list_(pa.float32(), 0)), "c", "dimension 0"),
    Refused(
        "fsl_fsl_struct",
        one(pa.list_(pa.list_(pa.struct([f("a", pa.int32())]), 2), 2)),
        "c",
        "cannot be nested",
    ),
    Refused(
        "dict_timestamp",
        one(pa.dictionary(pa.int32(), pa.timestamp("us", "UTC"))),
        "c",
        "does not parse back",
    ),
    Refused(
        "dict_list", one(pa.dictionary(pa.int32(), pa.list_(pa.int32()))), "c", "cannot be used"
    ),
    Refused(
        "nested_in_struct",
        one(pa.struct([f("ok", pa.int32()), f("bad", pa.decimal32(3, 1))])),
        "c.bad",
        "not supported",
    ),
    Refused("dot_in_top_level_name", pa.schema([f("a.b", pa.int32())]), "a.b", "'.'"),
    Refused(
        "duplicate_name", pa.schema([f("a", pa.int32()), f("a", pa.int64())]), "a", "duplicate"
    ),
    Refused(
        "non_utf8_metadata",
        pa.schema([pa.field("a", pa.int32(), metadata={b"k": b"\xff"})]),
        "a",
        "UTF-8",
    ),
    Refused(
        "pk_nullable",
        pa.schema([f("a", pa.int32(), **{"lance-schema:unenforced-primary-key": "YES"})]),
        "a",
        "nullable",
    ),
    Refused(
        "pk_in_list",
        one(
            pa.list_(f("item", pa.int32(), False, **{"lance-schema:unenforced-primary-key": "1"})),
            nullable=False,
        ),
        "c.item",
        "inside a list",
    ),
    Refused(
        "pk_not_leaf",
        pa.schema(
            [
                f(
                    "c",
                    pa.struct([f("a", pa.int32(), False)]),
                    False,
                    **{"lance-schema:unenforced-primary-key": "true"},
                )
            ]
        ),
        "c",
        "leaf",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_refused_like_pylance(case: Refused, tmp_path: Path) -> None:
    with pytest.raises(SchemaConversionError, match=case.match) as info:
        arrow_schema_to_fields(case.schema)
    assert info.value.field == case.field
    assert repr(case.field) in str(info.value)
    with pytest.raises(Exception):  # noqa: B017 - pylance raises OSError/ValueError/Arrow errors
        lance.write_dataset(case.schema.empty_table(), str(tmp_path / "t.lance"))


LANCE_SPECIAL = [
    ("json", one(pa.json_())),
    ("json_metadata", pa.schema([f("c", pa.string(), **{"ARROW:extension:name": "arrow.json"})])),
    ("blob", pa.schema([f("c", pa.large_binary(), **{"lance-encoding:blob": "true"})])),
]


@pytest.mark.parametrize("schema", [s for _, s in LANCE_SPECIAL], ids=[i for i, _ in LANCE_SPECIAL])
def test_lance_special_columns_refused(schema: pa.Schema, tmp_path: Path) -> None:
    """pylance rewrites these into Lance-only column kinds; we refuse rather than mis-describe them."""
    with pytest.raises(SchemaConversionError) as info:
        arrow_schema_to_fields(schema)
    assert info.value.field == "c"
    lance.write_dataset(schema.empty_table(), str(tmp_path / "t.lance"))
    manifest = read_latest_manifest(tmp_path / "t.lance")
    with pytest.raises(SchemaConversionError, match="'c'"):
        fields_to_arrow_schema(manifest.fields, manifest.schema_metadata)
    # ...because pylance did not store them as the plain Arrow type.
    assert manifest.fields[0].logical_type not in ("string", "large_binary")


# ---------------------------------------------------------- reading bad field lists


def pb(name: str, id: int, parent_id: int, logical_type: str, **kw: Any) -> file_pb2.Field:
    return file_pb2.Field(name=name, id=id, parent_id=parent_id, logical_type=logical_type, **kw)


@pytest.mark.parametrize(
    ("fields", "name", "match"),
    [
        ([pb("a", 0, -1, "int128")], "a", "unknown Lance logical type 'int128'"),
        ([pb("a", 0, -1, "decimal:64:5:2")], "a", "128- and 256-bit"),
        ([pb("a", 0, -1, "timestamp:ps:-")], "a", "time unit"),
        ([pb("a", 0, -1, "fixed_size_list:float:x")], "a", "malformed"),
        ([pb("a", 0, -1, "dict:string:float:false")], "a", "index type"),
        ([pb("a", 0, -1, "json")], "a", "json"),
        ([pb("a", 0, -1, "fixed_size_list:lance.bfloat16:4")], "a", "bfloat16"),
        ([pb("s", 0, -1, "struct"), pb("x", 1, 5, "int32")], "x", "parent_id 5"),
        # A parent listed after its child is as bad as a missing one (Lance panics).
        ([pb("x", 1, 0, "int32"), pb("s", 0, -1, "struct")], "x", "parent_id 0"),
        ([pb("a", 0, -1, "int32"), pb("b", 0, -1, "int32")], "b", "duplicate field id 0"),
        ([pb("l", 0, -1, "list")], "l", "needs 1 child"),
        ([pb("a", 0, -1, "int32"), pb("x", 1, 0, "int32")], "a", "needs 0 child"),
        (
            [pb("m", 0, -1, "map"), pb("entries", 1, 0, "struct"), pb("key", 2, 1, "string")],
            "m",
            "struct<key, value>",
        ),
        (
            [
                pb("s", 0, -1, "struct"),
                pb("l", 1, 0, "list"),
                pb("item", 2, 1, "float128"),
            ],
            "s.l.item",
            "float128",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_field_lists(fields: list[file_pb2.Field], name: str, match: str) -> None:
    with pytest.raises(SchemaConversionError, match=match) as info:
        fields_to_arrow_schema(fields)
    assert info.value.field == name
    assert repr(name) in str(info.value)


def test_extension_name_proto_field_becomes_metadata() -> None:
    """Old writers set only ``extension_name``; Lance puts it back into the metadata."""
    field = pb("u", 0, -1, "fixed_size_binary:16", extension_name="arrow.uuid", nullable=True)
    field.metadata["ARROW:extension:metadata"] = b""
    assert fields_to_arrow_schema([field]) == pa.schema([f("u", pa.uuid())])


# -------------------------------------------------------------------------- helpers


def test_start_id_and_max_field_id() -> None:
    schema = pa.schema([f("a", pa.int32()), f("s", pa.struct([f("x", pa.int8())]))])
    fields, _ = arrow_schema_to_fields(schema, start_id=10)
    assert [(x.name, x.id, x.parent_id) for x in fields] == [
        ("a", 10, -1),
        ("s", 11, -1),
        ("x", 12, 11),
    ]
    assert max_field_id(fields) == 12
    assert max_field_id([]) == -1
    with pytest.raises(SchemaConversionError):
        arrow_schema_to_fields(schema, start_id=-1)


def test_add_columns_matches_pylance(tmp_path: Path) -> None:
    """New columns continue after the table's max field id, as pylance numbers them."""
    uri = str(tmp_path / "t.lance")
    base = pa.schema([f("a", pa.int32()), f("s", pa.struct([f("x", pa.int8())]))])
    lance.write_dataset(pa.Table.from_pylist([{"a": 1, "s": {"x": 2}}], schema=base), uri)
    extra = pa.schema([f("l", pa.list_(pa.string())), f("e", pa.list_(pa.float32(), 2))])
    ds = lance.dataset(uri)
    ds.add_columns(extra)
    manifest = read_latest_manifest(tmp_path / "t.lance")
    base_fields, _ = arrow_schema_to_fields(base)
    new_fields, _ = arrow_schema_to_fields(extra, start_id=max_field_id(base_fields) + 1)
    assert list(manifest.fields) == base_fields + new_fields


def test_project_fields() -> None:
    schema = pa.schema(
        [
            f("a", pa.int32()),
            f("s", pa.struct([f("x", pa.list_(pa.int8())), f("y", pa.string())])),
            f("b", pa.string()),
        ]
    )
    fields, meta = arrow_schema_to_fields(schema)
    kept = project_fields(fields, ["b", "s"])
    assert [(x.name, x.id) for x in kept] == [("s", 1), ("x", 2), ("item", 3), ("y", 4), ("b", 5)]
    assert fields_to_arrow_schema(kept, meta) == pa.schema([schema.field("s"), schema.field("b")])
    kept[0].name = "changed"
    assert fields[1].name == "s"  # copies, not views
    with pytest.raises(SchemaConversionError, match="'x'"):
        project_fields(fields, ["x"])
