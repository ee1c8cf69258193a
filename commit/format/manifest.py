"""The binary manifest file: sections, the length-prefixed Manifest, and the footer.

A manifest file is laid out, in write order, as::

    [IndexSection]        optional; u32 LE length + protobuf, position in Manifest.index_section
    [Transaction]         optional inline transaction; u32 LE length + protobuf
    Manifest              u32 LE length + protobuf
    footer (16 bytes)     i64 LE position of the Manifest's length prefix,
                          i16 LE major, i16 LE minor, b"LANC"

The Manifest must be the last thing before the footer: readers compute its
length as ``file_size - position - 4 - 16`` and check it against the prefix.

**Where the inline transaction's position lives.** Lance 1.0.0-beta introduced
``transaction_section = 21``; pylance 14 renamed that field
``transaction_section_deprecated`` and writes the position in field **23**
(measured: every pylance 14.0.2 manifest carries field 23 and never 21; pylance
14 reads either). Our ``table.proto`` declares both (21 ``transaction_section``,
23 ``inline_transaction_position``): this module writes 23 like pylance 14,
reads 23 first and falls back to 21, and keeps both out of
:attr:`ManifestFile.manifest` (the position is reported as
:attr:`ManifestFile.transaction_position`, valid only for the bytes it came from).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import DecodeError

from lancetx.commit.errors import (
    LancetxError,
    ManifestFormatError,
    ObjectNotFoundError,
    UnsupportedFeatureError,
)
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.storage.limits import MANIFEST, ReadLimits, limits_of, too_large
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import table_pb2, transaction_pb2

MAGIC = b"LANC"
FOOTER_SIZE = 16
#: The footer version pylance 14 writes (``lance_file::format`` MAJOR/MINOR).
FOOTER_VERSION = (0, 2)
#: Bytes fetched by the first (and usually only) read of a manifest, as Lance does.
PREFETCH_SIZE = 64 * 1024

_LEN = struct.Struct("<I")
_FOOTER = struct.Struct("<qhh4s")

# ------------------------------------------------------------------ feature flags

FLAG_DELETION_FILES = 1
FLAG_STABLE_ROW_IDS = 2
FLAG_USE_V2_FORMAT_DEPRECATED = 4
FLAG_TABLE_CONFIG = 8
FLAG_BASE_PATHS = 16
FLAG_DISABLE_TRANSACTION_FILE = 32

#: Every flag Lance defines (``rust/lance-table/src/feature_flags.rs``); bits
#: from 64 up are unknown to Lance itself.
FEATURE_FLAG_NAMES: Mapping[int, str] = {
    FLAG_DELETION_FILES: "deletion_files",
    FLAG_STABLE_ROW_IDS: "stable_row_ids",
    FLAG_USE_V2_FORMAT_DEPRECATED: "use_v2_format (deprecated)",
    FLAG_TABLE_CONFIG: "table_config",
    FLAG_BASE_PATHS: "base_paths",
    FLAG_DISABLE_TRANSACTION_FILE: "disable_transaction_file",
}

#: Reader flags lancetx can honour: reading manifests, transactions and deletion
#: vectors of such tables is correct. (Deletion files stored under another base
#: path are refused at use, see :mod:`lancetx.commit.format.deletion`.)
READER_FLAGS: Mapping[int, str] = dict(FEATURE_FLAG_NAMES)

#: Writer flags lancetx can honour when committing: the manifest builder
#: assigns row-id sequences and ``next_row_id`` for stable row ids (2) and
#: carries base paths (16); a flag outside this set refuses the commit rather
#: than risk writing a manifest Lance would misread.
WRITER_FLAGS: Mapping[int, str] = dict(FEATURE_FLAG_NAMES)


def _flag_names(bits: int) -> list[str]:
    names = []
    for bit in range(64):
        mask = 1 << bit
        if bits & mask:
            known = FEATURE_FLAG_NAMES.get(mask)
            names.append(f"{known} (1<<{bit})" if known else f"unknown flag 1<<{bit}")
    return names


def _check_flags(flags: int, supported: Mapping[int, str], path: str, role: str) -> None:
    mask = 0
    for bit in supported:
        mask |= bit
    unknown = flags & ~mask
    if unknown:
        raise UnsupportedFeatureError(path, role, unknown, _flag_names(unknown))


def check_reader_flags(manifest: table_pb2.Manifest, path: str) -> None:
    """Raise UnsupportedFeatureError if ``manifest`` needs a reader feature we lack."""
    _check_flags(manifest.reader_feature_flags, READER_FLAGS, path, "reader")


def check_writer_flags(manifest: table_pb2.Manifest, path: str) -> None:
    """Raise UnsupportedFeatureError if committing on top of ``manifest`` needs a
    writer feature we lack."""
    _check_flags(manifest.writer_feature_flags, WRITER_FLAGS, path, "writer")


# ------------------------------------------------------ transaction position


def clear_file_positions(manifest: table_pb2.Manifest) -> None:
    """Remove the section offsets (index, inline transaction) a manifest carries:
    they describe the file it came from and are meaningless anywhere else."""
    manifest.ClearField("index_section")
    manifest.ClearField("transaction_section")
    manifest.ClearField("inline_transaction_position")


def _transaction_position(manifest: table_pb2.Manifest) -> int | None:
    """Field 23 (pylance 14), else the legacy field 21, else None."""
    if manifest.HasField("inline_transaction_position"):
        return manifest.inline_transaction_position
    if manifest.HasField("transaction_section"):
        return manifest.transaction_section
    return None


# -------------------------------------------------------------------- encoding


def _length_prefixed(message_bytes: bytes) -> bytes:
    return _LEN.pack(len(message_bytes)) + message_bytes


def encode_manifest(
    manifest: table_pb2.Manifest,
    *,
    indices: Sequence[table_pb2.IndexMetadata] | None = None,
    transaction: transaction_pb2.Transaction | None = None,
    footer_version: tuple[int, int] = FOOTER_VERSION,
) -> bytes:
    """The bytes of a manifest file holding ``manifest``.

    ``indices`` (even an empty list) are written as an IndexSection and
    ``transaction`` inline, before the manifest; their positions are set on a
    copy of ``manifest`` (``index_section`` and field 23, see the module
    docstring), never on the caller's message. Positions the caller's message
    already carries are dropped: they only describe the file they came from.
    """
    out = bytearray()
    copy = table_pb2.Manifest()
    copy.CopyFrom(manifest)
    clear_file_positions(copy)
    if indices is not None:
        section = table_pb2.IndexSection()
        section.indices.extend(indices)
        copy.index_section = len(out)
        out += _length_prefixed(section.SerializeToString())
    if transaction is not None:
        # Known fields serialize in field-number order, as prost writes them.
        copy.inline_transaction_position = len(out)
        out += _length_prefixed(transaction.SerializeToString())
    body = copy.SerializeToString()
    manifest_position = len(out)
    out += _length_prefixed(body)
    major, minor = footer_version
    out += _FOOTER.pack(manifest_position, major, minor, MAGIC)
    return bytes(out)


# -------------------------------------------------------------------- decoding


@dataclass
class ManifestFile:
    """A decoded manifest file.

    ``manifest`` is the Manifest message as stored, except that the inline
    transaction's position is removed from it (it is
    ``transaction_position``). ``indices`` is None when the file has no index
    section (an empty section gives ``[]``). ``size`` is the file's length.
    """

    manifest: table_pb2.Manifest
    indices: list[table_pb2.IndexMetadata] | None
    transaction: transaction_pb2.Transaction | None
    footer_major: int
    footer_minor: int
    size: int
    manifest_position: int = 0
    transaction_position: int | None = None

    @property
    def version(self) -> int:
        """The table version this manifest describes."""
        return self.manifest.version


class _NeedBytes(Exception):
    """Internal: decoding needs the file from ``position`` on, not yet fetched."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


