"""The manifest file format: encode/decode, byte compatibility with pylance, bad input."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import lance
import pytest
from lance_fixtures import (
    PylanceTable,
    _wire_fields,
    build_simple_table,
    store_listing,
)

from lancetx.commit.errors import ManifestFormatError, UnsupportedFeatureError
from lancetx.commit.format import naming
from lancetx.commit.format.listing import latest_manifest_location, list_manifest_locations
from lancetx.commit.format.manifest import (
    FLAG_BASE_PATHS,
    FLAG_DELETION_FILES,
    FLAG_STABLE_ROW_IDS,
    READER_FLAGS,
    WRITER_FLAGS,
    ManifestFile,
    check_reader_flags,
    check_writer_flags,
    decode_manifest,
    encode_manifest,
    read_manifest,
)
from lancetx.commit.format.snapshot import load_version
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.protos import file_pb2, table_pb2, transaction_pb2

# ------------------------------------------------------------------ helpers


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _position(data: bytes) -> int:
    return int(struct.unpack("<q", data[-16:-8])[0])


def _body(data: bytes) -> bytes:
    return data[_position(data) + 4 : -16]


def _reassemble(data: bytes, body: bytes) -> bytes:
    """``data`` with its manifest message replaced by ``body`` (sections and footer kept)."""
    position = _position(data)
    return data[:position] + struct.pack("<I", len(body)) + body + data[-16:]


def _mutate_manifest(data: bytes, change: Callable[[table_pb2.Manifest], None]) -> bytes:
    """Parse the manifest with the generated class (unknown fields kept), change it, re-assemble."""
    message = table_pb2.Manifest()
    message.ParseFromString(_body(data))
    change(message)
    return _reassemble(data, message.SerializeToString())


def _set_top_level_varint(data: bytes, number: int, value: int | None) -> bytes:
    """Drop every top-level field ``number`` from the manifest; append it with ``value``."""
    kept = b"".join(raw for n, raw in _wire_fields(_body(data)) if n != number)
    if value is not None:
        kept += _varint(number << 3) + _varint(value)
    return _reassemble(data, kept)


class CountingStore(LocalObjectStore):
    """A real local store that counts read requests."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.calls: list[str] = []

    def get(self, key: str) -> bytes:
        self.calls.append("get")
        return super().get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.calls.append("get_range")
        return super().get_range(key, start, end)

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        self.calls.append("get_tail")
        return super().get_tail(key, length)

    def head(self, key: str) -> ObjectMeta:
        self.calls.append("head")
        return super().head(key)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(str(tmp_path))


@pytest.fixture
def pylance_table(tmp_path: Path) -> PylanceTable:
    """3 versions by pylance (create, append, BTREE index): index section + inline txn."""
    return build_simple_table(str(tmp_path / "t"), appends=1, index=True)


def _latest_key(store: LocalObjectStore) -> str:
    location = latest_manifest_location(store, "t")
    assert location is not None
    return location.key


# ---------------------------------------------------------- encode / decode


def _sample_manifest() -> table_pb2.Manifest:
    manifest = table_pb2.Manifest(version=7, max_fragment_id=1, transaction_file="6-x.txn")
    manifest.fields.append(
        file_pb2.Field(name="a", id=0, parent_id=-1, logical_type="int64", nullable=True)
    )
    fragment = manifest.fragments.add(id=1, physical_rows=10)
    fragment.files.add(
        path="f.lance", fields=[0], column_indices=[0], file_major_version=2, file_minor_version=1
    )
    fragment.deletion_file.CopyFrom(
        table_pb2.DeletionFile(
            file_type=table_pb2.DeletionFile.ARROW_ARRAY, read_version=6, id=9, num_deleted_rows=2
        )
    )
    manifest.writer_version.library = "lancetx"
    manifest.writer_version.version = "0.1.0"
    manifest.data_format.file_format = "lance"
    manifest.data_format.version = "2.1"
    manifest.reader_feature_flags = FLAG_DELETION_FILES
    manifest.writer_feature_flags = FLAG_DELETION_FILES
    return manifest


def _sample_indices() -> list[table_pb2.IndexMetadata]:
    return [
        table_pb2.IndexMetadata(
            uuid=table_pb2.UUID(uuid=bytes(range(16))), fields=[0], name="a_idx", dataset_version=6
        ),
        table_pb2.IndexMetadata(
            uuid=table_pb2.UUID(uuid=bytes(16)), fields=[0], name="b_idx", dataset_version=7
        ),
    ]


