"""What every lean request shares: learning what botocore sends, signing it as botocore
does, and sending it the way botocore sends (see the package docstring).

A *template* is what botocore sends for one S3 operation on one bucket, minus the key,
the per-request headers and the signature. It is learned by making the call for a
probe key and stopping it in a ``request-created`` handler, after botocore signed it
and before anything is sent. :class:`Learned` keeps one template and learns it again
after :data:`RELEARN_AFTER` refusals in a row (:class:`AsyncLearned` for asyncio).
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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast
from urllib.parse import quote, urlsplit

from botocore.hooks import first_non_none_response

from lancetx.commit.storage.s3_lean import wire

if TYPE_CHECKING:
    import asyncio

#: Where probe keys live (never sent: a probe request is stopped before sending).
PROBE_PREFIX: Final = "_lancetx_lean_probe/"
#: Characters that botocore percent-encodes differently from a plain path (space,
#: ``+``, non-ASCII): the probe checks the key is quoted as :func:`quoted_key` does.
PROBE_CHARACTERS: Final = "a b+c~d=\u00e9"

#: Headers botocore sets per request (signature, date, retry bookkeeping), whatever
#: the operation; an operation's own per-request headers are named where it is learned.
PER_REQUEST: Final = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "amz-sdk-invocation-id",
        "amz-sdk-request",
    }
)
#: Refusals in a row (an answer other than success or "not found") after which a
#: template is learned again: botocore may have learned better meanwhile from the
#: ordinary requests (a bucket in another region than configured is redirected and
#: remembered by botocore's region redirector, which the never-sent probe skips).
RELEARN_AFTER: Final = 3

_SCOPE: Final = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=[^/]+/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
)
#: Headers SigV4 leaves unsigned (botocore's list).
_UNSIGNED: Final = frozenset({"expect", "transfer-encoding", "user-agent", "x-amzn-trace-id"})
#: SHA-256 of an empty body: the payload hash of a request without one.
EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()


def quoted_key(key: str) -> str:
    """``key`` as botocore puts it in an S3 URL's path (and a copy source header)."""
    return quote(key, safe="/~")


@dataclass(frozen=True)
class LeanTemplate:
    """What botocore sends for one operation, minus the key, the per-request headers
    and the signature."""

    #: The URL up to (not including) the quoted key.
    prefix: str
    region: str
    service: str
    headers: tuple[tuple[str, str], ...]
    method: str = "GET"
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
    url: str,
    headers: Mapping[str, str],
    probe_key: str,
    *,
    method: str = "GET",
    per_request: frozenset[str] = frozenset(),
) -> LeanTemplate | None:
    """The template of a signed request botocore built for ``probe_key``, without
    :data:`PER_REQUEST` headers and the operation's own ``per_request`` ones (lowercase
    names); or None when a lean request could not reproduce it (another signing
    algorithm, a session token of S3 Express, a query string, a key quoted otherwise)."""
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
    dropped = PER_REQUEST | per_request
    kept = tuple(
        (str(name), str(value))
        for name, value in headers.items()
        if str(name).lower() not in dropped
    )
    return LeanTemplate(url[: -len(quoted)], scope["region"], scope["service"], kept, method)


class Captured(Exception):
    """Raised by the probe handler to stop the probe request before it is sent."""

    def __init__(self, url: str, headers: Mapping[str, str], key: str) -> None:
        super().__init__("lean request probe")
        self.url = url
        self.headers = dict(headers)
        #: The probe key the request was built for.
        self.key = key


def probe_key() -> str:
    """A key no request is ever sent for (see :data:`PROBE_PREFIX`)."""
    return f"{PROBE_PREFIX}{uuid.uuid4().hex}/{PROBE_CHARACTERS}"


def _capture(key: str) -> Any:
    marker = quoted_key(key)

    def handler(request: Any, **_: Any) -> None:
        if marker in str(request.url):
            raise Captured(str(request.url), request.headers, key)

    return handler


@contextlib.contextmanager
def _capturing(client: Any, key: str) -> Any:
    events = client.meta.events
    unique_id = f"lancetx-lean-probe-{uuid.uuid4().hex}"
    # Last: after botocore signed the request and set its User-Agent.
    events.register_last("request-created.s3", _capture(key), unique_id=unique_id)
    try:
        yield
    finally:
        events.unregister("request-created.s3", unique_id=unique_id)