def _decode(buf: bytes, start: int, size: int, path: str) -> ManifestFile:
    """Decode the manifest file of ``size`` bytes given its bytes ``[start, size)``."""

    def fail(problem: str) -> ManifestFormatError:
        return ManifestFormatError(path, problem)

    def view(lo: int, hi: int) -> bytes:
        if lo < start:
            raise _NeedBytes(lo)
        return buf[lo - start : hi - start]

    if size < FOOTER_SIZE:
        raise fail(f"file is {size} bytes, shorter than the {FOOTER_SIZE}-byte footer (truncated?)")
    position, major, minor, magic = _FOOTER.unpack(view(size - FOOTER_SIZE, size))
    if magic != MAGIC:
        raise fail(
            f"footer magic is {magic!r}, expected {MAGIC!r} (truncated, or not a Lance manifest)"
        )
    if not 0 <= position <= size - FOOTER_SIZE - 4:
        raise fail(
            f"footer says the manifest starts at byte {position}, outside the file "
            f"(size {size}; it must lie in 0..{size - FOOTER_SIZE - 4})"
        )
    (recorded,) = _LEN.unpack(view(position, position + 4))
    actual = size - position - 4 - FOOTER_SIZE
    if recorded != actual:
        raise fail(
            f"manifest length prefix at byte {position} says {recorded} bytes, but "
            f"{actual} bytes lie between it and the footer"
        )
    body = view(position + 4, size - FOOTER_SIZE)
    manifest = table_pb2.Manifest()
    try:
        manifest.ParseFromString(body)
    except DecodeError as exc:
        raise fail(
            f"manifest at byte {position} does not decode as lance.table.Manifest: {exc}"
        ) from None
    transaction_position = _transaction_position(manifest)
    manifest.ClearField("transaction_section")
    manifest.ClearField("inline_transaction_position")

    def section(name: str, pos: int) -> bytes:
        if pos + 4 > position:
            raise fail(
                f"{name} position {pos} is outside the file's sections "
                f"(the manifest starts at byte {position}, file size {size})"
            )
        (length,) = _LEN.unpack(view(pos, pos + 4))
        if pos + 4 + length > position:
            raise fail(
                f"{name} length prefix at byte {pos} says {length} bytes, which runs past "
                f"the manifest at byte {position}"
            )
        return view(pos + 4, pos + 4 + length)

    indices: list[table_pb2.IndexMetadata] | None = None
    if manifest.HasField("index_section"):
        data = section("index section", manifest.index_section)
        index_section = table_pb2.IndexSection()
        try:
            index_section.ParseFromString(data)
        except DecodeError as exc:
            raise fail(
                f"index section at byte {manifest.index_section} does not decode "
                f"as lance.table.IndexSection: {exc}"
            ) from None
        indices = list(index_section.indices)

    transaction: transaction_pb2.Transaction | None = None
    if transaction_position is not None:
        data = section("inline transaction", transaction_position)
        transaction = transaction_pb2.Transaction()
        try:
            transaction.ParseFromString(data)
        except DecodeError as exc:
            raise fail(
                f"inline transaction at byte {transaction_position} does not decode "
                f"as lance.table.Transaction: {exc}"
            ) from None

    return ManifestFile(
        manifest=manifest,
        indices=indices,
        transaction=transaction,
        footer_major=major,
        footer_minor=minor,
        size=size,
        manifest_position=position,
        transaction_position=transaction_position,
    )


