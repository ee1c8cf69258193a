"""Which data files a commit of fragments written elsewhere references that are not
objects (``lancetx.verbs.writing._absent``): found by listing the directory, page by
page from the files' own keys, never by a request per file; a HEAD only confirms a
file the listing lacks; a store that cannot be listed reliably is asked file by file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from lancetx.commit.errors import ObjectStoreError
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
from lancetx.demo.embedded import (
    DEFAULT_REGION,
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    EmbeddedAws,
    InterceptedRequest,
    InterceptedResponse,
)
from lancetx.verbs.writing import _absent

pytestmark = pytest.mark.embedded_only

#: 40 data files with Lance-like names; the directory is listed 5 keys a page.
NAMES = [f"{i:08b}{i * 7919 % 1000:03d}.lance" for i in range(40)]


def _store(aws: EmbeddedAws, bucket: str, **kwargs: Any) -> S3ObjectStore:
    config = S3Config(
        endpoint_url=aws.endpoint,
        region=DEFAULT_REGION,
        access_key_id=FAKE_ACCESS_KEY,
        secret_access_key=FAKE_SECRET_KEY,
        max_attempts=1,
    )
    return S3ObjectStore(bucket, config=config, **kwargs)


@pytest.fixture
def seen(aws: EmbeddedAws) -> Iterator[list[InterceptedRequest]]:
    requests: list[InterceptedRequest] = []
    aws.set_interceptor(lambda request: requests.append(request) or None)
    try:
        yield requests
    finally:
        aws.set_interceptor(None)


@pytest.fixture
def store(aws: EmbeddedAws, bucket: str) -> S3ObjectStore:
    s = _store(aws, bucket, page_size=5)
    for name in NAMES:
        s.put(f"t.lance/data/{name}", b"x")
    s.put("t.lance/data0/not-data", b"x")  # a sibling prefix listing must not reach
    return s


def _files(store: Any, names: list[str]) -> list[tuple[str, Any, str]]:
    return [(name, store, f"t.lance/data/{name}") for name in names]


def _ops(seen: list[InterceptedRequest]) -> list[str]:
    return ["LIST" if r.method == "GET" and "list-type=2" in r.query else r.method for r in seen]


def test_files_on_one_page_cost_one_list(
    store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    chosen = sorted(NAMES)[10:14]
    assert _absent(_files(store, chosen)) == []
    assert _ops(seen) == ["LIST"]


def test_missing_files_are_found_across_pages_and_confirmed_by_head(
    store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    ordered = sorted(NAMES)
    chosen = [ordered[0], "0-gone.lance", ordered[7], ordered[23], ordered[39], "zz-gone.lance"]
    files = _files(store, chosen)
    absent = _absent(files)
    assert [path for path, _, _ in absent] == ["0-gone.lance", "zz-gone.lance"]
    ops = _ops(seen)
    # One page per group of nearby keys (never a walk through the 40 keys at 5 a page,
    # never more than one LIST per wanted key), a HEAD only for the two the listing lacks.
    assert ops.count("HEAD") == 2
    assert 1 <= ops.count("LIST") <= 5
    assert ops.count("LIST") < len(NAMES) // 5


def test_every_file_of_a_directory_is_found(
    store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    assert _absent(_files(store, list(reversed(NAMES)))) == []
    assert "HEAD" not in _ops(seen)
    # Every page once (a server may send one empty page at the end).
    assert len(NAMES) // 5 <= _ops(seen).count("LIST") <= len(NAMES) // 5 + 1


def test_a_refused_listing_falls_back_to_a_head_per_file(
    aws: EmbeddedAws, store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    denied = InterceptedResponse(403, b"<Error><Code>AccessDenied</Code></Error>")

    def refuse_lists(request: InterceptedRequest) -> InterceptedResponse | None:
        seen.append(request)
        return denied if "list-type=2" in request.query else None

    aws.set_interceptor(refuse_lists)
    absent = _absent(_files(store, [NAMES[3], "gone.lance"]))
    assert [path for path, _, _ in absent] == ["gone.lance"]
    assert sorted(_ops(seen)) == ["HEAD", "HEAD", "LIST"]


def test_a_store_that_may_list_stale_is_asked_file_by_file(
    aws: EmbeddedAws, bucket: str, store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    stale = _store(aws, bucket, consistent_list=False)
    absent = _absent(_files(stale, [NAMES[3], "gone.lance"]))
    assert [path for path, _, _ in absent] == ["gone.lance"]
    assert _ops(seen) == ["HEAD", "HEAD"]


def test_a_listing_that_lags_a_write_refuses_nothing(
    store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    """A file the listing does not show yet (an S3-compatible store whose listings lag)
    is asked for with a HEAD before it is called missing."""

    class Lagging(S3ObjectStore):
        def list_page(
            self, prefix: str, start_after: str = ""
        ) -> tuple[Sequence[ObjectMeta], bool]:
            found, more = super().list_page(prefix, start_after)
            return [m for m in found if not m.key.endswith(NAMES[5])], more

    lagging = Lagging(store.bucket, client=store.client, page_size=5)
    assert _absent(_files(lagging, [NAMES[5], NAMES[6]])) == []


def test_a_local_table_is_checked_file_by_file(tmp_path: Any) -> None:
    store = LocalObjectStore("/")
    base = str(tmp_path).strip("/")
    store.put(f"{base}/t.lance/data/{NAMES[0]}", b"x")
    files = [(name, store, f"{base}/t.lance/data/{name}") for name in (NAMES[0], "gone")]
    assert [path for path, _, _ in _absent(files)] == ["gone"]


def test_an_error_other_than_not_found_is_raised(aws: EmbeddedAws, store: S3ObjectStore) -> None:
    """A HEAD that fails for another reason does not pass for a missing file (nor for a
    present one): the error reaches the caller."""
    denied = InterceptedResponse(403, b"")
    aws.set_interceptor(lambda request: denied)
    try:
        with pytest.raises(ObjectStoreError, match="access denied"):
            _absent(_files(store, [NAMES[0]]))
    finally:
        aws.set_interceptor(None)