def _sample_transaction() -> transaction_pb2.Transaction:
    txn = transaction_pb2.Transaction(read_version=6, uuid="00000000-0000-4000-8000-000000000001")
    txn.delete.predicate = "a < 2"
    return txn


@pytest.mark.parametrize("with_indices", [None, "empty", "two"])
@pytest.mark.parametrize("with_txn", [False, True])
def test_decode_of_encode_returns_the_inputs(with_indices: str | None, with_txn: bool) -> None:
    manifest = _sample_manifest()
    before = manifest.SerializeToString()
    indices = {None: None, "empty": [], "two": _sample_indices()}[with_indices]
    txn = _sample_transaction() if with_txn else None

    data = encode_manifest(manifest, indices=indices, transaction=txn)

    assert manifest.SerializeToString() == before, "the caller's message was mutated"
    decoded = decode_manifest(data, path="mem://m")
    assert decoded.size == len(data)
    assert (decoded.footer_major, decoded.footer_minor) == (0, 2)
    assert data[-4:] == b"LANC"
    assert decoded.indices == indices
    assert decoded.transaction == txn
    expected = table_pb2.Manifest()
    expected.CopyFrom(manifest)
    if indices is not None:
        assert decoded.manifest.HasField("index_section")
        expected.index_section = decoded.manifest.index_section
        assert decoded.manifest.index_section == 0  # the first thing in the file
    else:
        assert not decoded.manifest.HasField("index_section")
    assert decoded.manifest == expected
    if txn is not None:
        assert decoded.transaction_position is not None
        assert decoded.transaction_position < decoded.manifest_position
    else:
        assert decoded.transaction_position is None
    # Re-encoding the decoded file reproduces the bytes exactly.
    again = encode_manifest(
        decoded.manifest, indices=decoded.indices, transaction=decoded.transaction
    )
    assert again == data


def test_encode_drops_stale_positions_and_honours_footer_version() -> None:
    manifest = _sample_manifest()
    manifest.index_section = 12345  # describes some other file
    data = encode_manifest(manifest, footer_version=(0, 1))
    decoded = decode_manifest(data, path="mem://m")
    assert not decoded.manifest.HasField("index_section")
    assert decoded.indices is None
    assert (decoded.footer_major, decoded.footer_minor) == (0, 1)
    assert manifest.index_section == 12345


def test_encode_writes_the_transaction_position_in_field_23_like_pylance() -> None:
    data = encode_manifest(_sample_manifest(), transaction=_sample_transaction())
    numbers = [n for n, _ in _wire_fields(_body(data))]
    assert 23 in numbers and 21 not in numbers
    assert numbers == sorted(numbers)  # tag order, as prost writes


def test_legacy_field_21_transaction_position_is_read() -> None:
    data = encode_manifest(_sample_manifest(), transaction=_sample_transaction())
    position = decode_manifest(data, path="m").transaction_position
    legacy = _set_top_level_varint(_set_top_level_varint(data, 23, None), 21, position)
    decoded = decode_manifest(legacy, path="m")
    assert decoded.transaction == _sample_transaction()
    assert decoded.transaction_position == position
    # Our own encoding of it moves the position to field 23.
    again = encode_manifest(decoded.manifest, transaction=decoded.transaction)
    assert again == data


# ------------------------------------------------------- pylance compatibility


def test_pylance_manifests_reencode_byte_for_byte(
    store: CountingStore, pylance_table: PylanceTable
) -> None:
    locations = list_manifest_locations(store, "t")
    assert [loc.version for loc in locations] == [1, 2, 3]
    saw_index_section = saw_inline_txn = False
    for location in locations:
        original = store.get(location.key)
        decoded = read_manifest(store, location.key)
        assert (decoded.footer_major, decoded.footer_minor) == (0, 2)  # pylance 14 writes 0.2
        saw_index_section |= decoded.indices is not None
        saw_inline_txn |= decoded.transaction is not None
        again = encode_manifest(
            decoded.manifest,
            indices=decoded.indices,
            transaction=decoded.transaction,
            footer_version=(decoded.footer_major, decoded.footer_minor),
        )
        assert again == original, location.key
    assert saw_index_section and saw_inline_txn


