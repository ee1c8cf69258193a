"""Base paths as locations (:mod:`lancetx.commit.format.bases`): the spellings pylance
writes are read as the same place, and a path that could walk up is refused."""

from __future__ import annotations

import os

import pytest

from lancetx.commit.errors import BasePathError
from lancetx.commit.format.bases import data_file_key, index_dir_key, key_in, parse_base
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.s3store import S3ObjectStore
from lancetx.protos import table_pb2


def _base(path: str, *, root: bool = True) -> table_pb2.BasePath:
    return table_pb2.BasePath(id=3, path=path, is_dataset_root=root)


@pytest.mark.parametrize(
    "path",
    [
        "s3://b/a/src.lance",
        "s3://b/a/src.lance/",
        "s3a://b/a/src.lance",
        "s3+ddb://b/a/src.lance?ddbTableName=T",  # what pylance's shallow_clone records
        "s3://b/a/%73rc.lance",
    ],
)
def test_the_spellings_of_one_s3_folder_are_one_place(path: str) -> None:
    root = parse_base(_base(path))
    assert (root.scheme, root.container, root.key) == ("s3", "b", "a/src.lance")
    assert data_file_key(root, "f.lance") == "a/src.lance/data/f.lance"
    assert index_dir_key(root, "u") == "a/src.lance/_indices/u/"
    store = S3ObjectStore("b")
    assert key_in(store, root, "a/src.lance/data/f.lance") == "a/src.lance/data/f.lance"
    assert key_in(S3ObjectStore("other"), root, "a/src.lance/data/f.lance") is None


def test_local_bases_relative_absolute_and_file_uris(tmp_path: os.PathLike[str]) -> None:
    store = LocalObjectStore("/")
    absolute = str(tmp_path) + "/src.lance"
    for path in (absolute, "file://" + absolute):
        root = parse_base(_base(path, root=False))
        assert root.key == absolute.lstrip("/")
        assert data_file_key(root, "f.lance") == absolute.lstrip("/") + "/f.lance"
        assert key_in(store, root, root.key) == root.key
    relative = parse_base(_base("rel/src.lance"))
    assert relative.key == os.path.abspath("rel/src.lance").lstrip("/")
    other = parse_base(_base("gs://bucket/t.lance"))
    assert not other.followable and key_in(store, other, "bucket/t.lance") is None


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("s3://b/a/../t.lance", "segment '..'"),
        ("s3://b/a/%2e%2e/t.lance", "segment '..'"),
        ("../t.lance", "'..' segment"),
        ("s3:///t.lance", "no bucket"),
        ("file://host/t.lance", "host 'host'"),
        ("", "empty"),
        ("s3://b/a\\..\\t", "backslash"),
    ],
)
def test_a_base_that_could_walk_up_or_names_no_place_is_refused(path: str, why: str) -> None:
    with pytest.raises(BasePathError, match=why.replace("\\", "\\\\")):
        parse_base(_base(path))
