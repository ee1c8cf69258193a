"""Fragment JSON <-> DataFragment proto, checked against real pylance fragments and manifests."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from google.protobuf import unknown_fields
from lance.fragment import FragmentMetadata, write_fragments

from lancetx.commit.errors import UnsupportedFeatureError
from lancetx.commit.format.fragments import (
    OVERLAYS_FEATURE_FLAG,
    OVERLAYS_FIELD_NUMBER,
    SPILLED_CREATED_AT_FIELD_NUMBER,
    SPILLED_LAST_UPDATED_AT_FIELD_NUMBER,
    SPILLED_ROW_IDS_FIELD_NUMBER,
    SPILLED_ROW_LINEAGE_FEATURE_FLAG,
    FragmentFormatError,
    fragment_from_json,
    fragment_from_pylance,
    fragment_to_json,
    fragment_to_pylance,
)
from lancetx.protos import table_pb2


def read_manifests(uri: Path) -> dict[int, table_pb2.Manifest]:
    """Every manifest by version, parsed the simple way (footer: i64 pos, i16, i16, b"LANC")."""
    out: dict[int, table_pb2.Manifest] = {}
    for path in (uri / "_versions").glob("*.manifest"):
        data = path.read_bytes()
        assert data[-4:] == b"LANC"
        (pos,) = struct.unpack("<q", data[-16:-8])
        (length,) = struct.unpack("<I", data[pos : pos + 4])
        manifest = table_pb2.Manifest.FromString(data[pos + 4 : pos + 4 + length])
        out[manifest.version] = manifest
    return out


def table(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "a": pa.array(range(start, start + n), pa.int64()),
            "s": pa.array([f"row-{i}" for i in range(start, start + n)]),
            "v": pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32(), 4)),
        }
    )


def assert_round_trips(meta: FragmentMetadata) -> table_pb2.DataFragment:
    """pylance object -> proto -> JSON equals pylance's JSON; the JSON rebuilds the object."""
    theirs = meta.to_json()
    proto = fragment_from_pylance(meta)
    ours = fragment_to_json(proto)
    assert ours == theirs
    assert json.dumps(ours) == json.dumps(theirs)  # same key order, plain JSON types
    assert json.loads(json.dumps(ours)) == ours
    assert FragmentMetadata.from_json(json.dumps(ours)) == meta
    assert fragment_to_pylance(proto) == meta
    assert fragment_from_json(json.loads(json.dumps(ours))) == proto
    return proto


def assert_matches_manifest(uri: Path, ds: lance.LanceDataset) -> list[table_pb2.DataFragment]:
    """Our protos of pylance's fragments equal the DataFragments in that version's manifest."""
    manifest = read_manifests(uri)[ds.version]
    protos = [assert_round_trips(fr.metadata) for fr in ds.get_fragments()]
    assert len(protos) == len(manifest.fragments) > 0
    for ours, real in zip(protos, manifest.fragments, strict=True):
        assert ours == real, f"{ours}\n!=\n{real}"
        # and the other way: the manifest's proto gives pylance's JSON.
        assert fragment_to_json(real) == fragment_to_json(ours)
    return protos


# ------------------------------------------------------------------ real fragments


def test_write_fragments(tmp_path: Path) -> None:
    uri = tmp_path / "t.lance"
    frags = write_fragments(table(300), str(uri), max_rows_per_file=100)
    assert len(frags) == 3
    for meta in frags:
        proto = assert_round_trips(meta)
        assert proto.physical_rows == 100
        assert proto.files[0].file_size_bytes > 0
        assert not proto.files[0].HasField("base_id")
        assert not proto.HasField("deletion_file")
        assert proto.WhichOneof("row_id_sequence") is None
    # Committing them (what the driver does with executors' JSON) gives a
    # manifest whose fragments are our protos of what pylance reports.
    sent = [
        FragmentMetadata.from_json(json.dumps(fragment_to_json(fragment_from_pylance(m))))
        for m in frags
    ]
    ds = lance.LanceDataset.commit(str(uri), lance.LanceOperation.Overwrite(table(0).schema, sent))
    protos = assert_matches_manifest(uri, ds)
    assert [p.id for p in protos] == [0, 1, 2]
    assert ds.count_rows() == 300