def test_pylance_reads_our_layout(
    store: CountingStore, pylance_table: PylanceTable, tmp_path: Path
) -> None:
    """Rewrite pylance's manifests in our own layout (a different section set),
    remove the transaction files: pylance still opens every version and finds
    every transaction in our inline section."""
    for location in list_manifest_locations(store, "t"):
        decoded = read_manifest(store, location.key)
        assert decoded.transaction is not None
        indices = decoded.indices if decoded.indices is not None else []  # add an empty section
        store.put(
            location.key,
            encode_manifest(decoded.manifest, indices=indices, transaction=decoded.transaction),
        )
    for meta in list(store.list("t/_transactions/")):
        store.delete(meta.key)
    for version in (1, 2, 3):
        ds = lance.dataset(pylance_table.uri, version=version)
        assert ds.count_rows() == (10 if version == 1 else 20)
        txn = ds.read_transaction(version)
        assert txn is not None and txn.read_version == version - 1
    assert {d.name for d in lance.dataset(pylance_table.uri).describe_indices()} == {"a_idx"}


# ------------------------------------------------------------ request count


def test_small_manifest_takes_one_request(
    store: CountingStore, pylance_table: PylanceTable
) -> None:
    key = _latest_key(store)
    store.calls.clear()
    decoded = read_manifest(store, key)
    assert store.calls == ["get_tail"]
    assert decoded.indices is not None and decoded.transaction is not None


def test_large_manifest_takes_one_more_range_request(store: CountingStore) -> None:
    manifest = _sample_manifest()
    manifest.schema_metadata["big"] = b"x" * 100_000
    data = encode_manifest(manifest, indices=_sample_indices(), transaction=_sample_transaction())
    key = naming.manifest_key("big", 7, naming.NamingScheme.V2)
    store.put(key, data)
    store.calls.clear()
    decoded = read_manifest(store, key)
    assert store.calls == ["get_tail", "get_range"]
    assert decoded.manifest.schema_metadata["big"] == b"x" * 100_000
    assert decoded.indices == _sample_indices()
    assert decoded.transaction == _sample_transaction()


def test_large_index_section_before_the_tail_takes_one_more_request(store: CountingStore) -> None:
    indices = [
        table_pb2.IndexMetadata(
            name=f"idx{i}", fields=[0], dataset_version=i, fragment_bitmap=b"y" * 1000
        )
        for i in range(100)
    ]
    data = encode_manifest(_sample_manifest(), indices=indices, transaction=_sample_transaction())
    assert len(data) > 64 * 1024 and len(data) - _position(data) < 64 * 1024
    key = naming.manifest_key("bigidx", 7, naming.NamingScheme.V1)
    store.put(key, data)
    store.calls.clear()
    decoded = read_manifest(store, key)
    assert store.calls == ["get_tail", "get_range"]
    assert decoded.indices == indices


# ---------------------------------------------------------------- bad input


def _truncate_tail(data: bytes) -> bytes:
    return data[:-7]


def _tiny(data: bytes) -> bytes:
    return data[:10]


def _wrong_magic(data: bytes) -> bytes:
    return data[:-4] + b"LANX"


def _position_outside(data: bytes) -> bytes:
    return data[:-16] + struct.pack("<q", len(data) + 100) + data[-8:]


def _negative_position(data: bytes) -> bytes:
    return data[:-16] + struct.pack("<q", -5) + data[-8:]


def _length_prefix_points_outside(data: bytes) -> bytes:
    position = _position(data)
    (length,) = struct.unpack_from("<I", data, position)
    return data[:position] + struct.pack("<I", length + 1000) + data[position + 4 :]


def _garbage_body(data: bytes) -> bytes:
    return _reassemble(data, b"\xff" * len(_body(data)))


def _index_section_outside(data: bytes) -> bytes:
    def change(m: table_pb2.Manifest) -> None:
        m.index_section = 1_000_000

    return _mutate_manifest(data, change)


def _index_length_past_manifest(data: bytes) -> bytes:
    message = table_pb2.Manifest()
    message.ParseFromString(_body(data))
    pos = message.index_section
    return data[:pos] + struct.pack("<I", 0xFFFFFF) + data[pos + 4 :]


def _index_section_not_protobuf(data: bytes) -> bytes:
    message = table_pb2.Manifest()
    message.ParseFromString(_body(data))
    pos = message.index_section
    (length,) = struct.unpack_from("<I", data, pos)
    return data[: pos + 4] + b"\xff" * length + data[pos + 4 + length :]


def _transaction_section_outside(data: bytes) -> bytes:
    return _set_top_level_varint(data, 23, 2_000_000)


