"""Deletion files: both encodings, Lance's threshold, pylance compatibility, bad input."""

from __future__ import annotations

import io
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from lance_fixtures import build_history_table, build_simple_table, store_listing
from pyroaring import BitMap

from lancetx.commit.errors import BasePathError, DeletionFileError, UnsupportedFeatureError
from lancetx.commit.format import naming
from lancetx.commit.format.deletion import (
    BITMAP_THRESHOLD,
    choose_file_type,
    deletion_file_key,
    read_deletion_vector,
    write_deletion_vector,
)
from lancetx.commit.format.listing import latest_manifest_location
from lancetx.commit.format.manifest import FLAG_DELETION_FILES, encode_manifest, read_manifest
from lancetx.commit.format.snapshot import load_version
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.protos import table_pb2, transaction_pb2

ARROW = table_pb2.DeletionFile.ARROW_ARRAY
BITMAP = table_pb2.DeletionFile.BITMAP


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(str(tmp_path))


def test_threshold_matches_lance() -> None:
    # Lance promotes a set to a bitmap once it holds more than 5,000 rows.
    assert BITMAP_THRESHOLD == 5000
    assert choose_file_type(1) == ARROW
    assert choose_file_type(5000) == ARROW
    assert choose_file_type(5001) == BITMAP


@pytest.mark.parametrize(
    ("rows", "file_type", "ext"),
    [
        (BitMap([0, 7, 99]), None, "arrow"),
        (BitMap(range(0, 20_000, 2)), None, "bin"),
        (BitMap([1, 2]), BITMAP, "bin"),
        (BitMap(range(6000)), ARROW, "arrow"),
    ],
)
def test_write_then_read(
    store: LocalObjectStore, rows: BitMap, file_type: int | None, ext: str
) -> None:
    deletion_file = write_deletion_vector(store, "t", 4, 11, rows, file_type=file_type)  # type: ignore[arg-type]
    assert deletion_file.num_deleted_rows == len(rows)
    assert deletion_file.read_version == 11
    assert 0 <= deletion_file.id < 2**64
    key = deletion_file_key("t", 4, deletion_file)
    assert key == f"t/_deletions/4-11-{deletion_file.id}.{ext}"
    assert read_deletion_vector(store, "t", 4, deletion_file) == rows
    if ext == "arrow":
        reader = pa.ipc.open_file(pa.BufferReader(store.get(key)))
        assert reader.schema == pa.schema([pa.field("row_id", pa.uint32(), nullable=False)])
        assert reader.num_record_batches == 1
    else:
        assert BitMap.deserialize(store.get(key)) == rows


def test_unknown_deletion_file_type_in_a_manifest_is_a_typed_error(
    store: LocalObjectStore,
) -> None:
    """proto3 enums are open: a corrupt manifest's file type must not escape as ValueError."""
    deletion_file = table_pb2.DeletionFile(read_version=3, id=7, num_deleted_rows=1)
    deletion_file.file_type = 5  # type: ignore[assignment]
    with pytest.raises(DeletionFileError, match=r"fragment 2 deletion file type 5") as info:
        read_deletion_vector(store, "t", 2, deletion_file)
    assert info.value.path == "t/_deletions/2-3-7.*"


def test_empty_vector_is_not_written(store: LocalObjectStore) -> None:
    with pytest.raises(ValueError, match="no deleted rows"):
        write_deletion_vector(store, "t", 0, 1, BitMap())
    assert store_listing(store) == []


