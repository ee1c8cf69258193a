"""An in-process moto server standing in for S3 and DynamoDB.

Used by the demo (``make demo``), the tests and the benchmarks. It serves real
HTTP on 127.0.0.1 (port 0 by default), so boto3, aioboto3 and pylance all talk
to it exactly as they would to AWS, with fake credentials.

Two differences from stock moto make it a faithful stand-in:

* **Atomic requests.** Stock moto has no lock between a condition check and the
  write, so racing conditional PutItems could both "win". Every request is
  served under one lock here, as a real service linearizes them.
* **Legacy S3 on demand.** With ``legacy_s3=True`` the S3 side silently ignores
  ``If-None-Match`` / ``If-Match`` on writes, like the S3-compatible stores
  lancetx exists for.

An optional *interceptor* sees each request first and may answer it instead
(fault injection: throttling, 5xx, timeouts, connection resets), before or
after letting it reach moto.
"""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from lancetx.commit.errors import MissingExtraError

FAKE_ACCESS_KEY = "testing"
FAKE_SECRET_KEY = "testing"
DEFAULT_REGION = "us-east-1"


@dataclass
class InterceptedRequest:
    """What an interceptor sees: the service is ``"s3"`` or ``"dynamodb"``."""

    service: str
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    #: For DynamoDB, the operation from ``X-Amz-Target`` (e.g. ``PutItem``).
    target: str = ""
    #: The client's TCP port on 127.0.0.1 (0 if unknown): tells which process sent it.
    client_port: int = 0
    #: The server's own port: with ``client_port``, the connection (another connection
    #: may use the same client port towards another server).
    server_port: int = 0


