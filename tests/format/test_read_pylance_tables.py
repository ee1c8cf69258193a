"""We read every table pylance writes, and agree with pylance about every version.

Tables come from :mod:`lance_fixtures` (``tests/support/``) (real pylance 14 histories: appends,
deletes of both deletion-file types, scalar and vector indices, update,
add/drop column, compaction, config update, overwrite, restore, stable row
ids), written on local disk and on S3 (the embedded moto server), with V1 and
V2 manifest names. For every version our reader must agree with pylance on
version numbers, fragments, physical and deleted rows (down to the deleted
offsets), row counts, index names, the schema and the transaction.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import lance
import pyarrow.compute as pc
import pytest
from lance_fixtures import (
    PylanceTable,
    build_history_table,
    build_simple_table,
    build_stable_row_id_table,
    manifest_bytes_difference,
    rows,
)

from lancetx.commit.errors import (
    DatasetNotFoundError,
    ManifestFormatError,
    VersionNotFoundError,
)
from lancetx.commit.format import naming
from lancetx.commit.format.deletion import read_deletion_vector
from lancetx.commit.format.listing import (
    MixedNamingSchemesError,
    detect_table_scheme,
    latest_manifest_location,
    list_manifest_locations,
)
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import encode_manifest, read_manifest
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.format.snapshot import Snapshot, load_snapshot, load_version
from lancetx.commit.format.transaction_file import read_transaction_file
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.commit.storage.s3store import S3ObjectStore
from lancetx.commit.storage.stores import open_object_store
from lancetx.demo.embedded import EmbeddedAws
from lancetx.protos import table_pb2

HAVE_SCHEMA = importlib.util.find_spec("lancetx.commit.format.schema") is not None

_BUILDERS = {"history": build_history_table, "stable_row_ids": build_stable_row_id_table}
_PARAMS = [
    (kind, backend, names)
    for kind in _BUILDERS
    for backend in ("local", "s3")
    for names in ("v1", "v2")
]


@pytest.fixture(scope="module")
def module_bucket(aws: EmbeddedAws) -> str:
    name = f"lancetx-read-{os.getpid()}-{id(aws) % 10_000}"
    boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module", params=_PARAMS, ids=["-".join(p) for p in _PARAMS])
def table(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PylanceTable:
    kind, backend, names = request.param
    build = _BUILDERS[kind]
    if backend == "s3":
        aws: EmbeddedAws = request.getfixturevalue("aws")
        bucket: str = request.getfixturevalue("module_bucket")
        uri = f"s3://{bucket}/tables/{kind}-{names}.lance"
        options: dict[str, str] | None = aws.pylance_storage_options()
    else:
        uri = str(tmp_path_factory.mktemp("pylance") / f"{kind}-{names}.lance")
        options = None
    return build(uri, v2_manifest_paths=names == "v2", storage_options=options)


@pytest.fixture(scope="module")
def opened(table: PylanceTable) -> Iterator[tuple[ObjectStore, str]]:
    store, base = open_object_store(table.uri, table.storage_options)
    yield store, base
    close = getattr(store, "close", None)
    if close is not None:
        close()


# ----------------------------------------------------------------- listing


def test_lists_every_version_pylance_lists(
    table: PylanceTable, opened: tuple[ObjectStore, str]
) -> None:
    store, base = opened
    expected = table.versions()
    assert expected == [v for v, _ in table.steps]  # the history is what the builder recorded
    locations = list_manifest_locations(store, base)
    assert [loc.version for loc in locations] == expected

    scheme = NamingScheme.V2 if table.v2_manifest_paths else NamingScheme.V1
    assert {loc.scheme for loc in locations} == {scheme}
    assert detect_table_scheme(store, base) is scheme
    for loc in locations:
        assert loc.key == naming.manifest_key(base, loc.version, scheme)
        assert loc.size == store.head(loc.key).size

    latest = latest_manifest_location(store, base)
    assert latest is not None and latest.version == table.dataset().version == expected[-1]
    assert load_version(store, base).version == expected[-1]


# --------------------------------------------------------------- per version


def _pylance_fragments(ds: lance.LanceDataset) -> dict[int, Any]:
    return {frag.fragment_id: frag for frag in ds.get_fragments()}


def _pylance_deleted_offsets(ds: lance.LanceDataset) -> dict[int, set[int]]:
    """Deleted offsets per fragment, from the row addresses pylance still returns."""
    live = ds.to_table(columns=[], with_row_address=True).column("_rowaddr")
    frag_ids = pc.shift_right(live, 32).to_pylist()
    offsets = pc.bit_wise_and(live, 0xFFFFFFFF).to_pylist()
    live_by_fragment: dict[int, set[int]] = {}
    for fid, off in zip(frag_ids, offsets, strict=True):
        live_by_fragment.setdefault(fid, set()).add(off)
    deleted: dict[int, set[int]] = {}
    for frag in ds.get_fragments():
        physical = frag.metadata.physical_rows
        deleted[frag.fragment_id] = set(range(physical)) - live_by_fragment.get(
            frag.fragment_id, set()
        )
    return deleted


def _check_version(table: PylanceTable, snap: Snapshot, version: int) -> None:
    ds = table.dataset(version)
    what = f"{table.uri} v{version}"
    assert snap.version == ds.version == version, what

    pl_frags = _pylance_fragments(ds)
    assert snap.fragment_ids == sorted(pl_frags), what
    deleted_offsets = _pylance_deleted_offsets(ds)
    for fragment in snap.fragments:
        pl = pl_frags[fragment.id]
        assert fragment.physical_rows == pl.metadata.physical_rows, (what, fragment.id)
        pl_deleted = pl.metadata.physical_rows - pl.count_rows()
        vector = snap.deletion_vector(fragment.id)
        assert len(vector) == pl_deleted == snap.fragment_deleted_rows(fragment), (
            what,
            fragment.id,
        )
        assert set(vector) == deleted_offsets[fragment.id], (what, fragment.id)
        pl_file = pl.metadata.deletion_file
        if fragment.HasField("deletion_file"):
            ours = fragment.deletion_file
            assert pl_file is not None, (what, fragment.id)
            assert ours.num_deleted_rows == pl_file.num_deleted_rows == len(vector)
            assert (ours.read_version, ours.id) == (pl_file.read_version, pl_file.id)
            expected_type = "bitmap" if ours.file_type == table_pb2.DeletionFile.BITMAP else "array"
            assert pl_file.file_type == expected_type
        else:
            assert pl_file is None, (what, fragment.id)

    assert snap.physical_rows == sum(f.metadata.physical_rows for f in pl_frags.values()), what
    assert snap.num_rows == ds.count_rows(), what
    assert set(snap.index_names) == {d.name for d in ds.describe_indices()}, what

    assert snap.field_names == ds.schema.names, what
    if HAVE_SCHEMA:
        assert snap.schema.equals(ds.schema, check_metadata=True), (what, snap.schema, ds.schema)

    txn = snap.transaction()
    assert txn is not None, what
    try:
        pl_txn = ds.read_transaction(version)
    except TypeError:
        # pylance 14.0.2 cannot convert a Rewrite that remapped indices to Python
        # (LanceOperation.RewrittenIndex.__init__() missing arguments).
        assert txn.WhichOneof("operation") == "rewrite" and txn.rewrite.rewritten_indices, what
    else:
        assert pl_txn is not None, what
        assert (txn.uuid, txn.read_version) == (pl_txn.uuid, pl_txn.read_version), what
    # pylance 14 stores the transaction inline and in _transactions/: both copies agree.
    if snap.manifest.transaction_file:
        from_file = read_transaction_file(snap.store, snap.base, snap.manifest.transaction_file)
        assert from_file == txn, what


def test_every_version_agrees_with_pylance(
    table: PylanceTable, opened: tuple[ObjectStore, str]
) -> None:
    store, base = opened
    locations = list_manifest_locations(store, base)
    seen_types: set[str] = set()
    seen_indices: set[str] = set()
    for location in locations:
        snap = load_snapshot(store, base, location)
        _check_version(table, snap, location.version)
        for fragment in snap.fragments:
            if fragment.HasField("deletion_file"):
                bitmap = fragment.deletion_file.file_type == table_pb2.DeletionFile.BITMAP
                seen_types.add("bin" if bitmap else "arrow")
        seen_indices.update(snap.index_names)
    # The history really covered what it claims (a fixture that stopped
    # producing .bin files or indices would otherwise pass silently).
    assert seen_types == table.deletion_file_types
    assert seen_indices == table.index_names
    if table.stable_row_ids:
        assert all(
            loc_snap.manifest.reader_feature_flags & 2
            for loc_snap in (load_snapshot(store, base, loc) for loc in locations)
        )


# ------------------------------------------------------------ every artifact


def test_every_manifest_reencodes_to_pylance_bytes(
    table: PylanceTable, opened: tuple[ObjectStore, str]
) -> None:
    store, base = opened
    for location in list_manifest_locations(store, base):
        original = store.get(location.key)
        decoded = read_manifest(store, location.key)
        assert (decoded.footer_major, decoded.footer_minor) == (0, 2)
        assert decoded.size == len(original)
        again = encode_manifest(
            decoded.manifest,
            indices=decoded.indices,
            transaction=decoded.transaction,
            footer_version=(decoded.footer_major, decoded.footer_minor),
        )
        # Identical except, at most, the order of map entries, which pylance
        # itself randomizes (Rust HashMap); see manifest_bytes_difference.
        assert manifest_bytes_difference(again, original) is None, location.key


_TXN_NAME = re.compile(r"^(\d+)-([0-9a-f-]{36})\.txn$")
_DELETION_NAME = re.compile(r"^(\d+)-(\d+)-(\d+)\.(arrow|bin)$")


def test_every_transaction_file_parses(
    table: PylanceTable, opened: tuple[ObjectStore, str]
) -> None:
    store, base = opened
    prefix = naming.join(base, naming.TRANSACTIONS_DIR) + "/"
    names = [meta.key[len(prefix) :] for meta in store.list(prefix)]
    named_by_manifests = {
        load_snapshot(store, base, loc).manifest.transaction_file
        for loc in list_manifest_locations(store, base)
    }
    assert named_by_manifests <= set(names)
    assert len(names) >= len(table.steps)
    for name in names:
        match = _TXN_NAME.match(name)
        assert match, name
        txn = read_transaction_file(store, base, name)
        assert txn.uuid == match.group(2)
        assert txn.read_version == int(match.group(1))
        assert txn.WhichOneof("operation") is not None


def test_every_deletion_file_parses(table: PylanceTable, opened: tuple[ObjectStore, str]) -> None:
    store, base = opened
    prefix = naming.join(base, naming.DELETIONS_DIR) + "/"
    files = [meta.key[len(prefix) :] for meta in store.list(prefix)]
    assert {name.rsplit(".", 1)[1] for name in files} == table.deletion_file_types
    for name in files:
        match = _DELETION_NAME.match(name)
        assert match, name
        fragment_id, read_version, file_id, ext = match.groups()
        deletion_file = table_pb2.DeletionFile(
            file_type=table_pb2.DeletionFile.BITMAP
            if ext == "bin"
            else table_pb2.DeletionFile.ARROW_ARRAY,
            read_version=int(read_version),
            id=int(file_id),
        )
        rows = read_deletion_vector(store, base, int(fragment_id), deletion_file)
        assert len(rows) > 0, name
        # Lance's choice of encoding: a bitmap only above 5,000 rows.
        assert (ext == "bin") == (len(rows) > 5000), (name, len(rows))


# ------------------------------------------------- listing: what is not a manifest


@pytest.fixture(params=["local", "s3"])
def simple(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[PylanceTable, ObjectStore, str]]:
    """A 3-version V2 table by pylance, and our store for it."""
    if request.param == "s3":
        aws: EmbeddedAws = request.getfixturevalue("aws")
        bucket: str = request.getfixturevalue("bucket")
        uri = f"s3://{bucket}/simple.lance"
        options: dict[str, str] | None = aws.pylance_storage_options()
    else:
        uri = str(tmp_path / "simple.lance")
        options = None
    table = build_simple_table(uri, appends=2, storage_options=options)
    store, base = open_object_store(uri, options)
    yield table, store, base
    close = getattr(store, "close", None)
    if close is not None:
        close()


def test_listing_skips_everything_but_final_manifests(
    simple: tuple[PylanceTable, ObjectStore, str],
) -> None:
    table, store, base = simple
    v3 = naming.manifest_key(base, 3, NamingScheme.V2)
    data = store.get(v3)
    store.put(naming.staged_manifest_key(base, 4, NamingScheme.V2), data)  # an unfinished commit
    store.put(naming.join(base, "_versions", "latest_version_hint.json"), b'{"version":9}')
    store.put(naming.join(base, "_versions", "notes.txt"), b"x")
    store.put(naming.join(base, "_versions", "d18446744073709551610.manifest"), data)  # detached
    assert table.versions() == [1, 2, 3]  # pylance ignores these files too
    # A manifest in a subdirectory is not one of this table's versions (pylance's
    # versions() lists recursively and would report it as a second "3").
    store.put(naming.join(base, "_versions", "sub", "5.manifest"), data)

    assert [loc.version for loc in list_manifest_locations(store, base)] == [1, 2, 3]
    latest = latest_manifest_location(store, base)
    assert latest is not None and latest.version == 3


def test_mixed_naming_schemes_are_refused(simple: tuple[PylanceTable, ObjectStore, str]) -> None:
    table, store, base = simple
    store.put(
        naming.manifest_key(base, 7, NamingScheme.V1),
        store.get(naming.manifest_key(base, 3, NamingScheme.V2)),
    )
    with pytest.raises(MixedNamingSchemesError) as info:
        list_manifest_locations(store, base)
    assert info.value.path == store.uri(naming.join(base, "_versions")) + "/"
    assert "V1" in str(info.value) and "V2" in str(info.value) and "7.manifest" in str(info.value)
    if not store.capabilities.lexically_ordered_list:
        # Without the V2-first shortcut every entry is seen, and refused, as in Lance.
        with pytest.raises(MixedNamingSchemesError):
            latest_manifest_location(store, base)
        with pytest.raises((OSError, ValueError), match="multiple manifest naming schemes"):
            table.dataset()


def test_latest_on_a_lexically_ordered_store_stops_at_the_first_entry(
    aws: EmbeddedAws, bucket: str
) -> None:
    options = aws.pylance_storage_options()
    table = build_simple_table(f"s3://{bucket}/lex.lance", appends=4, storage_options=options)
    client = boto3.client("s3", **aws.client_kwargs())
    pages: list[str] = []
    client.meta.events.register("before-call.s3.ListObjectsV2", lambda **kw: pages.append("page"))
    store = S3ObjectStore(bucket, client=client, page_size=1)
    latest = latest_manifest_location(store, table.base_key)
    assert latest is not None and latest.version == 5
    assert len(pages) == 1  # newest V2 name sorts first: no need to list the rest
    pages.clear()
    assert [loc.version for loc in list_manifest_locations(store, table.base_key)] == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert len(pages) >= 5


def test_missing_table_and_version_are_typed_errors(
    simple: tuple[PylanceTable, ObjectStore, str],
) -> None:
    _, store, base = simple
    missing = naming.join(base + "-missing")
    with pytest.raises(DatasetNotFoundError) as no_table:
        load_version(store, missing)
    assert no_table.value.uri == store.uri(missing)
    with pytest.raises(DatasetNotFoundError):
        load_version(store, missing, 1)
    with pytest.raises(VersionNotFoundError) as no_version:
        load_version(store, base, 99)
    assert (no_version.value.uri, no_version.value.version) == (store.uri(base), 99)
    assert "between 1 and 3" in str(no_version.value)
    gone = ManifestLocation(4, naming.manifest_key(base, 4, NamingScheme.V2), NamingScheme.V2)
    with pytest.raises(VersionNotFoundError, match="is missing"):
        load_snapshot(store, base, gone)


def test_manifest_under_the_wrong_name_is_refused(
    simple: tuple[PylanceTable, ObjectStore, str],
) -> None:
    _, store, base = simple
    v3 = naming.manifest_key(base, 3, NamingScheme.V2)
    store.put(v3, store.get(naming.manifest_key(base, 2, NamingScheme.V2)))
    with pytest.raises(
        ManifestFormatError, match="describes version 2, but its name says version 3"
    ):
        load_version(store, base)


def test_pylance_14_defaults(tmp_path: Path) -> None:
    """What the rest of the suite assumes about pylance 14 (fails if pylance changes)."""
    assert lance.__version__.startswith("14.")
    uri = str(tmp_path / "defaults.lance")
    lance.write_dataset(rows(0, 5, vectors=False), uri)  # no naming argument
    store, base = open_object_store(uri)
    locations = list_manifest_locations(store, base)
    assert [(loc.version, loc.scheme) for loc in locations] == [(1, NamingScheme.V2)]
    assert locations[0].key.endswith("/_versions/18446744073709551614.manifest")
    decoded = read_manifest(store, locations[0].key)
    assert (decoded.footer_major, decoded.footer_minor) == (0, 2)
    assert decoded.transaction is not None  # inline, and also in _transactions/
    assert decoded.manifest.transaction_file == f"0-{decoded.transaction.uuid}.txn"
    assert store.get(naming.join(base, "_versions", "latest_version_hint.json")) == b'{"version":1}'
