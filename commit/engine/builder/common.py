"""Constants and small helpers shared by the build steps: Lance's feature flags,
storage versions, index bitmaps, map updates, and the result type."""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message
from pyroaring import BitMap

from lancetx.commit.format import rowids
from lancetx.commit.format.fragments import OVERLAYS_FEATURE_FLAG, SPILLED_ROW_LINEAGE_FEATURE_FLAG
from lancetx.commit.format.manifest import clear_file_positions
from lancetx.protos import table_pb2

Manifest = table_pb2.Manifest
IndexMetadata = table_pb2.IndexMetadata
DataFragment = table_pb2.DataFragment


_V = TypeVar("_V", str, bytes)
#: A fragment id of 0 in Append/Overwrite/Update/Rewrite means "not assigned
#: yet" (``fragments_with_ids``): the builder gives it the next free id.
UNASSIGNED_FRAGMENT_ID = 0

FLAG_DELETION_FILES = 1
FLAG_STABLE_ROW_IDS = 2
FLAG_USE_V2_FORMAT_DEPRECATED = 4
FLAG_TABLE_CONFIG = 8
FLAG_BASE_PATHS = 16
FLAG_DISABLE_TRANSACTION_FILE = 32
#: Every flag bit Lance 9 defines (``rust/lance-table/src/feature_flags.rs``);
#: higher bits (pylance 14: 64 = data overlays, ...) are features we do not build.
KNOWN_FEATURE_FLAGS = 63

#: Flags of newer Lance releases we can name but do not build (see lancetx.commit.format.fragments).
NEWER_FLAG_NAMES = {
    OVERLAYS_FEATURE_FLAG: "data overlays",
    SPILLED_ROW_LINEAGE_FEATURE_FLAG: "spilled row lineage",
}

#: System index names (``rust/lance-table/src/system_index/``).
FRAG_REUSE_INDEX_NAME = "__lance_frag_reuse"
MEM_WAL_INDEX_NAME = "__lance_mem_wal"
SYSTEM_INDEX_NAMES = frozenset({FRAG_REUSE_INDEX_NAME, MEM_WAL_INDEX_NAME})

#: Data storage version of a new table without data files (pylance 14.0.2 writes 2.2).
DEFAULT_DATA_STORAGE_VERSION = "2.2"
LANCE_FILE_FORMAT = "lance"

#: ``LanceFileVersion::try_from_major_minor`` and its ordering.
FILE_VERSIONS: Mapping[tuple[int, int], str] = {
    (0, 0): "0.1",
    (0, 1): "0.1",
    (0, 2): "0.1",
    (0, 3): "2.0",
    (2, 0): "2.0",
    (2, 1): "2.1",
    (2, 2): "2.2",
    (2, 3): "2.3",
}
VERSION_ORDER = {"0.1": 0, "2.0": 1, "2.1": 2, "2.2": 3, "2.3": 4}
VERSION_ALIASES = {"legacy": "0.1", "0.3": "2.0"}
VERSION_NUMBERS = {"0.1": (0, 2), "2.0": (2, 0), "2.1": (2, 1), "2.2": (2, 2), "2.3": (2, 3)}

#: Field-metadata keys of the unenforced primary / clustering keys (``lance-core`` datatypes).
PK_KEY = "lance-schema:unenforced-primary-key"
PK_POSITION_KEY = "lance-schema:unenforced-primary-key:position"
CK_POSITION_KEY = "lance-schema:unenforced-clustering-key:position"

TOMBSTONE_FIELD = -2
U32_MAX = 2**32 - 1
UNKNOWN_CREATED_AT_VERSION = 1
U32_RE = re.compile(r"^\+?[0-9]+$")

_M = TypeVar("_M", bound=Message)


@dataclass(frozen=True)
class BuiltManifest:
    """The new version's manifest and its full index list."""

    manifest: Manifest
    indices: list[IndexMetadata] = field(default_factory=list)


def copy_message(msg: _M) -> _M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def op_name(op: str) -> str:
    return "".join(part.capitalize() for part in op.split("_"))


def fragment_bitmap(index: IndexMetadata) -> BitMap | None:
    """An index's fragment bitmap; None when it stores none (empty bytes)."""
    if not index.fragment_bitmap:
        return None
    return BitMap.deserialize(index.fragment_bitmap)


