"""Transaction files: naming, plain-protobuf layout, pylance compatibility, bad input."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from lance_fixtures import PylanceTable, build_simple_table, store_listing

from lancetx.commit.errors import ObjectNotFoundError, TransactionFileError
from lancetx.commit.format import naming
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.manifest import encode_manifest, read_manifest
from lancetx.commit.format.transaction_file import (
    read_transaction_file,
    read_transaction_of,
    transaction_file_name,
    write_transaction_file,
)
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.protos import transaction_pb2


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(str(tmp_path))


@pytest.fixture
def pylance_table(tmp_path: Path) -> PylanceTable:
    return build_simple_table(str(tmp_path / "t"), appends=2)


def _append_txn(read_version: int = 4) -> transaction_pb2.Transaction:
    txn = transaction_pb2.Transaction(read_version=read_version, uuid=str(uuid.uuid4()))
    fragment = txn.append.fragments.add(id=0, physical_rows=3)
    fragment.files.add(
        path="x.lance", fields=[0], column_indices=[0], file_major_version=2, file_minor_version=1
    )
    txn.transaction_properties["__lance_commit_message"] = "hello"
    return txn


def test_write_then_read_round_trip(store: LocalObjectStore) -> None:
    txn = _append_txn()
    name = write_transaction_file(store, "tbl", txn)
    assert name == f"4-{txn.uuid}.txn" == transaction_file_name(txn)
    key = naming.join("tbl", "_transactions", name)
    # Plain protobuf: no length prefix, nothing else.
    assert store.get(key) == txn.SerializeToString()
    assert read_transaction_file(store, "tbl", name) == txn


def test_transaction_without_uuid_or_operation_is_not_written(store: LocalObjectStore) -> None:
    with pytest.raises(ValueError, match="uuid"):
        write_transaction_file(store, "tbl", transaction_pb2.Transaction(read_version=1, append={}))
    with pytest.raises(ValueError, match="operation"):
        write_transaction_file(store, "tbl", transaction_pb2.Transaction(read_version=1, uuid="u"))
    assert store_listing(store) == []


def test_reads_pylance_transaction_files_byte_for_byte(
    store: LocalObjectStore, pylance_table: PylanceTable
) -> None:
    ds = pylance_table.dataset()
    for location in list_manifest_locations(store, "t"):
        manifest_file = read_manifest(store, location.key)
        name = manifest_file.manifest.transaction_file
        assert name.startswith(f"{location.version - 1}-") and name.endswith(".txn")
        txn = read_transaction_file(store, "t", name)
        assert store.get(naming.transaction_key("t", name)) == txn.SerializeToString()
        pl = ds.read_transaction(location.version)
        assert (txn.uuid, txn.read_version) == (pl.uuid, pl.read_version)
        assert txn.WhichOneof("operation") == ("overwrite" if location.version == 1 else "append")
        assert read_transaction_of(store, "t", manifest_file) == txn


def test_pylance_reads_our_transaction_file(
    store: LocalObjectStore, pylance_table: PylanceTable
) -> None:
    """Replace pylance's transaction file of version 3 with ours (new properties)."""
    location = list_manifest_locations(store, "t")[-1]
    manifest_file = read_manifest(store, location.key)
    txn = read_transaction_file(store, "t", manifest_file.manifest.transaction_file)
    txn.transaction_properties["written_by"] = "lancetx"
    assert write_transaction_file(store, "t", txn) == manifest_file.manifest.transaction_file
    # pylance prefers the inline copy; drop it so it must read our file.
    store.put(location.key, encode_manifest(manifest_file.manifest, indices=manifest_file.indices))
    assert read_manifest(store, location.key).transaction is None
    pl = lance.dataset(pylance_table.uri).read_transaction(location.version)
    assert pl.transaction_properties.get("written_by") == "lancetx"


def _arrow_file_bytes() -> bytes:
    sink = io.BytesIO()
    table = pa.table({"x": [1, 2, 3]})
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


GARBAGE = {
    "not-protobuf": (b"\xff\xff\xff\xff", "does not decode"),
    "truncated-field": (b"\x12\x24abc", "does not decode"),
    "valid-protobuf-without-operation": (
        transaction_pb2.Transaction(read_version=3, uuid="u").SerializeToString(),
        "without an operation",
    ),
    "empty": (b"", "without an operation"),
    "arrow-file": (_arrow_file_bytes(), ""),
}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_garbage_transaction_file_is_a_typed_error(case: str, store: LocalObjectStore) -> None:
    data, problem = GARBAGE[case]
    name = f"3-{uuid.uuid4()}.txn"
    key = naming.transaction_key("t", name)
    store.put(key, data)
    before = store_listing(store)
    with pytest.raises(TransactionFileError) as info:
        read_transaction_file(store, "t", name)
    assert info.value.path == store.uri(key)
    assert problem in info.value.problem
    assert store.uri(key) in str(info.value)
    assert store_listing(store) == before


def test_missing_transaction_file_is_object_not_found(store: LocalObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        read_transaction_file(store, "t", "1-nope.txn")
