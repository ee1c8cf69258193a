"""A lean request's HTTP/1.1 exchange, written and read on a connection of the client's own pool.

A lean request sent through botocore's HTTP session still cost ~1.9 ms of CPU on this
project's benchmark machine, most of it urllib3 and ``http.client`` around the bytes:
urllib3's request and retry bookkeeping, ``http.client`` writing each header through
``putheader``, and its response parser, which reads the status line and hands the
headers to the ``email`` package's feed parser (a dozen calls per header). For the
plain requests a lean request is — a signed request with a known-length body or none,
answered with a status, a few headers and a body of known length — that machinery
decides nothing.

:func:`round_trip` takes a connection from the very urllib3 pool botocore's session
would use for the URL (so TLS, certificates, client certificates, timeouts and
connection reuse are the session's; a URL the session sends through a proxy is not
the wire's: the connection is opened by urllib3 with them, and
given back to the pool after a complete answer), writes the request as ``http.client``
would (request line, ``Host``, ``Accept-Encoding: identity``, then the request's own
headers in their order, ``Content-Length: 0`` on a bodiless PUT, and where botocore's
connection would wait for ``100 Continue`` before a body, its wait of up to a second) and
reads the
answer: the status line, the headers, a body framed by ``Content-Length`` or chunked
transfer coding (never both), or none (``204``, ``304``), never longer than the range a GET asks
for (a success), or than :data:`ANSWER_LIMIT` (any other answer).

It returns None when it is not the one to send the request (a proxy, a session of
another kind, a request with a streamed body or chunked transfer coding): the caller
then sends it through the session as before. Anything it does not understand on the
wire (a malformed status line, headers or framing, a short body, a timeout, a reset)
raises :class:`WireError` and closes the connection: lean requests treat an exception
as "not answered" and the ordinary botocore call then gives the definitive answer, so a
failure here costs one request more and decides nothing.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit

__all__ = ["ANSWER_LIMIT", "WireError", "WireResponse", "round_trip", "signed_host"]

#: The most a status line or one header line may take, and all the headers together.
_LINE_LIMIT: Final = 65536
_HEAD_LIMIT: Final = 256 * 1024
#: What one ``recv`` asks for.
_CHUNK: Final = 65536
#: The most one write to the socket is given (urllib3's own block, where the connection
#: does not say): the socket's timeout applies to each write.
_BLOCK: Final = 16384
#: How long botocore waits for an interim ``100 Continue`` before sending the body.
_EXPECT_WAIT: Final = 1.0
#: Methods ``http.client`` sends ``Content-Length: 0`` for when there is no body.
_BODY_METHODS: Final = frozenset({"PATCH", "POST", "PUT"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
#: The most of an answer's body read for a request without a range (S3 answers a
#: write with a few hundred bytes; anything longer is left to the ordinary path).
ANSWER_LIMIT: Final = 1 << 20
_CHUNK_SIZE: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_RANGE: Final = re.compile(r"^\s*bytes=(?:-(?P<suffix>\d+)|(?P<first>\d+)-(?P<last>\d+))\s*$")


class WireError(Exception):
    """The exchange failed or was not understood (the connection was closed)."""


@dataclass(frozen=True)
class WireResponse:
    """An answer read by :func:`round_trip` (the attributes lean requests read of botocore's
    ``AWSResponse``)."""

    status_code: int
    #: Header names in lowercase (a name sent twice: its values joined by ``", "``).
    headers: Mapping[str, str]
    content: bytes
    #: No stream to close: the connection is already back in its pool (or closed).
    raw: None = field(default=None)


def signed_host(url: str) -> str:
    """The ``Host`` of a request for ``url``, as ``http.client`` sends it and SigV4 signs
    it: the host name (an IPv6 literal bracketed), with the port unless it is the
    scheme's default."""
    return _host(urlsplit(url))


def _host(parts: SplitResult) -> str:
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


