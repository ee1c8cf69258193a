"""The generated protobuf code: freshness, wire contract, and interop with pylance."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import unknown_fields
from google.protobuf.message import Message

from lancetx.protos import file_pb2, rowids_pb2, table_pb2, transaction_pb2

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
REGENERATE = ROOT / "tools" / "regenerate_protos.py"

# Manifest field numbers pylance writes that our table.proto does not declare.
# (23, the inline transaction offset pylance 14.0.2 writes instead of 21, is
# declared as inline_transaction_position.)
KNOWN_UNDECLARED_MANIFEST_FIELDS: set[int] = set()


def _run_check(proto_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REGENERATE), "--check", "--proto-dir", str(proto_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --------------------------------------------------------------------------- drift


def test_generated_code_matches_protos() -> None:
    proc = _run_check(PROTOS)
    assert proc.returncode == 0, f"run `make protos`:\n{proc.stdout}{proc.stderr}"


def test_check_flags_an_edited_proto(tmp_path: Path) -> None:
    """--check must fail when a .proto changes without regenerating (on a copy)."""
    copy = tmp_path / "protos"
    shutil.copytree(PROTOS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert _run_check(copy).returncode == 0

    proto = copy / "table.proto"
    text = proto.read_text()
    proto.write_text(text.replace("optional string branch = 20;", "optional string branch = 22;"))
    proc = _run_check(copy)
    assert proc.returncode == 1
    assert "differs: protos/table_pb2.py" in proc.stderr
    assert "file_pb2" not in proc.stderr


def test_generated_modules_import_siblings_relatively() -> None:
    for name in ("table_pb2", "transaction_pb2"):
        for suffix in (".py", ".pyi"):
            text = (PROTOS / (name + suffix)).read_text()
            assert "\nimport file_pb2" not in text and "\nimport table_pb2" not in text
            assert "from . import file_pb2 as " in text
    assert table_pb2.Manifest.__module__ == "lancetx.protos.table_pb2"


# ------------------------------------------------------------------ wire contract


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        (table_pb2.Manifest, "fields", 1),
        (table_pb2.Manifest, "fragments", 2),
        (table_pb2.Manifest, "version", 3),
        (table_pb2.Manifest, "schema_metadata", 5),
        (table_pb2.Manifest, "index_section", 6),
        (table_pb2.Manifest, "reader_feature_flags", 9),
        (table_pb2.Manifest, "writer_feature_flags", 10),
        (table_pb2.Manifest, "max_fragment_id", 11),
        (table_pb2.Manifest, "transaction_file", 12),
        (table_pb2.Manifest, "writer_version", 13),
        (table_pb2.Manifest, "next_row_id", 14),
        (table_pb2.Manifest, "data_format", 15),
        (table_pb2.Manifest, "config", 16),
        (table_pb2.Manifest, "base_paths", 18),
        (table_pb2.Manifest, "table_metadata", 19),
        (table_pb2.Manifest, "branch", 20),
        (table_pb2.Manifest, "transaction_section", 21),
        (table_pb2.Manifest.WriterVersion, "build_metadata", 4),
        (table_pb2.DataFragment, "deletion_file", 3),
        (table_pb2.DataFragment, "physical_rows", 4),
        (table_pb2.DataFragment, "inline_row_ids", 5),
        (table_pb2.DataFragment, "external_created_at_versions", 10),
        (table_pb2.DataFile, "file_size_bytes", 6),
        (table_pb2.DataFile, "base_id", 7),
        (table_pb2.DeletionFile, "num_deleted_rows", 4),
        (table_pb2.DeletionFile, "base_id", 7),
        (table_pb2.IndexMetadata, "index_details", 6),
        (table_pb2.IndexMetadata, "files", 10),
        (table_pb2.RegionManifest, "region_id", 11),
        (table_pb2.MemWalIndexDetails, "index_catchup", 10),
        (file_pb2.Field, "encoding", 7),
        (file_pb2.Field, "extension_name", 9),
        (file_pb2.Field, "metadata", 10),
        (file_pb2.Field, "unenforced_primary_key", 12),
        (file_pb2.Field, "unenforced_clustering_key_position", 15),
        (transaction_pb2.Transaction, "transaction_properties", 4),
        (transaction_pb2.Transaction.Update, "merged_generations", 5),
        (transaction_pb2.Transaction.Update, "update_mode", 7),
        (transaction_pb2.Transaction.Update, "inserted_rows", 8),
        (transaction_pb2.Transaction.Update, "updated_fragment_offsets", 9),
        (transaction_pb2.Transaction.UpdateConfig, "config_updates", 6),
        (transaction_pb2.Transaction.UpdateConfig, "field_metadata_updates", 9),
        (transaction_pb2.Transaction.UpdateConfig.FieldMetadataUpdate, "metadata", 5),
        (transaction_pb2.Transaction.Rewrite.RewrittenIndex, "new_index_files", 5),
        (transaction_pb2.Transaction.UpdateBases, "new_bases", 1),
        (rowids_pb2.U64Segment, "array", 5),
        (rowids_pb2.EncodedU64Array.U64Array, "values", 2),
        (rowids_pb2.RowDatasetVersionRun, "version", 2),
    ],
)
def test_field_number(message: type[Message], field: str, number: int) -> None:
    assert message.DESCRIPTOR.fields_by_name[field].number == number


def test_transaction_operation_oneof() -> None:
    names = [
        "append", "delete", "overwrite", "create_index", "rewrite", "merge", "restore",
        "reserve_fragments", "update", "project", "update_config", "data_replacement",
        "update_mem_wal_state", "clone", "update_bases",
    ]  # fmt: skip
    oneof = transaction_pb2.Transaction.DESCRIPTOR.oneofs_by_name["operation"]
    assert {f.name: f.number for f in oneof.fields} == {n: 100 + i for i, n in enumerate(names)}


def test_reserved_slots_and_packages() -> None:
    def reserved(message: type[Message]) -> set[int]:
        from google.protobuf import descriptor_pb2

        proto = descriptor_pb2.DescriptorProto()
        message.DESCRIPTOR.CopyToProto(proto)
        return {n for r in proto.reserved_range for n in range(r.start, r.end)}

    assert reserved(table_pb2.Manifest) == {17}
    assert reserved(file_pb2.Field) == {11}
    assert reserved(transaction_pb2.Transaction) == {200, 202}
    assert file_pb2.DESCRIPTOR.package == "lance.file"
    for module in (table_pb2, transaction_pb2, rowids_pb2):
        assert module.DESCRIPTOR.package == "lance.table"
    assert table_pb2.Manifest.DESCRIPTOR.full_name == "lance.table.Manifest"
    assert table_pb2.DeletionFile.DeletionFileType.Value("BITMAP") == 1
    assert file_pb2.Field.Type.Value("LEAF") == 2


# ------------------------------------------------------------------------ pylance


def _read_manifest(path: Path) -> tuple[bytes, table_pb2.Manifest]:
    """Parse a _versions/*.manifest file: footer -> u32 length -> Manifest."""
    data = path.read_bytes()
    pos, _major, _minor, magic = struct.unpack("<qhh4s", data[-16:])
    assert magic == b"LANC"
    (length,) = struct.unpack_from("<I", data, pos)
    return data, table_pb2.Manifest.FromString(data[pos + 4 : pos + 4 + length])


def _latest_manifest(root: Path) -> tuple[bytes, table_pb2.Manifest]:
    # Newest by content: with V2 names the newest version has the smallest name.
    parsed = [_read_manifest(p) for p in (root / "_versions").glob("*.manifest")]
    return max(parsed, key=lambda item: item[1].version)


def _inline_transaction(data: bytes, manifest: table_pb2.Manifest) -> transaction_pb2.Transaction:
    """The length-prefixed Transaction inside the manifest file."""
    if manifest.HasField("inline_transaction_position"):
        offset = manifest.inline_transaction_position
    else:
        offset = manifest.transaction_section
    (length,) = struct.unpack_from("<I", data, offset)
    return transaction_pb2.Transaction.FromString(data[offset + 4 : offset + 4 + length])


def test_pylance_manifest_round_trip(tmp_path: Path) -> None:
    lance = pytest.importorskip("lance")
    pa = pytest.importorskip("pyarrow")
    lance.write_dataset(pa.table({"a": [1, 2, 3]}), str(tmp_path))

    data, manifest = _latest_manifest(tmp_path)
    assert manifest.version == 1
    assert len(manifest.fragments) == 1
    assert manifest.fragments[0].physical_rows == 3
    assert manifest.fields[0].name == "a"
    assert manifest.fields[0].logical_type == "int64"
    assert manifest.writer_version.library == "lance"
    assert table_pb2.Manifest.FromString(manifest.SerializeToString()) == manifest

    undeclared = {f.field_number for f in unknown_fields.UnknownFieldSet(manifest)}
    assert undeclared <= KNOWN_UNDECLARED_MANIFEST_FIELDS, "pylance writes new Manifest fields"

    (txn_path,) = (tmp_path / "_transactions").glob("*.txn")
    assert txn_path.name == manifest.transaction_file
    txn = transaction_pb2.Transaction.FromString(txn_path.read_bytes())
    assert txn.WhichOneof("operation") == "overwrite"
    assert txn.read_version == 0
    assert [f.name for f in txn.overwrite.schema] == ["a"]
    assert _inline_transaction(data, manifest) == txn


def test_pylance_index_deletions_stable_row_ids(tmp_path: Path) -> None:
    lance = pytest.importorskip("lance")
    pa = pytest.importorskip("pyarrow")
    ds = lance.write_dataset(pa.table({"a": [1, 2, 3]}), str(tmp_path), enable_stable_row_ids=True)
    ds.create_scalar_index("a", "BTREE")
    lance.dataset(str(tmp_path)).delete("a = 2")

    data, manifest = _latest_manifest(tmp_path)
    assert manifest.version == 3
    assert manifest.reader_feature_flags & 0b11 == 0b11  # deletion files + stable row ids
    fragment = manifest.fragments[0]
    assert fragment.deletion_file.num_deleted_rows == 1
    row_ids = rowids_pb2.RowIdSequence.FromString(fragment.inline_row_ids)
    assert row_ids.segments[0].range.end == 3
    assert table_pb2.Manifest.FromString(manifest.SerializeToString()) == manifest

    (length,) = struct.unpack_from("<I", data, manifest.index_section)
    start = manifest.index_section + 4
    section = table_pb2.IndexSection.FromString(data[start : start + length])
    assert [i.name for i in section.indices] == ["a_idx"]
    assert section.indices[0].index_details.type_url.endswith("BTreeIndexDetails")

    undeclared = {f.field_number for f in unknown_fields.UnknownFieldSet(manifest)}
    assert undeclared <= KNOWN_UNDECLARED_MANIFEST_FIELDS
    assert len(unknown_fields.UnknownFieldSet(section.indices[0])) == 0
    assert _inline_transaction(data, manifest).WhichOneof("operation") == "delete"
