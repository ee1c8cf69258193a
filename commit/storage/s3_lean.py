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
requests themselves, as botocore does) and sends it through the client's own HTTP
session (its TLS, proxy, timeout and pool settings).

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

import contextlib
import hashlib
import hmac
import re
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast
from urllib.parse import quote, urlsplit

from botocore.awsrequest import AWSPreparedRequest, HeadersDict
from botocore.hooks import first_non_none_response

__all__ = [
    "AsyncLeanGets",
    "LeanGets",
    "LeanTemplate",
    "lean_gets",
    "sign_get",
    "template_from_request",
]

#: Where the probe key lives (never sent: the request is stopped before sending).
PROBE_PREFIX: Final = "_lancetx_lean_probe/"
#: Characters that botocore percent-encodes differently from a plain path (space,
#: ``+``, non-ASCII): the probe checks the key is quoted as :func:`quoted_key` does.
PROBE_CHARACTERS: Final = "a b+c~d=\u00e9"

#: Headers botocore sets per request (signature, date, retry bookkeeping) or that
#: a lean GET sets itself (its range) or leaves out (the checksum request).
_PER_REQUEST: Final = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "amz-sdk-invocation-id",
        "amz-sdk-request",
        "x-amz-checksum-mode",
        "range",
    }
)
#: Refusals in a row (an answer other than success or "not found") after which what a
#: lean GET sends is learned again: botocore may have learned better meanwhile from
#: the ordinary reads (a bucket in another region than configured is redirected and
#: remembered by botocore's region redirector, which the never-sent probe skips).
RELEARN_AFTER: Final = 3

_SCOPE: Final = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=[^/]+/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
)
_CONTENT_RANGE: Final = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$")


def quoted_key(key: str) -> str:
    """``key`` as botocore puts it in an S3 URL's path."""
    return quote(key, safe="/~")


#: Headers SigV4 leaves unsigned (botocore's list).
_UNSIGNED: Final = frozenset({"expect", "transfer-encoding", "user-agent", "x-amzn-trace-id"})
#: SHA-256 of an empty body: a GET's payload hash.
EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class LeanTemplate:
    """What botocore sends for a ``GetObject``, minus the key and the signature."""

    #: The URL up to (not including) the quoted key.
    prefix: str
    region: str
    service: str
    headers: tuple[tuple[str, str], ...]
    #: The ``host`` SigV4 signs (the URL's, without a default port) and the URL's
    #: path up to the key.
    host: str = field(init=False)
    path: str = field(init=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.prefix)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"  # an IPv6 literal, bracketed as in the URL
        if parts.port is not None and parts.port != {"http": 80, "https": 443}.get(parts.scheme):
            host = f"{host}:{parts.port}"
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "path", parts.path)


def template_from_request(
    url: str, headers: Mapping[str, str], probe_key: str
) -> LeanTemplate | None:
    """The template of a signed ``GetObject`` request botocore built for ``probe_key``,
    or None when a lean GET could not reproduce it (another signing algorithm, a
    session token of S3 Express, a query string, a key quoted otherwise)."""
    parts = urlsplit(url)
    quoted = quoted_key(probe_key)
    if parts.query or parts.fragment or not url.endswith("/" + quoted):
        return None
    scope = _SCOPE.match(str(headers.get("Authorization", "")))
    if scope is None or scope["service"] != "s3":
        return None
    lowered = {name.lower() for name in headers}
    if lowered & {"x-amz-s3session-token", "date", "host"}:
        return None  # S3 Express, or a request signed by its Date: not reproduced
    kept = tuple(
        (str(name), str(value))
        for name, value in headers.items()
        if str(name).lower() not in _PER_REQUEST
    )
    return LeanTemplate(url[: -len(quoted)], scope["region"], scope["service"], kept)


