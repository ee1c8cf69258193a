"""Onboarding and backfill of tables written before the external store, under
concurrency, stale listings and cleanup gaps: no legacy manifest is
overwritten and no commit is acknowledged below the latest version."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from engine_helpers import (
    EngineTable,
    make_table,
    rows,
)
from engine_helpers import (
    lancetx_append as engine_append,
)
from interleavings import StaleListingStore
from protocol_helpers import (
    BOUNDARIES,
    Crash,
    CrashingHandler,
)

from lancetx.commit.engine.committer import Parent, load_parent
from lancetx.commit.errors import (
    InvalidCommitError,
)
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.manifest import read_manifest
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.memory import MemoryManifestStore

ROWS = 10
V2 = NamingScheme.V2


def _manifest_keys(store: ObjectStore, base: str) -> dict[int, str]:
    return {loc.version: loc.key for loc in list_manifest_locations(store, base)}


def _bytes_of(store: ObjectStore, keys: dict[int, str]) -> dict[int, bytes]:
    return {v: store.get(k) for v, k in keys.items()}


def _legacy_table(tmp_path: Path, versions: int) -> EngineTable:
    """A table written without DynamoDB: versions 1..``versions`` (5 rows each)."""
    return make_table(str(tmp_path / "t.lance"), sizes=(5,) * versions)


def _ext(
    entries: MemoryManifestStore, hidden: set[str] | None = None
) -> ExternalStoreCommitHandler:
    return ExternalStoreCommitHandler(StaleListingStore(LocalObjectStore("/"), hidden), entries)


def test_two_onboarders_racing_a_ddb_committer_on_stale_listings(tmp_path: Path) -> None:
    """A and B found the external store empty and onboard late, on listings that
    show only version 1, while C onboarded and committed through the store:
    first C's v4 is final, then C's v5 is claimed but its writer crashed before
    the copy. Nobody overwrites a manifest; the history stays linear."""
    table = _legacy_table(tmp_path, 3)
    entries = MemoryManifestStore()
    keys = _manifest_keys(table.handler.store, table.base)
    legacy_bytes = _bytes_of(table.handler.store, keys)
    stale = {keys[2], keys[3]}
    a, b, c = _ext(entries, stale), _ext(entries, stale), _ext(entries)

    c4 = engine_append(EngineTable(table.uri, None, replace(table.conn, handler=c)), rows(100, 5))
    assert c4.version == 4
    onboarded_a = a._onboard(table.base)  # A: "the store was empty" a moment ago
    assert onboarded_a is not None and onboarded_a.version == 4
    with pytest.raises(Crash):
        engine_append(
            EngineTable(
                table.uri,
                None,
                replace(
                    table.conn, handler=CrashingHandler(c.store, entries, BOUNDARIES["after_claim"])
                ),
            ),
            rows(200, 5),
            parent=c4,
        )
    onboarded_b = b._onboard(table.base)
    assert onboarded_b is not None and onboarded_b.version == 4
    parent_b = Parent(onboarded_b, read_manifest(b.store, onboarded_b.key))
    txn_b = EngineTable(table.uri, None, replace(table.conn, handler=b))
    done_b = engine_append(txn_b, rows(300, 5), parent=parent_b)
    assert done_b.version == 6 and done_b.attempts == 2

    after = _manifest_keys(table.handler.store, table.base)
    assert sorted(after) == [1, 2, 3, 4, 5, 6]
    assert _bytes_of(table.handler.store, {v: after[v] for v in (1, 2, 3)}) == legacy_bytes
    assert [e.version for e in entries.entries()] == [3, 4, 5, 6]
    assert table.values() == [*range(15), *range(100, 105), *range(200, 205), *range(300, 305)]


def test_stale_listing_hiding_the_latest_legacy_versions(tmp_path: Path) -> None:
    table = _legacy_table(tmp_path, 4)
    entries = MemoryManifestStore()
    keys = _manifest_keys(table.handler.store, table.base)
    legacy_bytes = _bytes_of(table.handler.store, keys)
    handler = _ext(entries, {keys[3], keys[4]})
    done = engine_append(
        EngineTable(table.uri, None, replace(table.conn, handler=handler)), rows(100, 5)
    )
    assert done.version == 5
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in range(1, 5)}) == legacy_bytes
    assert table.versions() == [1, 2, 3, 4, 5]


def test_pre_store_parent_is_backfilled_so_its_claim_loses(tmp_path: Path) -> None:
    """A writer holding a pre-onboarding version (v2) after the store was onboarded
    at v4: backfill records v2..v3, so its claim of v3 loses instead of
    overwriting the legacy v3 manifest."""
    table = _legacy_table(tmp_path, 4)
    entries = MemoryManifestStore()
    keys = _manifest_keys(table.handler.store, table.base)
    legacy_bytes = _bytes_of(table.handler.store, keys)
    handler = _ext(entries)
    assert handler.resolve_latest(table.base) is not None  # onboarded at v4
    old = load_parent(handler, table.base, 2)
    assert old is not None
    done = engine_append(
        EngineTable(table.uri, None, replace(table.conn, handler=handler)), rows(100, 5), parent=old
    )
    assert done.version == 5 and done.attempts == 2
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in range(1, 5)}) == legacy_bytes


def _cleanup_gap(tmp_path: Path) -> tuple[EngineTable, dict[int, bytes]]:
    """Legacy versions 1..5 whose v3 manifest was removed by a cleanup (v2 kept,
    e.g. tagged)."""
    table = _legacy_table(tmp_path, 5)
    keys = _manifest_keys(table.handler.store, table.base)
    table.handler.store.delete(keys[3])
    return table, _bytes_of(table.handler.store, {v: k for v, k in keys.items() if v != 3})


def test_time_travel_read_of_a_legacy_table_with_a_cleanup_gap_keeps_the_latest(
    tmp_path: Path,
) -> None:
    """The first thing a process does on a never-onboarded legacy table is read the
    old version 2. Backfill must not leave the store believing v2 is the latest
    (v4, v5 exist beyond the gap): a writer would claim v3, and later v4 and v5,
    overwriting legacy manifests."""
    table, legacy = _cleanup_gap(tmp_path)
    entries = MemoryManifestStore()
    handler = _ext(entries)
    assert load_parent(handler, table.base, 2) is not None
    latest = handler.resolve_latest(table.base)
    assert latest is not None and latest.version == 5
    done = engine_append(
        EngineTable(table.uri, None, replace(table.conn, handler=handler)), rows(100, 5)
    )
    assert done.version == 6
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in legacy}) == legacy


def test_commit_on_a_pre_store_parent_below_a_cleanup_gap_is_never_lost(
    tmp_path: Path,
) -> None:
    """Onboarded at v5; a writer commits on the old v2, whose successor v3 was
    cleaned up. Claiming v3 must not succeed: the commit would be acknowledged
    at a version below the latest, which no reader ever sees."""
    table, legacy = _cleanup_gap(tmp_path)
    entries = MemoryManifestStore()
    handler = _ext(entries)
    assert handler.resolve_latest(table.base) is not None  # onboarded at v5
    old = load_parent(handler, table.base, 2)
    assert old is not None
    try:
        done = engine_append(
            EngineTable(table.uri, None, replace(table.conn, handler=handler)),
            rows(100, 5),
            parent=old,
        )
    except InvalidCommitError as refused:
        assert "version 3" in str(refused)
        done = None  # refused: it cannot be checked against the deleted v3
    latest = handler.resolve_latest(table.base)
    assert latest is not None
    if done is not None:
        assert done.version == latest.version, (
            f"acknowledged at v{done.version}, but the latest is v{latest.version}"
        )
    else:
        assert latest.version == 5
    after = _manifest_keys(table.handler.store, table.base)
    assert _bytes_of(table.handler.store, {v: after[v] for v in legacy}) == legacy
