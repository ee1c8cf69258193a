"""Fragment metadata: pylance's ``FragmentMetadata.to_json()`` dict <-> ``DataFragment``.

Spark executors describe the fragments they wrote as JSON in commit messages;
the driver turns them into ``lance.table.DataFragment`` protos for the manifest.
The JSON is the one pylance 14 produces and accepts (``FragmentMetadata.to_json()``
/ ``FragmentMetadata.from_json()``), which mirrors the serde form of Lance's
``Fragment`` (``lance-table/src/format/fragment.rs``)::

    {"id": 0,
     "files": [{"fields": [0, 1], "column_indices": [0, 1],
                "file_major_version": 2, "file_minor_version": 2,
                "file_size_bytes": 633, "base_id": null, "path": "….lance"}],
     "overlays": [],
     "physical_rows": 3,
     "deletion_file": {"read_version": 1, "id": 42, "file_type": "array",
                       "num_deleted_rows": 1, "base_id": null} | null,
     "row_id_meta": {"Inline": [10, 4, …]} | "Column" | {"External": {…}} | null,
     "created_at_version_meta": {"inline": […]} | {"column": {}} | {"external": {…}} | null,
     "last_updated_at_version_meta": (same shape) | null}

Everything is a plain int, string, list or null, so it survives ``json.dumps``.
Where Lance's proto uses 0 for "unknown" (``physical_rows``, ``file_size_bytes``,
``num_deleted_rows``) the JSON has ``null``, exactly as pylance converts them; a 0
in incoming JSON therefore comes back as ``null``.

pylance 14 knows ``DataFragment`` fields that our ``table.proto`` does not
declare (numbers and meaning established against pylance 14.0.2 manifests):

* ``overlays`` (data overlay files) = field 11, ``repeated DataOverlayFile``,
  gated by reader/writer feature flag 64. lancetx does not implement overlays:
  a non-empty ``overlays`` list, or a proto carrying field 11, is refused with
  :class:`UnsupportedFeatureError`.
* *Spilled row lineage* (compaction with ``lance.row_lineage.spill``): the row
  ids / version sequences live in data-file columns with reserved field ids
  -3, -4, -5 instead of inline bytes. The fragment then carries an empty
  message in field 12 (``row_id_sequence``, JSON ``"Column"``), 13
  (``last_updated_at_version_sequence``, JSON ``{"column": {}}``) and 14
  (``created_at_version_sequence``), with feature flag 2048. As the JSON holds
  no payload, these are kept losslessly as the exact (empty) proto fields.

Anything else we do not know (a JSON key, a proto field, a non-empty spilled
descriptor) is refused rather than dropped: conversion is lossless or it fails.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from lancetx.commit.errors import FormatError, UnsupportedFeatureError
from lancetx.protos import table_pb2

if TYPE_CHECKING:
    from lance.fragment import FragmentMetadata

__all__ = [
    "OVERLAYS_FEATURE_FLAG",
    "OVERLAYS_FIELD_NUMBER",
    "SPILLED_CREATED_AT_FIELD_NUMBER",
    "SPILLED_LAST_UPDATED_AT_FIELD_NUMBER",
    "SPILLED_ROW_IDS_FIELD_NUMBER",
    "SPILLED_ROW_LINEAGE_FEATURE_FLAG",
    "FragmentFormatError",
    "fragment_from_json",
    "fragment_from_pylance",
    "fragment_to_json",
    "fragment_to_pylance",
    "unsafe_file_paths",
]

#: ``DataFragment.overlays`` in Lance's table.proto (absent from ours).
OVERLAYS_FIELD_NUMBER = 11
#: Reader and writer feature flag Lance sets when any fragment has overlays.
OVERLAYS_FEATURE_FLAG = 64
#: ``DataFragment`` fields (absent from our table.proto) marking row lineage that
#: lives in a data-file column: members of the ``row_id_sequence``,
#: ``last_updated_at_version_sequence`` and ``created_at_version_sequence`` oneofs.
SPILLED_ROW_IDS_FIELD_NUMBER = 12
SPILLED_LAST_UPDATED_AT_FIELD_NUMBER = 13
SPILLED_CREATED_AT_FIELD_NUMBER = 14
#: Reader and writer feature flag pylance sets when row lineage is spilled.
SPILLED_ROW_LINEAGE_FEATURE_FLAG = 2048

# Proto fields read through our generated attributes, per message.
_DECLARED_FIELDS = {
    "lance.table.DataFragment": frozenset(range(1, 11)),
    "lance.table.DataFile": frozenset(range(1, 8)),
    "lance.table.DeletionFile": frozenset({1, 2, 3, 4, 7}),
    "lance.table.ExternalFile": frozenset({1, 2, 3}),
}
_SPILLED_FIELDS = frozenset(
    {
        SPILLED_ROW_IDS_FIELD_NUMBER,
        SPILLED_LAST_UPDATED_AT_FIELD_NUMBER,
        SPILLED_CREATED_AT_FIELD_NUMBER,
    }
)
# The three row-lineage oneofs: (JSON key, JSON tags inline/external/spilled,
# oneof name, spilled field number).
_LINEAGE = (
    ("row_id_meta", ("Inline", "External", "Column"), "row_id_sequence", 12),
    (
        "created_at_version_meta",
        ("inline", "external", "column"),
        "created_at_version_sequence",
        14,
    ),
    (
        "last_updated_at_version_meta",
        ("inline", "external", "column"),
        "last_updated_at_version_sequence",
        13,
    ),
)

_U32 = 2**32 - 1
_U64 = 2**64 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1

_FRAGMENT_KEYS = (
    "id",
    "files",
    "overlays",
    "physical_rows",
    "deletion_file",
    "row_id_meta",
    "created_at_version_meta",
    "last_updated_at_version_meta",
)
_DATA_FILE_KEYS = (
    "fields",
    "column_indices",
    "file_major_version",
    "file_minor_version",
    "file_size_bytes",
    "base_id",
    "path",
)
_DELETION_FILE_KEYS = ("read_version", "id", "file_type", "num_deleted_rows", "base_id")
_EXTERNAL_FILE_KEYS = ("path", "offset", "size")

_DELETION_TYPES = {
    "array": table_pb2.DeletionFile.ARROW_ARRAY,
    "bitmap": table_pb2.DeletionFile.BITMAP,
}
_DELETION_NAMES = {v: k for k, v in _DELETION_TYPES.items()}


class FragmentFormatError(FormatError):
    """Fragment metadata (JSON or proto) is malformed or carries something we cannot keep.

    ``path`` names the fragment (``"fragment 3"``) and the part at fault.
    """

    kind = "fragment metadata"


def _overlays_error(where: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(
        where,
        "writer",
        OVERLAYS_FEATURE_FLAG,
        [
            f"data overlay files (DataFragment.overlays, proto field {OVERLAYS_FIELD_NUMBER}); "
            "rewrite the fragment without overlays first"
        ],
    )


# ------------------------------------------------------------------- JSON -> proto


def fragment_from_json(d: Mapping[str, Any]) -> table_pb2.DataFragment:
    """Build the ``DataFragment`` proto from a pylance ``FragmentMetadata.to_json()`` dict.

    Accepts exactly the keys pylance writes (``overlays`` may be absent, as from
    older pylance). Raises :class:`FragmentFormatError` for a missing or unknown
    key or a value of the wrong type or range, and
    :class:`UnsupportedFeatureError` for non-empty ``overlays``.
    """
    if not isinstance(d, Mapping):
        raise FragmentFormatError("fragment", f"expected a JSON object, got {type(d).__name__}")
    frag_id = _uint(d, "id", "fragment", _U64, required=True)
    where = f"fragment {frag_id}"
    _check_keys(d, _FRAGMENT_KEYS, where)

    overlays = d.get("overlays")
    if overlays is not None and not isinstance(overlays, list):
        raise FragmentFormatError(f"{where}.overlays", "expected a list")
    if overlays:
        raise _overlays_error(where)

    out = table_pb2.DataFragment(id=frag_id)
    files = d.get("files")
    if not isinstance(files, list):
        raise FragmentFormatError(f"{where}.files", "expected a list of data files")
    for i, file in enumerate(files):
        out.files.append(_data_file_from_json(file, f"{where}.files[{i}]"))
    out.physical_rows = _uint(d, "physical_rows", where, _U64) or 0

    deletion = d.get("deletion_file")
    if deletion is not None:
        out.deletion_file.CopyFrom(_deletion_file_from_json(deletion, f"{where}.deletion_file"))

    spilled_markers: list[int] = []
    for key, tags, oneof, spilled in _LINEAGE:
        value = d.get(key)
        if value is None:
            continue
        inline_tag, external_tag, column_tag = tags
        here = f"{where}.{key}"
        if value == column_tag and key == "row_id_meta":
            # A serde unit variant: the bare string "Column".
            spilled_markers.append(spilled)
            continue
        kind, payload = _tagged(value, tags, here)
        inline_field, external_field = _oneof_members(oneof)
        if kind == inline_tag:
            setattr(out, inline_field, _bytes(payload, f"{here}.{kind}"))
        elif kind == external_tag:
            getattr(out, external_field).CopyFrom(_external(payload, f"{here}.{kind}"))
        elif key != "row_id_meta" and payload == {}:
            spilled_markers.append(spilled)
        else:
            raise FragmentFormatError(
                f"{here}.{kind}",
                f"expected {{}} (a spilled-lineage marker carries no data), got {payload!r}",
            )
    # In field-number order, as Lance serializes them, so the bytes match too.
    for number in sorted(spilled_markers):
        out.MergeFromString(_empty_field(number))
    return out


def _data_file_from_json(d: Any, where: str) -> table_pb2.DataFile:
    if not isinstance(d, Mapping):
        raise FragmentFormatError(where, "expected a JSON object")
    _check_keys(d, _DATA_FILE_KEYS, where)
    path = d.get("path")
    if not isinstance(path, str) or not path:
        raise FragmentFormatError(f"{where}.path", "expected a non-empty string")
    out = table_pb2.DataFile(
        path=path,
        fields=_int_list(d, "fields", where, required=True),
        column_indices=_int_list(d, "column_indices", where, required=False),
        file_major_version=_uint(d, "file_major_version", where, _U32) or 0,
        file_minor_version=_uint(d, "file_minor_version", where, _U32) or 0,
        file_size_bytes=_uint(d, "file_size_bytes", where, _U64) or 0,
    )
    base_id = _uint(d, "base_id", where, _U32)
    if base_id is not None:
        out.base_id = base_id
    return out


def _deletion_file_from_json(d: Any, where: str) -> table_pb2.DeletionFile:
    if not isinstance(d, Mapping):
        raise FragmentFormatError(where, "expected a JSON object or null")
    _check_keys(d, _DELETION_FILE_KEYS, where)
    file_type = d.get("file_type")
    if file_type not in _DELETION_TYPES:
        raise FragmentFormatError(
            f"{where}.file_type", f"expected 'array' or 'bitmap', got {file_type!r}"
        )
    out = table_pb2.DeletionFile(
        file_type=_DELETION_TYPES[file_type],
        read_version=_uint(d, "read_version", where, _U64, required=True),
        id=_uint(d, "id", where, _U64, required=True),
        num_deleted_rows=_uint(d, "num_deleted_rows", where, _U64) or 0,
    )
    base_id = _uint(d, "base_id", where, _U32)
    if base_id is not None:
        out.base_id = base_id
    return out


def _tagged(d: Any, tags: tuple[str, ...], where: str) -> tuple[str, Any]:
    """A serde externally tagged enum: exactly one key, one of ``tags``."""
    if not isinstance(d, Mapping) or len(d) != 1 or next(iter(d)) not in tags:
        raise FragmentFormatError(
            where, f"expected an object with exactly one key, one of {list(tags)}"
        )
    key = next(iter(d))
    return key, d[key]


def _oneof_members(oneof: str) -> tuple[str, str]:
    """The (inline bytes, external file) members of a row-lineage oneof."""
    fields = table_pb2.DataFragment.DESCRIPTOR.oneofs_by_name[oneof].fields
    inline = next(f.name for f in fields if f.name.startswith("inline_"))
    external = next(f.name for f in fields if f.name.startswith("external_"))
    return inline, external


def _empty_field(number: int) -> bytes:
    """Wire bytes of an empty length-delimited field ``number``."""
    return _varint(number << 3 | 2) + b"\x00"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _external(d: Any, where: str) -> table_pb2.ExternalFile:
    if not isinstance(d, Mapping):
        raise FragmentFormatError(where, "expected a JSON object")
    _check_keys(d, _EXTERNAL_FILE_KEYS, where)
    path = d.get("path")
    if not isinstance(path, str):
        raise FragmentFormatError(f"{where}.path", "expected a string")
    return table_pb2.ExternalFile(
        path=path,
        offset=_uint(d, "offset", where, _U64, required=True),
        size=_uint(d, "size", where, _U64, required=True),
    )


def _check_keys(d: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(d) - set(allowed), key=str)
    if unknown:
        raise FragmentFormatError(
            where,
            f"unknown key(s) {unknown}: written by a newer Lance? lancetx refuses to drop them",
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _uint(d: Mapping[str, Any], key: str, where: str, hi: int, *, required: bool = False) -> Any:
    v = d.get(key)
    if v is None:
        if required:
            raise FragmentFormatError(f"{where}.{key}", "missing")
        return None
    if not _is_int(v) or not 0 <= v <= hi:
        raise FragmentFormatError(f"{where}.{key}", f"expected an integer in [0, {hi}], got {v!r}")
    return v


def _int_list(d: Mapping[str, Any], key: str, where: str, *, required: bool) -> list[int]:
    v = d.get(key)
    if v is None and not required:
        return []
    if not isinstance(v, list) or not all(_is_int(x) and _I32_MIN <= x <= _I32_MAX for x in v):
        raise FragmentFormatError(f"{where}.{key}", f"expected a list of int32, got {v!r}")
    return list(v)


def _bytes(v: Any, where: str) -> bytes:
    if not isinstance(v, list) or not all(_is_int(x) and 0 <= x <= 255 for x in v):
        raise FragmentFormatError(where, "expected a list of byte values (0-255)")
    return bytes(v)


# ------------------------------------------------------------------- proto -> JSON


def fragment_to_json(f: table_pb2.DataFragment) -> dict[str, Any]:
    """The pylance ``FragmentMetadata.to_json()`` dict for a ``DataFragment`` proto.

    Keys come in pylance's order, so ``json.dumps`` gives the same text.
    Raises :class:`UnsupportedFeatureError` if the proto carries overlays (field
    11) and :class:`FragmentFormatError` for any other field this module does not
    convert, a spilled-lineage field with content, or an unknown deletion-file type.
    """
    where = f"fragment {f.id}"
    extra = _check_fields(f, where)
    files = [_data_file_to_json(df, f"{where}.files[{i}]") for i, df in enumerate(f.files)]

    deletion: dict[str, Any] | None = None
    if f.HasField("deletion_file"):
        dfile = f.deletion_file
        _check_fields(dfile, f"{where}.deletion_file")
        if dfile.file_type not in _DELETION_NAMES:
            raise FragmentFormatError(
                f"{where}.deletion_file", f"unknown deletion file type {dfile.file_type}"
            )
        deletion = {
            "read_version": dfile.read_version,
            "id": dfile.id,
            "file_type": _DELETION_NAMES[dfile.file_type],
            "num_deleted_rows": dfile.num_deleted_rows or None,
            "base_id": dfile.base_id if dfile.HasField("base_id") else None,
        }

    lineage: dict[str, Any] = {}
    for key, (inline_tag, external_tag, column_tag), oneof, spilled in _LINEAGE:
        here = f"{where}.{key}"
        inline_field, external_field = _oneof_members(oneof)
        which = _which_oneof(f, oneof)
        if which not in (None, inline_field, external_field):
            which = None  # a newer proto declaring the spilled member: in `extra`
        payload = extra.get(spilled)
        if payload is not None:
            if which is not None:
                raise FragmentFormatError(
                    here, f"both {which} and spilled field {spilled} are set (a oneof)"
                )
            if payload:
                raise FragmentFormatError(
                    here,
                    f"spilled row-lineage field {spilled} has content ({payload.hex()}) "
                    "lancetx cannot represent in JSON",
                )
            lineage[key] = column_tag if key == "row_id_meta" else {column_tag: {}}
        elif which == inline_field:
            lineage[key] = {inline_tag: list(getattr(f, which))}
        elif which == external_field:
            lineage[key] = {external_tag: _external_to_json(getattr(f, which), here)}
        else:
            lineage[key] = None

    return {
        "id": f.id,
        "files": files,
        "overlays": [],
        "physical_rows": f.physical_rows or None,
        "deletion_file": deletion,
        **lineage,
    }


def _which_oneof(msg: Message, oneof: str) -> str | None:
    # Through the base class: the generated stubs only accept literal oneof names.
    which: str | None = msg.WhichOneof(oneof)
    return which


def _data_file_to_json(df: table_pb2.DataFile, where: str) -> dict[str, Any]:
    _check_fields(df, where)
    return {
        "fields": list(df.fields),
        "column_indices": list(df.column_indices),
        "file_major_version": df.file_major_version,
        "file_minor_version": df.file_minor_version,
        "file_size_bytes": df.file_size_bytes or None,
        "base_id": df.base_id if df.HasField("base_id") else None,
        "path": df.path,
    }


def _external_to_json(ext: table_pb2.ExternalFile, where: str) -> dict[str, Any]:
    _check_fields(ext, where)
    return {"path": ext.path, "offset": ext.offset, "size": ext.size}


def _check_fields(msg: Message, where: str) -> dict[int, bytes]:
    """Refuse fields this module does not convert; return spilled-lineage payloads by number.

    Works whether a field is undeclared in our ``table.proto`` (protobuf keeps
    it as an unknown field) or declared by a newer one.
    """
    name = msg.DESCRIPTOR.full_name
    declared = _DECLARED_FIELDS[name]
    spilled = _SPILLED_FIELDS if name == "lance.table.DataFragment" else frozenset()
    payloads: dict[int, bytes] = {}
    foreign: set[int] = set()
    unknown = UnknownFieldSet(msg)
    for u in (unknown[i] for i in range(len(unknown))):
        if u.field_number in spilled and u.wire_type == 2:
            # Repeated occurrences of a message field merge; concatenation is that merge.
            payloads[u.field_number] = payloads.get(u.field_number, b"") + bytes(u.data)
        else:
            foreign.add(u.field_number)
    for fd, value in msg.ListFields():
        if fd.number in declared:
            continue
        if fd.number in spilled and fd.message_type is not None:
            payloads[fd.number] = value.SerializeToString()
        else:
            foreign.add(fd.number)
    if name == "lance.table.DataFragment" and OVERLAYS_FIELD_NUMBER in foreign:
        raise _overlays_error(where)
    if foreign:
        raise FragmentFormatError(
            where,
            f"carries proto field(s) {sorted(foreign)} of {name} that lancetx does not convert "
            "(written by a newer Lance?); refusing to drop them",
        )
    return payloads


# ------------------------------------------------------------------------ pylance


def fragment_from_pylance(meta: FragmentMetadata) -> table_pb2.DataFragment:
    """The ``DataFragment`` proto for a pylance ``FragmentMetadata`` (via its JSON)."""
    d: dict[str, Any] = meta.to_json()
    return fragment_from_json(d)


def fragment_to_pylance(f: table_pb2.DataFragment) -> FragmentMetadata:
    """A pylance ``FragmentMetadata`` for a ``DataFragment`` proto (via its JSON)."""
    from lance.fragment import FragmentMetadata

    result: FragmentMetadata = FragmentMetadata.from_json(json.dumps(fragment_to_json(f)))
    return result


def unsafe_file_paths(message: Message) -> list[tuple[str, str]]:
    """``(path, why)`` of every data file and external file named anywhere in
    ``message`` (a Transaction, a Manifest, a DataFragment …) whose path could
    name an object outside the table's folders (see
    :func:`lancetx.commit.format.naming.unsafe_relative_path`). Nothing a
    manifest names may be read, committed or deleted through such a path."""
    from lancetx.commit.format.naming import unsafe_relative_path

    out: list[tuple[str, str]] = []

    def walk(msg: Message) -> None:
        if isinstance(msg, (table_pb2.DataFile, table_pb2.ExternalFile)):
            problem = unsafe_relative_path(msg.path)
            if problem is not None:
                out.append((msg.path, problem))
            return
        for field_descriptor, value in msg.ListFields():
            if field_descriptor.message_type is None:
                continue
            if field_descriptor.message_type.GetOptions().map_entry:
                continue
            for item in value if field_descriptor.is_repeated else [value]:
                walk(item)

    walk(message)
    return out
