"""Deletion files: ``_deletions/{fragment_id}-{read_version}-{id}.{arrow|bin}``.

A fragment's deletion file lists the row *offsets* (0-based positions within
the fragment) that are deleted. Files are cumulative: a later delete on the
same fragment writes a new file holding every deleted offset, and the manifest
points at the newest. Two encodings (``DeletionFile.file_type``):

* ``ARROW_ARRAY`` (``.arrow``): an Arrow IPC *file* with exactly one record
  batch of one non-null column ``row_id: uint32`` (the proto comment says
  Int32; Lance's code and files use UInt32). Lance writes it ZSTD-compressed.
* ``BITMAP`` (``.bin``): a 32-bit Roaring bitmap in the portable
  serialization (roaring-rs ``serialize_into`` = pyroaring ``serialize``).

Lance picks a bitmap once a fragment has more than 5,000 deleted rows
(``BITMAP_THRESDHOLD`` in ``lance-core/src/utils/deletion.rs``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from pyroaring import BitMap

from lancetx.commit.errors import BasePathError, DeletionFileError, UnsupportedFeatureError
from lancetx.commit.format import naming
from lancetx.commit.format.bases import UriNames, deletion_dir_key, key_in, parse_base
from lancetx.commit.format.manifest import FLAG_BASE_PATHS
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import table_pb2

# Arrow deletion files are read and written with pyarrow, imported when one is: the
# operator tools name deletion files without loading it (``lancetx-sync status``,
# ``tests/test_import_cost.py``).

#: More deleted rows than this are written as a bitmap, fewer or equal as an Arrow array.
BITMAP_THRESHOLD = 5_000

_ARROW_MAGIC = b"ARROW1"
_ROW_ID = "row_id"


def deletion_file_key(base: str, fragment_id: int, deletion_file: table_pb2.DeletionFile) -> str:
    """Object key of ``deletion_file`` of fragment ``fragment_id`` under ``base``."""
    file_type = deletion_file.file_type
    if file_type not in (table_pb2.DeletionFile.ARROW_ARRAY, table_pb2.DeletionFile.BITMAP):
        # An open proto3 enum: a corrupt or newer manifest can carry any number here.
        raise DeletionFileError(
            naming.join(
                base,
                naming.DELETIONS_DIR,
                f"{fragment_id}-{deletion_file.read_version}-{deletion_file.id}.*",
            ),
            f"the manifest gives fragment {fragment_id} deletion file type {file_type}, "
            "which is neither ARROW_ARRAY (0) nor BITMAP (1)",
        )
    return naming.deletion_file_key(
        base,
        fragment_id,
        deletion_file.read_version,
        deletion_file.id,
        bitmap=file_type == table_pb2.DeletionFile.BITMAP,
    )


def choose_file_type(num_rows: int) -> table_pb2.DeletionFile.DeletionFileType.ValueType:
    """The encoding Lance would pick for ``num_rows`` deleted rows."""
    return (
        table_pb2.DeletionFile.BITMAP
        if num_rows > BITMAP_THRESHOLD
        else table_pb2.DeletionFile.ARROW_ARRAY
    )


def encode_arrow_deletions(rows: BitMap) -> bytes:
    """An Arrow IPC file of ``row_id: uint32 not null``, ZSTD-compressed like Lance's."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    schema = pa.schema([pa.field(_ROW_ID, pa.uint32(), nullable=False)])
    batch = pa.record_batch([pa.array(list(rows), type=pa.uint32())], schema=schema)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decode_arrow_deletions(data: bytes, *, path: str) -> BitMap:
    """Decode an ``.arrow`` deletion file; DeletionFileError naming ``path`` on any defect."""

    def fail(problem: str) -> DeletionFileError:
        return DeletionFileError(path, problem)

    if not data.startswith(_ARROW_MAGIC):
        hint = ""
        try:
            BitMap.deserialize(data)
            hint = "; it looks like a Roaring bitmap (.bin) file"
        except (ValueError, IndexError):
            pass
        raise fail(f"expected an Arrow IPC file (magic {_ARROW_MAGIC!r}), found {data[:8]!r}{hint}")
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        reader = ipc.open_file(pa.BufferReader(data))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise fail(f"not a readable Arrow IPC file: {exc}") from None
    schema = reader.schema
    if (
        len(schema) != 1
        or schema[0].name != _ROW_ID
        or schema[0].type != pa.uint32()
        or schema[0].nullable
    ):
        found = ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in schema)
        raise fail(f"expected one column 'row_id: uint32 not null', found schema ({found})")
    if len(batches) != 1:
        raise fail(f"expected exactly one record batch, found {len(batches)}")
    column = batches[0].column(0)
    if column.null_count:
        raise fail(f"row_id has {column.null_count} null values; deletion offsets cannot be null")
    return BitMap(column.to_numpy(zero_copy_only=False))


def decode_bitmap_deletions(data: bytes, *, path: str) -> BitMap:
    """Decode a ``.bin`` (portable Roaring) deletion file; DeletionFileError on junk."""
    if data.startswith(_ARROW_MAGIC):
        raise DeletionFileError(
            path, "expected a portable Roaring bitmap, found an Arrow IPC file (.arrow content)"
        )
    try:
        return BitMap.deserialize(data)
    except (ValueError, IndexError) as exc:
        raise DeletionFileError(
            path,
            f"does not deserialize as a portable 32-bit Roaring bitmap ({exc}; {len(data)} bytes)",
        ) from None