def test_reads_both_pylance_deletion_types(tmp_path: Path) -> None:
    table = build_history_table(str(tmp_path / "h"))
    store = LocalObjectStore(str(tmp_path))
    snap = load_version(store, "h", 5)  # after the .arrow delete and the .bin delete
    types = {f.id: f.deletion_file.file_type for f in snap.fragments if f.HasField("deletion_file")}
    assert types == {0: ARROW, 2: BITMAP}
    assert len(snap.deletion_vector(0)) == 3
    assert len(snap.deletion_vector(2)) == 6000
    pl = {f.fragment_id: f for f in table.dataset(5).get_fragments()}
    for fid, expected in ((0, 3), (2, 6000)):
        assert pl[fid].metadata.physical_rows - pl[fid].count_rows() == expected
    assert set(snap.deletion_vector(0)) == {0, 1, 2}  # a < 3: the first three rows
    assert set(snap.deletion_vector(2)) == set(range(6000))


@pytest.mark.parametrize(("file_type", "rows"), [(ARROW, [1, 5, 7]), (BITMAP, [0, 2, 4, 6, 8])])
def test_pylance_reads_our_deletion_files(tmp_path: Path, file_type: int, rows: list[int]) -> None:
    """Commit version 3 by hand with our deletion file; pylance must honour it."""
    table = build_simple_table(str(tmp_path / "t"), appends=1)  # fragments 0 and 1, 10 rows each
    store = LocalObjectStore(str(tmp_path))
    latest = latest_manifest_location(store, "t")
    assert latest is not None
    previous = read_manifest(store, latest.key)

    deletion_file = write_deletion_vector(
        store, "t", 1, latest.version, BitMap(rows), file_type=file_type
    )  # type: ignore[arg-type]
    manifest = table_pb2.Manifest()
    manifest.CopyFrom(previous.manifest)
    manifest.version = latest.version + 1
    manifest.fragments[1].deletion_file.CopyFrom(deletion_file)
    manifest.reader_feature_flags |= FLAG_DELETION_FILES
    manifest.writer_feature_flags |= FLAG_DELETION_FILES
    txn = transaction_pb2.Transaction(
        read_version=latest.version, uuid="00000000-0000-4000-8000-0000000000aa"
    )
    txn.delete.updated_fragments.append(manifest.fragments[1])
    txn.delete.predicate = "by lancetx"
    manifest.transaction_file = ""
    key = naming.manifest_key("t", manifest.version, latest.scheme)
    store.put_if_not_exists(
        key, encode_manifest(manifest, indices=previous.indices, transaction=txn)
    )

    ds = lance.dataset(table.uri)
    assert ds.version == latest.version + 1
    assert ds.count_rows() == 20 - len(rows)
    frag = {f.fragment_id: f for f in ds.get_fragments()}[1]
    assert frag.count_rows() == 10 - len(rows)
    assert frag.metadata.deletion_file.file_type == ("bitmap" if file_type == BITMAP else "array")
    remaining = set(ds.to_table(columns=["a"]).column("a").to_pylist())
    assert remaining == set(range(20)) - {10 + r for r in rows}


# ---------------------------------------------------------------- bad input


def _arrow_bytes(table: pa.Table, compression: str | None = None) -> bytes:
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    return sink.getvalue()


def _one_batch(column: pa.Array, name: str = "row_id", nullable: bool = False) -> bytes:
    schema = pa.schema([pa.field(name, column.type, nullable=nullable)])
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(pa.record_batch([column], schema=schema))
    return sink.getvalue()


