"""Lean writes: ``PutObject``, ``CopyObject`` and ``DeleteObject`` without botocore's
per-request pipeline.

A commit through DynamoDB writes its transaction file and its staged manifest, copies
the staged manifest to its final name and deletes the staged one: four S3 requests of
its six, at ~4-5 ms of botocore CPU each on this project's benchmark machine, where
pylance's whole insert (nine requests) costs ~12 ms. A :class:`LeanWrites` learns what
botocore sends for each of the three operations (once per client and bucket, a probe
request stopped before it is sent, as a lean GET learns its own) and sends them the
lean GET's way: signed as botocore signs them, seen by the client's ``before-send``
handlers, on a connection of the client's own pool (see :mod:`.wire`).

What botocore sends is reproduced, not approximated: a ``PutObject``'s body checksum
(the CRC32, SHA-1 or SHA-256 header botocore adds with
``request_checksum_calculation=when_supported``, or ``aws-chunked`` with a trailing
checksum over HTTPS), its payload hash (the body's SHA-256 over plain HTTP, or
botocore's constant), ``Content-MD5`` where botocore sends one, ``Expect:
100-continue``; a copy's ``x-amz-copy-source`` quoted as botocore quotes it. Each
template is checked when it is learned: signing the probe from it must give the very
request botocore built (URL, headers and signature); anything else (an algorithm it
does not compute, a header it does not know) gives no lean writes of that kind.

A lean write never decides anything. Every write made this way is one botocore may
send again: the same bytes to the same key, a copy of the same source, a delete. Any
answer but a plain success (an error status, a reset or lost answer, a ``CopyObject``
answered 200 with an error in its body, a response it does not understand) returns
None and the caller makes the ordinary botocore call, whose answer (after botocore's
retries) is the definitive one: a write whose lean attempt landed but whose answer was
lost is sent again, exactly as botocore resends an attempt whose answer it lost, and a
copy whose source is gone meanwhile is answered by botocore's ``NoSuchKey``. The
conditional writes (``If-None-Match``) are never sent this way: resending one after a
lost answer changes its outcome. A ``before-send`` handler that raises (a guard, an
injected fault) raises out of the lean write as it would out of botocore's call, so
it refuses a request once, not twice; one that answers is used, as botocore uses it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from xml.etree import ElementTree

from botocore.awsrequest import AWSRequest

from lancetx.commit.sansio import Steps
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.commit.storage.s3_lean.exchange import (
    Answer,
    LeanEffect,
    exchange,
    exchange_async,
    exchange_steps,
)
from lancetx.commit.storage.s3_lean.kit import (
    EMPTY_SHA256,
    AsyncLearned,
    Captured,
    LeanTemplate,
    Learned,
    amz_now,
    capture,
    capture_async,
    credentials,
    header,
    quoted_key,
    reproduces,
    shared,
    sign,
    template_from_request,
)

__all__ = [
    "LEAN_PUT_LIMIT",
    "AsyncLeanWrites",
    "Bodiless",
    "LeanWrites",
    "PutShape",
    "aws_chunked",
    "lean_writes",
    "prepare_copy",
    "prepare_delete",
    "prepare_put",
]

#: Bodies larger than this go through botocore only (a refused lean PUT sends its body
#: twice; a commit's own objects are far smaller).
LEAN_PUT_LIMIT: Final = 8 << 20
#: The probe's body: the checksums botocore computes from it tell what it computes.
PROBE_BODY: Final = b"lancetx lean write probe"
_PROBE_SOURCE: Final = ".source"
#: botocore's ``aws-chunked`` chunk size.
_CHUNK: Final = 1 << 20

_CHECKSUMS: Final[dict[str, Callable[[bytes], bytes]]] = {
    "x-amz-checksum-crc32": lambda data: zlib.crc32(data).to_bytes(4, "big"),
    "x-amz-checksum-sha1": lambda data: hashlib.sha1(data).digest(),
    "x-amz-checksum-sha256": lambda data: hashlib.sha256(data).digest(),
}
#: A PUT's headers that depend on its body.
_PER_PUT: Final = frozenset(
    {"content-md5", "x-amz-decoded-content-length", "content-length"}
    | {name for name in _CHECKSUMS}
    | {f"x-amz-checksum-{other}" for other in ("crc32c", "crc64nvme")}
)
_COPY_SOURCE: Final = "x-amz-copy-source"


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def aws_chunked(data: bytes, trailer: str, checksum: str) -> bytes:
    """``data`` in ``aws-chunked`` encoding with ``trailer: checksum`` after its last
    chunk, framed as botocore frames it (1 MiB chunks)."""
    parts = [
        b"%x\r\n%s\r\n" % (len(data[i : i + _CHUNK]), data[i : i + _CHUNK])
        for i in range(0, len(data), _CHUNK)
    ]
    parts.append(b"0\r\n%s:%s\r\n\r\n" % (trailer.encode("ascii"), checksum.encode("ascii")))
    return b"".join(parts)


@dataclass(frozen=True)
class PutShape:
    """What botocore sends for a ``PutObject``: the template, and how the headers
    that depend on the body are made."""

    template: LeanTemplate
    #: The checksum header's name as botocore spells it (in the headers, or named by
    #: ``X-Amz-Trailer``); None: no checksum.
    checksum: str | None
    #: Whether the checksum trails an ``aws-chunked`` body.
    trailer: bool
    #: Whether a ``Content-MD5`` header is sent.
    md5: bool
    #: The payload hash: None for the body's SHA-256, else botocore's constant.
    payload: str | None

    def headers(self, data: bytes) -> tuple[dict[str, str], str, bytes]:
        """The body-dependent headers, the payload hash and the body to send for ``data``."""
        extra: dict[str, str] = {}
        body = data
        if self.checksum is not None:
            digest = _b64(_CHECKSUMS[self.checksum.lower()](data))
            if self.trailer:
                extra["X-Amz-Decoded-Content-Length"] = str(len(data))
                body = aws_chunked(data, self.checksum, digest)
            else:
                extra[self.checksum] = digest
        if self.md5:
            extra["Content-MD5"] = _b64(hashlib.md5(data).digest())
        payload = self.payload if self.payload is not None else hashlib.sha256(data).hexdigest()
        return extra, payload, body


def _named(headers: Mapping[str, str], name: str) -> tuple[str, str] | None:
    return next(((str(k), str(v)) for k, v in headers.items() if str(k).lower() == name), None)


def _put_shape(captured: Captured | None, frozen: Any) -> PutShape | None:
    if captured is None or frozen is None:
        return None
    template = template_from_request(
        captured.url, captured.headers, captured.key, method="PUT", per_request=_PER_PUT
    )
    if template is None:
        return None
    found = {str(k).lower(): str(v) for k, v in captured.headers.items()}
    trailer = found.get("x-amz-trailer")
    in_headers = [name for name in found if name.startswith("x-amz-checksum-")]
    if trailer is not None:
        checksum: str | None = trailer
        if in_headers or found.get("content-encoding") != "aws-chunked":
            return None
    elif len(in_headers) > 1:
        return None
    else:
        named = _named(captured.headers, in_headers[0]) if in_headers else None
        checksum = named[0] if named is not None else None
    if checksum is not None and checksum.lower() not in _CHECKSUMS:
        return None  # an algorithm computed elsewhere (CRC32C, CRC64): botocore's only
    hashed = found.get("x-amz-content-sha256", "")
    shape = PutShape(
        template,
        checksum,
        trailer is not None,
        "content-md5" in found,
        None if hashed == hashlib.sha256(PROBE_BODY).hexdigest() else hashed,
    )
    extra, payload, _ = shape.headers(PROBE_BODY)
    return shape if reproduces(template, captured, extra, payload, frozen) else None


def _payload_of(captured: Captured) -> str:
    return next(
        (str(v) for k, v in captured.headers.items() if str(k).lower() == "x-amz-content-sha256"),
        EMPTY_SHA256,
    )


@dataclass(frozen=True)
class Bodiless:
    """What botocore sends for a ``CopyObject`` or a ``DeleteObject``."""

    template: LeanTemplate
    payload: str


def _bodiless(
    captured: Captured | None, frozen: Any, method: str, extra: Callable[[str], dict[str, str]]
) -> Bodiless | None:
    if captured is None or frozen is None:
        return None
    per_request = frozenset(name.lower() for name in extra(captured.key))
    template = template_from_request(
        captured.url, captured.headers, captured.key, method=method, per_request=per_request
    )
    if template is None:
        return None
    payload = _payload_of(captured)
    if not reproduces(template, captured, extra(captured.key), payload, frozen):
        return None
    return Bodiless(template, payload)


def _copy_source(bucket: str) -> Callable[[str], dict[str, str]]:
    """The header naming the source of the probe copy for ``key`` (the probe's source
    is the probe key with a suffix)."""
    return lambda key: {_COPY_SOURCE: quoted_key(f"{bucket}/{key}{_PROBE_SOURCE}")}


def _no_headers(key: str) -> dict[str, str]:
    del key
    return {}


def _prepare(
    template: LeanTemplate,
    key: str,
    extra: Mapping[str, str],
    payload: str,
    body: bytes | None,
    frozen: Any,
    amz_date: str | None,
) -> Any:
    url, headers = sign(template, key, extra, payload, frozen, amz_date or amz_now())
    # botocore's own preparation (its Content-Length rule, its prepared request type):
    # ``before-send`` handlers and the HTTP session see what they see from botocore.
    # A body as botocore sends it: a stream, written after ``Expect: 100-continue``.
    data = io.BytesIO(body) if body is not None else None
    return AWSRequest(method=template.method, url=url, headers=headers, data=data).prepare()


def prepare_put(
    shape: PutShape, key: str, data: bytes, frozen: Any, amz_date: str | None = None
) -> Any:
    """The prepared ``PutObject`` of ``data`` to ``key``, as botocore prepares it,
    signed at ``amz_date`` (default: now)."""
    extra, payload, body = shape.headers(data)
    return _prepare(shape.template, key, extra, payload, body, frozen, amz_date)


def prepare_copy(
    copy: Bodiless, bucket: str, src: str, dst: str, frozen: Any, amz_date: str | None = None
) -> Any:
    """The prepared ``CopyObject`` of ``src`` to ``dst``, as botocore prepares it."""
    extra = {_COPY_SOURCE: quoted_key(f"{bucket}/{src}")}
    return _prepare(copy.template, dst, extra, copy.payload, None, frozen, amz_date)


def prepare_delete(delete: Bodiless, key: str, frozen: Any, amz_date: str | None = None) -> Any:
    """The prepared ``DeleteObject`` of ``key``, as botocore prepares it."""
    return _prepare(delete.template, key, {}, delete.payload, None, frozen, amz_date)


# --------------------------------------------------------------- accepted answers


def _put_meta(key: str, size: int, status: int, headers: Any, body: bytes) -> ObjectMeta | None:
    del body
    return ObjectMeta(key=key, size=size, etag=header(headers, "ETag")) if status == 200 else None


def _copy_meta(key: str, status: int, body: bytes) -> ObjectMeta | None:
    """The copy's metadata from a 200 whose body is a ``CopyObjectResult`` (S3 may
    answer 200 and put an error in the body: that is no success)."""
    if status != 200:
        return None
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    if root.tag.rsplit("}", 1)[-1] != "CopyObjectResult":
        return None
    fields = {child.tag.rsplit("}", 1)[-1]: child.text or "" for child in root}
    if "ETag" not in fields:
        return None
    try:
        modified: datetime | None = datetime.fromisoformat(fields["LastModified"])
    except (KeyError, ValueError):
        modified = None
    # UNKNOWN_SIZE, as the ordinary copy reports it (CopyObject never tells the size).
    return ObjectMeta(key=key, size=-1, etag=fields["ETag"], last_modified=modified)


def _deleted(status: int) -> bool | None:
    return True if status in (200, 204) else None


def _write_steps(
    learned: Learned[Any] | AsyncLearned[Any], operation: str, prepare: Callable[[Any], Any]
) -> Steps[LeanEffect, Answer | None]:
    # A handler's error other than a connection failure leaves the write, as it
    # leaves botocore's call.
    return exchange_steps(operation, prepare, learned.answered, handler_errors_leave=True)


# ------------------------------------------------------------------ the writers


class LeanWrites:
    """Lean ``PutObject``, ``CopyObject`` and ``DeleteObject`` requests in one bucket
    through one botocore client (see the module docstring). Thread-safe."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

        def frozen() -> Any:
            found = credentials(client)
            return None if found is None else found.get_frozen_credentials()

        def learn_put() -> PutShape | None:
            captured = capture(
                client, lambda key: client.put_object(Bucket=bucket, Key=key, Body=PROBE_BODY)
            )
            return _put_shape(captured, frozen())

        source = _copy_source(bucket)

        def learn_copy() -> Bodiless | None:
            captured = capture(
                client,
                lambda key: client.copy_object(
                    Bucket=bucket,
                    Key=key,
                    CopySource={"Bucket": bucket, "Key": key + _PROBE_SOURCE},
                ),
            )
            return _bodiless(captured, frozen(), "PUT", source)

        def learn_delete() -> Bodiless | None:
            captured = capture(client, lambda key: client.delete_object(Bucket=bucket, Key=key))
            return _bodiless(captured, frozen(), "DELETE", _no_headers)

        self._put = Learned(learn_put)
        self._copy = Learned(learn_copy)
        self._delete = Learned(learn_delete)

    def learned(self) -> tuple[PutShape | None, Bodiless | None, Bodiless | None]:
        """What a lean ``PutObject``, ``CopyObject`` and ``DeleteObject`` send (learned
        now if not yet); None: no lean writes of that kind."""
        return self._put.get(), self._copy.get(), self._delete.get()

    def _exchange(
        self, learned: Learned[Any], operation: str, prepare: Callable[[Any], Any]
    ) -> Answer | None:
        """Send what ``prepare(frozen credentials)`` builds; the answer's status, headers
        and body, or None when it was not answered in full."""
        return exchange(self._client, _write_steps(learned, operation, prepare))

    def put(self, key: str, data: bytes) -> ObjectMeta | None:
        """``data`` written to ``key``, or None: write it the ordinary way."""
        shape = self._put.get() if len(data) <= LEAN_PUT_LIMIT else None
        if shape is None:
            return None
        answer = self._exchange(
            self._put, "PutObject", lambda frozen: prepare_put(shape, key, data, frozen)
        )
        return None if answer is None else _put_meta(key, len(data), *answer)

    def copy(self, src: str, dst: str) -> ObjectMeta | None:
        """``src`` copied to ``dst``, or None: copy it the ordinary way."""
        copy = self._copy.get()
        if copy is None:
            return None
        answer = self._exchange(
            self._copy,
            "CopyObject",
            lambda frozen: prepare_copy(copy, self._bucket, src, dst, frozen),
        )
        return None if answer is None else _copy_meta(dst, answer[0], answer[2])

    def delete(self, key: str) -> bool:
        """Whether ``key`` was deleted; False: delete it the ordinary way."""
        delete = self._delete.get()
        if delete is None:
            return False
        answer = self._exchange(
            self._delete, "DeleteObject", lambda frozen: prepare_delete(delete, key, frozen)
        )
        return answer is not None and bool(_deleted(answer[0]))


