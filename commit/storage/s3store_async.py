"""The object-store interface as coroutines, and its S3 implementation over aioboto3.

:class:`AsyncS3ObjectStore` behaves like :class:`~lancetx.commit.storage.s3store.S3ObjectStore`
request for request: the same S3 calls, the same legacy rule (never a
conditional header), and the same errors, because both translate botocore
failures with :func:`~lancetx.commit.storage.s3store.translate_s3_error`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from types import TracebackType
from typing import Any

from lancetx.commit.errors import MissingExtraError, ObjectNotFoundError

try:
    import aioboto3
    import aiohttp
    from aiobotocore.config import AioConfig
except ImportError as exc:  # the sync API never imports this module
    raise MissingExtraError("the asyncio S3 object store", "async", exc.name) from exc

from lancetx.commit.storage.limits import ReadLimits
from lancetx.commit.storage.objectstore import ObjectMeta, StoreCapabilities
from lancetx.commit.storage.s3_lean.gets import AsyncLeanGets
from lancetx.commit.storage.s3_lean.writes import AsyncLeanWrites
from lancetx.commit.storage.s3store import (
    DEFAULT_PAGE_SIZE,
    STREAM_CHUNK,
    S3Config,
    TailBuffer,
    check_key,
    check_range,
    ignored_range,
    invalid_range_total,
    is_ambiguous_conflict,
    legacy_put_if_not_exists_error,
    meta_from_copy,
    meta_from_head,
    meta_from_listing,
    range_of_response,
    refuse_conditional_headers,
    s3_uri,
    tail_of_response,
    translate_s3_error,
)

# Failures aiobotocore may let through unwrapped (e.g. a truncated body).
_ASYNC_TRANSIENT: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError)


class AsyncObjectStore(abc.ABC):
    """:class:`~lancetx.commit.storage.objectstore.ObjectStore` as coroutines; ``list`` returns a list."""

    capabilities: StoreCapabilities
    #: See :attr:`ObjectStore.read_limits <lancetx.commit.storage.objectstore.ObjectStore.read_limits>`.
    read_limits: ReadLimits | None = None

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """The full URI of ``key``, for messages."""

    @abc.abstractmethod
    async def get(self, key: str) -> bytes:
        """The whole object. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (fewer if the object ends first). Raises ObjectNotFoundError."""

    @abc.abstractmethod
    async def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes and the total size, in one request."""

    async def get_tail_bulk(self, key: str, length: int) -> tuple[bytes, int] | None:
        """See :meth:`~lancetx.commit.storage.objectstore.ObjectStore.get_tail_bulk`."""
        del key, length
        return None

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectMeta:
        """Metadata without the body. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    async def put(self, key: str, data: bytes) -> ObjectMeta:
        """Write (or overwrite) an object."""

    @abc.abstractmethod
    async def put_if_not_exists(self, key: str, data: bytes) -> ObjectMeta:
        """Create only if absent, atomically; ObjectExistsError if present,
        UnsupportedOperationError if ``capabilities.conditional_put`` is False."""

    @abc.abstractmethod
    async def copy(self, src: str, dst: str) -> ObjectMeta:
        """Server-side copy overwriting ``dst``. Raises ObjectNotFoundError if ``src`` is absent."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Delete; a missing object is not an error."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> list[ObjectMeta]:
        """Every object whose key starts with ``prefix``."""

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections."""

    async def __aenter__(self) -> AsyncObjectStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncS3ObjectStore(AsyncObjectStore):
    """Objects in one S3 bucket over aioboto3.

    The aioboto3 session is made from ``config`` (default: boto3's
    environment); its one S3 client is opened on first use and closed by
    :meth:`close` or ``async with``. The store belongs to the event loop it was
    first used on. ``legacy``, ``consistent_list`` and ``page_size`` mean what
    they mean for :class:`~lancetx.commit.storage.s3store.S3ObjectStore`; a legacy
    store's client also carries the ``before-send`` guard that refuses
    conditional headers.
    """

    def __init__(
        self,
        bucket: str,
        *,
        config: S3Config | None = None,
        legacy: bool = False,
        consistent_list: bool = True,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid S3 bucket name {bucket!r}")
        if not 1 <= page_size <= DEFAULT_PAGE_SIZE:
            raise ValueError(f"page_size must be in 1..{DEFAULT_PAGE_SIZE}, got {page_size}")
        self.bucket = bucket
        #: See :attr:`S3ObjectStore.table_uris`.
        self.table_uris: dict[str, str] = {}
        self.legacy = legacy
        self.page_size = page_size
        self.config = config or S3Config()
        self.capabilities = StoreCapabilities(
            conditional_put=not legacy,
            atomic_rename=False,
            lexically_ordered_list=True,
            consistent_list=consistent_list,
        )
        self._session = aioboto3.Session(**self.config.session_kwargs())
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._lean: AsyncLeanGets | None = None
        self._lean_writes: AsyncLeanWrites | None = None

    def __repr__(self) -> str:
        return f"AsyncS3ObjectStore({self.bucket!r}, legacy={self.legacy})"

    async def client(self) -> Any:
        """The aiobotocore S3 client, opened on first call (e.g. to register event handlers)."""
        if self._client is not None:
            return self._client
        async with self._open_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                client = await stack.enter_async_context(
                    self._session.client(
                        "s3",
                        config=AioConfig(**self.config.config_kwargs()),
                        **self.config.client_kwargs(),
                    )
                )
                if self.legacy:
                    client.meta.events.register(
                        "before-send.s3",
                        refuse_conditional_headers,
                        unique_id="lancetx-legacy-guard",
                    )
                self._stack, self._client = stack, client
        return self._client

    async def close(self) -> None:
        """Close the client (if opened). The store cannot be used afterwards."""
        async with self._open_lock:
            self._closed = True
            stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> AsyncS3ObjectStore:
        return self

    def uri(self, key: str) -> str:
        """See :meth:`S3ObjectStore.uri`."""
        return self.table_uris.get(key) or s3_uri(self.bucket, key)

    def name_table(self, base: str, uri: str) -> None:
        """See :meth:`S3ObjectStore.name_table`."""
        self.table_uris[base] = uri

    def _error(
        self, exc: Exception, operation: str, key: str, source_key: str | None = None
    ) -> Exception:
        mapped = translate_s3_error(
            exc,
            operation=operation,
            bucket=self.bucket,
            key=key,
            source_key=source_key,
            transient_types=_ASYNC_TRANSIENT,
        )
        return mapped if mapped is not None else exc

    @staticmethod
    async def _read(response: Any) -> bytes:
        async with response["Body"] as body:
            data: bytes = await body.read()
        return data

    async def get(self, key: str) -> bytes:
        """See :meth:`AsyncObjectStore.get`."""
        check_key(key)
        client = await self.client()
        try:
            response = await client.get_object(Bucket=self.bucket, Key=key)
            return await self._read(response)
        except Exception as exc:
            raise self._error(exc, "GetObject", key) from exc

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """See :meth:`AsyncObjectStore.get_range`."""
        check_key(key)
        check_range(start, end)
        if start == end:
            await self.head(key)
            return b""
        client = await self.client()
        try:
            response = await client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}"
            )
            body = await self._read(response)
        except Exception as exc:
            if invalid_range_total(exc) is not None:
                return b""
            raise self._error(exc, "GetObject", key) from exc
        return range_of_response(body, response.get("ContentRange"), start, end)

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """See :meth:`AsyncObjectStore.get_tail`."""
        check_key(key)
        if length < 0:
            raise ValueError(f"tail length must not be negative, got {length}")
        if length == 0:
            return b"", (await self.head(key)).size
        client = await self.client()
        try:
            response = await client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes=-{length}"
            )
            if ignored_range(response, length):
                # The whole object came back: keep its tail, never all of it.
                tail = TailBuffer(length)
                async with response["Body"] as stream:
                    while chunk := await stream.read(STREAM_CHUNK):
                        tail.feed(chunk)
                return tail.result()
            body = await self._read(response)
        except Exception as exc:
            total = invalid_range_total(exc)
            if total is None:
                raise self._error(exc, "GetObject", key) from exc
            return b"", total if total >= 0 else (await self.head(key)).size
        data, size = tail_of_response(body, response.get("ContentRange"), length)
        return data, size if size is not None else (await self.head(key)).size

    async def get_tail_bulk(self, key: str, length: int) -> tuple[bytes, int] | None:
        """See :meth:`S3ObjectStore.get_tail_bulk`: a lean GET (:mod:`.s3_lean`)."""
        check_key(key)
        client = await self.client()
        lean = self._lean
        if lean is None or lean.client is not client:
            lean = self._lean = AsyncLeanGets(client, self.bucket)
        return await lean.get_tail(key, length)

    async def _writes(self) -> AsyncLeanWrites:
        client = await self.client()
        lean = self._lean_writes
        if lean is None or lean.client is not client:
            lean = self._lean_writes = AsyncLeanWrites(client, self.bucket)
        return lean

    async def head(self, key: str) -> ObjectMeta:
        """See :meth:`AsyncObjectStore.head`."""
        check_key(key)
        client = await self.client()
        try:
            response = await client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            raise self._error(exc, "HeadObject", key) from exc
        return meta_from_head(key, response)

    async def put(self, key: str, data: bytes) -> ObjectMeta:
        """See :meth:`AsyncObjectStore.put` (a lean write first, as
        :meth:`S3ObjectStore.put <lancetx.commit.storage.s3store.S3ObjectStore.put>`)."""
        check_key(key)
        lean = await self._writes()
        client = await self.client()
        try:
            written = await lean.put(key, data)
            if written is not None:
                return written
            response = await client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            raise self._error(exc, "PutObject", key) from exc
        return ObjectMeta(key=key, size=len(data), etag=response.get("ETag"))

    async def put_if_not_exists(self, key: str, data: bytes) -> ObjectMeta:
        """As :meth:`S3ObjectStore.put_if_not_exists <lancetx.commit.storage.s3store.S3ObjectStore.put_if_not_exists>`."""
        check_key(key)
        if self.legacy:
            raise legacy_put_if_not_exists_error(self.bucket, key)
        client = await self.client()
        try:
            response = await client.put_object(
                Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*"
            )
        except Exception as exc:
            if is_ambiguous_conflict(exc):
                try:
                    # At most len(data) bytes: a larger object is not ours anyway.
                    tail, total = await self.get_tail(key, len(data))
                except ObjectNotFoundError:
                    tail, total = b"", -1
                if total == len(data) and tail == data:
                    return await self.head(key)
            raise self._error(exc, "PutObject", key) from exc
        return ObjectMeta(key=key, size=len(data), etag=response.get("ETag"))

    async def copy(self, src: str, dst: str) -> ObjectMeta:
        """See :meth:`AsyncObjectStore.copy`."""
        check_key(src)
        check_key(dst)
        lean = await self._writes()
        client = await self.client()
        try:
            copied = await lean.copy(src, dst)
            if copied is not None:
                return copied
            response = await client.copy_object(
                Bucket=self.bucket, Key=dst, CopySource={"Bucket": self.bucket, "Key": src}
            )
        except Exception as exc:
            raise self._error(exc, "CopyObject", dst, source_key=src) from exc
        return meta_from_copy(dst, response)

    async def delete(self, key: str) -> None:
        """See :meth:`AsyncObjectStore.delete`."""
        check_key(key)
        lean = await self._writes()
        client = await self.client()
        try:
            if await lean.delete(key):
                return
            await client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            mapped = self._error(exc, "DeleteObject", key)
            if isinstance(mapped, ObjectNotFoundError):
                return
            raise mapped from exc

    async def list(self, prefix: str) -> list[ObjectMeta]:
        """See :meth:`AsyncObjectStore.list`."""
        check_key(prefix, allow_empty=True)
        client = await self.client()
        result: list[ObjectMeta] = []
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": prefix,
            "MaxKeys": self.page_size,
        }
        while True:
            try:
                page = await client.list_objects_v2(**kwargs)
            except Exception as exc:
                raise self._error(exc, "ListObjectsV2", prefix) from exc
            result.extend(meta_from_listing(entry) for entry in page.get("Contents", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return result
            kwargs["ContinuationToken"] = token


__all__ = ["AsyncObjectStore", "AsyncS3ObjectStore"]