def test_deletions_array_and_bitmap(tmp_path: Path) -> None:
    uri = tmp_path / "t.lance"
    lance.write_dataset(table(12000), str(uri), max_rows_per_file=6000)
    ds = lance.dataset(str(uri))
    ds.delete("a < 5")  # fragment 0: 5 rows -> arrow array file
    ds.delete("a >= 6000 AND a < 11900")  # fragment 1: 5900 rows (> 5000) -> roaring bitmap
    ds = lance.dataset(str(uri))
    protos = assert_matches_manifest(uri, ds)
    d0, d1 = protos[0].deletion_file, protos[1].deletion_file
    assert d0.file_type == table_pb2.DeletionFile.ARROW_ARRAY
    assert d0.num_deleted_rows == 5
    assert d1.file_type == table_pb2.DeletionFile.BITMAP
    assert d1.num_deleted_rows == 5900
    j0, j1 = (fragment_to_json(p)["deletion_file"] for p in protos)
    assert j0["file_type"] == "array" and j1["file_type"] == "bitmap"
    assert j0["id"] == d0.id and j0["read_version"] == d0.read_version
    # Deletion file ids are random u64s; they must survive JSON untouched.
    assert isinstance(j0["id"], int) and j0["id"] < 2**64


def test_stable_row_ids(tmp_path: Path) -> None:
    uri = tmp_path / "t.lance"
    lance.write_dataset(table(10), str(uri), enable_stable_row_ids=True)
    ds = lance.write_dataset(table(5, start=10), str(uri), mode="append")
    ds.delete("a = 3")
    ds = lance.dataset(str(uri))
    protos = assert_matches_manifest(uri, ds)
    for p in protos:
        assert p.WhichOneof("row_id_sequence") == "inline_row_ids"
        assert p.WhichOneof("created_at_version_sequence") == "inline_created_at_versions"
        assert p.WhichOneof("last_updated_at_version_sequence") == "inline_last_updated_at_versions"
    j = fragment_to_json(protos[1])
    assert set(j["row_id_meta"]) == {"Inline"}
    assert set(j["created_at_version_meta"]) == {"inline"}
    assert all(isinstance(b, int) and 0 <= b < 256 for b in j["row_id_meta"]["Inline"])


def test_every_version_of_a_history_matches(tmp_path: Path) -> None:
    """Append, delete, overwrite: each version's manifest fragments equal our protos."""
    uri = tmp_path / "t.lance"
    lance.write_dataset(table(10), str(uri))
    lance.write_dataset(table(10, start=10), str(uri), mode="append")
    lance.dataset(str(uri)).delete("a % 3 = 0")
    manifests = read_manifests(uri)
    assert sorted(manifests) == [1, 2, 3]
    for version, manifest in manifests.items():
        ds = lance.dataset(str(uri), version=version)
        metas = [fr.metadata for fr in ds.get_fragments()]
        assert [fragment_from_pylance(m) for m in metas] == list(manifest.fragments)


def test_spilled_row_lineage(tmp_path: Path) -> None:
    """pylance 14 compaction can spill row lineage into data-file columns (fields 12-14)."""
    uri = tmp_path / "t.lance"
    ds = lance.write_dataset(table(5), str(uri), enable_stable_row_ids=True)
    ds.update_config({"lance.row_lineage.spill": "true", "lance.row_lineage.inline_max_bytes": "1"})
    ds = lance.write_dataset(table(400, start=100), str(uri), mode="append")
    ds.delete("a = 107")
    ds.optimize.compact_files(materialize_deletions_threshold=0.0)
    ds = lance.dataset(str(uri))
    manifest = read_manifests(uri)[ds.version]
    assert manifest.reader_feature_flags & SPILLED_ROW_LINEAGE_FEATURE_FLAG
    (real,) = manifest.fragments
    assert sorted(u.field_number for u in unknown_fields.UnknownFieldSet(real)) == [
        SPILLED_ROW_IDS_FIELD_NUMBER,
        SPILLED_LAST_UPDATED_AT_FIELD_NUMBER,
        SPILLED_CREATED_AT_FIELD_NUMBER,
    ]
    (proto,) = assert_matches_manifest(uri, ds)
    assert proto.SerializeToString() == real.SerializeToString()
    j = fragment_to_json(proto)
    assert j["row_id_meta"] == "Column"
    assert j["created_at_version_meta"] == j["last_updated_at_version_meta"] == {"column": {}}
    assert sorted(j["files"][0]["fields"])[:3] == [-5, -4, -3]  # the spilled lineage columns
    # Content inside a spilled marker has no JSON form: refused, not dropped.
    stuffed = table_pb2.DataFragment()
    stuffed.CopyFrom(proto)
    stuffed.MergeFromString(b"\x62\x02\x08\x01")  # field 12 = {1: 1}
    with pytest.raises(FragmentFormatError, match="has content"):
        fragment_to_json(stuffed)


