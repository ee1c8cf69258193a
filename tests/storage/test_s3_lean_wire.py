"""Lean requests on the wire (``commit/storage/s3_lean/wire.py``): written and read on a
connection of the client's own pool, the bytes botocore's session would send, and
anything unusual on the wire an exception (the ordinary call then answers).

* the request bytes (GET, bodiless PUT and DELETE, a PUT with a body and ``Expect:
  100-continue``) are those botocore's HTTP session writes for the same prepared request,
  over TLS too, where the session's trust is the wire's (an untrusted certificate refused);
* a lean GET and each lean write go out without botocore's session, one request each
  against the embedded server, and a connection the server keeps open serves the next;
* answers framed by ``Content-Length``, chunked, or none (204) are read whole, never
  beyond the range a GET asked for (a server ignoring it does not make it read more);
  ``Connection: close`` and HTTP/1.0 answers close the connection;
* a malformed status line, an answer without framing, a short body, a silent server:
  a :class:`WireError`, the connection closed, the pool's size kept; the lean GET then
  gives None, the store's read goes through botocore;
* an interrupt mid-answer leaves, the connection closed and the pool's size kept;
* a final answer instead of ``100 Continue``: the body is not sent, the connection closed
  (and a success then is no success: a WireError);
* a proxy, a streamed body, another HTTP client: not the wire's request (None);
* attacks: a stream not at its start is sent from where it stands, a Content-Length
  other than the body's is refused, two framings or a chunk size that is not plain hex
  are not understood, bytes after an answer (or a close while idle) never answer the
  next request, a large body is written a block at a time (each write its own timeout),
  threads on a two-connection pool each get their own answer, an interrupt at any step
  leaves the pool whole, keys of any characters name the same object, and appends
  through the Table API whose lean answers are cut short land once.
"""

from __future__ import annotations

import contextlib
import io
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.awsrequest import AWSRequest
from botocore.httpsession import URLLib3Session
from s3_helpers import s3_config

from lancetx.commit.storage.s3_lean import lean_gets, lean_writes
from lancetx.commit.storage.s3_lean.kit import transport
from lancetx.commit.storage.s3_lean.wire import ANSWER_LIMIT, WireError, round_trip, signed_host
from lancetx.commit.storage.s3store import S3ObjectStore
from lancetx.demo.embedded import EmbeddedAws

#: What a scripted server answers: given the request head (and body, read by its
#: Content-Length unless ``Expect`` asked to wait), the bytes to send back; ``None``
#: sends nothing and closes.
Script = Callable[[bytes, bytes], bytes | None]

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