BAD_MANIFESTS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "truncated-tail": (_truncate_tail, "magic"),
    "truncated-to-10-bytes": (_tiny, "shorter than the 16-byte footer"),
    "wrong-magic": (_wrong_magic, "footer magic is b'LANX'"),
    "position-outside": (_position_outside, "outside the file"),
    "negative-position": (_negative_position, "starts at byte -5, outside the file"),
    "length-prefix-outside": (_length_prefix_points_outside, "manifest length prefix"),
    "garbage-manifest": (_garbage_body, "does not decode as lance.table.Manifest"),
    "index-section-outside": (_index_section_outside, "index section position 1000000 is outside"),
    "index-length-past-manifest": (_index_length_past_manifest, "index section length prefix"),
    "index-section-not-protobuf": (
        _index_section_not_protobuf,
        "does not decode as lance.table.IndexSection",
    ),
    "transaction-section-outside": (
        _transaction_section_outside,
        "inline transaction position 2000000 is outside",
    ),
}


@pytest.mark.parametrize("case", list(BAD_MANIFESTS))
def test_bad_manifest_is_a_typed_error_naming_file_and_problem(
    case: str, store: CountingStore, pylance_table: PylanceTable
) -> None:
    corrupt, problem = BAD_MANIFESTS[case]
    key = _latest_key(store)
    store.put(key, corrupt(store.get(key)))
    before = store_listing(store)

    with pytest.raises(ManifestFormatError) as info:
        read_manifest(store, key)
    assert info.value.path == store.uri(key)
    assert problem in info.value.problem
    assert store.uri(key) in str(info.value) and problem in str(info.value)
    # decode_manifest agrees on the whole bytes, and the snapshot loader surfaces it too.
    with pytest.raises(ManifestFormatError, match="invalid Lance manifest"):
        decode_manifest(store.get(key), path=store.uri(key))
    with pytest.raises(ManifestFormatError):
        load_version(store, "t")
    assert store_listing(store) == before, "a failed read wrote something"


def test_unknown_reader_flag_is_refused_naming_file_and_flag(
    store: CountingStore, pylance_table: PylanceTable
) -> None:
    key = _latest_key(store)
    decoded = read_manifest(store, key)
    decoded.manifest.reader_feature_flags |= 1 << 40
    store.put(
        key,
        encode_manifest(decoded.manifest, indices=decoded.indices, transaction=decoded.transaction),
    )
    before = store_listing(store)

    with pytest.raises(UnsupportedFeatureError) as info:
        read_manifest(store, key)
    assert info.value.path == store.uri(key)
    assert info.value.role == "reader"
    assert info.value.flags == 1 << 40
    assert "1<<40" in str(info.value) and store.uri(key) in str(info.value)
    with pytest.raises(UnsupportedFeatureError):
        load_version(store, "t")
    # Lance agrees this table must not be read.
    with pytest.raises(ValueError, match="cannot be read by this version of Lance"):
        lance.dataset(pylance_table.uri).count_rows()
    # The bytes themselves are a valid manifest: only the flag check refuses them.
    assert decode_manifest(store.get(key), path="x").manifest.reader_feature_flags >> 40 == 1
    assert store_listing(store) == before


def test_flag_tables() -> None:
    # Lance's known flags (feature_flags.rs) are 1..32; bits from 64 up are unknown to it.
    assert set(READER_FLAGS) == {1, 2, 4, 8, 16, 32}
    # The builder assigns row ids and carries base paths, so every known flag is writable.
    assert set(WRITER_FLAGS) == {1, 2, 4, 8, 16, 32}
    manifest = table_pb2.Manifest(
        reader_feature_flags=FLAG_DELETION_FILES | FLAG_STABLE_ROW_IDS | FLAG_BASE_PATHS,
        writer_feature_flags=FLAG_DELETION_FILES | FLAG_STABLE_ROW_IDS | (1 << 40),
    )
    check_reader_flags(manifest, "p")
    with pytest.raises(UnsupportedFeatureError, match="1<<40") as info:
        check_writer_flags(manifest, "p")
    assert info.value.role == "writer" and info.value.flags == 1 << 40
    with pytest.raises(UnsupportedFeatureError, match="unknown flag 1<<6"):
        check_reader_flags(table_pb2.Manifest(reader_feature_flags=64), "p")


def test_read_transaction_of_prefers_inline(
    store: CountingStore, pylance_table: PylanceTable
) -> None:
    key = _latest_key(store)
    decoded = read_manifest(store, key)
    assert decoded.transaction is not None
    store.calls.clear()
    assert read_transaction_of(store, "t", decoded) == decoded.transaction
    assert store.calls == []
    without_inline = ManifestFile(
        manifest=decoded.manifest,
        indices=decoded.indices,
        transaction=None,
        footer_major=0,
        footer_minor=2,
        size=decoded.size,
    )
    assert read_transaction_of(store, "t", without_inline) == decoded.transaction
    assert store.calls == ["get_tail"]  # one request, capped (lancetx_max_transaction_bytes)
