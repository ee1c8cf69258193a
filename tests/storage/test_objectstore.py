"""The ObjectStore contract, run against every store, plus the local store's
crash safety and URI resolution (open_object_store)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from lancetx.commit.errors import (
    InvalidUriError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    StorageOptionError,
)
from lancetx.commit.storage.localstore import TEMP_MARKER, LocalObjectStore, is_temp_name, temp_name
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.commit.storage.s3store import UNKNOWN_SIZE, S3Config, S3ObjectStore
from lancetx.commit.storage.stores import open_object_store
from lancetx.demo.embedded import DEFAULT_REGION, FAKE_ACCESS_KEY, FAKE_SECRET_KEY

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

ODD_KEYS = ["with space/a b.bin", "unicodé/日本/ß.manifest", "plus+and%percent/x=1&y"]


def s3_config(endpoint: str, **overrides: object) -> S3Config:
    values: dict[str, object] = {
        "endpoint_url": endpoint,
        "region": DEFAULT_REGION,
        "access_key_id": FAKE_ACCESS_KEY,
        "secret_access_key": FAKE_SECRET_KEY,
        "max_attempts": 2,
        "max_pool_connections": 32,
    }
    values.update(overrides)
    return S3Config(**values)  # type: ignore[arg-type]


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> ObjectStore:
    """Each contract test runs on the local store and on S3 (moto over HTTP)."""
    if request.param == "local":
        return LocalObjectStore(str(tmp_path))
    aws = request.getfixturevalue("aws")
    bucket = request.getfixturevalue("bucket")
    return S3ObjectStore(bucket, config=s3_config(aws.endpoint))


# ------------------------------------------------------------------ contract


def test_put_get_overwrite(store: ObjectStore) -> None:
    meta = store.put("t/data/a.bin", b"first")
    assert (meta.key, meta.size) == ("t/data/a.bin", 5)
    assert store.get("t/data/a.bin") == b"first"
    store.put("t/data/a.bin", b"second, longer")
    assert store.get("t/data/a.bin") == b"second, longer"
    store.put("t/empty", b"")
    assert store.get("t/empty") == b""


def test_get_missing_names_the_uri(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError) as info:
        store.get("t/missing.bin")
    assert store.uri("t/missing.bin") in str(info.value)
    assert info.value.uri == store.uri("t/missing.bin")
    for call in (
        lambda: store.get_range("t/missing.bin", 0, 4),
        lambda: store.get_range("t/missing.bin", 2, 2),
        lambda: store.get_tail("t/missing.bin", 4),
        lambda: store.get_tail("t/missing.bin", 0),
        lambda: store.head("t/missing.bin"),
    ):
        with pytest.raises(ObjectNotFoundError):
            call()


def test_get_range(store: ObjectStore) -> None:
    store.put("r", b"0123456789")
    assert store.get_range("r", 0, 10) == b"0123456789"
    assert store.get_range("r", 2, 5) == b"234"
    assert store.get_range("r", 9, 10) == b"9"
    assert store.get_range("r", 4, 4) == b""
    assert store.get_range("r", 7, 100) == b"789"  # the object ends first
    assert store.get_range("r", 10, 20) == b""  # starts at the end
    assert store.get_range("r", 50, 60) == b""  # starts past the end
    with pytest.raises(ValueError):
        store.get_range("r", 5, 4)
    with pytest.raises(ValueError):
        store.get_range("r", -1, 4)


def test_get_tail(store: ObjectStore) -> None:
    store.put("tail", b"0123456789")
    assert store.get_tail("tail", 3) == (b"789", 10)
    assert store.get_tail("tail", 10) == (b"0123456789", 10)
    assert store.get_tail("tail", 64) == (b"0123456789", 10)  # longer than the object
    assert store.get_tail("tail", 0) == (b"", 10)
    store.put("empty", b"")
    assert store.get_tail("empty", 8) == (b"", 0)
    with pytest.raises(ValueError):
        store.get_tail("tail", -1)


def test_head_size_and_etag(store: ObjectStore) -> None:
    put = store.put("h/obj", b"abcdef")
    meta = store.head("h/obj")
    assert (meta.key, meta.size) == ("h/obj", 6)
    assert meta.etag is not None and meta.etag == put.etag
    assert meta.last_modified is not None
    store.put("h/obj", b"abcdefgh")
    changed = store.head("h/obj")
    assert changed.size == 8 and changed.etag != meta.etag


def test_copy(store: ObjectStore) -> None:
    store.put("c/src", b"payload")
    store.put("c/dst", b"old contents to be replaced")
    meta = store.copy("c/src", "c/dst")
    assert meta.key == "c/dst"
    assert meta.size in (7, UNKNOWN_SIZE)  # S3 CopyObject does not report the size
    assert meta.etag is not None
    assert store.get("c/dst") == b"payload"
    assert store.get("c/src") == b"payload"
    assert store.head("c/dst").size == 7
    assert store.copy("c/src", "c/new/deeper/dst").key == "c/new/deeper/dst"
    assert store.get("c/new/deeper/dst") == b"payload"


def test_copy_missing_source_names_the_source(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError) as info:
        store.copy("c/nope", "c/dst")
    assert info.value.uri == store.uri("c/nope")
    with pytest.raises(ObjectNotFoundError):
        store.head("c/dst")


def test_delete_and_delete_missing(store: ObjectStore) -> None:
    store.put("d/x", b"1")
    store.delete("d/x")
    with pytest.raises(ObjectNotFoundError):
        store.get("d/x")
    store.delete("d/x")  # already gone: fine
    store.delete("d/never/existed")


def test_list_recursive_with_prefix(store: ObjectStore) -> None:
    keys = [
        "t/_versions/1.manifest",
        "t/_versions/2.manifest",
        "t/data/f.lance",
        "t/data/g/h.lance",
    ]
    for key in [*keys, "tx/other", "u/unrelated"]:
        store.put(key, key.encode())
    assert sorted(m.key for m in store.list("t/")) == sorted(keys)
    assert sorted(m.key for m in store.list("t/_versions/")) == keys[:2]
    # A prefix need not end at a directory boundary.
    assert sorted(m.key for m in store.list("t/_ver")) == keys[:2]
    assert sorted(m.key for m in store.list("t")) == sorted([*keys, "tx/other"])
    assert list(store.list("nothing/here/")) == []
    sizes = {m.key: m.size for m in store.list("t/data/")}
    assert sizes == {"t/data/f.lance": 14, "t/data/g/h.lance": 16}


@pytest.mark.parametrize("key", ODD_KEYS)
def test_keys_with_spaces_and_unicode(store: ObjectStore, key: str) -> None:
    store.put(key, b"odd")
    assert store.get(key) == b"odd"
    assert store.head(key).size == 3
    assert [m.key for m in store.list(key.split("/")[0] + "/")] == [key]
    store.copy(key, key + ".copy")
    assert store.get(key + ".copy") == b"odd"
    store.delete(key)
    with pytest.raises(ObjectNotFoundError):
        store.head(key)


def test_put_if_not_exists(store: ObjectStore) -> None:
    assert store.capabilities.conditional_put
    meta = store.put_if_not_exists("p/v1", b"mine")
    assert meta.size == 4
    with pytest.raises(ObjectExistsError) as info:
        store.put_if_not_exists("p/v1", b"theirs")
    assert store.uri("p/v1") in str(info.value)
    assert store.get("p/v1") == b"mine"


def test_put_if_not_exists_race_has_one_winner(store: ObjectStore) -> None:
    n = 16
    barrier = threading.Barrier(n)
    winners: list[int] = []
    losers: list[int] = []
    errors: list[BaseException] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            store.put_if_not_exists("race/_versions/7.manifest", f"writer {i}".encode())
            winners.append(i)
        except ObjectExistsError:
            losers.append(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(winners) == 1 and len(losers) == n - 1
    assert store.get("race/_versions/7.manifest") == f"writer {winners[0]}".encode()
    assert [m.key for m in store.list("race/")] == ["race/_versions/7.manifest"]


def test_keys_are_root_relative(store: ObjectStore) -> None:
    with pytest.raises(ValueError):
        store.put("/absolute", b"x")
    with pytest.raises(ValueError):
        store.get("")


# ------------------------------------------------------------------ local store


def test_local_capabilities_and_uri(tmp_path: object) -> None:
    store = LocalObjectStore(str(tmp_path))
    caps = store.capabilities
    assert (caps.conditional_put, caps.atomic_rename, caps.lexically_ordered_list) == (
        True,
        True,
        False,
    )
    assert store.uri("a/b") == f"file://{tmp_path}/a/b"
    assert LocalObjectStore("/").uri("tmp/x") == "file:///tmp/x"


def test_local_keys_cannot_escape_the_root(tmp_path: object) -> None:
    store = LocalObjectStore(os.path.join(str(tmp_path), "root"))
    with pytest.raises(ValueError):
        store.put("../outside", b"x")
    assert not os.path.exists(os.path.join(str(tmp_path), "outside"))


def test_local_put_is_written_under_root(tmp_path: object) -> None:
    store = LocalObjectStore(str(tmp_path))
    store.put("deep/er/file", b"z")
    with open(os.path.join(str(tmp_path), "deep", "er", "file"), "rb") as f:
        assert f.read() == b"z"


def _half_then_fail(real_write: Callable[[int, bytes], int]) -> Callable[[int, bytes], int]:
    def write(fd: int, data: bytes) -> int:
        if len(data) > 1:
            real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    return write


def _files_under(root: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


@pytest.mark.parametrize("method", ["put", "put_if_not_exists"])
def test_local_failed_write_leaves_no_partial_object(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    root = str(tmp_path)
    store = LocalObjectStore(root)
    with monkeypatch.context() as m:
        m.setattr(os, "write", _half_then_fail(os.write))
        with pytest.raises(ObjectStoreError, match="No space left"):
            getattr(store, method)("t/_versions/1.manifest", b"x" * 4096)
    with pytest.raises(ObjectNotFoundError):
        store.get("t/_versions/1.manifest")
    assert _files_under(root) == []  # the temporary file was removed too
    assert list(store.list("t/")) == []


def test_local_failed_overwrite_keeps_the_old_object(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalObjectStore(str(tmp_path))
    store.put("t/obj", b"old and complete")
    with monkeypatch.context() as m:
        m.setattr(os, "write", _half_then_fail(os.write))
        with pytest.raises(ObjectStoreError):
            store.put("t/obj", b"new" * 1000)
    assert store.get("t/obj") == b"old and complete"
    assert [meta.key for meta in store.list("t/")] == ["t/obj"]


def test_local_crash_before_rename_leaves_only_an_invisible_temp_file(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed between writing and renaming cannot clean up: the
    temporary file stays on disk, but no reader or listing ever sees it."""
    root = str(tmp_path)
    store = LocalObjectStore(root)

    class Killed(BaseException):
        pass

    def killed(*args: object, **kwargs: object) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(os, "replace", killed)
        m.setattr(os, "unlink", lambda *a, **k: None)  # a dead process removes nothing
        with pytest.raises(Killed):
            store.put("t/_versions/2.manifest", b"complete bytes")
    left = _files_under(root)
    assert len(left) == 1 and TEMP_MARKER in left[0]  # the crash really left a temp file
    assert is_temp_name(os.path.basename(left[0]))
    with pytest.raises(ObjectNotFoundError):
        store.head("t/_versions/2.manifest")
    assert list(store.list("t/")) == []
    assert list(store.list("")) == []