def decode_manifest(data: bytes, *, path: str) -> ManifestFile:
    """Decode a whole manifest file. Raises ManifestFormatError naming ``path``.

    Feature flags are not checked here (see :func:`read_manifest`).
    """
    return _decode(bytes(data), 0, len(data), path)


def decode_manifest_tail(buf: bytes, total: int, *, path: str) -> ManifestFile | None:
    """Decode a manifest file of ``total`` bytes from its last ``len(buf)`` bytes.

    None when the tail is not enough: the caller then fetches bytes
    ``[0, total - len(buf))`` and decodes the whole file with
    :func:`decode_manifest` (one more request for a large manifest). No I/O, so
    sync and async readers share it. Feature flags are not checked here.
    """
    try:
        return _decode(bytes(buf), total - len(buf), total, path)
    except _NeedBytes:
        return None


def read_manifest(
    store: ObjectStore, key: str, *, size: int | None = None, bulk: bool = False
) -> ManifestFile:
    """Read and decode the manifest at ``key``, refusing unknown reader features.

    One ``get_tail`` request reads manifests up to 64 KiB (sections included),
    or up to ``size`` when the caller knows the file's size (an external-store
    entry records it); otherwise a larger file takes one more ``get_range`` for
    the part before the tail. ``bulk``: one of many reads made together, which the
    store may send its cheaper way (``ObjectStore.get_tail_bulk``; its failures are
    read again the ordinary way). Raises ObjectNotFoundError, ManifestFormatError
    (ManifestTooLargeError for a file over the store's manifest cap, refused before
    more than the cap is read: see :mod:`lancetx.commit.storage.limits`) or
    UnsupportedFeatureError (path = ``store.uri(key)``).
    """
    path = store.uri(key)
    cap = limits_of(store).manifest
    # ``size`` comes from an external-store item: a hint, never a reason to buffer more.
    length = min(max(PREFETCH_SIZE, size or 0), cap)
    fetched = store.get_tail_bulk(key, length) if bulk else None
    buf, total = fetched if fetched is not None else store.get_tail(key, length)
    if total > cap:
        raise too_large(path, MANIFEST, total, cap)
    decoded = decode_manifest_tail(buf, total, path=path)
    if decoded is None:
        # Everything before the manifest is its sections (and, in legacy files,
        # dictionary values): fetch all of it at once, so a large manifest costs
        # exactly one more request.
        buf = store.get_range(key, 0, total - len(buf)) + buf
        if len(buf) != total:
            raise ManifestFormatError(
                path, f"file changed while being read (expected {total} bytes, got {len(buf)})"
            ) from None
        decoded = _decode(buf, 0, total, path)
    check_reader_flags(decoded.manifest, path)
    return decoded


