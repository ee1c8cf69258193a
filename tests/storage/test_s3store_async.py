"""AsyncS3ObjectStore on the embedded moto server: the same behaviour as the
synchronous store, driven with asyncio.run (no pytest-asyncio)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from s3_helpers import s3_config as embedded_s3_config

from lancetx.commit.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    TransientObjectStoreError,
    UnsupportedOperationError,
)
from lancetx.commit.storage.s3store import UNKNOWN_SIZE, S3Config
from lancetx.commit.storage.s3store_async import AsyncObjectStore, AsyncS3ObjectStore
from lancetx.demo.embedded import (
    EmbeddedAws,
    InterceptedRequest,
    InterceptedResponse,
)

T = TypeVar("T")

ACCESS_DENIED = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
UNAVAILABLE = b"<Error><Code>ServiceUnavailable</Code><Message>Slow down</Message></Error>"


def s3_config(endpoint: str, **overrides: Any) -> S3Config:
    """The embedded server's configuration, retrying little (these tests count attempts)."""
    return embedded_s3_config(
        endpoint, **{"max_attempts": 2, "max_pool_connections": 32, **overrides}
    )


def run(store: AsyncS3ObjectStore, body: Callable[[AsyncS3ObjectStore], Awaitable[T]]) -> T:
    """Run ``body(store)`` in a fresh event loop and close the store afterwards."""

    async def main() -> T:
        async with store:
            return await body(store)

    return asyncio.run(main())


@pytest.fixture
def make(aws: EmbeddedAws, bucket: str) -> Callable[..., AsyncS3ObjectStore]:
    def factory(**kwargs: Any) -> AsyncS3ObjectStore:
        config = kwargs.pop("config", None) or s3_config(aws.endpoint)
        return AsyncS3ObjectStore(bucket, config=config, **kwargs)

    return factory


@pytest.fixture
def intercept(aws: EmbeddedAws) -> Iterator[EmbeddedAws]:
    try:
        yield aws
    finally:
        aws.set_interceptor(None)