@dataclass
class InterceptedResponse:
    """A canned answer: returned to the client instead of moto's."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: Let the request reach moto first, then answer with this response
    #: (a write that lands while the client sees an error: an ambiguous outcome).
    after_forwarding: bool = False
    #: Drop the connection instead of answering (the client sees a reset), after
    #: forwarding if ``after_forwarding``.
    reset: bool = False
    #: Called once the request was forwarded (or, if it is not, before answering):
    #: e.g. kill the client after its write landed.
    then: Callable[[], None] | None = None


Interceptor = Callable[[InterceptedRequest], "InterceptedResponse | None"]

_CONDITIONAL_HEADERS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")


class _LockedApp:
    """WSGI wrapper: one request at a time, optional legacy S3, optional interceptor."""

    def __init__(self, app: Any, legacy_s3: bool) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.legacy_s3 = legacy_s3
        self.interceptor: Interceptor | None = None

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        service = "dynamodb" if target.startswith("DynamoDB") else "s3"
        if service == "s3" and self.legacy_s3:
            for header in _CONDITIONAL_HEADERS:
                environ.pop(header, None)
        interceptor = self.interceptor
        pending: InterceptedResponse | None = None
        if interceptor is not None:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(body)
            request = InterceptedRequest(
                service=service,
                method=environ.get("REQUEST_METHOD", ""),
                path=environ.get("PATH_INFO", ""),
                query=environ.get("QUERY_STRING", ""),
                headers={
                    k[5:].replace("_", "-").lower(): str(v)
                    for k, v in environ.items()
                    if k.startswith("HTTP_")
                },
                body=body,
                target=target.split(".", 1)[-1] if target else "",
                client_port=int(environ.get("REMOTE_PORT") or 0),
                server_port=int(environ.get("SERVER_PORT") or 0),
            )
            pending = interceptor(request)
            if pending is not None and not pending.after_forwarding:
                return _respond(pending, start_response, environ)
        with self._lock:
            if pending is None:
                # Materialize the body inside the lock: moto builds responses lazily.
                return _drain(self._app(environ, start_response))
            # Run the real request, discard its answer, return the canned one.
            _drain(self._app(environ, lambda *a, **k: None))
        return _respond(pending, start_response, environ)


def _drain(chunks: Iterable[bytes]) -> list[bytes]:
    """The whole body, then ``close()`` as WSGI requires (the server only
    sees the list we return, so it cannot close the app's iterable)."""
    try:
        return list(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _respond(
    response: InterceptedResponse, start_response: Callable[..., Any], environ: dict[str, Any]
) -> list[bytes]:
    if response.then is not None:
        response.then()
    if response.reset:
        sock = environ.get("werkzeug.socket")
        if sock is not None:
            # Linger 0: closing sends RST; the server treats the error as a dropped connection.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # Now, not when the server gets round to closing: a keep-alive client would
            # otherwise wait on the open connection for an answer that never comes.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        raise ConnectionResetError("injected: connection reset")
    reason = {400: "Bad Request", 403: "Forbidden", 500: "Internal Server Error", 503: "Slow Down"}
    status = f"{response.status} {reason.get(response.status, 'Error')}"
    headers = [*response.headers, ("Content-Length", str(len(response.body)))]
    start_response(status, headers)
    return [response.body]


class EmbeddedAws:
    """A moto server on 127.0.0.1 serving S3 and DynamoDB over HTTP.

    Use as a context manager::

        with EmbeddedAws() as aws:
            s3 = boto3.client("s3", endpoint_url=aws.endpoint, **aws.client_kwargs())
    """

    def __init__(self, port: int = 0, *, legacy_s3: bool = False) -> None:
        self._port = port
        self._legacy_s3 = legacy_s3
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._app: _LockedApp | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedAws:
        """Start serving; returns self. Importing moto is deferred to here so the
        package does not need moto unless the embedded server is used. Starting a
        started server does nothing (so ``with server.start() as aws`` is fine)."""
        if self._server is not None:
            return self
        try:
            from moto.moto_server.werkzeug_app import (
                DomainDispatcherApplication,
                MotoRequestHandler,
                create_backend_app,
            )
            from werkzeug.serving import make_server
        except ImportError as exc:
            raise MissingExtraError("the embedded AWS server", "embedded", exc.name) from exc

        class _QuietHandler(MotoRequestHandler):  # type: ignore[misc,valid-type]
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

            def send_response(self, code: int, message: str | None = None) -> None:
                # http.server adds its own Server header, and moto's responses carry
                # one too: a strict HTTP parser (aiohttp's, under PYTHONASYNCIODEBUG=1)
                # rejects the duplicate. The answer keeps moto's (or none).
                self.log_request(code)
                self.send_response_only(code, message)
                self.send_header("Date", self.date_time_string())

        self._app = _LockedApp(DomainDispatcherApplication(create_backend_app), self._legacy_s3)
        self._server = make_server(
            "127.0.0.1", self._port, self._app, threaded=True, request_handler=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="embedded-aws", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving. State held by moto's in-process backends is kept."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None

    def __enter__(self) -> EmbeddedAws:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ settings

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self._server is None:
            raise RuntimeError("EmbeddedAws is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def dynamodb_endpoint(self) -> str:
        """The DynamoDB endpoint: the same server as S3."""
        return self.endpoint

    @property
    def legacy_s3(self) -> bool:
        """Whether S3 ignores conditional headers."""
        return self._app.legacy_s3 if self._app is not None else self._legacy_s3

    @legacy_s3.setter
    def legacy_s3(self, value: bool) -> None:
        self._legacy_s3 = value
        if self._app is not None:
            self._app.legacy_s3 = value

    def set_interceptor(self, interceptor: Interceptor | None) -> None:
        """Install (or with None remove) a request interceptor for fault injection."""
        if self._app is None:
            raise RuntimeError("EmbeddedAws is not started")
        self._app.interceptor = interceptor

    def client_kwargs(self, service: str = "s3") -> dict[str, Any]:
        """Keyword arguments for ``boto3.client(service, ...)`` pointing at this server
        (one endpoint serves both services; ``service`` is accepted so that callers
        also work with setups where S3 and DynamoDB are separate servers)."""
        return {
            "endpoint_url": self.endpoint,
            "region_name": DEFAULT_REGION,
            "aws_access_key_id": FAKE_ACCESS_KEY,
            "aws_secret_access_key": FAKE_SECRET_KEY,
        }

    def pylance_storage_options(self) -> dict[str, str]:
        """``storage_options`` for pylance (S3 and its ``s3+ddb://`` DynamoDB store)."""
        return {
            "aws_endpoint": self.endpoint,
            "dynamodb_endpoint": self.endpoint,
            "allow_http": "true",
            "aws_access_key_id": FAKE_ACCESS_KEY,
            "aws_secret_access_key": FAKE_SECRET_KEY,
            "aws_region": DEFAULT_REGION,
        }

    def environ(self) -> dict[str, str]:
        """Environment variables that point boto3 and pylance at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "DYNAMODB_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
            "AWS_DEFAULT_REGION": DEFAULT_REGION,
            "AWS_REGION": DEFAULT_REGION,
        }


def fake_credentials_environ() -> dict[str, str]:
    """Fake credentials, so nothing can ever authenticate against real AWS."""
    return {"AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY}


__all__ = [
    "EmbeddedAws",
    "InterceptedRequest",
    "InterceptedResponse",
    "Interceptor",
    "fake_credentials_environ",
]