def serialize_bitmap(bitmap: BitMap) -> bytes:
    """Portable 32-bit Roaring bytes without run containers (as roaring-rs writes)."""
    # pyroaring builds run containers from ranges and optimizes by default;
    # rebuilding from a plain list keeps array/bitset containers only.
    return bytes(BitMap(list(bitmap), optimize=False).serialize())


def set_bitmap(index: IndexMetadata, bitmap: BitMap) -> None:
    index.fragment_bitmap = serialize_bitmap(bitmap)


def is_vector_index(index: IndexMetadata) -> bool:
    return index.HasField("index_details") and index.index_details.type_url.endswith(
        "VectorIndexDetails"
    )


def is_system_index(index: IndexMetadata) -> bool:
    return index.name in SYSTEM_INDEX_NAMES


def high_water_mark(manifest: Manifest) -> int | None:
    """``Manifest::max_fragment_id``: the stored high-water mark, else the max id."""
    if manifest.HasField("max_fragment_id"):
        return manifest.max_fragment_id
    if manifest.fragments:
        return max(f.id for f in manifest.fragments)
    return None


def normalize_storage_version(version: str) -> str | None:
    v = version.strip().lower()
    v = VERSION_ALIASES.get(v, v)
    return v if v in VERSION_ORDER else None


def file_version(data_file: table_pb2.DataFile) -> str | None:
    return FILE_VERSIONS.get((data_file.file_major_version, data_file.file_minor_version))


def row_count(fragment: DataFragment) -> int:
    """``physical_rows``, else the row-id count (Lance's fallback), else 0."""
    if fragment.physical_rows > 0:
        return fragment.physical_rows
    if fragment.WhichOneof("row_id_sequence") == "inline_row_ids":
        return rowids.row_id_count(fragment.inline_row_ids, f"fragment {fragment.id} row ids")
    return 0


def parse_u32(value: str | None) -> int | None:
    if value is None or not U32_RE.match(value):
        return None
    number = int(value)
    return number if number <= U32_MAX else None


def apply_map(
    target: MutableMapping[str, _V], entries: Sequence[tuple[str, _V | None]], replace: bool
) -> None:
    """``apply_update_map``: a None value deletes the key; ``replace`` starts from an empty map."""
    if replace:
        target.clear()
        for key, value in entries:
            if value is not None:
                target[key] = value
        return
    for key, value in entries:
        if value is not None:
            target[key] = value
        elif key in target:
            del target[key]


def apply_str_map(
    target: MutableMapping[str, str], entries: Sequence[tuple[str, str | None]], replace: bool
) -> None:
    apply_map(target, entries, replace)


def apply_bytes_map(
    target: MutableMapping[str, bytes], entries: Sequence[tuple[str, str | None]], replace: bool
) -> None:
    """On a ``map<string, bytes>`` field: values are stored as UTF-8."""
    apply_map(target, [(k, None if v is None else v.encode("utf-8")) for k, v in entries], replace)


def field_paths(frag: DataFragment) -> dict[int, str]:
    out: dict[int, str] = {}
    for df in frag.files:
        for fid in df.fields:
            if fid >= 0:
                out[fid] = df.path
    return out


def physically_rewritten(before: DataFragment, after: DataFragment) -> bool:
    """``merge_fragment_physically_rewritten``: the data files changed (sizes aside)."""
    if len(before.files) != len(after.files):
        return True
    for p, m in zip(before.files, after.files, strict=True):
        if (
            p.path != m.path
            or list(p.fields) != list(m.fields)
            or list(p.column_indices) != list(m.column_indices)
            or p.file_major_version != m.file_major_version
            or p.file_minor_version != m.file_minor_version
            or (p.base_id if p.HasField("base_id") else None)
            != (m.base_id if m.HasField("base_id") else None)
        ):
            return True
    return False


def describe_ids(ids: Sequence[int], limit: int = 20) -> str:
    if not ids:
        return "no fragments"
    if len(ids) <= limit:
        return str(list(ids))
    return f"{len(ids)} fragments with ids {ids[0]}..{ids[-1]}"


def uuid_str(raw: bytes) -> str:
    try:
        return str(uuidlib.UUID(bytes=raw))
    except ValueError:
        return raw.hex()


def clear_positions(manifest: Manifest) -> None:
    # Positions in the file a manifest came from; meaningless in a new file.
    clear_file_positions(manifest)
    manifest.version_aux_data = 0