def capture(client: Any, call: Callable[[str], Any]) -> Captured | None:
    """What botocore would send for ``call(probe key)`` on ``client``, never sent; None
    when it cannot be learned (no credentials, a bucket botocore refuses, ...)."""
    if transport(client) is None or credentials(client) is None:
        return None
    key = probe_key()
    with _capturing(client, key):
        try:
            call(key)
        except Captured as captured:
            return captured
        except Exception:
            return None
    return None  # the probe was answered without being built: nothing to learn


async def capture_async(client: Any, call: Callable[[str], Awaitable[Any]]) -> Captured | None:
    """:func:`capture` for an aiobotocore client."""
    if transport(client) is None or credentials(client) is None:
        return None
    key = probe_key()
    with _capturing(client, key):
        try:
            await call(key)
        except Captured as captured:
            return captured
        except Exception:
            return None
    return None


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


def sign(
    template: LeanTemplate,
    key: str,
    extra: Mapping[str, str],
    payload_hash: str,
    credentials: Any,
    amz_date: str,
) -> tuple[str, dict[str, str]]:
    """The URL and headers of ``template``'s request for ``key`` with the headers
    ``extra`` added, signed with SigV4 as botocore's S3 signer signs it (the same
    canonical request: every header but botocore's unsigned ones, the host, the
    payload hash ``payload_hash`` — unless the template carries a constant one, such
    as ``UNSIGNED-PAYLOAD``) at ``amz_date`` (``YYYYMMDDTHHMMSSZ``) with
    ``credentials`` (botocore's frozen ones)."""
    quoted = quoted_key(key)
    headers = dict(template.headers)
    headers.update(extra)
    headers["X-Amz-Date"] = amz_date
    headers.setdefault("X-Amz-Content-SHA256", payload_hash)
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
            template.method,
            template.path + quoted,
            "",
            "".join(f"{name}:{signed[name]}\n" for name in names),
            signed_names,
            signed["x-amz-content-sha256"],
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


def amz_now() -> str:
    """Now, as SigV4 dates a request."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def reproduces(
    template: LeanTemplate,
    captured: Captured,
    extra: Mapping[str, str],
    payload_hash: str,
    credentials: Any,
) -> bool:
    """Whether signing ``captured``'s probe from ``template`` (with the per-request
    headers ``extra`` it would get) gives exactly the request botocore built: the
    same URL and the same headers, signature included."""
    amz_date = next((v for k, v in captured.headers.items() if k.lower() == "x-amz-date"), "")
    if not amz_date:
        return False
    url, headers = sign(template, captured.key, extra, payload_hash, credentials, amz_date)
    theirs = {str(k).lower(): str(v) for k, v in captured.headers.items()}
    return url == captured.url and {k.lower(): v for k, v in headers.items()} == theirs


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A response header (botocore's headers are case-insensitive; aiobotocore's a
    dict of lowercase names)."""
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return None if value is None else str(value)


