"""Acceptance "us → pylance": manifests lancetx builds and commits are tables pylance reads.

Every case commits with lancetx (transaction file, build_manifest,
encode_manifest, put_if_not_exists at the table's naming scheme) on local disk
and on S3 (the embedded moto server), then checks with real pylance that the
new version opens (no Python warning, no Lance WARN/ERROR log line), is listed
by ``versions()``, returns exactly the expected rows, and that pylance can keep
committing on top of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.dataset import LanceOperation
from lance.fragment import write_fragments
from pyroaring import BitMap

from lancetx.commit.engine.builder import BuiltManifest, build_manifest
from lancetx.commit.errors import DatasetNotFoundError
from lancetx.commit.format import naming
from lancetx.commit.format.deletion import read_deletion_vector, write_deletion_vector
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.listing import detect_table_scheme
from lancetx.commit.format.manifest import decode_manifest, encode_manifest
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.format.schema import arrow_schema_to_fields
from lancetx.commit.format.snapshot import Snapshot, load_version
from lancetx.commit.format.transaction_file import write_transaction_file
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.commit.storage.stores import open_object_store
from lancetx.protos import table_pb2, transaction_pb2

Txn = transaction_pb2.Transaction


# ------------------------------------------------------------------- harness


@dataclass
class Table:
    """A table location with both views of it: pylance's and lancetx's."""

    uri: str
    storage_options: dict[str, str] | None
    store: ObjectStore
    base: str

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return lance.dataset(self.uri, version=version, storage_options=self.storage_options)

    def latest(self) -> Snapshot:
        return load_version(self.store, self.base)

    def write(self, data: pa.Table, **kwargs: Any) -> list[table_pb2.DataFragment]:
        """Data files written by pylance, as DataFragments (ids unassigned)."""
        frags = write_fragments(data, self.uri, storage_options=self.storage_options, **kwargs)
        return [fragment_from_pylance(f) for f in frags]

    def txn(self, read_version: int | None = None) -> Txn:
        if read_version is None:
            read_version = self.latest().version
        return Txn(read_version=read_version, uuid=str(uuid.uuid4()))

    def commit(self, txn: Txn, *, inline: bool = True, **kwargs: Any) -> BuiltManifest:
        """Commit ``txn`` as the next version, the way lancetx's commit path does."""
        try:
            snap: Snapshot | None = self.latest()
        except DatasetNotFoundError:
            snap = None
        name = write_transaction_file(self.store, self.base, txn)
        if txn.WhichOneof("operation") == "restore":
            source = load_version(self.store, self.base, txn.restore.version)
            kwargs["restore_source"] = (source.manifest, source.indices)
        version = snap.version + 1 if snap is not None else 1
        built = build_manifest(
            snap.manifest if snap is not None else None,
            snap.indices if snap is not None else [],
            txn,
            version=version,
            transaction_file=name,
            **kwargs,
        )
        data = encode_manifest(
            built.manifest, indices=built.indices or None, transaction=txn if inline else None
        )
        scheme = detect_table_scheme(self.store, self.base) or NamingScheme.V2
        self.store.put_if_not_exists(naming.manifest_key(self.base, version, scheme), data)
        return built

    def manifest_key(self, version: int) -> str:
        scheme = detect_table_scheme(self.store, self.base)
        assert scheme is not None
        return naming.manifest_key(self.base, version, scheme)


@pytest.fixture(params=["local", "s3"])
def new_table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], Table]]:
    """A factory of table locations, on local disk or in a fresh moto bucket."""

    def make(name: str) -> Table:
        if request.param == "local":
            uri = str(tmp_path / name)
            options = None
        else:
            aws = request.getfixturevalue("aws")
            bucket = request.getfixturevalue("bucket")
            uri = f"s3://{bucket}/{name}"
            options = aws.pylance_storage_options()
        store, base = open_object_store(uri, options)
        return Table(uri, options, store, base)

    yield make


def rows(start: int, n: int) -> pa.Table:
    return pa.table(
        {"a": pa.array(range(start, start + n), pa.int64()), "b": pa.array(range(n), pa.int64())}
    )


def sorted_rows(table: pa.Table, key: str = "a") -> list[dict[str, Any]]:
    return table.sort_by(key).to_pylist()