@dataclass(frozen=True)
class DeletionLocation:
    """Where a deletion file is: its key in the table's store (None when it lives in
    another store: another bucket, another kind of store) and its full URI."""

    key: str | None
    uri: str


def locate_deletion_file(
    store: UriNames,
    base: str,
    fragment_id: int,
    deletion_file: table_pb2.DeletionFile,
    bases: Iterable[table_pb2.BasePath] = (),
) -> DeletionLocation:
    """Where the deletion file of fragment ``fragment_id`` is: in the table's own
    ``_deletions/`` (at ``base`` of ``store``), or under the base path its
    ``base_id`` names among ``bases`` (the manifest's; a shallow clone reads the
    source's deletion files there). BasePathError for an id not among ``bases``,
    a base that is not a dataset root, or one that cannot be followed."""
    if not deletion_file.HasField("base_id"):
        key = deletion_file_key(base, fragment_id, deletion_file)
        return DeletionLocation(key, store.uri(key))
    roots = {b.id: b for b in bases}
    found = roots.get(deletion_file.base_id)
    if found is None:
        raise BasePathError(
            store.uri(base),
            f"the deletion file of fragment {fragment_id} is stored under base path id "
            f"{deletion_file.base_id}, which the manifest does not register "
            f"(registered ids: {', '.join(str(i) for i in sorted(roots)) or 'none'})",
        )
    root = parse_base(found)
    key = deletion_file_key(deletion_dir_key(root), fragment_id, deletion_file)
    own = key_in(store, root, key)
    return DeletionLocation(own, store.uri(own) if own is not None else root.object_uri(key))


def decode_deletion_vector(
    data: bytes, deletion_file: table_pb2.DeletionFile, *, path: str
) -> BitMap:
    """The deleted row offsets held by ``data``, the bytes of ``deletion_file``."""
    if deletion_file.file_type == table_pb2.DeletionFile.BITMAP:
        return decode_bitmap_deletions(data, path=path)
    return decode_arrow_deletions(data, path=path)


def encode_deletion_vector(
    read_version: int,
    rows: BitMap,
    *,
    file_type: table_pb2.DeletionFile.DeletionFileType.ValueType | None = None,
) -> tuple[table_pb2.DeletionFile, bytes]:
    """A new deletion file holding ``rows`` (the full, cumulative set): its
    DeletionFile message (random u64 id, as in Lance) and its bytes. No I/O."""
    if not rows:
        raise ValueError("no deleted rows: a fragment without deletions has no deletion file")
    chosen = choose_file_type(len(rows)) if file_type is None else file_type
    deletion_file = table_pb2.DeletionFile(
        file_type=chosen,
        read_version=read_version,
        id=secrets.randbits(64),
        num_deleted_rows=len(rows),
    )
    if chosen == table_pb2.DeletionFile.BITMAP:
        data = bytes(rows.serialize())
    else:
        data = encode_arrow_deletions(rows)
    return deletion_file, data


def read_deletion_vector(
    store: ObjectStore,
    base: str,
    fragment_id: int,
    deletion_file: table_pb2.DeletionFile,
    bases: Iterable[table_pb2.BasePath] = (),
) -> BitMap:
    """The deleted row offsets of fragment ``fragment_id`` (``bases``: the manifest's
    base paths, for a deletion file stored under one).

    Raises ObjectNotFoundError if the file is absent, DeletionFileError if its
    content does not match its type, BasePathError for a base that cannot be
    followed (see :func:`locate_deletion_file`), and UnsupportedFeatureError for
    one outside ``store`` (another bucket: read it through a store of its own).
    """
    location = locate_deletion_file(store, base, fragment_id, deletion_file, bases)
    if location.key is None:
        raise outside_store_error(location)
    return decode_deletion_vector(store.get(location.key), deletion_file, path=location.uri)


def outside_store_error(location: DeletionLocation) -> UnsupportedFeatureError:
    """A deletion file this store cannot read (it lives in another bucket or store)."""
    return UnsupportedFeatureError(
        location.uri,
        "reader",
        FLAG_BASE_PATHS,
        [
            "base_paths (a deletion file under a base path in another bucket or store than the table's)"
        ],
    )


def write_deletion_vector(
    store: ObjectStore,
    base: str,
    fragment_id: int,
    read_version: int,
    rows: BitMap,
    *,
    file_type: table_pb2.DeletionFile.DeletionFileType.ValueType | None = None,
) -> table_pb2.DeletionFile:
    """Write a deletion file holding every deleted offset of the fragment.

    ``rows`` must be the full (cumulative) set. ``file_type`` defaults to
    Lance's choice (:func:`choose_file_type`). The file id is a random u64, as
    in Lance. Returns the DeletionFile to put on the fragment.
    """
    deletion_file, data = encode_deletion_vector(read_version, rows, file_type=file_type)
    store.put(deletion_file_key(base, fragment_id, deletion_file), data)
    return deletion_file


__all__ = [
    "BITMAP_THRESHOLD",
    "DeletionLocation",
    "choose_file_type",
    "decode_arrow_deletions",
    "decode_bitmap_deletions",
    "decode_deletion_vector",
    "deletion_file_key",
    "encode_arrow_deletions",
    "encode_deletion_vector",
    "locate_deletion_file",
    "outside_store_error",
    "read_deletion_vector",
    "write_deletion_vector",
]
