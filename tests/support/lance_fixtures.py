"""Tables written by real pylance, for tests that must read what Lance writes.

Each builder runs a fixed history of pylance operations against ``uri`` (a
local path or ``s3://bucket/key`` with ``storage_options``) and returns a
:class:`PylanceTable` describing it: which version each step produced and
which deletion-file types and indices it should contain. Data is kept small so
a whole history takes well under a second on local disk.

Facts these builders rely on (pylance 14.0.2, measured):

* ``write_dataset(..., enable_v2_manifest_paths=...)`` defaults to True (V2 names);
* stable row ids: ``write_dataset(..., enable_stable_row_ids=True)``;
* deleting 3 rows of a fragment writes an ``.arrow`` deletion file, deleting
  more than 5,000 writes a ``.bin`` (Roaring) file;
* ``optimize.compact_files`` commits two versions (ReserveFragments, Rewrite).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa

VECTOR_DIM = 8


@dataclass
class PylanceTable:
    """A table pylance wrote, and what its history should contain."""

    uri: str
    storage_options: dict[str, str] | None
    v2_manifest_paths: bool
    stable_row_ids: bool = False
    #: ``(version, description)`` of every committed step, in order.
    steps: list[tuple[int, str]] = field(default_factory=list)
    #: Deletion-file extensions the history must have produced (``arrow``, ``bin``).
    deletion_file_types: set[str] = field(default_factory=set)
    index_names: set[str] = field(default_factory=set)

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The table (at ``version``) as pylance opens it."""
        return lance.dataset(self.uri, version=version, storage_options=self.storage_options)

    def versions(self) -> list[int]:
        """Every version pylance lists for the table."""
        return [int(v["version"]) for v in self.dataset().versions()]

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    @property
    def base_key(self) -> str:
        """The table's key inside its container (bucket, or ``/`` on local disk)."""
        if self.is_s3:
            return self.uri[len("s3://") :].split("/", 1)[1].strip("/")
        return os.path.abspath(self.uri).lstrip("/")

    @property
    def bucket(self) -> str | None:
        return self.uri[len("s3://") :].split("/", 1)[0] if self.is_s3 else None


def _vectors(rng: np.random.Generator, n: int) -> pa.FixedSizeListArray:
    values = pa.array(rng.random(n * VECTOR_DIM, dtype=np.float32))
    return pa.FixedSizeListArray.from_arrays(values, VECTOR_DIM)


def rows(
    start: int, n: int, *, seed: int = 0, vectors: bool = True, schema_metadata: bool = True
) -> pa.Table:
    """``n`` rows with ``a`` = start.., ``b`` = 0.., and ``vec`` (fixed_size_list<float32, 8>).

    With ``schema_metadata`` the schema carries two metadata keys (pylance
    writes map entries in random order; leave it off for byte-exact checks).
    """
    columns: dict[str, Any] = {
        "a": pa.array(range(start, start + n), pa.int64()),
        "b": pa.array(range(n), pa.int64()),
    }
    if vectors:
        columns["vec"] = _vectors(np.random.default_rng(seed), n)
    table = pa.table(columns)
    if schema_metadata:
        table = table.replace_schema_metadata({"lancetx.fixture": "1", "owner": "tests"})
    return table


class _Recorder:
    def __init__(self, table: PylanceTable) -> None:
        self.table = table

    def step(self, description: str, action: Callable[[], Any]) -> None:
        before = self._latest()
        action()
        after = self._latest()
        for version in range(before + 1, after + 1):
            suffix = "" if after == before + 1 else f" ({version - before}/{after - before})"
            self.table.steps.append((version, description + suffix))

    def _latest(self) -> int:
        try:
            return int(self.table.dataset().version)
        except (OSError, ValueError):
            return 0


