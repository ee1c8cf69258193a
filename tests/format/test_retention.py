"""The cleanup horizon and the file-name checks every maintenance tool applies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lancetx.commit.format.naming import unsafe_relative_path, unsafe_transaction_file_name
from lancetx.commit.format.retention import (
    TagFileError,
    cleanup_horizon,
    read_tags,
    removed_versions,
)
from lancetx.commit.storage.stores import open_object_store


def test_the_horizon_is_the_oldest_untagged_version_with_a_manifest() -> None:
    assert cleanup_horizon([], set()) is None
    assert cleanup_horizon([2, 5, 6], {2}) == 5
    assert cleanup_horizon([3, 4], set()) == 3
    assert cleanup_horizon([2, 6], {2, 6}) == 6  # all tagged: the latest


def test_removed_versions_are_below_the_horizon_and_without_a_manifest(tmp_path: Path) -> None:
    store, base = open_object_store(str(tmp_path / "t.lance"), {})
    for version in (2, 5, 6):
        store.put(f"{base}/_versions/{version}.manifest", b"m")
    store.put(f"{base}/_refs/tags/gold.json", json.dumps({"version": 2}).encode())
    assert removed_versions(store, base, [1, 3, 4, 7]) == {1, 3, 4}
    assert [t.version for t in read_tags(store, base)] == [2]
    store.put(f"{base}/_refs/tags/bad.json", b'{"version": "two"}')
    with pytest.raises(TagFileError, match=r"bad\.json"):
        read_tags(store, base)
    # An unreadable tag counts as none: the horizon drops to 2, fewer are removed.
    assert removed_versions(store, base, [1, 3, 4]) == {1}


@pytest.mark.parametrize(
    "path",
    ["", "/abs.lance", "../x.lance", "a/../../x", "a//b", "./x", "s3://b/x", "c:x", "a\\..\\x",
     "%2e%2e/x", "a/%2E%2E/x", "a%2fb"],
)  # fmt: skip
def test_unsafe_relative_paths_are_named(path: str) -> None:
    assert unsafe_relative_path(path) is not None


@pytest.mark.parametrize("path", ["x.lance", "0101-abc.lance", "sub/x.lance", "a.b..c.lance"])
def test_ordinary_paths_pass(path: str) -> None:
    assert unsafe_relative_path(path) is None


def test_transaction_file_names_stay_in_their_folder() -> None:
    assert unsafe_transaction_file_name("3-0c2d.txn") is None
    assert unsafe_transaction_file_name("sub/3.txn") is not None
    assert unsafe_transaction_file_name("../b.lance/_transactions/3.txn") is not None