def lean_writes(client: Any, bucket: str) -> LeanWrites:
    """The process's :class:`LeanWrites` for ``client`` and ``bucket`` (see
    :func:`~lancetx.commit.storage.s3_lean.kit.shared`)."""
    return shared(LeanWrites, client, bucket)


class AsyncLeanWrites:
    """:class:`LeanWrites` for an aiobotocore client (one event loop)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

        async def frozen() -> Any:
            found = credentials(client)
            return None if found is None else await found.get_frozen_credentials()

        async def learn_put() -> PutShape | None:
            async def probe(key: str) -> Any:
                return await client.put_object(Bucket=bucket, Key=key, Body=PROBE_BODY)

            captured = await capture_async(client, probe)
            return _put_shape(captured, await frozen())

        source = _copy_source(bucket)

        async def learn_copy() -> Bodiless | None:
            async def probe(key: str) -> Any:
                return await client.copy_object(
                    Bucket=bucket,
                    Key=key,
                    CopySource={"Bucket": bucket, "Key": key + _PROBE_SOURCE},
                )

            captured = await capture_async(client, probe)
            return _bodiless(captured, await frozen(), "PUT", source)

        async def learn_delete() -> Bodiless | None:
            async def probe(key: str) -> Any:
                return await client.delete_object(Bucket=bucket, Key=key)

            captured = await capture_async(client, probe)
            return _bodiless(captured, await frozen(), "DELETE", _no_headers)

        self._put = AsyncLearned(learn_put)
        self._copy = AsyncLearned(learn_copy)
        self._delete = AsyncLearned(learn_delete)

    @property
    def client(self) -> Any:
        """The client it writes through."""
        return self._client

    async def learned(self) -> tuple[PutShape | None, Bodiless | None, Bodiless | None]:
        """See :meth:`LeanWrites.learned`."""
        return await self._put.get(), await self._copy.get(), await self._delete.get()

    async def _exchange(
        self, learned: AsyncLearned[Any], operation: str, prepare: Callable[[Any], Any]
    ) -> Answer | None:
        """See :meth:`LeanWrites._exchange`."""
        return await exchange_async(self._client, _write_steps(learned, operation, prepare))

    async def put(self, key: str, data: bytes) -> ObjectMeta | None:
        """See :meth:`LeanWrites.put`."""
        shape = await self._put.get() if len(data) <= LEAN_PUT_LIMIT else None
        if shape is None:
            return None
        answer = await self._exchange(
            self._put, "PutObject", lambda frozen: prepare_put(shape, key, data, frozen)
        )
        return None if answer is None else _put_meta(key, len(data), *answer)

    async def copy(self, src: str, dst: str) -> ObjectMeta | None:
        """See :meth:`LeanWrites.copy`."""
        copy = await self._copy.get()
        if copy is None:
            return None
        answer = await self._exchange(
            self._copy,
            "CopyObject",
            lambda frozen: prepare_copy(copy, self._bucket, src, dst, frozen),
        )
        return None if answer is None else _copy_meta(dst, answer[0], answer[2])

    async def delete(self, key: str) -> bool:
        """See :meth:`LeanWrites.delete`."""
        delete = await self._delete.get()
        if delete is None:
            return False
        answer = await self._exchange(
            self._delete, "DeleteObject", lambda frozen: prepare_delete(delete, key, frozen)
        )
        return answer is not None and bool(_deleted(answer[0]))