def read_manifest_at(
    store: ObjectStore, location: ManifestLocation, *, bulk: bool = False
) -> ManifestFile:
    """Read the manifest at ``location``, falling back to ``location.alternate_key``
    when ``key`` is gone (a staged manifest finalized and deleted meanwhile).
    ``bulk``: see :func:`read_manifest`."""
    try:
        return read_manifest(store, location.key, size=location.size, bulk=bulk)
    except ObjectNotFoundError:
        if location.alternate_key is None:
            raise
        return read_manifest(store, location.alternate_key, size=location.size, bulk=bulk)


class BulkTailReader(Protocol):
    """What :func:`read_manifest_bulk_async` needs of an asyncio store."""

    read_limits: ReadLimits | None

    def uri(self, key: str) -> str: ...

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int]: ...

    async def get_tail_bulk(self, key: str, length: int) -> tuple[bytes, int] | None: ...


async def read_manifest_bulk_async(
    store: BulkTailReader, key: str, size: int | None
) -> ManifestFile | None:
    """The manifest at ``key`` read the store's cheaper way (one of many reads made
    together: see ``AsyncObjectStore.get_tail_bulk``), or None when that did not give
    a whole, decodable manifest within the cap and of known features: the caller then
    reads it the ordinary way, which gives the definitive answer or error."""
    if size is None:
        return None
    cap = limits_of(store).manifest
    fetched = await store.get_tail_bulk(key, min(max(PREFETCH_SIZE, size), cap))
    if fetched is None or fetched[1] > cap:
        return None
    path = store.uri(key)
    try:
        decoded = decode_manifest_tail(fetched[0], fetched[1], path=path)
        if decoded is not None:
            check_reader_flags(decoded.manifest, path)
    except LancetxError:
        return None
    return decoded


def section_positions(
    indices: Sequence[table_pb2.IndexMetadata] | None,
    transaction: transaction_pb2.Transaction | None,
) -> tuple[int | None, int | None]:
    """Where :func:`encode_manifest` puts the index section and the inline transaction
    (None: not written)."""
    index_position = 0 if indices is not None else None
    end = 0
    if indices is not None:
        section = table_pb2.IndexSection()
        section.indices.extend(indices)
        end = len(_length_prefixed(section.SerializeToString()))
    return index_position, (end if transaction is not None else None)


def serialized_for_pylance(manifest_file: ManifestFile) -> bytes:
    """The Manifest message as pylance serializes it for ``LanceDataset(...,
    serialized_manifest=)``: the message as stored in the file, with the positions of
    its index section and inline transaction (pylance reads both from the file at
    those offsets). Opening pylance with it skips its manifest GET.

    A decoded file's positions are the file's; a manifest lancetx just committed (not
    read back) gets the positions :func:`encode_manifest` gave it in the file."""
    copy = table_pb2.Manifest()
    copy.CopyFrom(manifest_file.manifest)
    index_position, transaction_position = section_positions(
        manifest_file.indices, manifest_file.transaction
    )
    if manifest_file.transaction_position is not None:
        transaction_position = manifest_file.transaction_position
    if index_position is not None and not copy.HasField("index_section"):
        copy.index_section = index_position
    if transaction_position is not None:
        copy.inline_transaction_position = transaction_position
    return copy.SerializeToString()


def data_file_signature(manifest: table_pb2.Manifest) -> bytes:
    """What new data files for a version depend on: its schema (fields with their ids,
    schema metadata) and data storage format. Two versions with the same signature take
    the same data files, so one pylance dataset can write them for both."""
    parts = [f.SerializeToString(deterministic=True) for f in manifest.fields]
    parts.append(repr(sorted(manifest.schema_metadata.items())).encode())
    parts.append(manifest.data_format.SerializeToString(deterministic=True))
    return b"\x00".join(parts)


__all__ = [
    "FEATURE_FLAG_NAMES",
    "FLAG_BASE_PATHS",
    "FLAG_DELETION_FILES",
    "FLAG_DISABLE_TRANSACTION_FILE",
    "FLAG_STABLE_ROW_IDS",
    "FLAG_TABLE_CONFIG",
    "FLAG_USE_V2_FORMAT_DEPRECATED",
    "FOOTER_VERSION",
    "MAGIC",
    "PREFETCH_SIZE",
    "READER_FLAGS",
    "WRITER_FLAGS",
    "BulkTailReader",
    "ManifestFile",
    "check_reader_flags",
    "check_writer_flags",
    "clear_file_positions",
    "data_file_signature",
    "decode_manifest",
    "decode_manifest_tail",
    "encode_manifest",
    "read_manifest",
    "read_manifest_at",
    "read_manifest_bulk_async",
    "section_positions",
    "serialized_for_pylance",
]
