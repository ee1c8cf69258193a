"""Arrow schema <-> Lance field list (``lance.file.Field``), as Lance writes it.

A Lance manifest stores its schema as a flat, depth-first pre-order list of
:class:`~lancetx.protos.file_pb2.Field` messages linked by ``parent_id`` (``-1`` for
a top-level column), plus ``schema_metadata`` (``map<string, bytes>``). This
module produces exactly the fields pylance writes for an Arrow schema and turns
a field list back into the Arrow schema pylance reports. The rules follow Lance's
``lance-core`` ``datatypes`` module (``LogicalType``, ``Field: TryFrom<&ArrowField>``)
and ``lance-file`` ``datatypes.rs`` (``pb::Field: From<&Field>``):

* Ids are assigned in pre-order, starting at ``start_id``; a child gets its
  parent's id as ``parent_id``. ``Field.type`` is left at 0: Lance never sets it.
* Nested types and their children:

  - ``struct`` -> one child per struct field;
  - ``list`` / ``large_list`` -> one child, the item field (its own name,
    nullability and metadata are kept); the type is ``list.struct`` /
    ``large_list.struct`` when the item is a struct;
  - ``map`` -> one child, the ``entries`` struct (``key``, ``value``); the
    names are stored as written, but read back as ``entries``/``key``/``value``
    as pylance presents them;
  - ``fixed_size_list`` of a struct -> ``fixed_size_list:struct:N`` with the item
    struct as its one child;
  - any other ``fixed_size_list`` is a *leaf*: ``fixed_size_list:<item type>:N``
    (e.g. ``fixed_size_list:float:128``), no child field. Lance therefore forgets
    the item's name, nullability and metadata: it reads back as a nullable
    field named ``item``.

* Leaf type strings: ``int8`` .. ``uint64``, ``halffloat``/``float``/``double``,
  ``bool``, ``null``, ``string``, ``large_string``, ``binary``, ``large_binary``,
  ``date32:day``, ``date64:ms``, ``time32:s|ms``, ``time64:us|ns``,
  ``timestamp:<unit>:<tz or ->``, ``duration:<unit>``, ``decimal:128|256:P:S``,
  ``fixed_size_binary:N``, ``dict:<value>:<index>:false``.
* ``encoding`` is the legacy column encoding Lance still records: PLAIN for
  fixed-width types, lists and maps, VAR_BINARY for strings/binaries, DICTIONARY
  for dictionaries, NONE for structs and ``null``.
* Arrow field metadata becomes ``metadata`` (UTF-8 bytes); ``lance:field_id`` is
  dropped, as pylance does. ``ARROW:extension:name`` is mirrored into
  ``extension_name``. Extension types (``arrow.uuid``, ``arrow.fixed_shape_tensor``
  ...) are stored as their storage type plus the two ``ARROW:extension:*`` keys;
  on the way back, registered extension types are rebuilt.
* ``lance-schema:unenforced-primary-key[:position]`` and
  ``lance-schema:unenforced-clustering-key:position`` metadata set the matching
  ``unenforced_*`` proto fields, and the primary-key rules Lance enforces are
  checked.

Types pylance changes on write (so ``fields_to_arrow_schema`` returns the changed
type): ``string_view``/``binary_view`` -> ``string``/``binary``; an ordered
dictionary -> unordered; a fixed-size-list item -> ``item``, nullable, without
metadata; map key/value fields -> ``key``/``value`` (names are stored, but not
reported). Types it refuses (and so do we, with :class:`SchemaConversionError`):
``decimal32``/``decimal64``, list views, unions, run-end encoded, intervals,
sorted maps, fixed-size lists of lists/maps or of dimension <= 0, dictionaries
whose value type does not round-trip through its type string, non-UTF-8
metadata, top-level names containing ``.`` or repeated. Lance's own special
columns are refused too, because pylance rewrites them: blob columns
(``lance-encoding:blob``, ``lance.blob.v2``, logical type ``blob``), JSON
(``arrow.json``/``lance.json``, logical type ``json``) and ``lance.bfloat16``.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from lancetx.commit.errors import SchemaConversionError
from lancetx.protos import file_pb2

__all__ = [
    "arrow_schema_to_fields",
    "fields_to_arrow_schema",
    "max_field_id",
    "project_fields",
]

# Metadata keys with a meaning to Lance or Arrow.
_FIELD_ID_KEY = "lance:field_id"
_EXT_NAME_KEY = "ARROW:extension:name"
_EXT_META_KEY = "ARROW:extension:metadata"
_PK_KEY = "lance-schema:unenforced-primary-key"
_PK_POSITION_KEY = "lance-schema:unenforced-primary-key:position"
_CK_POSITION_KEY = "lance-schema:unenforced-clustering-key:position"
_BLOB_KEY = "lance-encoding:blob"

# Extension names pylance rewrites into something else; converting them
# ourselves would not produce what pylance writes.
_LANCE_SPECIAL_EXTENSIONS = {
    "arrow.json": "JSON columns are rewritten by Lance into its own 'json' type",
    "lance.json": "JSON columns are rewritten by Lance into its own 'json' type",
    "lance.blob.v2": "blob columns are stored by Lance as blob descriptors",
    "lance.bfloat16": "bfloat16 columns are not supported by lancetx",
}

_U32_MAX = 2**32 - 1

_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "uint8": pa.uint8(),
    "int16": pa.int16(),
    "uint16": pa.uint16(),
    "int32": pa.int32(),
    "uint32": pa.uint32(),
    "int64": pa.int64(),
    "uint64": pa.uint64(),
    "halffloat": pa.float16(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "large_string": pa.large_string(),
    "large_binary": pa.large_binary(),
    "date32:day": pa.date32(),
    "date64:ms": pa.date64(),
    "time32:s": pa.time32("s"),
    "time32:ms": pa.time32("ms"),
    "time64:us": pa.time64("us"),
    "time64:ns": pa.time64("ns"),
    "duration:s": pa.duration("s"),
    "duration:ms": pa.duration("ms"),
    "duration:us": pa.duration("us"),
    "duration:ns": pa.duration("ns"),
}
# Reverse lookup; string_view/binary_view deliberately map onto string/binary.
_SIMPLE_NAMES: dict[pa.DataType, str] = {t: name for name, t in _SIMPLE_TYPES.items()}
_SIMPLE_NAMES[pa.string_view()] = "string"
_SIMPLE_NAMES[pa.binary_view()] = "binary"

_TIME_UNITS = ("s", "ms", "us", "ns")


class _Unsupported(Exception):
    """Internal: a type problem, re-raised as SchemaConversionError with the field path."""


# ----------------------------------------------------------------- Arrow -> Lance


def arrow_schema_to_fields(
    schema: pa.Schema, *, start_id: int = 0
) -> tuple[list[file_pb2.Field], dict[str, bytes]]:
    """Convert an Arrow schema into the Lance field list and schema metadata.

    Returns ``(fields, schema_metadata)`` exactly as pylance records them in a
    manifest for a new table: fields in depth-first pre-order with ids
    ``start_id, start_id + 1, ...`` and ``parent_id`` ``-1`` for top-level
    columns. Use ``start_id=max_field_id(existing) + 1`` for columns added to an
    existing table.

    Raises :class:`SchemaConversionError` naming the (dotted) field path when a
    type or metadata entry cannot be stored by Lance.
    """
    if start_id < 0:
        raise SchemaConversionError("<schema>", f"start_id must be >= 0, got {start_id}")
    nodes = [_arrow_field_to_node(f, f.name) for f in schema]
    _validate_top_level(nodes)
    for node in nodes:
        _verify_primary_key(node, ancestors=[])
    out: list[file_pb2.Field] = []
    next_id = start_id
    for node in nodes:
        next_id = node.emit(-1, next_id, out)
    return out, _metadata_to_bytes(schema.metadata, "<schema>")


@dataclass
class _Node:
    """A Lance field before ids are assigned (mirrors Lance's ``Field``)."""

    path: str
    proto: file_pb2.Field
    children: list[_Node] = field(default_factory=list)

    def emit(self, parent_id: int, next_id: int, out: list[file_pb2.Field]) -> int:
        self.proto.id = next_id
        self.proto.parent_id = parent_id
        out.append(self.proto)
        next_id += 1
        for child in self.children:
            next_id = child.emit(self.proto.id, next_id, out)
        return next_id


def _arrow_field_to_node(f: pa.Field, path: str) -> _Node:
    try:
        return _convert_field(f, path)
    except _Unsupported as e:
        raise SchemaConversionError(path, str(e)) from None


def _convert_field(f: pa.Field, path: str) -> _Node:
    dtype = f.type
    if isinstance(dtype, pa.BaseExtensionType):
        # The Arrow C export is what Lance receives: the storage type with the
        # extension name and serialized parameters in the field metadata.
        raw_meta = _c_exported_metadata(f)
        dtype = dtype.storage_type
    else:
        raw_meta = dict(f.metadata or {})
    metadata = _metadata_to_bytes(raw_meta, path)
    metadata.pop(_FIELD_ID_KEY, None)

    ext_name = metadata.get(_EXT_NAME_KEY, b"").decode()
    if ext_name in _LANCE_SPECIAL_EXTENSIONS:
        raise _Unsupported(
            f"extension type {ext_name!r}: {_LANCE_SPECIAL_EXTENSIONS[ext_name]}; "
            "store the data as a plain Arrow type"
        )
    if _BLOB_KEY in metadata:
        raise _Unsupported(
            f"metadata {_BLOB_KEY!r} marks a Lance blob column, which pylance rewrites into "
            "blob descriptors; lancetx does not support blob columns"
        )

    children: list[_Node] = []
    if pa.types.is_struct(dtype):
        logical = "struct"
        children = [_arrow_field_to_node(c, f"{path}.{c.name}") for c in dtype.fields]
    elif pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        item = dtype.value_field
        logical = "list" if pa.types.is_list(dtype) else "large_list"
        if _is_struct_like(item.type):
            logical += ".struct"
        children = [_arrow_field_to_node(item, f"{path}.{item.name}")]
    elif pa.types.is_fixed_size_list(dtype):
        item = dtype.value_field
        _check_fsl(dtype, nested=False)
        if pa.types.is_struct(item.type):
            logical = f"fixed_size_list:struct:{dtype.list_size}"
            children = [_arrow_field_to_node(item, f"{path}.{item.name}")]
        else:
            logical = _leaf_logical_type(dtype)
    elif pa.types.is_map(dtype):
        if dtype.keys_sorted:
            raise _Unsupported("maps with keys_sorted=True are not supported by Lance")
        entries = dtype.field(0)
        children = [_arrow_field_to_node(entries, f"{path}.{entries.name}")]
        logical = "map"
    else:
        logical = _leaf_logical_type(dtype)

    proto = file_pb2.Field(
        name=f.name,
        logical_type=logical,
        nullable=f.nullable,
        encoding=_encoding(dtype),
        metadata=metadata,
        extension_name=ext_name,
    )
    _set_key_positions(proto, metadata)
    return _Node(path, proto, children)


def _is_struct_like(t: pa.DataType) -> bool:
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    return bool(pa.types.is_struct(t))


def _check_fsl(dtype: pa.DataType, *, nested: bool) -> None:
    """Lance's ``is_supported_fixed_size_list_child`` and dimension check."""
    if dtype.list_size <= 0:
        raise _Unsupported(
            f"fixed_size_list dimension {dtype.list_size}; dimension must be a positive integer"
        )
    item = dtype.value_type
    if isinstance(item, pa.BaseExtensionType):
        raise _Unsupported(
            f"fixed_size_list of extension type {item.extension_name!r} is not supported"
        )
    if pa.types.is_struct(item) and nested:
        raise _Unsupported("a fixed_size_list of structs cannot be nested in a fixed_size_list")
    if pa.types.is_list(item) or pa.types.is_large_list(item) or pa.types.is_map(item):
        raise _Unsupported(f"fixed_size_list of {item} is not supported by Lance")
    if pa.types.is_fixed_size_list(item):
        _check_fsl(item, nested=True)


def _leaf_logical_type(t: pa.DataType) -> str:
    """Lance's ``LogicalType: TryFrom<&DataType>`` for types without child fields."""
    simple = _SIMPLE_NAMES.get(t)
    if simple is not None:
        return simple
    if pa.types.is_timestamp(t):
        return f"timestamp:{t.unit}:{t.tz if t.tz is not None else '-'}"
    if pa.types.is_decimal128(t):
        return f"decimal:128:{t.precision}:{t.scale}"
    if pa.types.is_decimal256(t):
        return f"decimal:256:{t.precision}:{t.scale}"
    if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        return f"fixed_size_binary:{t.byte_width}"
    if pa.types.is_fixed_size_list(t):
        _check_fsl(t, nested=False)
        return f"fixed_size_list:{_leaf_logical_type(t.value_type)}:{t.list_size}"
    if pa.types.is_dictionary(t):
        if isinstance(t.value_type, pa.BaseExtensionType):
            raise _Unsupported("dictionary of an extension type is not supported")
        logical = (
            f"dict:{_leaf_logical_type(t.value_type)}:{_leaf_logical_type(t.index_type)}:false"
        )
        # pylance refuses a dictionary whose type string does not parse back
        # (e.g. a timestamp value type, whose string contains ':').
        if len(logical.split(":")) != 4:
            raise _Unsupported(
                f"dictionary type {t}: its Lance type string {logical!r} does not parse back"
            )
        return logical
    if pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        # Only reachable for nested types where Lance wants a leaf (a
        # dictionary's values).
        raise _Unsupported(f"{t} cannot be used here")
    raise _Unsupported(f"Arrow type {t} is not supported by Lance")


def _encoding(t: pa.DataType) -> file_pb2.Encoding.ValueType:
    if pa.types.is_dictionary(t):
        return file_pb2.DICTIONARY
    if t in (pa.string(), pa.binary(), pa.large_string(), pa.large_binary()) or t in (
        pa.string_view(),
        pa.binary_view(),
    ):
        return file_pb2.VAR_BINARY
    if pa.types.is_struct(t) or pa.types.is_null(t):
        return file_pb2.NONE
    return file_pb2.PLAIN


def _parse_u32(value: bytes | None) -> int | None:
    """Rust's ``str::parse::<u32>``: optional '+', ASCII digits, in range."""
    if value is None:
        return None
    m = re.fullmatch(rb"\+?([0-9]+)", value)
    if m is None:
        return None
    n = int(m.group(1))
    return n if n <= _U32_MAX else None


def _set_key_positions(proto: file_pb2.Field, metadata: Mapping[str, bytes]) -> None:
    pk_position = _parse_u32(metadata.get(_PK_POSITION_KEY))
    if pk_position is None:
        legacy = metadata.get(_PK_KEY)
        if legacy is not None and legacy.decode().lower() in ("true", "1", "yes"):
            pk_position = 0
    if pk_position is not None:
        proto.unenforced_primary_key = True
        proto.unenforced_primary_key_position = pk_position
    ck_position = _parse_u32(metadata.get(_CK_POSITION_KEY))
    if ck_position is not None:
        proto.unenforced_clustering_key_position = ck_position


def _validate_top_level(nodes: Sequence[_Node]) -> None:
    seen: set[str] = set()
    for node in nodes:
        name = node.proto.name
        if "." in name:
            raise SchemaConversionError(
                name,
                "top-level field names cannot contain '.' (Lance uses it for nested paths); "
                "use a struct column instead",
            )
        if name in seen:
            raise SchemaConversionError(name, "duplicate top-level field name")
        seen.add(name)


def _verify_primary_key(node: _Node, ancestors: list[_Node]) -> None:
    """Lance's ``Schema::verify_primary_key``: leaf, never nullable, not in a list or map."""
    chain = [*ancestors, node]
    if node.proto.unenforced_primary_key:
        if node.children:
            raise SchemaConversionError(node.path, "a primary key column must be a leaf")
        for a in chain:
            lt = a.proto.logical_type
            if a.proto.nullable:
                raise SchemaConversionError(
                    node.path,
                    f"a primary key column and all its ancestors must not be nullable "
                    f"({a.path!r} is nullable)",
                )
            if lt in ("list", "list.struct", "large_list", "large_list.struct", "map"):
                raise SchemaConversionError(
                    node.path, f"a primary key column must not be inside a {lt} ({a.path!r})"
                )
    for child in node.children:
        _verify_primary_key(child, chain)


def _metadata_to_bytes(
    metadata: Mapping[bytes, bytes] | Mapping[str, str] | None, path: str
) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for k, v in (metadata or {}).items():
        kb = k if isinstance(k, bytes) else k.encode()
        vb = v if isinstance(v, bytes) else v.encode()
        try:
            key = kb.decode()
            vb.decode()
        except UnicodeDecodeError:
            raise SchemaConversionError(
                path,
                f"metadata entry {kb!r} is not valid UTF-8 (Lance stores metadata as strings); "
                "base64-encode binary metadata",
            ) from None
        out[key] = vb
    return out


class _ArrowSchemaStruct(ctypes.Structure):
    """The Arrow C data interface ``struct ArrowSchema``."""

    _fields_ = [
        ("format", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("metadata", ctypes.c_void_p),
        ("flags", ctypes.c_int64),
        ("n_children", ctypes.c_int64),
        ("children", ctypes.c_void_p),
        ("dictionary", ctypes.c_void_p),
        ("release", ctypes.c_void_p),
        ("private_data", ctypes.c_void_p),
    ]


def _c_exported_metadata(f: pa.Field) -> dict[bytes, bytes]:
    """The field metadata pyarrow hands to Lance through the C data interface.

    For an extension type this includes ``ARROW:extension:name`` and the
    serialized ``ARROW:extension:metadata``, which pyarrow exposes no other way
    for its C++-defined extension types.
    """
    capsule = f.__arrow_c_schema__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    c_schema = _ArrowSchemaStruct.from_address(get_pointer(capsule, b"arrow_schema"))
    out: dict[bytes, bytes] = {}
    pos = c_schema.metadata
    if not pos:
        return out
    # Layout: int32 count, then per entry int32 key length, key, int32 value length, value.
    count = ctypes.c_int32.from_address(pos).value
    pos += 4
    for _ in range(count):
        klen = ctypes.c_int32.from_address(pos).value
        key = ctypes.string_at(pos + 4, klen)
        pos += 4 + klen
        vlen = ctypes.c_int32.from_address(pos).value
        value = ctypes.string_at(pos + 4, vlen)
        pos += 4 + vlen
        out[key] = value
    del capsule  # the capsule's destructor releases the exported schema
    return out


# ----------------------------------------------------------------- Lance -> Arrow


@dataclass
class _Tree:
    proto: file_pb2.Field
    children: list[_Tree] = field(default_factory=list)


def fields_to_arrow_schema(
    fields: Sequence[file_pb2.Field], metadata: Mapping[str, bytes] | None = None
) -> pa.Schema:
    """Rebuild the Arrow schema from a Lance field list and schema metadata.

    The inverse of :func:`arrow_schema_to_fields`, and the schema pylance reports
    for a manifest with these fields: nesting comes from ``parent_id`` (a parent
    must precede its children, as Lance requires), field metadata and
    ``extension_name`` become Arrow field metadata, and registered Arrow
    extension types are rebuilt from it.

    Raises :class:`SchemaConversionError` naming the field for an unknown or
    unsupported logical type, a ``parent_id`` that names no earlier field, a
    duplicate id, or children that do not fit the parent's type.
    """
    roots: list[_Tree] = []
    by_id: dict[int, _Tree] = {}
    for proto in fields:
        node = _Tree(proto)
        if proto.id in by_id:
            raise SchemaConversionError(
                proto.name,
                f"duplicate field id {proto.id} (also used by {by_id[proto.id].proto.name!r})",
            )
        if proto.parent_id == -1:
            roots.append(node)
        else:
            parent = by_id.get(proto.parent_id)
            if parent is None:
                raise SchemaConversionError(
                    proto.name,
                    f"parent_id {proto.parent_id} does not name a field listed before it "
                    f"(field id {proto.id})",
                )
            parent.children.append(node)
        by_id[proto.id] = node

    arrow_fields = [_tree_to_arrow(root, root.proto.name) for root in roots]
    schema_meta = {k.encode(): bytes(v) for k, v in (metadata or {}).items()}
    schema = pa.schema(arrow_fields, metadata=schema_meta or None)
    if any(_has_extension_metadata(f) for f in schema):
        # Arrow's IPC reader turns ARROW:extension:* metadata into registered
        # extension types, as pyarrow's C-data import does for pylance.
        schema = pa.ipc.read_schema(pa.py_buffer(schema.serialize()))
    return schema


def _tree_to_arrow(node: _Tree, path: str) -> pa.Field:
    try:
        return _build_arrow_field(node, path)
    except _Unsupported as e:
        raise SchemaConversionError(path, str(e)) from None


def _build_arrow_field(node: _Tree, path: str) -> pa.Field:
    proto = node.proto
    lt = proto.logical_type
    metadata: dict[bytes, bytes] = {k.encode(): bytes(v) for k, v in proto.metadata.items()}
    if proto.extension_name:
        metadata[_EXT_NAME_KEY.encode()] = proto.extension_name.encode()
    ext_name = metadata.get(_EXT_NAME_KEY.encode(), b"").decode(errors="replace")
    if ext_name in _LANCE_SPECIAL_EXTENSIONS:
        raise _Unsupported(f"extension type {ext_name!r}: {_LANCE_SPECIAL_EXTENSIONS[ext_name]}")

    children = [_tree_to_arrow(c, f"{path}.{c.proto.name}") for c in node.children]

    def expect_children(n: int) -> None:
        if len(children) != n:
            raise _Unsupported(
                f"logical type {lt!r} needs {n} child field(s), found {len(children)}"
            )

    dtype: pa.DataType
    if lt == "struct":
        dtype = pa.struct(children)
    elif lt in ("list", "list.struct"):
        expect_children(1)
        dtype = pa.list_(children[0])
    elif lt in ("large_list", "large_list.struct"):
        expect_children(1)
        dtype = pa.large_list(children[0])
    elif lt.startswith("fixed_size_list:struct:"):
        expect_children(1)
        dtype = pa.list_(children[0], _parse_int(lt.rsplit(":", 1)[1], lt))
    elif lt == "map":
        expect_children(1)
        dtype = _map_type(children[0])
    else:
        expect_children(0)
        dtype = _parse_leaf(lt)
    return pa.field(proto.name, dtype, nullable=proto.nullable, metadata=metadata or None)


def _map_type(entries: pa.Field) -> pa.DataType:
    et = entries.type
    if not pa.types.is_struct(et) or et.num_fields != 2:
        raise _Unsupported(f"map entries must be a struct<key, value>, found {et}")
    if entries.nullable or entries.metadata:
        raise _Unsupported(
            f"map entries field {entries.name!r} must be non-nullable and carry no metadata"
        )
    key, value = et.field(0), et.field(1)
    if key.nullable:
        raise _Unsupported(f"map key field {key.name!r} must not be nullable")
    # Lance stores the writer's names, but pyarrow's C-data import (how pylance
    # hands schemas over) renames them to entries/key/value; so do we.
    return pa.map_(key.with_name("key"), value.with_name("value"))


def _parse_int(s: str, lt: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", s):
        raise _Unsupported(f"malformed logical type {lt!r}")
    return int(s)


def _parse_leaf(lt: str) -> pa.DataType:
    """Lance's ``DataType: TryFrom<&LogicalType>`` for types without child fields."""
    simple = _SIMPLE_TYPES.get(lt)
    if simple is not None:
        return simple
    if lt in ("json", "blob"):
        raise _Unsupported(
            f"Lance logical type {lt!r} is a Lance-specific column kind lancetx does not support"
        )
    parts = lt.split(":")
    kind = parts[0]
    if kind == "fixed_size_list" and len(parts) >= 3:
        inner = ":".join(parts[1:-1])
        if inner == "lance.bfloat16":
            raise _Unsupported(_LANCE_SPECIAL_EXTENSIONS["lance.bfloat16"])
        size = _parse_int(parts[-1], lt)
        return pa.list_(_parse_leaf(inner), size)
    if kind == "fixed_size_binary" and len(parts) == 2:
        return pa.binary(_parse_int(parts[1], lt))
    if kind == "dict" and len(parts) == 4:
        value, index = _parse_leaf(parts[1]), _parse_leaf(parts[2])
        if not pa.types.is_integer(index):
            raise _Unsupported(f"dictionary index type {parts[2]!r} is not an integer type")
        return pa.dictionary(index, value)
    if kind == "decimal" and len(parts) == 4:
        bits = parts[1]
        precision, scale = _parse_int(parts[2], lt), _parse_int(parts[3], lt)
        if bits == "128":
            return pa.decimal128(precision, scale)
        if bits == "256":
            return pa.decimal256(precision, scale)
        raise _Unsupported(f"only 128- and 256-bit decimals are supported, found {lt!r}")
    if kind == "timestamp" and len(parts) >= 3:
        # A time zone may itself contain ':' (e.g. "+05:00"), so split at most twice.
        _, unit, tz = lt.split(":", 2)
        if unit not in _TIME_UNITS:
            raise _Unsupported(f"unknown time unit in {lt!r}")
        return pa.timestamp(unit, None if tz == "-" else tz)
    raise _Unsupported(f"unknown Lance logical type {lt!r}")


def _has_extension_metadata(f: pa.Field) -> bool:
    if f.metadata and _EXT_NAME_KEY.encode() in f.metadata:
        return True
    t = f.type
    if pa.types.is_struct(t):
        return any(_has_extension_metadata(c) for c in t.fields)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_extension_metadata(t.value_field)
    if pa.types.is_map(t):
        return _has_extension_metadata(t.field(0))
    return False


# ------------------------------------------------------------------------ helpers


def max_field_id(fields: Iterable[file_pb2.Field]) -> int:
    """The largest field id in ``fields``, or ``-1`` when there are none.

    ``max_field_id(fields) + 1`` is the ``start_id`` for new columns. (For a
    table, the manifest's own max field id also counts ids of dropped columns.)
    """
    return max((f.id for f in fields), default=-1)


def project_fields(fields: Sequence[file_pb2.Field], names: Iterable[str]) -> list[file_pb2.Field]:
    """Keep the top-level columns named in ``names`` together with all their descendants.

    Field order, ids and parent ids are unchanged (the schema order, not the
    order of ``names``). Raises :class:`SchemaConversionError` for a name that is
    not a top-level column.
    """
    wanted = list(names)
    top_level = {f.name for f in fields if f.parent_id == -1}
    for name in wanted:
        if name not in top_level:
            raise SchemaConversionError(name, "no top-level column with this name")
    keep_ids: set[int] = set()
    out: list[file_pb2.Field] = []
    for f in fields:
        if (f.parent_id == -1 and f.name in wanted) or f.parent_id in keep_ids:
            keep_ids.add(f.id)
            copy = file_pb2.Field()
            copy.CopyFrom(f)
            out.append(copy)
    return out