def index_names(ds: lance.LanceDataset) -> list[str]:
    return [i.name for i in ds.describe_indices()]


def pylance_table(t: Table, data: pa.Table, **kwargs: Any) -> int:
    ds = lance.write_dataset(data, t.uri, storage_options=t.storage_options, **kwargs)
    return int(ds.version)


_QUIET_CHECK = """
import json, sys, lance
uri, opts = sys.argv[1], json.loads(sys.argv[2])
ds = lance.dataset(uri, storage_options=opts)
seen = []
for v in ds.versions():
    d = lance.dataset(uri, version=v["version"], storage_options=opts)
    d.to_table()
    d.describe_indices()
    d.count_rows()
    seen.append(v["version"])
print(json.dumps(seen))
"""


def assert_pylance_quiet(t: Table, expected_versions: list[int]) -> None:
    """A fresh pylance process with Lance logging at WARN opens and scans every
    version without a WARN or ERROR line, and lists exactly these versions."""
    env = dict(os.environ, LANCE_LOG="warn")
    proc = subprocess.run(
        [sys.executable, "-c", _QUIET_CHECK, t.uri, json.dumps(t.storage_options)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    noisy = [line for line in proc.stderr.splitlines() if re.search(r"\b(WARN|ERROR)\b", line)]
    assert not noisy, "\n".join(noisy)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected_versions


def assert_opens(
    t: Table, version: int, expected: list[dict[str, Any]] | None = None, key: str = "a"
) -> lance.LanceDataset:
    """pylance opens ``version`` as the latest, lists it, and returns ``expected``."""
    ds = t.dataset()
    assert ds.version == version
    assert version in [v["version"] for v in ds.versions()]
    pinned = t.dataset(version)
    assert pinned.version == version
    if expected is not None:
        assert sorted_rows(ds.to_table(), key) == expected
        assert ds.count_rows() == len(expected)
    return ds


# ----------------------------------------------------------------------- Append


@pytest.mark.parametrize("v2_paths", [True, False], ids=["v2-names", "v1-names"])
def test_append(new_table: Callable[[str], Table], v2_paths: bool) -> None:
    t = new_table("append.lance")
    n = pylance_table(t, rows(0, 10), enable_v2_manifest_paths=v2_paths)
    n = int(
        lance.write_dataset(
            rows(10, 5), t.uri, mode="append", storage_options=t.storage_options
        ).version
    )

    frags = t.write(rows(100, 7))
    assert [f.id for f in frags] == [0]
    txn = t.txn()
    txn.append.fragments.extend(frags)
    # no inline copy: pylance's conflict check below must read our .txn file
    built = t.commit(txn, inline=False)
    assert built.manifest.version == n + 1
    name = naming.NamingScheme.V2.file_name(n + 1) if v2_paths else f"{n + 1}.manifest"
    assert t.manifest_key(n + 1).endswith("_versions/" + name)

    expected = sorted_rows(pa.concat_tables([rows(0, 10), rows(10, 5), rows(100, 7)]))
    ds = assert_opens(t, n + 1, expected)
    assert [f.fragment_id for f in ds.get_fragments()] == [0, 1, 2]
    assert ds.versions()[-1]["version"] == n + 1

    # pylance commits concurrently (planned against version n): it must load our
    # transaction file to check for conflicts, and Append/Append is compatible.
    theirs = write_fragments(rows(200, 3), t.uri, storage_options=t.storage_options)
    ds2 = lance.LanceDataset.commit(
        t.uri, LanceOperation.Append(theirs), read_version=n, storage_options=t.storage_options
    )
    assert ds2.version == n + 2
    more = lance.write_dataset(
        rows(300, 2), t.uri, mode="append", storage_options=t.storage_options
    )
    assert more.version == n + 3
    expected = sorted_rows(
        pa.concat_tables([rows(0, 10), rows(10, 5), rows(100, 7), rows(200, 3), rows(300, 2)])
    )
    assert sorted_rows(t.dataset().to_table()) == expected
    assert [f.fragment_id for f in t.dataset().get_fragments()] == [0, 1, 2, 3, 4]
    assert_pylance_quiet(t, list(range(1, n + 4)))


def test_pylance_conflict_check_needs_our_transaction_file(tmp_path: Path) -> None:
    """Control for test_append: without our .txn file pylance's concurrent commit fails,
    so its success there came from reading the file we wrote."""
    store, base = open_object_store(str(tmp_path / "c.lance"))
    t = Table(str(tmp_path / "c.lance"), None, store, base)
    n = pylance_table(t, rows(0, 3))
    txn = t.txn()
    txn.append.fragments.extend(t.write(rows(10, 3)))
    built = t.commit(txn, inline=False)
    t.store.delete(naming.transaction_key(t.base, built.manifest.transaction_file))
    theirs = write_fragments(rows(20, 1), t.uri)
    with pytest.raises(OSError, match=r"_transactions/.*\.txn"):
        lance.LanceDataset.commit(t.uri, LanceOperation.Append(theirs), read_version=n)


# ----------------------------------------------------------------------- Delete


def test_delete_with_both_deletion_file_formats(new_table: Callable[[str], Table]) -> None:
    t = new_table("delete.lance")
    n = pylance_table(t, rows(0, 30), max_rows_per_file=10)  # fragments 0, 1, 2
    snap = t.latest()
    assert snap.fragment_ids == [0, 1, 2]

    arrow_rows, bitmap_rows = BitMap([1, 3, 5]), BitMap([0, 2, 4, 6, 8, 9])
    f0 = table_pb2.DataFragment()
    f0.CopyFrom(snap.fragment(0))
    f0.deletion_file.CopyFrom(
        write_deletion_vector(
            t.store, t.base, 0, n, arrow_rows, file_type=table_pb2.DeletionFile.ARROW_ARRAY
        )
    )
    f1 = table_pb2.DataFragment()
    f1.CopyFrom(snap.fragment(1))
    f1.deletion_file.CopyFrom(
        write_deletion_vector(
            t.store, t.base, 1, n, bitmap_rows, file_type=table_pb2.DeletionFile.BITMAP
        )
    )
    txn = t.txn()
    txn.delete.updated_fragments.extend([f0, f1])
    txn.delete.deleted_fragment_ids.append(2)  # all of fragment 2
    txn.delete.predicate = "a in (1, 3, 5, 10, 12, 14, 16, 18, 19) or a >= 20"
    built = t.commit(txn)
    assert built.manifest.reader_feature_flags & 1

    gone = {1, 3, 5} | {10 + r for r in bitmap_rows} | set(range(20, 30))
    expected = [r for r in sorted_rows(rows(0, 30)) if r["a"] not in gone]
    ds = assert_opens(t, n + 1, expected)
    assert [f.fragment_id for f in ds.get_fragments()] == [0, 1]
    files = {
        f.deletion_file().split("/")[-1].rsplit(".", 1)[-1]
        for f in ds.get_fragments()
        if f.deletion_file()
    }
    assert files == {"arrow", "bin"}

    # a cumulative second delete on fragment 0, in the other format
    snap = t.latest()
    more = read_deletion_vector(t.store, t.base, 0, snap.fragment(0).deletion_file) | BitMap([7])
    f0b = table_pb2.DataFragment()
    f0b.CopyFrom(snap.fragment(0))
    f0b.deletion_file.CopyFrom(
        write_deletion_vector(
            t.store, t.base, 0, snap.version, more, file_type=table_pb2.DeletionFile.BITMAP
        )
    )
    txn2 = t.txn()
    txn2.delete.updated_fragments.append(f0b)
    txn2.delete.predicate = "a = 7"
    t.commit(txn2)
    expected = [r for r in expected if r["a"] != 7]
    assert_opens(t, n + 2, expected)

    # pylance deletes on top of our deletion files (it reads and extends them)
    t.dataset().delete("a = 0 or a = 11")
    expected = [r for r in expected if r["a"] not in (0, 11)]
    assert_opens(t, n + 3, expected)
    assert_pylance_quiet(t, list(range(1, n + 4)))


# -------------------------------------------------------------------- Overwrite


def test_overwrite_with_a_new_schema(new_table: Callable[[str], Table]) -> None:
    t = new_table("overwrite.lance")
    n = pylance_table(t, rows(0, 10))
    t.dataset().create_scalar_index("a", "BTREE")
    t.dataset().update_config({"keep": "1", "over": "old"})
    n = t.dataset().version

    new = pa.table(
        {"x": pa.array(["p", "q", "r"]), "y": pa.array([1.5, 2.5, None], pa.float64())}
    ).replace_schema_metadata({"m": "1"})
    fields, metadata = arrow_schema_to_fields(new.schema)
    frags = t.write(new, mode="overwrite")  # field ids from 0, as for a new schema
    assert list(frags[0].files[0].fields) == [f.id for f in fields]
    txn = t.txn()
    txn.overwrite.fragments.extend(frags)
    txn.overwrite.schema.extend(fields)
    for k, v in metadata.items():
        txn.overwrite.schema_metadata[k] = v
    txn.overwrite.config_upsert_values["over"] = "new"
    built = t.commit(txn)
    assert built.indices == []

    ds = assert_opens(t, n + 1, sorted_rows(new, "x"), key="x")
    assert ds.schema == new.schema
    assert ds.config() == {"keep": "1", "over": "new"}
    assert index_names(ds) == []
    assert [f.fragment_id for f in ds.get_fragments()] == [1]  # after the high-water mark 0
    assert sorted_rows(t.dataset(n).to_table()) == sorted_rows(rows(0, 10))  # time travel
    lance.write_dataset(new, t.uri, mode="append", storage_options=t.storage_options)
    assert t.dataset().count_rows() == 6
    assert_pylance_quiet(t, list(range(1, n + 3)))


def test_create_a_table_with_overwrite(new_table: Callable[[str], Table]) -> None:
    t = new_table("created.lance")
    frags = t.write(rows(0, 4), schema=rows(0, 4).schema)
    fields, _ = arrow_schema_to_fields(rows(0, 4).schema)
    txn = Txn(read_version=0, uuid=str(uuid.uuid4()))
    txn.overwrite.fragments.extend(frags)
    txn.overwrite.schema.extend(fields)
    txn.overwrite.config_upsert_values["c"] = "1"
    built = t.commit(txn)
    assert built.manifest.version == 1
    assert built.manifest.data_format.version == "2.2"
    ds = assert_opens(t, 1, sorted_rows(rows(0, 4)))
    assert ds.config() == {"c": "1"}
    assert detect_table_scheme(t.store, t.base) is NamingScheme.V2
    lance.write_dataset(rows(4, 1), t.uri, mode="append", storage_options=t.storage_options)
    assert_pylance_quiet(t, [1, 2])


# ----------------------------------------------------------------- UpdateConfig


def test_update_config(new_table: Callable[[str], Table]) -> None:
    t = new_table("config.lance")
    n = pylance_table(t, rows(0, 5).replace_schema_metadata({"old": "x"}))
    t.dataset().update_config({"a": "1", "b": "2"})
    t.dataset().update_metadata({"team": "data"})
    n = t.dataset().version

    txn = t.txn()
    uc = txn.update_config
    for key, value in (("a", "10"), ("b", None), ("c", "3")):
        e = uc.config_updates.update_entries.add(key=key)
        if value is not None:
            e.value = value
    uc.table_metadata_updates.replace = True
    uc.table_metadata_updates.update_entries.add(key="owner", value="lancetx")
    uc.schema_metadata_updates.update_entries.add(key="old")  # no value: delete
    uc.schema_metadata_updates.update_entries.add(key="new", value="y")
    uc.field_metadata_updates[1].update_entries.add(key="unit", value="m")
    built = t.commit(txn)
    assert built.manifest.writer_feature_flags & 8

    ds = assert_opens(t, n + 1, sorted_rows(rows(0, 5)))
    assert ds.config() == {"a": "10", "c": "3"}
    assert ds.metadata == {"owner": "lancetx"}
    assert ds.schema.metadata == {b"new": b"y"}
    assert ds.schema.field("b").metadata == {b"unit": b"m"}

    # clearing the config clears writer flag 8, and pylance still writes on top
    txn2 = t.txn()
    txn2.update_config.config_updates.replace = True
    built2 = t.commit(txn2)
    assert built2.manifest.writer_feature_flags & 8 == 0
    assert t.dataset().config() == {}
    t.dataset().update_config({"z": "1"})
    assert t.dataset().config() == {"z": "1"}
    assert_pylance_quiet(t, list(range(1, n + 4)))


# ------------------------------------------------------------ ReserveFragments


def test_reserve_fragments(new_table: Callable[[str], Table]) -> None:
    t = new_table("reserve.lance")
    n = pylance_table(t, rows(0, 10), max_rows_per_file=5)  # fragments 0, 1
    txn = t.txn()
    txn.reserve_fragments.num_fragments = 3
    built = t.commit(txn)
    assert built.manifest.max_fragment_id == 4
    assert_opens(t, n + 1, sorted_rows(rows(0, 10)))
    # pylance's next fragment comes after the reserved ids 2..4
    lance.write_dataset(rows(10, 2), t.uri, mode="append", storage_options=t.storage_options)
    assert [f.fragment_id for f in t.dataset().get_fragments()] == [0, 1, 5]
    # and so does ours
    txn2 = t.txn()
    txn2.append.fragments.extend(t.write(rows(20, 1)))
    t.commit(txn2)
    assert [f.fragment_id for f in t.dataset().get_fragments()] == [0, 1, 5, 6]
    assert_pylance_quiet(t, list(range(1, n + 4)))


# ---------------------------------------------------------------------- Restore


def test_restore(new_table: Callable[[str], Table]) -> None:
    t = new_table("restore.lance")
    pylance_table(t, rows(0, 4))
    t.dataset().create_scalar_index("a", "BTREE")
    lance.write_dataset(rows(10, 4), t.uri, mode="append", storage_options=t.storage_options)
    t.dataset().delete("a < 2")
    n = t.dataset().version  # 4

    txn = t.txn()
    txn.restore.version = 2
    built = t.commit(txn)
    assert built.manifest.max_fragment_id == 1  # the high-water mark did not go back to 0
    ds = assert_opens(t, n + 1, sorted_rows(rows(0, 4)))
    assert index_names(ds) == ["a_idx"]
    assert ds.to_table(filter="a = 3").num_rows == 1
    lance.write_dataset(rows(20, 1), t.uri, mode="append", storage_options=t.storage_options)
    assert [f.fragment_id for f in t.dataset().get_fragments()] == [0, 2]
    assert_pylance_quiet(t, list(range(1, n + 3)))


# ---------------------------------------------------------------------- Project


def test_project_drops_a_column_and_its_index(new_table: Callable[[str], Table]) -> None:
    t = new_table("project.lance")
    pylance_table(t, rows(0, 6))
    t.dataset().create_scalar_index("b", "BTREE")
    t.dataset().create_scalar_index("a", "BTREE")
    n = t.dataset().version
    snap = t.latest()
    txn = t.txn()
    txn.project.schema.extend(f for f in snap.manifest.fields if f.name == "a")
    built = t.commit(txn)
    assert [i.name for i in built.indices] == ["a_idx"]
    ds = assert_opens(t, n + 1, [{"a": i} for i in range(6)])
    assert ds.schema.names == ["a"]
    assert index_names(ds) == ["a_idx"]
    lance.write_dataset(
        pa.table({"a": pa.array([9], pa.int64())}),
        t.uri,
        mode="append",
        storage_options=t.storage_options,
    )
    assert t.dataset().count_rows() == 7
    assert_pylance_quiet(t, list(range(1, n + 3)))


# ----------------------------------------------------------------------- Update


def test_update_moves_rows_to_a_new_fragment(new_table: Callable[[str], Table]) -> None:
    t = new_table("update.lance")
    pylance_table(t, rows(0, 10))
    t.dataset().create_scalar_index("b", "BTREE")
    n = t.dataset().version
    snap = t.latest()

    # "UPDATE SET b = b + 100 WHERE a < 3": delete the old rows, write them anew
    moved = BitMap([0, 1, 2])
    updated = table_pb2.DataFragment()
    updated.CopyFrom(snap.fragment(0))
    updated.deletion_file.CopyFrom(write_deletion_vector(t.store, t.base, 0, n, moved))
    new_rows = pa.table(
        {"a": pa.array([0, 1, 2], pa.int64()), "b": pa.array([100, 101, 102], pa.int64())}
    )
    txn = t.txn()
    txn.update.updated_fragments.append(updated)
    txn.update.new_fragments.extend(t.write(new_rows))
    txn.update.fields_modified.append(next(f.id for f in snap.manifest.fields if f.name == "b"))
    built = t.commit(txn)
    assert [f.id for f in built.manifest.fragments] == [0, 1]

    expected = sorted_rows(rows(0, 10))
    for r in expected:
        if r["a"] < 3:
            r["b"] += 100
    ds = assert_opens(t, n + 1, expected)
    assert sorted(ds.to_table(filter="b >= 100")["a"].to_pylist()) == [0, 1, 2]
    assert ds.to_table(filter="b = 1").num_rows == 0
    ds.update({"b": "b + 1"}, where="a = 5")
    assert t.dataset().to_table(filter="a = 5")["b"].to_pylist() == [6]
    assert_pylance_quiet(t, list(range(1, n + 3)))


# ------------------------------------------------------------------ CreateIndex


def test_drop_an_index_pylance_made(new_table: Callable[[str], Table]) -> None:
    t = new_table("index.lance")
    pylance_table(t, rows(0, 8))
    t.dataset().create_scalar_index("a", "BTREE")
    n = t.dataset().version
    snap = t.latest()
    assert snap.index_names == ["a_idx"]
    txn = t.txn()
    txn.create_index.removed_indices.extend(snap.indices)
    built = t.commit(txn)
    assert built.indices == []
    ds = assert_opens(t, n + 1, sorted_rows(rows(0, 8)))
    assert index_names(ds) == []
    # our manifest has no index section at all, like pylance's for an index-free table
    raw = t.store.get(t.manifest_key(n + 1))
    assert not decode_manifest(raw, path="x").manifest.HasField("index_section")
    t.dataset().create_scalar_index("a", "BTREE")
    assert index_names(t.dataset()) == ["a_idx"]
    assert_pylance_quiet(t, list(range(1, n + 3)))


# --------------------------------------------------------- schema round trip


ROUND_TRIP_SCHEMA = pa.schema(
    [
        pa.field("i8", pa.int8()),
        pa.field("i16", pa.int16()),
        pa.field("i32", pa.int32(), nullable=False),
        pa.field("i64", pa.int64(), metadata={"unit": "ms", "doc": "an int64"}),
        pa.field("u8", pa.uint8()),
        pa.field("u16", pa.uint16()),
        pa.field("u32", pa.uint32()),
        pa.field("u64", pa.uint64()),
        pa.field("f16", pa.float16()),
        pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64()),
        pa.field("flag", pa.bool_()),
        pa.field("s", pa.string()),
        pa.field("ls", pa.large_string()),
        pa.field("bin", pa.binary()),
        pa.field("day", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("dec", pa.decimal128(10, 2)),
        pa.field("ints", pa.list_(pa.int32())),
        pa.field("lints", pa.large_list(pa.string())),
        pa.field("vec", pa.list_(pa.float32(), 8)),
        pa.field(
            "point",
            pa.struct(
                [pa.field("x", pa.float64()), pa.field("y", pa.float64(), metadata={"k": "v"})]
            ),
        ),
        pa.field(
            "events",
            pa.list_(
                pa.struct([pa.field("name", pa.string()), pa.field("tags", pa.list_(pa.string()))])
            ),
        ),
    ],
    metadata={"table": "round-trip", "version": "1"},
)


def round_trip_data() -> pa.Table:
    import datetime as dt

    n = 3
    columns: dict[str, Any] = {
        "i8": [-1, 0, 1],
        "i16": [-300, 0, 300],
        "i32": [1, 2, 3],
        "i64": [2**40, None, -(2**40)],
        "u8": [0, 128, 255],
        "u16": [0, 1, 65535],
        "u32": [0, 1, 2**32 - 1],
        "u64": [0, 1, 2**64 - 1],
        "f16": [0.5, None, -1.5],
        "f32": [1.25, 2.5, None],
        "f64": [3.0, -0.125, 1e300],
        "flag": [True, False, None],
        "s": ["a", None, "ccc"],
        "ls": ["large", "", None],
        "bin": [b"\x00\x01", None, b"z"],
        "day": [dt.date(2024, 1, 1), None, dt.date(1970, 1, 2)],
        "ts": [
            dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
            None,
            dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
        ],
        "dec": [Decimal("12.34"), None, Decimal("-0.01")],
        "ints": [[1, 2], [], None],
        "lints": [["x"], None, ["y", "z"]],
        "vec": [[float(i + j) for j in range(8)] for i in range(n)],
        "point": [{"x": 1.0, "y": 2.0}, None, {"x": -1.0, "y": None}],
        "events": [[{"name": "e1", "tags": ["t1", "t2"]}], [], [{"name": None, "tags": None}]],
    }
    import numpy as np

    data = {
        name: pa.array(values, type=ROUND_TRIP_SCHEMA.field(name).type)
        for name, values in columns.items()
    }
    data["f16"] = pa.array(np.array([0.5, np.nan, -1.5], dtype=np.float16), type=pa.float16())
    return pa.Table.from_pydict(data, schema=ROUND_TRIP_SCHEMA)


def test_schema_round_trip_creates_a_table_pylance_reads(new_table: Callable[[str], Table]) -> None:
    t = new_table("schema.lance")
    data = round_trip_data()
    fields, metadata = arrow_schema_to_fields(ROUND_TRIP_SCHEMA)
    frags = t.write(data, schema=ROUND_TRIP_SCHEMA)
    # the data files refer to columns by the field ids pylance gave the schema;
    # they must be the ids we give it
    ours = {f.id for f in fields}
    for frag in frags:
        for df in frag.files:
            assert set(df.fields) <= ours
    leaf_ids = {f.id for f in fields} - {f.parent_id for f in fields}
    assert leaf_ids <= {fid for frag in frags for df in frag.files for fid in df.fields}

    txn = Txn(read_version=0, uuid=str(uuid.uuid4()))
    txn.overwrite.fragments.extend(frags)
    txn.overwrite.schema.extend(fields)
    for k, v in metadata.items():
        txn.overwrite.schema_metadata[k] = v
    built = t.commit(txn)
    assert built.manifest.version == 1

    ds = t.dataset()
    assert ds.version == 1
    assert [v["version"] for v in ds.versions()] == [1]
    assert ds.schema == ROUND_TRIP_SCHEMA
    assert ds.schema.equals(ROUND_TRIP_SCHEMA, check_metadata=True)
    assert ds.schema.metadata == ROUND_TRIP_SCHEMA.metadata
    assert ds.schema.field("i64").metadata == ROUND_TRIP_SCHEMA.field("i64").metadata
    got = ds.to_table()
    assert got.num_rows == 3
    for name in ROUND_TRIP_SCHEMA.names:
        if name == "f16":
            assert got.column(name).to_pylist()[0::2] == data.column(name).to_pylist()[0::2]
        else:
            assert got.column(name).to_pylist() == data.column(name).to_pylist(), name
    # pylance appends rows of the same schema to our table
    lance.write_dataset(data, t.uri, mode="append", storage_options=t.storage_options)
    assert t.dataset().count_rows() == 6
    assert_pylance_quiet(t, [1, 2])


# --------------------------------------------------------------- stable row ids


def test_append_to_a_table_with_stable_row_ids(new_table: Callable[[str], Table]) -> None:
    t = new_table("stable.lance")
    pylance_table(t, rows(0, 5), enable_stable_row_ids=True)
    lance.write_dataset(rows(5, 3), t.uri, mode="append", storage_options=t.storage_options)
    n = t.dataset().version
    txn = t.txn()
    txn.append.fragments.extend(t.write(rows(100, 4)))
    built = t.commit(txn)
    assert built.manifest.reader_feature_flags & 2 and built.manifest.next_row_id == 12

    ds = assert_opens(
        t, n + 1, sorted_rows(pa.concat_tables([rows(0, 5), rows(5, 3), rows(100, 4)]))
    )
    assert ds.has_stable_row_ids
    with_ids = ds.to_table(with_row_id=True)
    by_a = dict(zip(with_ids["a"].to_pylist(), with_ids["_rowid"].to_pylist(), strict=True))
    assert [by_a[a] for a in (100, 101, 102, 103)] == [8, 9, 10, 11]
    assert sorted(by_a.values()) == list(range(12))
    # row ids stay with their rows through a pylance update, and new rows continue at 12
    ds.update({"b": "b + 1000"}, where="a = 101")
    lance.write_dataset(rows(200, 1), t.uri, mode="append", storage_options=t.storage_options)
    after = t.dataset().to_table(with_row_id=True)
    ids_after = dict(zip(after["a"].to_pylist(), after["_rowid"].to_pylist(), strict=True))
    assert ids_after[101] == 9 and ids_after[200] == 12
    assert_pylance_quiet(t, list(range(1, n + 4)))