def test_spilled_fields_map_to_their_oneofs() -> None:
    """Field 12 is the row ids, 13 last-updated, 14 created-at (checked against pylance)."""
    d = variant(
        row_id_meta="Column",
        created_at_version_meta={"column": {}},
        last_updated_at_version_meta={"inline": [1, 2]},
    )
    proto = fragment_from_json(d)
    assert proto.SerializeToString().endswith(b"\x3a\x02\x01\x02\x62\x00\x72\x00")
    assert fragment_to_json(proto) == d
    meta = FragmentMetadata.from_json(json.dumps(d))
    assert meta.to_json() == d
    both = fragment_from_json(variant(row_id_meta={"Inline": [1]}))
    both.MergeFromString(b"\x62\x00")
    with pytest.raises(FragmentFormatError, match="both inline_row_ids and spilled field 12"):
        fragment_to_json(both)


# ------------------------------------------------------------- synthetic variants

BASE: dict[str, Any] = {
    "id": 7,
    "files": [
        {
            "fields": [0, 1, 2],
            "column_indices": [0, 1, 2],
            "file_major_version": 2,
            "file_minor_version": 1,
            "file_size_bytes": 1234,
            "base_id": None,
            "path": "abc.lance",
        }
    ],
    "overlays": [],
    "physical_rows": 100,
    "deletion_file": None,
    "row_id_meta": None,
    "created_at_version_meta": None,
    "last_updated_at_version_meta": None,
}


