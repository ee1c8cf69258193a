"""Lean GETs: many object reads without botocore's per-request pipeline.

A writer that catches up on a history pylance wrote reads one manifest per version
(their DynamoDB items carry no summary of the transaction). Through botocore each of
those GETs cost ~2-4 ms of CPU on this project's benchmark machine, most of it not
the HTTP exchange: resolving the endpoint by evaluating S3's rule set, building the
User-Agent twice, emitting a dozen events, parsing ~30 response headers into typed
fields. pylance's Rust client spends a fraction of that, so a commit 128 versions
behind such a history cost 2.5-3.6x pylance's CPU (``benchmarks/conflict_check.py
--history pylance``).

A :class:`LeanGets` learns once, per client and bucket, what botocore would send for
a ``GetObject`` (the URL up to the key, the constant headers, the signing region and
service) by building one request for a probe key and stopping it before anything is
sent (a ``request-created`` handler, after botocore signed it). Each lean GET then
builds that request for another key, signs it with botocore's own SigV4 signer and
the client's own credentials (refreshed as botocore refreshes them), lets the client's
``before-send`` handlers see it (request counters, guards, and mocks that answer
requests themselves, as botocore does) and sends it on a connection of the client's own
pool (its TLS, timeout and pool settings; see :mod:`.wire`), or through the client's
HTTP session where the wire does not send it (a proxy, an asyncio client).

A lean GET never decides anything: any answer other than a plain success (an error
status, a connection failure, a response it does not understand) returns None, and
the caller reads the object the ordinary way, through botocore, whose retries and
error translation give the definitive answer — so a failure costs one request more,
and errors are exactly those of the ordinary path. After a few refusals in a row
(see :data:`RELEARN_AFTER`) what a lean GET sends is learned again, from what botocore
knows by then (a bucket in another region, which botocore's redirector learns from
the ordinary reads). A client botocore would not sign
with plain SigV4 (anonymous access, SigV4a, S3 Express sessions) or whose request
carries a query string gets no lean reads at all. Lean GETs do not ask for the
object's checksum (as botocore with ``response_checksum_validation=when_required``):
the callers check what they read (a manifest's size against its item, its structure
as it decodes).
"""

from __future__ import annotations

import re
from typing import Any, Final, cast

from botocore.awsrequest import AWSPreparedRequest, HeadersDict

from lancetx.commit.sansio import Steps
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
    LeanTemplate,
    Learned,
    amz_now,
    capture,
    capture_async,
    header,
    shared,
    sign,
    template_from_request,
)

__all__ = ["AsyncLeanGets", "LeanGets", "lean_gets", "sign_get"]

#: A GET's own per-request headers: its range, and the checksum request it leaves out.
_PER_GET: Final = frozenset({"x-amz-checksum-mode", "range"})
_CONTENT_RANGE: Final = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$")


def sign_get(
    template: LeanTemplate, key: str, length: int, credentials: Any, amz_date: str
) -> tuple[str, dict[str, str]]:
    """The URL and headers of a ``Range: bytes=-length`` GET of ``key``, signed as
    botocore signs it (:func:`~lancetx.commit.storage.s3_lean.kit.sign`)."""
    return sign(template, key, {"Range": f"bytes=-{length}"}, EMPTY_SHA256, credentials, amz_date)


def _prepared(template: LeanTemplate, key: str, length: int, frozen: Any) -> Any:
    url, headers = sign_get(template, key, length, frozen, amz_now())
    # botocore's own prepared header type (what ``AWSRequest.prepare`` builds; its
    # stubs name another): ``before-send`` handlers see what they see from botocore.
    # Streamed: the body is read once the headers are understood.
    return AWSPreparedRequest("GET", url, cast(Any, HeadersDict(headers)), None, True)


def _tail_from(status: int, headers: Any, length: int) -> int | None:
    """The object's total size if a response with ``status`` and ``headers`` to a
    ``Range: bytes=-length`` GET is one a lean GET accepts; None otherwise."""
    if status == 206:
        match = _CONTENT_RANGE.match(header(headers, "Content-Range") or "")
        if match is None:
            return None
        first, last, total = (int(g) for g in match.groups())
        return total if last - first + 1 <= length and last == total - 1 else None
    if status == 200:
        declared = header(headers, "Content-Length")
        # A server that ignored the range sends the whole object: accept it only
        # when that is no more than asked for (the ordinary path streams the rest).
        if declared is None or not declared.isdigit() or int(declared) > length:
            return None
        return int(declared)
    return None


def _get_steps(
    learned: Learned[LeanTemplate] | AsyncLearned[LeanTemplate],
    template: LeanTemplate,
    key: str,
    length: int,
) -> Steps[LeanEffect, Answer | None]:
    """The exchange of one lean tail GET; its body is read only if the status and
    headers are an answer it accepts (:func:`_tail_from`)."""
    return exchange_steps(
        "GetObject",
        lambda frozen: _prepared(template, key, length, frozen),
        learned.answered,
        wanted=lambda status, headers: _tail_from(status, headers, length) is not None,
        # Any failure reads it the ordinary way, which repeats the request and
        # raises what botocore raises (a handler's error included).
        handler_errors_leave=False,
    )


def _tail(answer: Answer | None, length: int) -> tuple[bytes, int] | None:
    """The tail and total size an accepted answer gives, or None."""
    if answer is None:
        return None
    status, headers, body = answer
    total = _tail_from(status, headers, length)
    if total is None or len(body) != min(length, total):
        return None
    return body, total


def _template(captured: Any) -> LeanTemplate | None:
    if captured is None:
        return None
    return template_from_request(captured.url, captured.headers, captured.key, per_request=_PER_GET)


class LeanGets:
    """Lean ``Range: bytes=-N`` GETs of objects in one bucket through one botocore
    client (see the module docstring). Thread-safe."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._learned = Learned(
            lambda: _template(
                capture(client, lambda key: client.get_object(Bucket=bucket, Key=key))
            )
        )

    def template(self) -> LeanTemplate | None:
        """What a lean GET sends (learned on first use); None: no lean GETs here."""
        return self._learned.get()

    def get_tail(self, key: str, length: int) -> tuple[bytes, int] | None:
        """The last ``length`` bytes of ``key`` and its total size, or None: read it
        the ordinary way (see the module docstring)."""
        template = self.template()
        if template is None or length <= 0:
            return None
        return _tail(
            exchange(self._client, _get_steps(self._learned, template, key, length)), length
        )


def lean_gets(client: Any, bucket: str) -> LeanGets:
    """The process's :class:`LeanGets` for ``client`` and ``bucket`` (see
    :func:`~lancetx.commit.storage.s3_lean.kit.shared`)."""
    return shared(LeanGets, client, bucket)


class AsyncLeanGets:
    """:class:`LeanGets` for an aiobotocore client (one event loop)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client

        async def learn() -> LeanTemplate | None:
            async def probe(key: str) -> Any:
                return await client.get_object(Bucket=bucket, Key=key)

            return _template(await capture_async(client, probe))

        self._learned = AsyncLearned(learn)

    @property
    def client(self) -> Any:
        """The client it reads through."""
        return self._client

    async def template(self) -> LeanTemplate | None:
        """See :meth:`LeanGets.template`."""
        return await self._learned.get()

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int] | None:
        """See :meth:`LeanGets.get_tail`."""
        template = await self.template()
        if template is None or length <= 0:
            return None
        steps = _get_steps(self._learned, template, key, length)
        return _tail(await exchange_async(self._client, steps), length)