def test_temp_names_are_unmistakable() -> None:
    name = temp_name("1.manifest")
    assert name.startswith(".1.manifest" + TEMP_MARKER)
    assert is_temp_name(name)
    assert not is_temp_name("1.manifest")
    assert not is_temp_name(".hidden")


def test_local_listing_skips_directories_and_follows_deletes(tmp_path: object) -> None:
    store = LocalObjectStore(str(tmp_path))
    os.makedirs(os.path.join(str(tmp_path), "t", "emptydir"))
    store.put("t/a", b"1")
    assert [m.key for m in store.list("t/")] == ["t/a"]
    with pytest.raises(ObjectNotFoundError):
        store.get("t/emptydir")
    with pytest.raises(ObjectNotFoundError):
        store.head("t/emptydir")


# ------------------------------------------------------------ open_object_store


@pytest.mark.parametrize(
    ("uri", "base"),
    [
        ("file:///a/b", "a/b"),
        ("file:///a/b/", "a/b"),
        ("file://localhost/a/b", "a/b"),
        ("file:///tmp/with%20space/t.lance", "tmp/with space/t.lance"),
        ("/a/b", "a/b"),
        ("/a/b/", "a/b"),
        ("/tmp/with%20literal", "tmp/with%20literal"),
        ("/", ""),
    ],
)
def test_open_local(uri: str, base: str) -> None:
    store, key = open_object_store(uri)
    assert isinstance(store, LocalObjectStore) and store.root == "/"
    assert key == base