def close_response(response: Any, *, read: bool) -> None:
    """Give the connection back (the body was read) or drop it (it was not: a
    connection with an unread body must not serve another request)."""
    raw = getattr(response, "raw", None)
    close = getattr(raw, "release_conn" if read else "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def transport(client: Any) -> Any:
    """The client's own HTTP session (its TLS, proxy, timeout and pool settings)."""
    return getattr(getattr(client, "_endpoint", None), "http_session", None)


def credentials(client: Any) -> Any:
    """The client's credentials (refreshed as botocore refreshes them), or None."""
    get = getattr(client, "_get_credentials", None)
    return get() if callable(get) else None


def before_send(client: Any, operation: str, prepared: Any) -> Any:
    """Let the client's ``before-send`` handlers see ``prepared`` as botocore lets them
    see an ``operation`` request; the answer one of them gave, or None."""
    return first_non_none_response(
        client.meta.events.emit(f"before-send.s3.{operation}", request=prepared)
    )


async def before_send_async(client: Any, operation: str, prepared: Any) -> Any:
    """:func:`before_send` for an aiobotocore client."""
    return first_non_none_response(
        await client.meta.events.emit(f"before-send.s3.{operation}", request=prepared)
    )


def send(client: Any, operation: str, prepared: Any) -> Any:
    """Send ``prepared`` as botocore sends an ``operation`` request: its ``before-send``
    handlers see it first (and one may answer it), then :func:`transmit` sends it."""
    answered = before_send(client, operation, prepared)
    return answered if answered is not None else transmit(client, prepared)


def transmit(client: Any, prepared: Any) -> Any:
    """Send ``prepared`` (its ``before-send`` handlers have seen it) on a connection of
    the client's own pool (:func:`~.wire.round_trip`), or through its HTTP session when
    the wire is not the one to send it. Raises on a failed exchange (the caller then
    makes the ordinary call)."""
    session = transport(client)
    answer = wire.round_trip(session, prepared)
    return answer if answer is not None else session.send(prepared)


async def send_async(client: Any, operation: str, prepared: Any) -> Any:
    """:func:`send` for an aiobotocore client."""
    answered = await before_send_async(client, operation, prepared)
    return answered if answered is not None else await transport(client).send(prepared)


async def content_async(response: Any) -> bytes:
    """A response's body (aiobotocore's content is awaitable)."""
    body = response.content
    if not isinstance(body, bytes):
        body = await body
    return bytes(body)


def refusals_after(refusals: int, status: int) -> int:
    """The refusals in a row after an answer with ``status``: a success or a missing
    object (an ordinary answer: a read may look for one, a copy's source may be gone)
    starts afresh."""
    return 0 if 200 <= status < 300 or status == 404 else refusals + 1


T = TypeVar("T")


class Learned(Generic[T]):
    """One learned template (whatever :func:`learn` returns; None: no lean requests),
    learned on first use and again after :data:`RELEARN_AFTER` refusals. Thread-safe."""

    def __init__(self, learn: Callable[[], T | None]) -> None:
        self._learn = learn
        self._lock = threading.Lock()
        self._learned = False
        self._value: T | None = None
        self._refusals = 0

    def get(self) -> T | None:
        """The template (learned now if not yet)."""
        with self._lock:
            if not self._learned:
                self._value = self._learn()
                self._learned = True
                self._refusals = 0
            return self._value

    def answered(self, status: int) -> None:
        """Count an answer with ``status`` (see :func:`refusals_after`)."""
        with self._lock:
            self._refusals = refusals_after(self._refusals, status)
            if self._refusals >= RELEARN_AFTER:
                self._learned = False


class AsyncLearned(Generic[T]):
    """:class:`Learned` for one event loop, learned by a coroutine."""

    def __init__(self, learn: Callable[[], Awaitable[T | None]]) -> None:
        self._learn = learn
        self._lock: asyncio.Lock | None = None
        self._learned = False
        self._value: T | None = None
        self._refusals = 0

    async def get(self) -> T | None:
        """See :meth:`Learned.get`."""
        if self._lock is None:
            import asyncio  # not on the synchronous paths (a CLI call's start-up)

            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._learned:
                self._value = await self._learn()
                self._learned = True
                self._refusals = 0
            return self._value

    def answered(self, status: int) -> None:
        """See :meth:`Learned.answered`."""
        self._refusals = refusals_after(self._refusals, status)
        if self._refusals >= RELEARN_AFTER:
            self._learned = False


_shared: weakref.WeakKeyDictionary[Any, dict[tuple[type, str], Any]] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def shared(kind: Callable[[Any, str], T], client: Any, bucket: str) -> T:
    """The process's ``kind(client, bucket)`` (a :class:`~.gets.LeanGets`, a
    :class:`~.writes.LeanWrites`): what it learns is learned once however many stores
    (connections) share the client."""
    with _shared_lock:
        try:
            per_client = _shared.setdefault(client, {})
        except TypeError:  # a client that cannot be weakly referenced: not shared
            return kind(client, bucket)
        wanted = (cast(type, kind), bucket)
        found = per_client.get(wanted)
        if found is None:
            found = per_client[wanted] = kind(client, bucket)
        return cast(T, found)