def build_history_table(
    uri: str, *, v2_manifest_paths: bool = True, storage_options: dict[str, str] | None = None
) -> PylanceTable:
    """Create, append, delete (both deletion-file types), index (scalar and
    vector), update, add/drop a column, compact, update the config, overwrite,
    delete again, restore an old version: about 17 versions."""
    table = PylanceTable(uri, storage_options, v2_manifest_paths)
    rec = _Recorder(table)
    opts = storage_options

    def ds() -> lance.LanceDataset:
        return table.dataset()

    rec.step(
        "create 300 rows",
        lambda: lance.write_dataset(
            rows(0, 300, seed=1),
            uri,
            enable_v2_manifest_paths=v2_manifest_paths,
            storage_options=opts,
        ),
    )
    rec.step(
        "append 300 rows",
        lambda: lance.write_dataset(
            rows(300, 300, seed=2), uri, mode="append", storage_options=opts
        ),
    )
    rec.step("delete 3 rows of fragment 0 (.arrow)", lambda: ds().delete("a < 3"))
    rec.step(
        "append 8000 rows",
        lambda: lance.write_dataset(
            rows(10_000, 8000, seed=3), uri, mode="append", storage_options=opts
        ),
    )
    rec.step(
        "delete 6000 rows of fragment 2 (.bin)",
        lambda: ds().delete("a >= 10000 AND a < 16000"),
    )
    rec.step("create BTREE index on a", lambda: ds().create_scalar_index("a", "BTREE"))
    rec.step(
        "create IVF_PQ index on vec",
        lambda: ds().create_index("vec", "IVF_PQ", num_partitions=1, num_sub_vectors=2),
    )
    rec.step("update b = b + 1 where a < 50", lambda: ds().update({"b": "b + 1"}, where="a < 50"))
    rec.step("add column c = a * 2", lambda: ds().add_columns({"c": "a * 2"}))
    rec.step("drop column c", lambda: ds().drop_columns(["c"]))
    rec.step(
        "compact files",
        lambda: ds().optimize.compact_files(target_rows_per_fragment=100_000),
    )
    rec.step(
        "update config",
        lambda: ds().update_config({"lancetx.test": "1", "lancetx.other": "two"}),
    )
    rec.step(
        "overwrite with 120 rows",
        lambda: lance.write_dataset(
            rows(50_000, 120, seed=4), uri, mode="overwrite", storage_options=opts
        ),
    )
    rec.step("delete 7 rows after overwrite", lambda: ds().delete("a < 50007"))
    rec.step("restore version 5", lambda: table.dataset(5).restore())
    table.deletion_file_types = {"arrow", "bin"}
    table.index_names = {"a_idx", "vec_idx"}
    return table


def build_stable_row_id_table(
    uri: str, *, v2_manifest_paths: bool = True, storage_options: dict[str, str] | None = None
) -> PylanceTable:
    """A table with stable row ids: create, append, delete, update, compact."""
    table = PylanceTable(uri, storage_options, v2_manifest_paths, stable_row_ids=True)
    rec = _Recorder(table)
    opts = storage_options

    def ds() -> lance.LanceDataset:
        return table.dataset()

    rec.step(
        "create 200 rows with stable row ids",
        lambda: lance.write_dataset(
            rows(0, 200, vectors=False),
            uri,
            enable_v2_manifest_paths=v2_manifest_paths,
            enable_stable_row_ids=True,
            storage_options=opts,
        ),
    )
    rec.step(
        "append 200 rows",
        lambda: lance.write_dataset(
            rows(200, 200, vectors=False), uri, mode="append", storage_options=opts
        ),
    )
    rec.step("delete 10 rows", lambda: ds().delete("a >= 100 AND a < 110"))
    rec.step("update b where a < 20", lambda: ds().update({"b": "b + 100"}, where="a < 20"))
    rec.step("create BTREE index on a", lambda: ds().create_scalar_index("a", "BTREE"))
    rec.step("compact files", lambda: ds().optimize.compact_files(target_rows_per_fragment=100_000))
    table.deletion_file_types = {"arrow"}
    table.index_names = {"a_idx"}
    return table