def test_open_relative_path_is_made_absolute(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(str(tmp_path))
    store, key = open_object_store("rel/t.lance")
    assert isinstance(store, LocalObjectStore)
    assert "/" + key == os.path.join(str(tmp_path), "rel", "t.lance")


@pytest.mark.parametrize(
    ("uri", "bucket", "base"),
    [
        ("s3://bkt/a/b", "bkt", "a/b"),
        ("s3://bkt/a/b/", "bkt", "a/b"),
        ("s3://bkt", "bkt", ""),
        ("s3://bkt/", "bkt", ""),
        ("s3://bkt/my%20table/t.lance", "bkt", "my table/t.lance"),
        ("s3+ddb://bkt/a/b?ddbTableName=T", "bkt", "a/b"),
        ("s3+ddb://bkt/a/b/?ddbTableName=T", "bkt", "a/b"),
    ],
)
def test_open_s3(uri: str, bucket: str, base: str) -> None:
    store, key = open_object_store(uri, {"aws_region": "us-east-1"})
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, key) == (bucket, base)
    assert store.legacy is False and store.capabilities.conditional_put


@pytest.mark.parametrize(
    ("options", "legacy", "expected"),
    [
        ({}, None, False),
        ({"lancetx_legacy_s3": "true"}, None, True),
        ({"LANCETX_LEGACY_S3": "1"}, None, True),
        ({"lancetx_legacy_s3": "false"}, None, False),
        ({"lancetx_legacy_s3": "true"}, False, False),  # the argument wins
        ({}, True, True),
    ],
)
def test_open_s3_legacy(options: dict[str, str], legacy: bool | None, expected: bool) -> None:
    store, _ = open_object_store("s3+ddb://bkt/t?ddbTableName=T", options, legacy=legacy)
    assert isinstance(store, S3ObjectStore)
    assert store.legacy is expected
    assert store.capabilities.conditional_put is not expected


def test_open_s3_consistent_list_option() -> None:
    store, _ = open_object_store("s3://bkt/t", {"lancetx_consistent_list": "false"})
    assert store.capabilities.consistent_list is False
    store, _ = open_object_store("s3://bkt/t")
    assert store.capabilities.consistent_list is True


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://bkt/t", "supported: file://, s3://, s3\\+ddb://"),
        ("az://c/t", "unsupported URI scheme 'az'"),
        ("s3:///t", "no bucket"),
        ("file://otherhost/t", "host"),
        ("", "empty"),
    ],
)
def test_open_rejects(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        open_object_store(uri)
    assert isinstance(info.value, InvalidUriError) and info.value.uri == uri


def test_open_rejects_bad_legacy_option() -> None:
    with pytest.raises(ValueError, match="lancetx_legacy_s3") as info:
        open_object_store("s3://bkt/t", {"lancetx_legacy_s3": "maybe"})
    assert isinstance(info.value, StorageOptionError)