class _Reader:
    """Buffered reads from a socket (what is left unread after an answer says whether
    the connection can serve another request)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buffer = bytearray()

    def _fill(self) -> None:
        chunk = self._sock.recv(_CHUNK)
        if not chunk:
            raise WireError("the connection closed mid-answer")
        self._buffer += chunk

    def readline(self) -> bytes:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line
            if len(self._buffer) > _LINE_LIMIT:
                raise WireError("a line of the answer is too long")
            self._fill()

    def read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    @property
    def pending(self) -> bool:
        return bool(self._buffer)


def _status(line: bytes) -> tuple[str, int]:
    parts = line.split(None, 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
        raise WireError(f"not an HTTP/1.x status line: {line[:80]!r}")
    status = int(parts[1])
    if not 100 <= status <= 599 or len(parts[1]) != 3:
        raise WireError(f"not an HTTP status: {line[:80]!r}")
    return parts[0].decode("ascii"), status


def _headers(reader: _Reader) -> dict[str, str]:
    found: dict[str, str] = {}
    size = 0
    while True:
        line = reader.readline()
        size += len(line)
        if size > _HEAD_LIMIT:
            raise WireError("the answer's headers are too long")
        if line in (b"\r\n", b"\n"):
            return found
        if line[:1] in (b" ", b"\t"):
            raise WireError("a folded header line")  # obsolete; http.client's parser would join it
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise WireError(f"not a header line: {line[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        found[key] = f"{found[key]}, {text}" if key in found else text


def _head(reader: _Reader) -> tuple[str, int, dict[str, str]]:
    version, status = _status(reader.readline())
    return version, status, _headers(reader)


def _too_long(size: int, limit: int) -> None:
    if size > limit:
        # Not read: a server that ignored a range could send a whole large object.
        raise WireError(f"an answer of {size} bytes, more than the {limit} this request reads")


def _answer_limit(headers: Any) -> int:
    """The most of a successful answer's body :func:`round_trip` reads: the length of the
    range a GET asks for (``bytes=-N``, ``bytes=A-B``), else :data:`ANSWER_LIMIT`."""
    raw = headers.get("Range")
    text = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw or "")
    match = _RANGE.match(text)
    if match is None:
        return ANSWER_LIMIT
    if match["suffix"] is not None:
        return int(match["suffix"])
    return int(match["last"]) - int(match["first"]) + 1


def _chunked(reader: _Reader, limit: int) -> bytes:
    parts: list[bytes] = []
    read = 0
    while True:
        size_line = reader.readline().split(b";", 1)[0].strip()
        # Hex digits only (``int`` would also take a sign, ``0x`` and ``_``).
        if _CHUNK_SIZE.fullmatch(size_line) is None:
            raise WireError(f"not a chunk size: {size_line[:40]!r}")
        size = int(size_line, 16)
        if size == 0:
            _headers(reader)  # trailers, if any, then the blank line
            return b"".join(parts)
        read += size
        _too_long(read, limit)
        parts.append(reader.read(size))
        if reader.read(2) != b"\r\n":
            raise WireError("a chunk not followed by CRLF")


def _body(
    reader: _Reader, method: str, status: int, headers: Mapping[str, str], limit: int
) -> bytes:
    if method == "HEAD" or status in (204, 304):
        return b""
    coding = headers.get("transfer-encoding")
    if coding is not None and "content-length" in headers:
        # Two framings: which one the server meant is a guess (RFC 9112 6.3: an error).
        raise WireError("an answer framed by both Transfer-Encoding and Content-Length")
    if coding is not None:
        if coding.strip().lower() != "chunked":
            raise WireError(f"a transfer coding other than chunked: {coding!r}")
        return _chunked(reader, limit)
    length = headers.get("content-length")
    if length is None or not length.strip().isdigit():
        # A body delimited by the connection's close: left to the ordinary path.
        raise WireError("an answer without a Content-Length")
    _too_long(int(length.strip()), limit)
    return reader.read(int(length.strip()))


def _keeps_alive(version: str, headers: Mapping[str, str]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if "close" in tokens:
        return False
    return version == "HTTP/1.1" or "keep-alive" in tokens


def _request_head(method: str, url: str, headers: Any, body: bytes | None) -> bytes:
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {_host(parts)}"]
    names = set()
    declared: str | None = None
    for name, value in headers.items():
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        lines.append(f"{name}: {text}")
        names.add(str(name).lower())
        if str(name).lower() == "content-length":
            declared = text.strip()
    if "host" in names or "user-agent" not in names:
        raise WireError("a request that sets its own Host, or no User-Agent")
    if declared is not None and declared != str(len(body or b"")):
        # The server would wait for bytes never sent, or read the rest as the next
        # request on the connection (and answer a request nobody made).
        raise WireError(f"a Content-Length of {declared!r} for a body of {len(body or b'')} bytes")
    # http.client's additions, in its place (after Host) and by its rules.
    if "accept-encoding" not in names:
        lines.insert(2, "Accept-Encoding: identity")
    if "content-length" not in names and (body is not None or method in _BODY_METHODS):
        lines.append(f"Content-Length: {len(body or b'')}")
    head = "\r\n".join(lines)
    # Only the separators may break lines (http.client refuses such headers too).
    breaks = len(lines) - 1
    if head.count("\r") != breaks or head.count("\n") != breaks or "\0" in head:
        raise WireError("a header that cannot be sent as is (CR, LF or NUL in it)")
    return (head + "\r\n\r\n").encode("latin-1")


def _plain_body(prepared: Any) -> tuple[bool, bytes | None]:
    """Whether the request's body is one :func:`round_trip` sends, and its bytes."""
    body = prepared.body
    if body is None or isinstance(body, bytes):
        return True, body
    if isinstance(body, io.BytesIO):
        # From where the stream stands, as the session reads it (and as botocore
        # measured its Content-Length), not from its start.
        data, start = body.getvalue(), body.tell()
        return True, data[start:] if start else data
    return False, None