class _Captured(Exception):
    """Raised by the probe handler to stop the probe request before it is sent."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        super().__init__("lean GET probe")
        self.url = url
        self.headers = dict(headers)


def _probe_key() -> str:
    return f"{PROBE_PREFIX}{uuid.uuid4().hex}/{PROBE_CHARACTERS}"


def _capture(marker: str) -> Any:
    def handler(request: Any, **_: Any) -> None:
        if marker in str(request.url):
            raise _Captured(str(request.url), request.headers)

    return handler


class _SigningKeys:
    """SigV4 signing keys by (secret, day): derived once a day, not per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, str, str, str], bytes] = {}

    def key(self, secret: str, day: str, region: str, service: str) -> bytes:
        wanted = (secret, day, region, service)
        with self._lock:
            found = self._keys.get(wanted)
        if found is not None:
            return found
        key = f"AWS4{secret}".encode()
        for part in (day, region, service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        with self._lock:
            if len(self._keys) > 16:
                self._keys.clear()  # rotated credentials, another day: start afresh
            self._keys[wanted] = key
        return key


_SIGNING_KEYS = _SigningKeys()


def _trimmed(value: str) -> str:
    return " ".join(value.split())


def sign_get(
    template: LeanTemplate, key: str, length: int, credentials: Any, amz_date: str
) -> tuple[str, dict[str, str]]:
    """The URL and headers of a ``Range: bytes=-length`` GET of ``key``, signed with
    SigV4 as botocore's S3 signer signs it (the same canonical request: every header
    but botocore's unsigned ones, the host, the payload hash of an empty body) at
    ``amz_date`` (``YYYYMMDDTHHMMSSZ``) with ``credentials`` (botocore's frozen ones)."""
    quoted = quoted_key(key)
    headers = dict(template.headers)
    headers["Range"] = f"bytes=-{length}"
    headers["X-Amz-Date"] = amz_date
    headers["X-Amz-Content-SHA256"] = EMPTY_SHA256
    if credentials.token:
        headers["X-Amz-Security-Token"] = credentials.token
    signed = {name.lower(): _trimmed(value) for name, value in headers.items()}
    for name in _UNSIGNED:
        signed.pop(name, None)
    signed.setdefault("host", template.host)
    names = sorted(signed)
    signed_names = ";".join(names)
    canonical = "\n".join(
        [
            "GET",
            template.path + quoted,
            "",
            "".join(f"{name}:{signed[name]}\n" for name in names),
            signed_names,
            EMPTY_SHA256,
        ]
    )
    day = amz_date[:8]
    scope = f"{day}/{template.region}/{template.service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    signing_key = _SIGNING_KEYS.key(credentials.secret_key, day, template.region, template.service)
    signature = hmac.new(signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={signed_names}, Signature={signature}"
    )
    return template.prefix + quoted, headers


def _prepared(template: LeanTemplate, key: str, length: int, credentials: Any) -> Any:
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    url, headers = sign_get(template, key, length, credentials, amz_date)
    # botocore's own prepared header type (what ``AWSRequest.prepare`` builds; its
    # stubs name another): ``before-send`` handlers see what they see from botocore.
    # Streamed: the body is read once the headers are understood.
    return AWSPreparedRequest("GET", url, cast(Any, HeadersDict(headers)), None, True)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # botocore's headers are case-insensitive; aiobotocore's a dict of lowercase names.
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return None if value is None else str(value)


def _tail_from(status: int, headers: Mapping[str, str], length: int) -> int | None:
    """The object's total size if a response with ``status`` and ``headers`` to a
    ``Range: bytes=-length`` GET is one a lean GET accepts; None otherwise."""
    if status == 206:
        match = _CONTENT_RANGE.match(_header(headers, "Content-Range") or "")
        if match is None:
            return None
        first, last, total = (int(g) for g in match.groups())
        return total if last - first + 1 <= length and last == total - 1 else None
    if status == 200:
        declared = _header(headers, "Content-Length")
        # A server that ignored the range sends the whole object: accept it only
        # when that is no more than asked for (the ordinary path streams the rest).
        if declared is None or not declared.isdigit() or int(declared) > length:
            return None
        return int(declared)
    return None


def _accepted(body: bytes, total: int, length: int) -> tuple[bytes, int] | None:
    return (body, total) if len(body) == min(length, total) else None


def _close(response: Any, *, read: bool) -> None:
    """Give the connection back (the body was read) or drop it (it was not: a
    connection with an unread body must not serve another request)."""
    raw = getattr(response, "raw", None)
    close = getattr(raw, "release_conn" if read else "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _transport(client: Any) -> Any:
    return getattr(getattr(client, "_endpoint", None), "http_session", None)


def _credentials(client: Any) -> Any:
    get = getattr(client, "_get_credentials", None)
    return get() if callable(get) else None


class LeanGets:
    """Lean ``Range: bytes=-N`` GETs of objects in one bucket through one botocore
    client (see the module docstring). Thread-safe."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket
        self._lock = threading.Lock()
        self._learned = False
        self._template: LeanTemplate | None = None
        self._refusals = 0

    def template(self) -> LeanTemplate | None:
        """What a lean GET sends (learned on first use); None: no lean GETs here."""
        with self._lock:
            if not self._learned:
                self._template = self._learn()
                self._learned = True
                self._refusals = 0
            return self._template

    def _answered(self, status: int) -> None:
        with self._lock:
            self._refusals = _refusals_after(self._refusals, status)
            if self._refusals >= RELEARN_AFTER:
                self._learned = False

    def _learn(self) -> LeanTemplate | None:
        if _transport(self._client) is None or _credentials(self._client) is None:
            return None
        probe = _probe_key()
        marker = quoted_key(probe)
        events = self._client.meta.events
        unique_id = f"lancetx-lean-probe-{uuid.uuid4().hex}"
        # Last: after botocore signed the request and set its User-Agent.
        events.register_last("request-created.s3", _capture(marker), unique_id=unique_id)
        try:
            self._client.get_object(Bucket=self._bucket, Key=probe)
        except _Captured as captured:
            return template_from_request(captured.url, captured.headers, probe)
        except Exception:
            return None  # no credentials, a bucket botocore refuses, ...: no lean GETs
        finally:
            events.unregister("request-created.s3", unique_id=unique_id)
        return None  # the probe was answered without being built: nothing to learn

    def get_tail(self, key: str, length: int) -> tuple[bytes, int] | None:
        """The last ``length`` bytes of ``key`` and its total size, or None: read it
        the ordinary way (see the module docstring)."""
        template = self.template()
        if template is None or length <= 0:
            return None
        try:
            frozen = _credentials(self._client).get_frozen_credentials()
            prepared = _prepared(template, key, length, frozen)
            answered = first_non_none_response(
                self._client.meta.events.emit("before-send.s3.GetObject", request=prepared)
            )
            response = answered if answered is not None else _transport(self._client).send(prepared)
        except Exception:
            return None  # the ordinary read repeats it and raises what botocore raises
        read = False
        try:
            self._answered(response.status_code)
            total = _tail_from(response.status_code, response.headers, length)
            if total is None:
                return None
            body = response.content
            read = True
            return _accepted(body, total, length)
        except Exception:
            return None
        finally:
            _close(response, read=read)


def _refusals_after(refusals: int, status: int) -> int:
    """The refusals in a row after an answer with ``status``: a success or a missing
    object (an ordinary answer, for a read that may look for one) starts afresh."""
    return 0 if 200 <= status < 300 or status == 404 else refusals + 1


_shared: weakref.WeakKeyDictionary[Any, dict[str, LeanGets]] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def lean_gets(client: Any, bucket: str) -> LeanGets:
    """The process's :class:`LeanGets` for ``client`` and ``bucket``: what it learned is
    learned once however many stores (connections) share the client."""
    with _shared_lock:
        try:
            per_bucket = _shared.setdefault(client, {})
        except TypeError:  # a client that cannot be weakly referenced: not shared
            return LeanGets(client, bucket)
        found = per_bucket.get(bucket)
        if found is None:
            found = per_bucket[bucket] = LeanGets(client, bucket)
        return found


class AsyncLeanGets:
    """:class:`LeanGets` for an aiobotocore client (one event loop)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket
        self._learned = False
        self._template: LeanTemplate | None = None
        self._lock: Any = None
        self._refusals = 0

    @property
    def client(self) -> Any:
        """The client it reads through."""
        return self._client

    async def template(self) -> LeanTemplate | None:
        """See :meth:`LeanGets.template`."""
        import asyncio

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._learned:
                self._template = await self._learn()
                self._learned = True
                self._refusals = 0
            return self._template

    async def _learn(self) -> LeanTemplate | None:
        if _transport(self._client) is None or _credentials(self._client) is None:
            return None
        probe = _probe_key()
        marker = quoted_key(probe)
        events = self._client.meta.events
        unique_id = f"lancetx-lean-probe-{uuid.uuid4().hex}"
        events.register_last("request-created.s3", _capture(marker), unique_id=unique_id)
        try:
            await self._client.get_object(Bucket=self._bucket, Key=probe)
        except _Captured as captured:
            return template_from_request(captured.url, captured.headers, probe)
        except Exception:
            return None
        finally:
            events.unregister("request-created.s3", unique_id=unique_id)
        return None

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int] | None:
        """See :meth:`LeanGets.get_tail`."""
        template = await self.template()
        if template is None or length <= 0:
            return None
        try:
            frozen = await _credentials(self._client).get_frozen_credentials()
            prepared = _prepared(template, key, length, frozen)
            answered = first_non_none_response(
                await self._client.meta.events.emit("before-send.s3.GetObject", request=prepared)
            )
            response = (
                answered if answered is not None else await _transport(self._client).send(prepared)
            )
        except Exception:
            return None
        read = False
        try:
            self._refusals = _refusals_after(self._refusals, response.status_code)
            if self._refusals >= RELEARN_AFTER:
                self._learned = False  # see LeanGets._answered
            total = _tail_from(response.status_code, response.headers, length)
            if total is None:
                return None
            body = response.content
            if not isinstance(body, bytes):
                body = await body  # aiobotocore's content is awaitable
            read = True
            return _accepted(body, total, length)
        except Exception:
            return None
        finally:
            _close(response, read=read)