class Recorder:
    """``before-send`` handler recording each request's operation and header names."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, list[str]]] = []

    def __call__(self, request: Any, event_name: str, **_: Any) -> None:
        self.requests.append((event_name.rsplit(".", 1)[-1], [k.lower() for k in request.headers]))

    def conditional(self) -> list[tuple[str, str]]:
        return [
            (op, name)
            for op, names in self.requests
            for name in names
            if name in ("if-none-match", "if-match") or name.startswith("x-amz-copy-source-if-")
        ]


def test_is_an_async_object_store(make: Callable[..., AsyncS3ObjectStore]) -> None:
    store = make()
    assert isinstance(store, AsyncObjectStore)
    assert store.capabilities.conditional_put and store.capabilities.lexically_ordered_list
    assert store.uri("a/b") == f"s3://{store.bucket}/a/b"


def test_roundtrip(make: Callable[..., AsyncS3ObjectStore]) -> None:
    async def body(store: AsyncS3ObjectStore) -> None:
        put = await store.put("t/obj", b"0123456789")
        assert put.size == 10
        assert await store.get("t/obj") == b"0123456789"
        await store.put("t/obj", b"abcdefghij")  # overwrite
        assert await store.get("t/obj") == b"abcdefghij"
        assert await store.get_range("t/obj", 2, 5) == b"cde"
        assert await store.get_range("t/obj", 8, 100) == b"ij"
        assert await store.get_range("t/obj", 20, 30) == b""
        assert await store.get_range("t/obj", 3, 3) == b""
        assert await store.get_tail("t/obj", 3) == (b"hij", 10)
        assert await store.get_tail("t/obj", 64) == (b"abcdefghij", 10)  # longer than the object
        assert await store.get_tail("t/obj", 0) == (b"", 10)
        await store.put("t/empty", b"")
        assert await store.get_tail("t/empty", 5) == (b"", 0)
        meta = await store.head("t/obj")
        assert meta.size == 10 and meta.etag and meta.last_modified is not None
        copied = await store.copy("t/obj", "t/copy")
        assert copied.size == UNKNOWN_SIZE and copied.etag == meta.etag
        assert await store.get("t/copy") == b"abcdefghij"
        await store.delete("t/copy")
        await store.delete("t/copy")  # missing: fine
        with pytest.raises(ObjectNotFoundError):
            await store.head("t/copy")

    run(make(), body)


def test_missing_objects(make: Callable[..., AsyncS3ObjectStore]) -> None:
    async def body(store: AsyncS3ObjectStore) -> None:
        for call in (
            store.get("t/none"),
            store.get_range("t/none", 0, 4),
            store.get_tail("t/none", 4),
            store.head("t/none"),
        ):
            with pytest.raises(ObjectNotFoundError) as info:
                await call
            assert f"s3://{store.bucket}/t/none" in str(info.value)
        with pytest.raises(ObjectNotFoundError) as copy_info:
            await store.copy("t/none", "t/dst")
        assert copy_info.value.uri == store.uri("t/none")

    run(make(), body)


@pytest.mark.parametrize("key", ["with space/a b.bin", "unicodé/日本/ß.manifest"])
def test_odd_keys(make: Callable[..., AsyncS3ObjectStore], key: str) -> None:
    async def body(store: AsyncS3ObjectStore) -> None:
        await store.put(key, b"odd")
        assert await store.get(key) == b"odd"
        assert [m.key for m in await store.list(key.split("/")[0] + "/")] == [key]

    run(make(), body)


def test_list_paginates(make: Callable[..., AsyncS3ObjectStore]) -> None:
    keys = [f"t/_versions/{n:020d}.manifest" for n in (3, 1, 5, 2, 4)]
    recorder = Recorder()

    async def body(store: AsyncS3ObjectStore) -> list[str]:
        for key in keys:
            await store.put(key, b"m")
        await store.put("t/data/x", b"d")
        (await store.client()).meta.events.register("before-send.s3", recorder)
        return [m.key for m in await store.list("t/_versions/")]

    assert run(make(page_size=2), body) == sorted(keys)
    assert [op for op, _ in recorder.requests] == ["ListObjectsV2"] * 3


def test_put_if_not_exists_race_has_one_winner(make: Callable[..., AsyncS3ObjectStore]) -> None:
    async def body(store: AsyncS3ObjectStore) -> tuple[list[Any], bytes]:
        results = await asyncio.gather(
            *(
                store.put_if_not_exists("race/_versions/1.manifest", f"writer {i}".encode())
                for i in range(16)
            ),
            return_exceptions=True,
        )
        return list(results), await store.get("race/_versions/1.manifest")

    results, stored = run(make(), body)
    winners = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, ObjectExistsError)]
    assert len(winners) == 1 and len(losers) == 15
    assert stored == f"writer {winners[0]}".encode()


def test_legacy_store_never_sends_a_conditional_header(
    legacy_aws: EmbeddedAws, bucket: str
) -> None:
    store = AsyncS3ObjectStore(bucket, config=s3_config(legacy_aws.endpoint), legacy=True)
    assert store.capabilities.conditional_put is False
    recorder = Recorder()

    async def body(store: AsyncS3ObjectStore) -> None:
        (await store.client()).meta.events.register("before-send.s3", recorder)
        await store.put("t/a", b"0123456789")
        await store.get("t/a")
        await store.get_range("t/a", 1, 3)
        await store.get_tail("t/a", 4)
        await store.head("t/a")
        await store.copy("t/a", "t/_versions/1.manifest")
        await store.list("t/")
        await store.delete("t/a")
        sent = len(recorder.requests)
        with pytest.raises(UnsupportedOperationError, match=r"s3\+ddb://"):
            await store.put_if_not_exists("t/_versions/2.manifest", b"m")
        assert len(recorder.requests) == sent
        client = await store.client()
        with pytest.raises(UnsupportedOperationError):  # the guard on the client itself
            await client.put_object(Bucket=bucket, Key="t/k", Body=b"x", IfNoneMatch="*")

    run(store, body)
    ops = {op for op, _ in recorder.requests}
    assert {
        "PutObject",
        "GetObject",
        "HeadObject",
        "CopyObject",
        "DeleteObject",
        "ListObjectsV2",
    } <= ops
    assert recorder.conditional() == []


def test_recorder_sees_if_none_match_on_a_modern_store(
    make: Callable[..., AsyncS3ObjectStore],
) -> None:
    recorder = Recorder()

    async def body(store: AsyncS3ObjectStore) -> None:
        (await store.client()).meta.events.register("before-send.s3", recorder)
        await store.put_if_not_exists("t/_versions/1.manifest", b"m")

    run(make(), body)
    assert recorder.conditional() == [("PutObject", "if-none-match")]


def test_persistent_503_is_transient(
    intercept: EmbeddedAws, make: Callable[..., AsyncS3ObjectStore]
) -> None:
    gets: list[str] = []

    def unavailable(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.method == "GET":
            gets.append(request.path)
            return InterceptedResponse(503, UNAVAILABLE)
        return None

    async def body(store: AsyncS3ObjectStore) -> None:
        await store.put("t/obj", b"x")
        intercept.set_interceptor(unavailable)
        with pytest.raises(TransientObjectStoreError, match="GetObject s3://"):
            await store.get("t/obj")

    run(make(), body)
    assert len(gets) == 2


def test_access_denied_names_action_and_arn(
    intercept: EmbeddedAws, make: Callable[..., AsyncS3ObjectStore]
) -> None:
    intercept.set_interceptor(lambda r: InterceptedResponse(403, ACCESS_DENIED))

    async def body(store: AsyncS3ObjectStore) -> None:
        with pytest.raises(ObjectStoreError) as info:
            await store.get("t/obj")
        assert not isinstance(info.value, TransientObjectStoreError)
        assert f"s3:GetObject on arn:aws:s3:::{store.bucket}/t/obj" in str(info.value)
        with pytest.raises(ObjectStoreError, match="s3:ListBucket"):
            await store.list("t/")

    run(make(), body)


def test_ambiguous_conditional_create_is_resolved(
    intercept: EmbeddedAws, make: Callable[..., AsyncS3ObjectStore]
) -> None:
    puts: list[str] = []

    def lose_first_response(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.method != "PUT":
            return None
        puts.append(request.path)
        if len(puts) == 1:
            return InterceptedResponse(503, UNAVAILABLE, after_forwarding=True)
        return None

    async def body(store: AsyncS3ObjectStore) -> bytes:
        intercept.set_interceptor(lose_first_response)
        await store.put_if_not_exists("t/_versions/1.manifest", b"ours")
        return await store.get("t/_versions/1.manifest")

    assert run(make(), body) == b"ours"
    assert len(puts) == 2


def test_closed_store_refuses_requests(make: Callable[..., AsyncS3ObjectStore]) -> None:
    async def body() -> None:
        store = make()
        await store.put("k", b"v")
        await store.close()
        with pytest.raises(RuntimeError, match="closed"):
            await store.get("k")

    asyncio.run(body())


def test_endpoint_from_environment(
    aws: EmbeddedAws, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws.endpoint)
    store = AsyncS3ObjectStore(bucket, config=S3Config(max_attempts=1, connect_timeout=2))

    async def body(store: AsyncS3ObjectStore) -> bytes:
        await store.put("env/k", b"from env")
        return await store.get("env/k")

    assert run(store, body) == b"from env"