class ScriptedServer:
    """A TCP server on 127.0.0.1 that records every request's bytes and answers each by
    ``script``; it keeps a connection open for the next request unless told otherwise."""

    def __init__(
        self, script: Script, *, continue_first: bool = True, tls: ssl.SSLContext | None = None
    ) -> None:
        self.script = script
        self.tls = tls
        self.continue_first = continue_first
        self.requests: list[bytes] = []
        self.connections = 0
        #: The server's end of each connection, in the order accepted.
        self.accepted: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self.accepted.append(conn)
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # a client that reset the connection
            self._exchanges(conn)

    def _exchanges(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                conn.close()
                return  # a client that refused the certificate
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                head += b"\r\n\r\n"
                lines = head.decode("latin-1").lower().split("\r\n")
                length = next(
                    (int(v.split(":", 1)[1]) for v in lines if v.startswith("content-length:")), 0
                )
                expects = "expect: 100-continue" in lines
                if expects and length and not buffer:
                    if not self.continue_first:
                        # A final answer before the body: nothing more on this connection.
                        self.requests.append(head)
                        answer = self.script(head, b"")
                        if answer is not None:
                            conn.sendall(answer)
                        return
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                while len(buffer) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append(head + body)
                answer = self.script(head, body)
                if answer is None:
                    return
                conn.sendall(answer)
                if b"connection: close" in answer.lower() or b"x-then-close:" in answer.lower():
                    return  # announced, or not (a test's marker the client ignores)

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Script = lambda head, body: OK, **kwargs: Any) -> ScriptedServer:
        server = ScriptedServer(script, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def _store(endpoint: str, **overrides: Any) -> S3ObjectStore:
    return S3ObjectStore("bkt", config=s3_config(endpoint, **{"max_attempts": 1, **overrides}))


def _prepared(url: str, method: str = "GET", body: Any = None, **headers: Any) -> Any:
    base = {"User-Agent": "lancetx-test", "X-Amz-Date": "20260101T000000Z"}
    return AWSRequest(method=method, url=url, headers={**base, **headers}, data=body).prepare()


def _pool_size(session: Any, url: str) -> int:
    pool = session._get_connection_manager(url, None).connection_from_url(url)
    return int(pool.pool.qsize())


# ------------------------------------------------------------------ the bytes


@pytest.mark.parametrize(
    ("method", "body", "headers"),
    [
        ("GET", None, {"Range": "bytes=-65536"}),
        ("DELETE", None, {}),
        ("PUT", None, {"x-amz-copy-source": "bkt/a%20b"}),
        ("PUT", b"some bytes", {"Expect": b"100-continue", "Content-MD5": "abc=="}),
        ("PUT", io.BytesIO(b"a stream"), {"Expect": b"100-continue"}),
        ("PUT", b"some bytes", {"Expect": "100-continue"}),
    ],
    ids=["get", "delete", "copy", "put-expect", "put-stream-of-bytes", "put-expect-str"],
)
def test_the_request_bytes_are_what_botocores_session_writes(
    serve: Callable[..., ScriptedServer], method: str, body: Any, headers: dict[str, Any]
) -> None:
    server = serve()
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/t/a%20b%2Bc"
    assert session.send(_prepared(url, method, body, **headers)).content == b"hello"
    if isinstance(body, io.BytesIO):
        body.seek(0)
    answer = round_trip(session, _prepared(url, method, body, **headers))
    assert answer is not None and (answer.status_code, answer.content) == (200, b"hello")
    theirs, ours = server.requests
    assert ours == theirs


def _self_signed(directory: Any) -> tuple[str, ssl.SSLContext]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return str(cert), context


def test_over_tls_the_bytes_and_the_trust_are_the_sessions(
    serve: Callable[..., ScriptedServer], tmp_path: Any
) -> None:
    cert, context = _self_signed(tmp_path)
    server = serve(tls=context)
    url = f"https://127.0.0.1:{server.port}/bkt/k"
    session = URLLib3Session(verify=cert)
    assert session.send(_prepared(url, Range="bytes=-5")).content == b"hello"
    got = round_trip(session, _prepared(url, Range="bytes=-5"))
    assert got is not None and (got.status_code, got.content) == (200, b"hello")
    theirs, ours = server.requests
    assert ours == theirs
    # A body of many blocks, written through TLS as the session writes it.
    body = bytes(range(256)) * 4096
    for send in (session.send, lambda request: round_trip(session, request)):
        answer = send(_prepared(url, "PUT", io.BytesIO(body)))
        assert answer is not None and answer.content == b"hello"
    assert server.requests[2].endswith(body) and server.requests[3] == server.requests[2]
    # A session that does not trust the certificate refuses it on the wire too.
    with pytest.raises(Exception, match=r"(?i)certificate"):
        round_trip(URLLib3Session(), _prepared(url))
    assert len(server.requests) == 4


def test_a_lean_get_and_each_lean_write_bypass_botocores_session(
    aws: EmbeddedAws, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = S3ObjectStore(bucket, config=s3_config(aws.endpoint, max_attempts=1))
    gets, writes = lean_gets(store.client, bucket), lean_writes(store.client, bucket)
    gets.template(), writes.learned()  # learned before the session is taken away

    def refused(*_: Any, **__: Any) -> Any:
        raise AssertionError("sent through botocore's HTTP session")

    monkeypatch.setattr(transport(store.client), "send", refused)
    seen: list[str] = []
    store.client.meta.events.register(
        "before-send.s3", lambda request, **_: seen.append(request.method)
    )
    assert writes.put("k/a", b"x" * 3000) is not None
    assert writes.copy("k/a", "k/b") is not None
    assert gets.get_tail("k/b", 100) == (b"x" * 100, 3000)
    assert writes.delete("k/a") is True
    assert seen == ["PUT", "PUT", "GET", "DELETE"]


def test_a_connection_kept_open_serves_the_next_request(
    serve: Callable[..., ScriptedServer],
) -> None:
    server = serve()
    session = transport(_store(server.url).client)
    for n in range(3):
        answer = round_trip(session, _prepared(f"{server.url}/bkt/k{n}"))
        assert answer is not None and answer.content == b"hello"
    assert (len(server.requests), server.connections) == (3, 1)


# ------------------------------------------------------------------ framing


@pytest.mark.parametrize(
    ("answer", "status", "content", "reused"),
    [
        (
            b"HTTP/1.1 206 Partial\r\nContent-Length: 3\r\nX-A: 1\r\nx-a: 2\r\n\r\nabc",
            206,
            b"abc",
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n",
            200,
            b"abcde",
            True,
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", 200, b"ok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", False),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 1\r\n\r\nx",
            404,
            b"x",
            True,
        ),
    ],
    ids=["length", "chunked", "no-content", "close", "http-1.0", "interim"],
)
def test_answers_are_read_whole(
    serve: Callable[..., ScriptedServer], answer: bytes, status: int, content: bytes, reused: bool
) -> None:
    server = serve(lambda head, body: answer)
    session = transport(_store(server.url).client)
    got = round_trip(session, _prepared(f"{server.url}/bkt/k"))
    assert got is not None and (got.status_code, got.content) == (status, content)
    if status == 206:
        assert got.headers["x-a"] == "1, 2"
    round_trip(session, _prepared(f"{server.url}/bkt/k"))
    assert server.connections == (1 if reused else 2)


@pytest.mark.parametrize(
    "answer",
    [
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nno framing",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
        None,
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0_3\r\nabc\r\n0\r\n\r\n",
    ],
    ids=[
        *("status", "unframed", "short", "coding", "chunk-size", "folded", "closed"),
        *("two-lengths", "length-and-chunked", "chunk-0x", "chunk-sign", "chunk-underscore"),
    ],
)
def test_an_answer_it_does_not_understand_raises_and_closes(
    serve: Callable[..., ScriptedServer], answer: bytes | None
) -> None:
    server = serve(lambda head, body: answer)
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    before = _pool_size(session, url)
    with pytest.raises(WireError):
        round_trip(session, _prepared(url))
    assert _pool_size(session, url) == before
    server.script = lambda head, body: OK
    assert round_trip(session, _prepared(url)) is not None  # a new connection
    assert server.connections == 2


@pytest.mark.parametrize(
    ("headers", "answer"),
    [
        ({"Range": "bytes=-100"}, b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n"),
        ({"Range": "bytes=0-99"}, b"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n"),
        ({"Range": "bytes=-4"}, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n"),
        ({}, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (ANSWER_LIMIT + 1)),
    ],
    ids=["range-ignored", "range-overrun", "chunked-overrun", "no-range"],
)
def test_a_body_longer_than_asked_for_is_not_read(
    serve: Callable[..., ScriptedServer], headers: dict[str, str], answer: bytes
) -> None:
    server = serve(lambda head, body: answer)  # the body never comes: reading would hang
    session = transport(_store(server.url, read_timeout=30).client)
    with pytest.raises(WireError, match="more than the"):
        round_trip(session, _prepared(f"{server.url}/bkt/k", **headers))


def test_an_error_answer_longer_than_the_range_is_read_whole(
    serve: Callable[..., ScriptedServer],
) -> None:
    error = b"<Error><Code>PermanentRedirect</Code></Error>"
    moved = b"HTTP/1.1 301 Moved\r\nContent-Length: %d\r\n\r\n%b" % (len(error), error)
    server = serve(lambda head, body: moved)
    session = transport(_store(server.url).client)
    got = round_trip(session, _prepared(f"{server.url}/bkt/k", Range="bytes=-8"))
    assert got is not None and (got.status_code, got.content) == (301, error)


def test_an_interrupt_mid_answer_leaves_with_the_connection_closed(
    serve: Callable[..., ScriptedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lancetx.commit.storage.s3_lean import wire

    server = serve()
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    assert round_trip(session, _prepared(url)) is not None
    before = _pool_size(session, url)

    def interrupted(self: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(wire._Reader, "_fill", interrupted)
    with pytest.raises(KeyboardInterrupt):
        round_trip(session, _prepared(url))
    monkeypatch.undo()
    assert _pool_size(session, url) == before
    assert round_trip(session, _prepared(url)) is not None
    assert server.connections == 2  # the interrupted one was closed, not reused


def test_a_silent_server_is_a_read_timeout(serve: Callable[..., ScriptedServer]) -> None:
    hold = threading.Event()

    def silent(head: bytes, body: bytes) -> bytes | None:
        hold.wait(10)
        return None

    server = serve(silent)
    session = transport(_store(server.url, read_timeout=0.2).client)
    try:
        with pytest.raises(WireError, match="timed out"):
            round_trip(session, _prepared(f"{server.url}/bkt/k"))
    finally:
        hold.set()


def test_a_final_answer_instead_of_continue_leaves_the_body_unsent(
    serve: Callable[..., ScriptedServer],
) -> None:
    refused = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\ndenied"
    server = serve(lambda head, body: refused if not body else OK, continue_first=False)
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    got = round_trip(session, _prepared(url, "PUT", b"a body", Expect=b"100-continue"))
    assert got is not None and (got.status_code, got.content) == (403, b"denied")
    assert not server.requests[0].endswith(b"a body")
    assert round_trip(session, _prepared(url)) is not None
    assert server.connections == 2  # the one whose body was never sent is not reused


def test_a_success_instead_of_continue_is_no_success(
    serve: Callable[..., ScriptedServer],
) -> None:
    """A 2xx final answer before the body went out (the server never read it): not a
    write that landed; the body is not sent and the exchange fails (the ordinary
    call answers)."""
    server = serve(lambda head, body: OK, continue_first=False)
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    before = _pool_size(session, url)
    with pytest.raises(WireError, match="before the request's body was sent"):
        round_trip(session, _prepared(url, "PUT", b"a body", Expect=b"100-continue"))
    assert not server.requests[0].endswith(b"a body")
    assert _pool_size(session, url) == before


def test_a_lean_get_that_fails_on_the_wire_leaves_the_read_to_botocore(
    serve: Callable[..., ScriptedServer],
) -> None:
    answers = iter([b"HTTP/1.1 200 OK\r\n\r\nunframed"])
    tail = b"HTTP/1.1 206 Partial\r\nContent-Range: bytes 2-4/5\r\nContent-Length: 3\r\n\r\nllo"

    def script(head: bytes, body: bytes) -> bytes:
        return next(answers, tail)

    server = serve(script)
    store = _store(server.url)
    gets = lean_gets(store.client, "bkt")
    if gets.template() is None:
        pytest.skip("no lean template for this client")
    assert gets.get_tail("k", 3) is None  # the wire failed: the caller reads through botocore
    assert store.get_tail("k", 3) == (b"llo", 5)
    assert len(server.requests) == 2


# ------------------------------------------------------------------ not the wire's


def test_a_proxy_or_a_streamed_body_is_not_the_wires(
    serve: Callable[..., ScriptedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve()
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    assert round_trip(session, _prepared(url, "PUT", iter([b"x"]))) is None
    assert (
        round_trip(session, _prepared(url, "PUT", b"x", **{"Transfer-Encoding": "chunked"})) is None
    )
    assert round_trip(object(), _prepared(url)) is None  # another HTTP client's session
    for bad in ("a\r\nX-Injected: 1", "a\nb", "a\rb", "a\0b"):
        with pytest.raises(WireError, match="cannot be sent as is"):
            round_trip(session, _prepared(url, **{"X-Amz-Meta-A": bad}))
    monkeypatch.setattr(session._proxy_config, "proxy_url_for", lambda url: "http://proxy:3128")
    assert round_trip(session, _prepared(url)) is None
    assert server.requests == []


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://127.0.0.1:9000/b/k", "127.0.0.1:9000"),
        ("https://s3.amazonaws.com:443/b/k", "s3.amazonaws.com"),
        ("http://h:80/k", "h"),
        ("http://[::1]:9000/k", "[::1]:9000"),
    ],
)
def test_the_host_is_http_clients(url: str, host: str) -> None:
    assert signed_host(url) == host


# ------------------------------------------------------------------ attacks


def test_a_stream_not_at_its_start_is_sent_from_where_it_stands(
    serve: Callable[..., ScriptedServer],
) -> None:
    """botocore measures a stream's Content-Length from where it stands and the session
    sends from there: the wire sends those bytes, not the stream's whole buffer (whose
    first bytes would be stored and whose rest read as the next request)."""
    server = serve()
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    for send in (session.send, lambda request: round_trip(session, request)):
        stream = io.BytesIO(b"0123456789")
        stream.read(4)
        answer = send(_prepared(url, "PUT", stream))
        assert answer is not None and answer.content == b"hello"
    theirs, ours = server.requests
    assert theirs.endswith(b"Content-Length: 6\r\n\r\n456789")
    assert ours == theirs


@pytest.mark.parametrize("declared", ["99", "2"], ids=["longer", "shorter"])
def test_a_content_length_other_than_the_bodys_is_not_sent(
    serve: Callable[..., ScriptedServer], declared: str
) -> None:
    """A Content-Length that is not the body's (a ``before-send`` handler that changed
    one of them) would leave the server waiting, or reading the rest of the body as
    another request: the wire refuses it before taking a connection."""
    server = serve()
    session = transport(_store(server.url, read_timeout=2).client)
    url = f"{server.url}/bkt/k"
    before = _pool_size(session, url)
    request = _prepared(url, "PUT", b"abc")
    request.headers["Content-Length"] = declared
    with pytest.raises(WireError, match="Content-Length"):
        round_trip(session, request)
    assert (server.requests, server.connections) == ([], 0)
    assert _pool_size(session, url) == before


STALE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"


@pytest.mark.parametrize("when", ["with-the-answer", "after-the-answer"])
def test_bytes_after_an_answer_are_never_the_next_answer(
    serve: Callable[..., ScriptedServer], when: str
) -> None:
    """A server that sends a second answer nobody asked for (with the first, or later
    on the idle pooled connection): the next request is never answered by it."""
    from urllib3.util.wait import wait_for_read

    together = when == "with-the-answer"
    server = serve(lambda head, body: OK + STALE if together and b"/first " in head else OK)
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt"
    first = round_trip(session, _prepared(f"{url}/first"))
    assert first is not None and first.content == b"hello"
    if not together:
        pool = session._get_connection_manager(url, None).connection_from_url(url)
        idle = next(conn for conn in list(pool.pool.queue) if conn is not None and conn.sock)
        server.accepted[0].sendall(STALE)  # the server's end of the idle connection
        assert wait_for_read(idle.sock, 10)  # there before the next request is sent
    second = round_trip(session, _prepared(f"{url}/second"))
    assert second is not None and second.content == b"hello"
    assert server.connections == 2


def test_many_threads_on_a_small_pool_each_get_their_own_answer(
    serve: Callable[..., ScriptedServer],
) -> None:
    """Threads share one client whose pool keeps two connections; the server names the
    request in each answer and closes the connection after every third answer
    without saying so. Each exchange gives its own request's answer or a WireError (a
    connection taken before its close was seen), never another's, never a hang; the
    pool keeps its size."""
    lock = threading.Lock()
    answered = [0]

    def script(head: bytes, body: bytes) -> bytes:
        path = head.split(b" ", 2)[1]
        with lock:
            answered[0] += 1
            drop = answered[0] % 3 == 0
        mark = b"X-Then-Close: 1\r\n" if drop else b""
        return b"HTTP/1.1 200 OK\r\n%bContent-Length: %d\r\n\r\n%b" % (mark, len(path), path)

    server = serve(script)
    session = transport(_store(server.url, max_pool_connections=2).client)
    errors: list[BaseException] = []
    wrong: list[tuple[bytes, bytes]] = []
    right = [0]

    def worker(n: int) -> None:
        for i in range(15):
            path = f"/bkt/t{n}-{i}"
            try:
                answer = round_trip(session, _prepared(f"{server.url}{path}"))
            except WireError:
                continue
            except BaseException as exc:  # reported below
                errors.append(exc)
                return
            if answer is None or answer.content != path.encode():
                wrong.append((path.encode(), answer.content if answer else b""))
            with lock:
                right[0] += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert (errors, wrong) == ([], [])
    assert right[0] > 0 and server.connections > 2
    assert _pool_size(session, f"{server.url}/bkt") == 2


@pytest.mark.parametrize("where", ["connect", "_head", "_body", "_keeps_alive"])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_at_each_step_leaves_the_pool_whole(
    serve: Callable[..., ScriptedServer],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    interrupt: type[BaseException],
) -> None:
    """An interrupt while connecting, reading the head, the body, or after the answer
    was read: it leaves the exchange as it is, the connection is closed (never reused
    with an answer half read) and the pool keeps its size."""
    from botocore.awsrequest import AWSHTTPConnection

    from lancetx.commit.storage.s3_lean import wire

    server = serve()
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    if where != "connect":
        assert round_trip(session, _prepared(url)) is not None  # a kept connection
    before = _pool_size(session, url)

    def interrupted(*_: Any, **__: Any) -> Any:
        raise interrupt

    owner: Any = AWSHTTPConnection if where == "connect" else wire
    monkeypatch.setattr(owner, where, interrupted)
    with pytest.raises(interrupt):
        round_trip(session, _prepared(url))
    monkeypatch.undo()
    assert _pool_size(session, url) == before
    answer = round_trip(session, _prepared(url))
    assert answer is not None and answer.content == b"hello"
    assert server.connections == (1 if where == "connect" else 2)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_mid_answer_leaves_a_lean_write_and_a_lean_get(
    aws: EmbeddedAws, bucket: str, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    """Not "no answer" (None, then botocore's call): the interrupt itself leaves, so
    the caller's own handling (keep the files, say what settles it) runs."""
    from lancetx.commit.storage.s3_lean import wire

    store = S3ObjectStore(bucket, config=s3_config(aws.endpoint, max_attempts=1))
    gets, writes = lean_gets(store.client, bucket), lean_writes(store.client, bucket)
    assert writes.put("k/a", b"data") is not None and gets.template() is not None

    def interrupted(*_: Any, **__: Any) -> Any:
        raise interrupt

    monkeypatch.setattr(wire, "_body", interrupted)
    for call in (
        lambda: writes.put("k/b", b"data"),
        lambda: writes.copy("k/a", "k/c"),
        lambda: writes.delete("k/a"),
        lambda: gets.get_tail("k/a", 2),
    ):
        with pytest.raises(interrupt):
            call()
    monkeypatch.undo()
    # Each request was sent and answered (the interrupt came as the body was read).
    assert gets.get_tail("k/c", 2) == (b"ta", 4)
    assert gets.get_tail("k/a", 2) is None  # deleted: 404, read the ordinary way


NASTY_KEYS = [
    "t/a b/c%41d?e=f#g",
    "t/\u00fc\u00f1/\u65e5\u672c/\U0001f600",
    "t/x+y=z&w;v:u@s,r!q'p(o)n*m$l",
    "t/ trailing space /",
    # (LF too is quoted, but the embedded server's routing refuses it, botocore's call too)
    "t/carriage\rreturn\tand tab",
    "t/%0D%0AX-Injected: 1",
]


def test_keys_of_any_characters_reach_the_same_object(
    aws: EmbeddedAws, bucket: str, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spaces, ``%``, ``?``, ``#``, non-ASCII, CR, tab in a key: the lean PUT, copy,
    GET and DELETE (botocore's session taken away) name the very object botocore's own
    calls name, and nothing of a key reaches the request's headers."""
    store = S3ObjectStore(bucket, config=s3_config(aws.endpoint, max_attempts=1))
    gets, writes = lean_gets(store.client, bucket), lean_writes(store.client, bucket)
    gets.template(), writes.learned()

    def refused(*_: Any, **__: Any) -> Any:
        raise AssertionError("sent through botocore's HTTP session")

    monkeypatch.setattr(transport(store.client), "send", refused)
    for n, key in enumerate(NASTY_KEYS):
        data = f"object {n}".encode()
        assert writes.put(key, data) is not None, key
        assert writes.copy(key, key + ".copy") is not None, key
        assert gets.get_tail(key + ".copy", 100) == (data, len(data)), key
        assert s3_client.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
        assert writes.delete(key) is True, key
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="t/")
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(k + ".copy" for k in NASTY_KEYS)


class _Recording:
    """A pooled connection's socket, recording the size of each write."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.writes: list[int] = []

    def sendall(self, data: Any) -> None:
        self.writes.append(len(data))
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_a_large_body_is_written_a_block_at_a_time(
    serve: Callable[..., ScriptedServer],
) -> None:
    """The socket's timeout applies to each write: the session writes a body a block at
    a time, so a large body is never held to one timeout for all of it (a slow link
    would time every lean PUT of a few MiB out, and send it twice)."""
    server = serve()
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    assert round_trip(session, _prepared(url)) is not None
    pool = session._get_connection_manager(url, None).connection_from_url(url)
    idle = next(conn for conn in list(pool.pool.queue) if conn is not None and conn.sock)
    recording = idle.sock = _Recording(idle.sock)
    body = bytes(range(256)) * (8 << 12)  # 8 MiB, as a lean PUT's (botocore's) stream
    for send in (session.send, lambda request: round_trip(session, request)):
        recording.writes.clear()
        answer = send(_prepared(url, "PUT", io.BytesIO(body)))
        assert answer is not None and answer.content == b"hello"
        assert server.requests[-1].endswith(body)
        assert sum(recording.writes) == len(server.requests[-1])
        assert max(recording.writes) <= idle.blocksize
    assert server.connections == 1  # both on the recorded connection


def test_a_connection_the_server_closed_while_idle_is_not_used(
    serve: Callable[..., ScriptedServer],
) -> None:
    """A server that closes kept-alive connections between requests (without saying
    so in its answer): the next request goes on a new connection, not into the closed
    one (no WireError, no request more)."""
    from urllib3.util.wait import wait_for_read

    dropped = b"HTTP/1.1 200 OK\r\nX-Then-Close: 1\r\nContent-Length: 5\r\n\r\nhello"
    server = serve(lambda head, body: dropped)
    session = transport(_store(server.url).client)
    url = f"{server.url}/bkt/k"
    for _ in range(3):
        answer = round_trip(session, _prepared(url))
        assert answer is not None and answer.content == b"hello"
        pool = session._get_connection_manager(url, None).connection_from_url(url)
        idle = next(conn for conn in list(pool.pool.queue) if conn is not None and conn.sock)
        assert wait_for_read(idle.sock, 10)  # its close has arrived
    assert (len(server.requests), server.connections) == (3, 3)


# ------------------------------------------------------------------ in a commit


class _CutSocket:
    """A socket whose answer ends ``where`` the test says, as if the server closed
    there: before its first byte, mid status line, one byte short of the end of its
    head, or halfway through its body (an answer without a body is then whole)."""

    def __init__(self, sock: Any, where: str, cut: list[str]) -> None:
        self._sock = sock
        self._where = where
        self._cut = cut
        self._buffer = b""
        self._left: int | None = None

    def _plan(self) -> int:
        while b"\r\n\r\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise AssertionError("the server closed before answering")
            self._buffer += chunk
        head = self._buffer.index(b"\r\n\r\n") + 4
        lines = self._buffer[:head].decode("latin-1").lower().split("\r\n")
        length = next((int(v.split(":")[1]) for v in lines if v.startswith("content-length:")), 0)
        cut = {"nothing": 0, "status-line": 8, "head": head - 1, "body": head + length // 2}
        if self._where == "body" and length < 2:
            return 1 << 30  # nothing to cut in
        self._cut.append(self._where)
        return cut[self._where]

    def recv(self, size: int) -> bytes:
        if self._left is None:
            self._left = self._plan()
        if self._left <= 0:
            return b""
        if not self._buffer:
            self._buffer = bytes(self._sock.recv(65536))
        data = self._buffer[: min(size, self._left)]
        self._buffer = self._buffer[len(data) :]
        self._left -= len(data)
        return data


class CutAnswers:
    """Cuts the answer to the next lean request that ``match`` (method, URL, headers)
    picks (see :class:`_CutSocket`); the request itself is sent whole (it lands)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
        from lancetx.commit.storage.s3_lean import wire

        self.match: Callable[[str, str, Any], bool] | None = None
        #: The requests picked, and those whose answer was cut.
        self.picked: list[str] = []
        self.cut: list[str] = []
        self._current = threading.local()
        head, reader = wire._request_head, wire._Reader

        def request_head(method: str, url: str, headers: Any, body: bytes | None) -> bytes:
            match = self.match
            self._current.pick = match is not None and match(method, url, headers)
            if self._current.pick:
                self.match = None
                self.picked.append(method)
            return head(method, url, headers, body)

        def cut_reader(sock: Any) -> Any:
            if getattr(self._current, "pick", False):
                return reader(_CutSocket(sock, where, self.cut))
            return reader(sock)

        monkeypatch.setattr(wire, "_request_head", request_head)
        monkeypatch.setattr(wire, "_Reader", cut_reader)


def _lean_of(write: str) -> Callable[[str, str, Any], bool]:
    def copying(headers: Any) -> bool:
        return any(str(name).lower() == "x-amz-copy-source" for name in headers)

    return {
        "transaction file": lambda m, u, h: m == "PUT" and "/_transactions/" in u,
        "staged manifest": lambda m, u, h: m == "PUT" and "/_versions/" in u and not copying(h),
        "copy": lambda m, u, h: m == "PUT" and copying(h),
        "staged delete": lambda m, u, h: m == "DELETE" and "/_versions/" in u,
        "catch-up read": lambda m, u, h: m == "GET",
    }[write]


@pytest.mark.parametrize("where", ["nothing", "status-line", "head", "body"])
def test_a_commit_whose_lean_answers_are_cut_short_lands_once(
    aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """Appends through the Table API while, in turn, the answer to each of a commit's
    lean requests (its transaction file, staged manifest, copy, staged delete, and a
    read of versions pylance committed, as the writer catches up) is cut short —
    before its first byte, mid status line, at the end of its head, mid body — and the
    connection closes.
    Every append lands once, every version opens with pylance, no staged manifest is
    left and no file of a landed version is gone."""
    import lance
    import pyarrow as pa
    from claim_faults import check_every_version_opens
    from protocol_helpers import ddb_uri, ensure_ddb_table

    import lancetx

    options = {**aws.pylance_storage_options(), "max_attempts": "1"}
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)

    def rows(start: int) -> Any:
        return pa.table({"id": pa.array(range(start, start + 10), pa.int64())})

    lancetx.write_table(uri, rows(0), storage_options=options)
    held = lancetx.open(uri, storage_options=options)
    held.append(rows(10))  # learned and connected: the next appends are the plain ones
    cutter = CutAnswers(monkeypatch, where)
    start = 20
    for write in ("transaction file", "staged manifest", "copy", "staged delete"):
        cutter.match = _lean_of(write)
        held.append(rows(start))
        start += 10
        assert cutter.match is None, f"no lean {write} was sent"
    # Versions pylance commits: their manifests are read (lean, several at once) as the
    # writer catches up.
    for _ in range(2):
        lance.write_dataset(rows(start), uri, mode="append", storage_options=options)
        start += 10
    cutter.match = _lean_of("catch-up read")
    held.append(rows(start))
    start += 10
    assert cutter.match is None, "no lean read as the writer caught up"
    monkeypatch.undo()
    assert cutter.picked == ["PUT", "PUT", "PUT", "DELETE", "GET"]
    # (a write's answer has no body to cut: the copy's and the read's have)
    assert len(cutter.cut) == (2 if where == "body" else 5)
    assert held.version == 9
    plain = aws.pylance_storage_options()
    assert check_every_version_opens(uri, plain) == {v: 10 * v for v in range(1, 10)}
    ids = lance.dataset(uri, storage_options=plain).to_table().column("id").to_pylist()
    assert sorted(ids) == list(range(start))
    pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    keys = {o["Key"] for page in pages for o in page.get("Contents", [])}
    assert not [k for k in keys if "/_versions/" in k and not k.endswith(".manifest")]
    assert len([k for k in keys if "/_transactions/" in k]) == 9


@pytest.mark.parametrize("write", ["transaction file", "staged manifest", "copy", "staged delete"])
def test_an_interrupt_as_a_commits_lean_answer_is_read_keeps_a_landed_claims_files(
    aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    write: str,
) -> None:
    """Ctrl-C while the answer to one of a commit's lean writes is read (the write has
    landed): the append leaves with the interrupt. Before the claim nothing is
    committed; after it (the copy, the staged delete) the version is there for
    pylance with all its rows: no file of the landed claim was deleted."""
    import lance
    import pyarrow as pa
    from claim_faults import check_every_version_opens
    from protocol_helpers import ddb_uri, ensure_ddb_table

    import lancetx
    from lancetx.commit.storage.s3_lean import wire

    options = {**aws.pylance_storage_options(), "max_attempts": "1"}
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    rows = [pa.table({"id": pa.array(range(n, n + 10), pa.int64())}) for n in (0, 10, 20)]
    lancetx.write_table(uri, rows[0], storage_options=options)
    held = lancetx.open(uri, storage_options=options)
    held.append(rows[1])
    match = _lean_of(write)
    picked = threading.local()
    head, body = wire._request_head, wire._body

    def request_head(method: str, url: str, headers: Any, data: bytes | None) -> bytes:
        picked.now = match(method, url, headers)
        return head(method, url, headers, data)

    def interrupted_body(*args: Any) -> bytes:
        if getattr(picked, "now", False):
            raise KeyboardInterrupt
        return body(*args)

    monkeypatch.setattr(wire, "_request_head", request_head)
    monkeypatch.setattr(wire, "_body", interrupted_body)
    with pytest.raises(KeyboardInterrupt):
        held.append(rows[2])
    monkeypatch.undo()
    landed = write in ("copy", "staged delete")
    plain = aws.pylance_storage_options()
    expected = {1: 10, 2: 20, **({3: 30} if landed else {})}
    assert check_every_version_opens(uri, plain) == expected
    if landed:
        ids = lance.dataset(uri, storage_options=plain).to_table().column("id").to_pylist()
        assert sorted(ids) == list(range(30))
    # The writer goes on from what is there.
    lancetx.open(uri, storage_options=options).append(rows[2])
    assert lance.dataset(uri, storage_options=plain).count_rows() == (40 if landed else 30)
