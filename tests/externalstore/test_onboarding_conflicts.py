"""Conflict detection across versions committed before the table used the
external store, when a stale listing hides them or a cleanup removed them."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import (
    delete_transaction,
    make_table,
    rows,
)
from engine_helpers import (
    lancetx_append as engine_append,
)
from interleavings import StaleListingStore

from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.commit.errors import (
    InvalidCommitError,
)
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.memory import MemoryManifestStore

ROWS = 10
V2 = NamingScheme.V2


def _manifest_keys(store: ObjectStore, base: str) -> dict[int, str]:
    return {loc.version: loc.key for loc in list_manifest_locations(store, base)}


def _ext(
    entries: MemoryManifestStore, hidden: set[str] | None = None
) -> ExternalStoreCommitHandler:
    return ExternalStoreCommitHandler(StaleListingStore(LocalObjectStore("/"), hidden), entries)


def test_stale_listing_cannot_hide_a_pre_store_version_from_conflict_checks(
    tmp_path: Path,
) -> None:
    """Ours deletes rows 5, 6 of fragment 0, planned at v2. Before the table used
    the external store, v3 deleted rows 0, 1 of the same fragment and v4
    appended. The store is onboarded at v4; the stale listing omits v3. Ours must
    still be checked against v3 (rebased: all four rows deleted), or its
    deletion file silently replaces v3's and rows 0, 1 come back."""
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))
    read = table.latest()
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)  # v3
    engine_append(table, rows(100, 5))  # v4
    keys = _manifest_keys(table.handler.store, table.base)
    handler = _ext(MemoryManifestStore(), {keys[3]})

    done = commit_transaction(handler, table.base, ours)

    assert done.version == 5
    assert table.values() == [2, 3, 4, 7, 8, 9, *range(10, 20), *range(100, 105)]


def test_a_cleaned_up_version_between_read_and_latest_is_refused_not_skipped(
    tmp_path: Path,
) -> None:
    """Any handler: the version right after ours' read version was cleaned up, so
    its transaction cannot be checked. The commit is refused; before, the gap
    was skipped and ours (planned without v3's deletions) resurrected rows."""
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))
    read = table.latest()
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)  # v3
    engine_append(table, rows(100, 5))  # v4
    table.handler.store.delete(_manifest_keys(table.handler.store, table.base)[3])

    with pytest.raises(InvalidCommitError, match=r"\[3\]"):
        commit_transaction(table.handler, table.base, ours)
    assert [loc.version for loc in table.handler.list_versions(table.base)] == [1, 2, 4]


def test_versions_up_to_the_parent_missing_from_a_stale_listing_are_refused(
    tmp_path: Path,
) -> None:
    """Conditional-PUT handler over a listing that lags: the caller holds v3 as
    parent (read by name), ours read v2, and the listing does not show v3 yet.
    Ours must not be committed unchecked against v3."""
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))
    read = table.latest()
    ours = delete_transaction(table, read, {0: [5, 6]}, "a in (5, 6)")
    table.commit(delete_transaction(table, read, {0: [0, 1]}, "a < 2"), parent=read)  # v3
    keys = _manifest_keys(table.handler.store, table.base)
    handler = ConditionalPutCommitHandler(StaleListingStore(LocalObjectStore("/"), {keys[3]}))
    parent = load_parent(handler, table.base, 3)

    with pytest.raises(InvalidCommitError, match=r"\[3\]"):
        commit_transaction(handler, table.base, ours, parent=parent)
    assert table.versions() == [1, 2, 3]