def _pool(session: Any, url: str) -> Any:
    """The urllib3 pool the session would send ``url`` through, set up as it sets it up;
    None when the session is not one this module knows, or goes through a proxy."""
    proxy_config = getattr(session, "_proxy_config", None)
    manager_for = getattr(session, "_get_connection_manager", None)
    setup_ssl = getattr(session, "_setup_ssl_cert", None)
    if proxy_config is None or not callable(manager_for) or not callable(setup_ssl):
        return None
    if proxy_config.proxy_url_for(url):
        return None
    pool = manager_for(url, None).connection_from_url(url)
    setup_ssl(pool, url, getattr(session, "_verify", True))
    return pool


def _timeouts(pool: Any) -> tuple[float | None, float | None]:
    from urllib3.util.timeout import Timeout

    timeout = getattr(pool, "timeout", None)
    if not isinstance(timeout, Timeout):
        raise WireError("a pool without urllib3's Timeout")
    return (
        Timeout.resolve_default_timeout(timeout.connect_timeout),
        Timeout.resolve_default_timeout(timeout.read_timeout),
    )


def _send(sock: Any, head: bytes, body: bytes, block: int) -> None:
    """``head`` then ``body``, written ``block`` bytes at a time: each write gets the
    whole timeout, as each of the session's writes does (a large body is not held to
    one timeout for all of it)."""
    if len(head) + len(body) <= block:
        sock.sendall(head + body)
        return
    view = memoryview(body)
    first = max(block - len(head), 0)
    sock.sendall(head + view[:first])
    for start in range(first, len(view), block):
        sock.sendall(view[start : start + block])


def round_trip(session: Any, prepared: Any) -> WireResponse | None:
    """Send ``prepared`` (botocore's prepared request) on a connection of ``session``'s
    pool and read the answer; None: this module does not send it (see the module
    docstring). Raises WireError (or the socket's error) when the exchange failed."""
    from botocore.awsrequest import AWSPreparedRequest
    from botocore.httpsession import URLLib3Session

    if not isinstance(session, URLLib3Session) or not isinstance(prepared, AWSPreparedRequest):
        return None  # another HTTP client (aiobotocore's, a stand-in): its own send
    method = str(prepared.method).upper()
    headers = prepared.headers
    lowered = {str(name).lower() for name in headers}
    plain, body = _plain_body(prepared)
    if not plain or "transfer-encoding" in lowered:
        return None
    # botocore's connection waits for ``100 Continue`` only when the header holds these
    # bytes (botocore's own requests: it encodes every header); a lean request's str
    # header is written without waiting, as the session writes it.
    expect = headers.get("Expect", b"") == b"100-continue"
    try:
        pool = _pool(session, prepared.url)
    except Exception:
        return None
    if pool is None:
        return None
    try:
        head = _request_head(method, prepared.url, headers, body)
    except (UnicodeError, ValueError) as exc:
        raise WireError(f"the request cannot be written as is: {exc}") from exc
    connect_timeout, read_timeout = _timeouts(pool)
    conn = pool._get_conn()
    reusable = False
    try:
        if conn.sock is None:
            conn.timeout = connect_timeout
            conn.connect()
        sock = conn.sock
        sock.settimeout(read_timeout)
        block = int(getattr(conn, "blocksize", _BLOCK) or _BLOCK)
        reader = _Reader(sock)
        answer = None
        if expect and body:
            sock.sendall(head)
            # botocore's rule: wait up to a second for an interim answer; a final
            # answer instead means the body is not sent (and the connection not reused).
            from urllib3.util.wait import wait_for_read

            if wait_for_read(sock, _EXPECT_WAIT):
                version, status, found = _head(reader)
                if status != 100:
                    answer = (version, status, found, False)
            if answer is None:
                _send(sock, b"", body, block)
        else:
            _send(sock, head, body or b"", block)
        if answer is None:
            version, status, found = _head(reader)
            while 100 <= status < 200:  # interim answers (http.client skips them too)
                version, status, found = _head(reader)
            answer = (version, status, found, True)
        version, status, found, body_sent = answer
        if not body_sent and 200 <= status < 300:
            # A refusal before the body makes sense; a success for a body never sent
            # would be a write taken as done that holds none of its bytes.
            raise WireError(f"a {status} answer before the request's body was sent")
        # A success carries at most the range asked for; an error its own short body.
        limit = _answer_limit(headers) if 200 <= status < 300 else ANSWER_LIMIT
        content = _body(reader, method, status, found, limit)
        reusable = body_sent and not reader.pending and _keeps_alive(version, found)
        return WireResponse(status, found, content)
    except (OSError, ValueError, UnicodeError) as exc:  # TimeoutError is an OSError
        raise WireError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if not reusable:
            with contextlib.suppress(Exception):
                conn.close()
        # Back in the pool either way (a closed one reconnects): the pool keeps its size.
        pool._put_conn(conn)