def build_simple_table(
    uri: str,
    *,
    v2_manifest_paths: bool = True,
    storage_options: dict[str, str] | None = None,
    appends: int = 1,
    index: bool = False,
) -> PylanceTable:
    """A small table: one create plus ``appends`` appends of 10 rows each, and
    (``index=True``) a BTREE index on ``a``. No schema metadata, so pylance's
    manifests are byte-deterministic."""
    table = PylanceTable(uri, storage_options, v2_manifest_paths)
    rec = _Recorder(table)
    rec.step(
        "create 10 rows",
        lambda: lance.write_dataset(
            rows(0, 10, vectors=False, schema_metadata=False),
            uri,
            enable_v2_manifest_paths=v2_manifest_paths,
            storage_options=storage_options,
        ),
    )
    for i in range(appends):
        start = 10 * (i + 1)
        rec.step(
            f"append 10 rows ({i + 1})",
            lambda start=start: lance.write_dataset(  # type: ignore[misc]
                rows(start, 10, vectors=False, schema_metadata=False),
                uri,
                mode="append",
                storage_options=storage_options,
            ),
        )
    if index:
        rec.step(
            "create BTREE index on a", lambda: table.dataset().create_scalar_index("a", "BTREE")
        )
        table.index_names = {"a_idx"}
    return table


def store_listing(store: Any, prefix: str = "") -> list[tuple[str, int, str | None]]:
    """``(key, size, etag)`` of every object under ``prefix``: compare before and
    after a failing call to prove nothing was written."""
    return sorted((meta.key, meta.size, meta.etag) for meta in store.list(prefix))


# ------------------------------------------------------- byte-level comparison

#: Map fields of lance.table.Manifest (schema_metadata, config, table_metadata).
MANIFEST_MAP_FIELDS = frozenset({5, 16, 19})


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _wire_fields(data: bytes) -> list[tuple[int, bytes]]:
    """Top-level ``(field number, raw bytes of the field)`` in wire order (test-side parser)."""
    out: list[tuple[int, bytes]] = []
    i = 0
    while i < len(data):
        start = i
        key, i = _varint(data, i)
        wire_type = key & 7
        if wire_type == 0:
            _, i = _varint(data, i)
        elif wire_type == 1:
            i += 8
        elif wire_type == 2:
            length, i = _varint(data, i)
            i += length
        elif wire_type == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire_type}")
        out.append((key >> 3, data[start:i]))
    return out


def manifest_bytes_difference(ours: bytes, theirs: bytes) -> str | None:
    """None if two manifest files are byte-identical or differ only in the
    order of Manifest map entries; otherwise a description of the difference.

    Lance's protobuf maps are Rust HashMaps, so pylance itself writes the
    entries of ``schema_metadata``/``config``/``table_metadata`` in a random
    order: byte equality can only be asked up to that order.
    """
    if ours == theirs:
        return None
    if len(ours) != len(theirs):
        return f"sizes differ: {len(ours)} != {len(theirs)}"
    if ours[-16:] != theirs[-16:]:
        return f"footers differ: {ours[-16:]!r} != {theirs[-16:]!r}"
    (position,) = struct.unpack("<q", ours[-16:-8])
    if ours[:position] != theirs[:position]:
        return "sections before the manifest differ"

    def canonical(data: bytes) -> list[tuple[int, list[bytes]]]:
        runs: list[tuple[int, list[bytes]]] = []
        for number, raw in _wire_fields(data[position + 4 : -16]):
            if runs and runs[-1][0] == number and number in MANIFEST_MAP_FIELDS:
                runs[-1][1].append(raw)
            else:
                runs.append((number, [raw]))
        return [(n, sorted(r) if n in MANIFEST_MAP_FIELDS else r) for n, r in runs]

    a, b = canonical(ours), canonical(theirs)
    if a != b:
        for (na, ra), (nb, rb) in zip(a, b, strict=False):
            if (na, ra) != (nb, rb):
                return f"manifest field {na} differs from field {nb}: {ra!r} != {rb!r}"
        return f"manifest has {len(a)} field runs vs {len(b)}"
    return None


__all__ = [
    "MANIFEST_MAP_FIELDS",
    "VECTOR_DIM",
    "PylanceTable",
    "build_history_table",
    "build_simple_table",
    "build_stable_row_id_table",
    "manifest_bytes_difference",
    "rows",
    "store_listing",
]