BAD_FILES = {
    "arrow-int64-column": (
        ARROW,
        _one_batch(pa.array([1, 2, 3], pa.int64())),
        "found schema (row_id: int64 not null)",
    ),
    "arrow-wrong-name": (
        ARROW,
        _one_batch(pa.array([1], pa.uint32()), name="rid"),
        "expected one column",
    ),
    "arrow-nullable": (
        ARROW,
        _one_batch(pa.array([1, None], pa.uint32()), nullable=True),
        "row_id: uint32)",
    ),
    "arrow-two-batches": (
        ARROW,
        _arrow_bytes(
            pa.table({"row_id": pa.array([1, 2, 3], pa.uint32())}).cast(
                pa.schema([pa.field("row_id", pa.uint32(), nullable=False)])
            )
        ),
        "exactly one record batch",
    ),
    "arrow-junk": (ARROW, b"not an arrow file at all", "expected an Arrow IPC file"),
    "arrow-truncated": (
        ARROW,
        _one_batch(pa.array([1, 2], pa.uint32()))[:40],
        "not a readable Arrow IPC file",
    ),
    "arrow-holding-a-bitmap": (ARROW, BitMap([1, 2, 3]).serialize(), "looks like a Roaring bitmap"),
    "bin-junk": (
        BITMAP,
        b"junk junk junk junk",
        "does not deserialize as a portable 32-bit Roaring bitmap",
    ),
    "bin-empty": (BITMAP, b"", "does not deserialize"),
    "bin-holding-arrow": (
        BITMAP,
        _one_batch(pa.array([1], pa.uint32())),
        "found an Arrow IPC file",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_wrong_deletion_file_is_a_typed_error_naming_the_file(
    case: str, store: LocalObjectStore
) -> None:
    file_type, data, problem = BAD_FILES[case]
    deletion_file = table_pb2.DeletionFile(
        file_type=file_type, read_version=3, id=42, num_deleted_rows=3
    )  # type: ignore[arg-type]
    key = deletion_file_key("t", 9, deletion_file)
    store.put(key, data)
    before = store_listing(store)
    with pytest.raises(DeletionFileError) as info:
        read_deletion_vector(store, "t", 9, deletion_file)
    assert info.value.path == store.uri(key)
    assert problem in info.value.problem
    assert store.uri(key) in str(info.value)
    assert store_listing(store) == before


def test_a_deletion_file_under_a_base_path_is_read_from_that_base(tmp_path: Path) -> None:
    """A shallow clone's fragments keep their deletion files in the source's folder,
    registered as a base path: read there when it is in the same store, refused with
    the reason when the id is not registered, and when the base is in another bucket."""
    store = LocalObjectStore("/")
    source = str(tmp_path / "src.lance").lstrip("/")
    deletion_file = write_deletion_vector(store, source, 0, 1, BitMap([1, 4]))
    deletion_file.base_id = 2
    root = table_pb2.BasePath(id=2, path=str(tmp_path / "src.lance"), is_dataset_root=True)
    clone = str(tmp_path / "clone.lance").lstrip("/")
    assert read_deletion_vector(store, clone, 0, deletion_file, [root]) == BitMap([1, 4])
    with pytest.raises(BasePathError, match="base path id 2, which the manifest does not"):
        read_deletion_vector(store, clone, 0, deletion_file)
    elsewhere = table_pb2.BasePath(id=2, path="s3://other/src.lance", is_dataset_root=True)
    with pytest.raises(UnsupportedFeatureError, match="another bucket"):
        read_deletion_vector(store, clone, 0, deletion_file, [elsewhere])
    folder = table_pb2.BasePath(id=2, path=str(tmp_path / "src.lance"), is_dataset_root=False)
    with pytest.raises(BasePathError, match="not a dataset root"):
        read_deletion_vector(store, clone, 0, deletion_file, [folder])


def test_snapshot_counts_deletions_from_the_file_when_the_manifest_lacks_the_count(
    store: LocalObjectStore,
) -> None:
    """Old Lance versions left ``num_deleted_rows`` unset (0): the file is the truth."""
    deletion_file = write_deletion_vector(store, "t", 0, 1, BitMap([2, 4, 6]))
    deletion_file.num_deleted_rows = 0
    manifest = table_pb2.Manifest(version=2)
    fragment = manifest.fragments.add(id=0, physical_rows=10)
    fragment.deletion_file.CopyFrom(deletion_file)
    key = naming.manifest_key("t", 2, naming.NamingScheme.V1)
    store.put(key, encode_manifest(manifest))
    snap = load_version(store, "t")
    assert (snap.physical_rows, snap.deleted_rows, snap.num_rows) == (10, 3, 7)
    assert snap.deletion_vector(0) == BitMap([2, 4, 6])