def variant(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    d.update(changes)
    return d


EXTERNAL = {"path": "_rowids/x.bin", "offset": 16, "size": 2**40}
VARIANTS = {
    "plain": variant(),
    "two_files_base_id": variant(
        files=[
            {**BASE["files"][0], "fields": [0], "column_indices": [0], "base_id": 3},
            {**BASE["files"][0], "fields": [1, -1], "column_indices": [1, 0], "path": "d.lance"},
            {**BASE["files"][0], "fields": [2], "column_indices": [0], "base_id": 0},
        ]
    ),
    "legacy_v1_file": variant(
        files=[
            {
                **BASE["files"][0],
                "column_indices": [],
                "file_major_version": 0,
                "file_minor_version": 0,
                "file_size_bytes": None,
            }
        ],
        physical_rows=None,
    ),
    "deletion_bitmap_base": variant(
        deletion_file={
            "read_version": 4,
            "id": 2**64 - 1,
            "file_type": "bitmap",
            "num_deleted_rows": 9000,
            "base_id": 2,
        }
    ),
    "inline_lineage": variant(
        row_id_meta={"Inline": [0, 255, 7]},
        created_at_version_meta={"inline": []},
        last_updated_at_version_meta={"inline": [10, 4, 10, 2, 16, 3]},
    ),
    "spilled_lineage": variant(
        row_id_meta="Column",
        created_at_version_meta={"column": {}},
        last_updated_at_version_meta={"column": {}},
    ),
}


@pytest.mark.parametrize("d", VARIANTS.values(), ids=VARIANTS.keys())
def test_json_variants_round_trip_through_pylance(d: dict[str, Any]) -> None:
    proto = fragment_from_json(d)
    assert fragment_to_json(proto) == d
    assert table_pb2.DataFragment.FromString(proto.SerializeToString()) == proto
    # pylance reads our JSON and writes it back unchanged.
    meta = FragmentMetadata.from_json(json.dumps(fragment_to_json(proto)))
    assert meta.to_json() == d
    assert fragment_from_pylance(meta) == proto
    assert fragment_to_pylance(proto) == meta


# Valid for Lance's proto and serde, but pylance 14.0.2 cannot take them back.
BEYOND_PYLANCE = {
    # pb num_deleted_rows 0 means unknown: pylance's to_json says null, and its
    # own from_json then fails (DeletionFile wants an int).
    "deletion_unknown_count": variant(
        deletion_file={
            "read_version": 1,
            "id": 5,
            "file_type": "array",
            "num_deleted_rows": None,
            "base_id": None,
        }
    ),
    # external_* (fields 6, 8, 10) are in our proto and Lance's serde source, but
    # pylance 14's RowIdMeta knows only Inline/Column (it ignores field 6 in a
    # manifest and then reports "All fragments must have row ids").
    "external_row_ids": variant(
        row_id_meta={"External": EXTERNAL},
        created_at_version_meta={"external": EXTERNAL},
        last_updated_at_version_meta={"external": {**EXTERNAL, "offset": 0}},
    ),
}


@pytest.mark.parametrize("d", BEYOND_PYLANCE.values(), ids=BEYOND_PYLANCE.keys())
def test_json_variants_pylance_cannot_read(d: dict[str, Any]) -> None:
    proto = fragment_from_json(d)
    assert fragment_to_json(proto) == d
    assert json.loads(json.dumps(d)) == d
    with pytest.raises((TypeError, ValueError)):
        FragmentMetadata.from_json(json.dumps(d))


def test_proto_field_mapping() -> None:
    proto = fragment_from_json(VARIANTS["deletion_bitmap_base"])
    assert proto.id == 7 and proto.physical_rows == 100
    assert proto.deletion_file.file_type == table_pb2.DeletionFile.BITMAP
    assert proto.deletion_file.id == 2**64 - 1
    assert proto.deletion_file.base_id == 2
    f0 = proto.files[0]
    assert (f0.path, list(f0.fields), f0.file_major_version, f0.file_minor_version) == (
        "abc.lance",
        [0, 1, 2],
        2,
        1,
    )
    ext = fragment_from_json(BEYOND_PYLANCE["external_row_ids"])
    assert ext.external_row_ids == table_pb2.ExternalFile(**EXTERNAL)
    assert ext.external_created_at_versions.size == 2**40
    assert ext.external_last_updated_at_versions.offset == 0
    inline = fragment_from_json(VARIANTS["inline_lineage"])
    assert inline.inline_row_ids == bytes([0, 255, 7])
    assert inline.inline_last_updated_at_versions == bytes([10, 4, 10, 2, 16, 3])
    assert inline.HasField("inline_created_at_versions")  # empty bytes, still set


def test_zero_means_unknown_like_lance() -> None:
    """Lance's proto uses 0 for unknown; Lance's JSON uses null. 0 in JSON normalizes to null."""
    d = variant(physical_rows=0)
    d["files"][0]["file_size_bytes"] = 0
    out = fragment_to_json(fragment_from_json(d))
    assert out["physical_rows"] is None
    assert out["files"][0]["file_size_bytes"] is None
    missing = {"id": 1, "files": []}  # what older writers may send
    assert fragment_to_json(fragment_from_json(missing)) == {
        **variant(id=1, files=[], physical_rows=None)
    }


# ------------------------------------------------------------------------ overlays


def test_overlays_refused(tmp_path: Path) -> None:
    """A real pylance overlay: the JSON and the manifest's field 11 are both refused."""
    uri = tmp_path / "t.lance"
    ds = lance.write_dataset(table(4), str(uri))
    values = write_fragments(
        pa.table({"s": ["X", "Z"]}), str(uri), schema=pa.schema([pa.field("s", pa.string())])
    )
    data_file = values[0].files[0]
    data_file.fields = [1]
    op = lance.LanceOperation.DataOverlay(
        groups=[
            lance.LanceOperation.DataOverlayGroup(
                fragment_id=0,
                overlays=[
                    lance.LanceOperation.DataOverlayFile(data_file=data_file, offsets=[1, 3])
                ],
            )
        ]
    )
    ds2 = lance.LanceDataset.commit(str(uri), op, read_version=ds.version)
    overlay_json = ds2.get_fragments()[0].metadata.to_json()
    assert overlay_json["overlays"][0]["offsets"] == [1, 3]

    with pytest.raises(UnsupportedFeatureError, match="overlay") as info:
        fragment_from_json(overlay_json)
    assert info.value.flags == OVERLAYS_FEATURE_FLAG
    assert "fragment 0" in str(info.value)

    manifest = read_manifests(uri)[ds2.version]
    assert manifest.reader_feature_flags & OVERLAYS_FEATURE_FLAG
    assert manifest.writer_feature_flags & OVERLAYS_FEATURE_FLAG
    with pytest.raises(UnsupportedFeatureError, match=f"proto field {OVERLAYS_FIELD_NUMBER}"):
        fragment_to_json(manifest.fragments[0])
    # Without field 11 the same fragment converts: it really is the overlay we refuse.
    plain = table_pb2.DataFragment()
    plain.CopyFrom(manifest.fragments[0])
    plain.DiscardUnknownFields()
    assert fragment_to_json(plain) == {**overlay_json, "overlays": []}


# --------------------------------------------------------------------- bad input


def with_file(**changes: Any) -> dict[str, Any]:
    return variant(files=[{**BASE["files"][0], **changes}])


@pytest.mark.parametrize(
    ("d", "where"),
    [
        ({"files": []}, "fragment.id"),
        (variant(id=-1), "fragment.id"),
        (variant(id=True), "fragment.id"),
        (variant(id=2**64), "fragment.id"),
        (variant(future_key=1), "fragment 7"),
        (variant(files=None), "fragment 7.files"),
        (variant(physical_rows="3"), "fragment 7.physical_rows"),
        (variant(overlays={}), "fragment 7.overlays"),
        (with_file(path=""), "fragment 7.files[0].path"),
        (with_file(fields=[0, 2**31]), "fragment 7.files[0].fields"),
        (with_file(column_indices=[1.0]), "fragment 7.files[0].column_indices"),
        (with_file(base_id=2**32), "fragment 7.files[0].base_id"),
        (with_file(extra=None), "fragment 7.files[0]"),
        (
            variant(deletion_file={"read_version": 1, "id": 2, "file_type": "roaring"}),
            "fragment 7.deletion_file.file_type",
        ),
        (
            variant(deletion_file={"id": 2, "file_type": "array"}),
            "fragment 7.deletion_file.read_version",
        ),
        (variant(row_id_meta={"inline": [1]}), "fragment 7.row_id_meta"),
        (variant(row_id_meta={"Inline": [256]}), "fragment 7.row_id_meta.Inline"),
        (variant(row_id_meta={"Inline": [], "External": EXTERNAL}), "fragment 7.row_id_meta"),
        (variant(created_at_version_meta={"Inline": [1]}), "fragment 7.created_at_version_meta"),
        (
            variant(last_updated_at_version_meta={"external": {"path": "x", "offset": 0}}),
            "fragment 7.last_updated_at_version_meta.external.size",
        ),
    ],
)
def test_bad_json(d: dict[str, Any], where: str) -> None:
    with pytest.raises(FragmentFormatError) as info:
        fragment_from_json(d)
    assert info.value.path == where
    assert "fragment metadata" in str(info.value)


def test_not_a_mapping() -> None:
    with pytest.raises(FragmentFormatError, match="JSON object"):
        fragment_from_json([BASE])  # type: ignore[arg-type]


def test_unknown_proto_fields_refused() -> None:
    proto = fragment_from_json(VARIANTS["deletion_bitmap_base"])
    # Field 20 (varint 1) on the DataFile: something a newer Lance might add.
    proto.files[0].MergeFromString(b"\xa0\x01\x01")
    with pytest.raises(FragmentFormatError, match=r"\[20\]") as info:
        fragment_to_json(proto)
    assert info.value.path == "fragment 7.files[0]"
    bad_type = fragment_from_json(VARIANTS["deletion_bitmap_base"])
    bad_type.deletion_file.file_type = 5  # type: ignore[assignment]
    with pytest.raises(FragmentFormatError, match="deletion file type 5"):
        fragment_to_json(bad_type)
