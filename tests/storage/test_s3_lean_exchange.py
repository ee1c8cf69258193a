"""The lean exchange's steps and drivers (commit/storage/s3_lean/exchange.py):
what ends an exchange with None (make the ordinary call), what leaves it, and
what happens to the answer's connection on each way out. A fake client stands in
for botocore's here (the steps and drivers only touch the handful of client
attributes named below); the lean requests against the embedded server are
tested in test_s3_lean.py and test_s3_lean_writes.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import HTTPClientError

from lancetx.commit.storage.s3_lean.exchange import exchange, exchange_async, exchange_steps


class FakeRaw:
    def __init__(self) -> None:
        self.released = 0
        self.closed = 0

    def release_conn(self) -> None:
        self.released += 1

    def close(self) -> None:
        self.closed += 1


class FakeResponse:
    def __init__(self, status: int, body: Any = b"body") -> None:
        self.status_code = status
        self.headers = {"etag": '"x"'}
        self.raw = FakeRaw()
        self._body = body

    @property
    def content(self) -> Any:
        if isinstance(self._body, BaseException):
            raise self._body
        return self._body


def fake_client(
    response: FakeResponse | None = None,
    *,
    send_error: BaseException | None = None,
    handler: Any = None,
    credentials_error: BaseException | None = None,
) -> Any:
    def get_credentials() -> Any:
        if credentials_error is not None:
            raise credentials_error
        return SimpleNamespace(get_frozen_credentials=lambda: "frozen")

    def emit(event: str, request: Any) -> list[tuple[Any, Any]]:
        return [(handler, handler(request))] if handler is not None else []

    def send(prepared: Any) -> FakeResponse:
        if send_error is not None:
            raise send_error
        assert response is not None
        return response

    return SimpleNamespace(
        _get_credentials=get_credentials,
        meta=SimpleNamespace(events=SimpleNamespace(emit=emit)),
        _endpoint=SimpleNamespace(http_session=SimpleNamespace(send=send)),
    )


def run(client: Any, *, leave: bool = False, wanted: Any = None) -> Any:
    statuses: list[int] = []
    steps = exchange_steps(
        "PutObject",
        lambda frozen: ("prepared", frozen),
        statuses.append,
        handler_errors_leave=leave,
        **({"wanted": wanted} if wanted is not None else {}),
    )
    return exchange(client, steps), statuses


def test_a_plain_answer_is_heard_in_full_and_its_connection_given_back() -> None:
    response = FakeResponse(200)
    answer, statuses = run(fake_client(response))
    assert answer == (200, {"etag": '"x"'}, b"body")
    assert statuses == [200]
    assert (response.raw.released, response.raw.closed) == (1, 0)


def test_an_answer_not_wanted_is_dropped_unread() -> None:
    response = FakeResponse(403)
    answer, statuses = run(fake_client(response), wanted=lambda status, headers: status == 200)
    assert answer is None
    assert statuses == [403]  # counted as a refusal all the same
    assert (response.raw.released, response.raw.closed) == (0, 1)


@pytest.mark.parametrize(
    "client",
    [
        pytest.param(fake_client(credentials_error=RuntimeError("no creds")), id="credentials"),
        pytest.param(fake_client(send_error=ConnectionResetError("reset")), id="send"),
        pytest.param(
            fake_client(handler=lambda r: (_ for _ in ()).throw(HTTPClientError(error="x"))),
            id="handler-connection-failure",
        ),
    ],
)
def test_a_failed_effect_ends_with_none_never_an_error(client: Any) -> None:
    assert run(client, leave=True)[0] is None


def test_a_body_that_fails_midway_ends_with_none_and_drops_the_connection() -> None:
    response = FakeResponse(200, body=ConnectionResetError("midway"))
    assert run(fake_client(response))[0] is None
    assert (response.raw.released, response.raw.closed) == (0, 1)


def test_a_handlers_own_error_leaves_only_where_the_caller_says() -> None:
    def boom(request: Any) -> Any:
        raise RuntimeError("guard refused")

    assert run(fake_client(handler=boom), leave=False)[0] is None
    with pytest.raises(RuntimeError, match="guard refused"):
        run(fake_client(handler=boom), leave=True)


def test_a_handler_that_answers_is_the_answer() -> None:
    answered = FakeResponse(204, body=b"")
    answer, _ = run(fake_client(send_error=AssertionError("sent"), handler=lambda r: answered))
    assert answer == (204, answered.headers, b"")


def test_an_interrupt_while_reading_leaves_and_drops_the_connection_at_once() -> None:
    response = FakeResponse(200, body=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as caught:
        run(fake_client(response))
    # Dropped before the interrupt reached us, not whenever the traceback is freed.
    assert (response.raw.released, response.raw.closed) == (0, 1)
    del caught


def test_the_asyncio_driver_runs_the_same_steps() -> None:
    class AsyncFake:
        def __init__(self, response: FakeResponse) -> None:
            async def frozen() -> str:
                return "frozen"

            async def emit(event: str, request: Any) -> list[Any]:
                return []

            async def send(prepared: Any) -> FakeResponse:
                return response

            self._get_credentials = lambda: SimpleNamespace(get_frozen_credentials=frozen)
            self.meta = SimpleNamespace(events=SimpleNamespace(emit=emit))
            self._endpoint = SimpleNamespace(http_session=SimpleNamespace(send=send))

    response = FakeResponse(200)
    steps = exchange_steps("GetObject", lambda f: f, lambda s: None, handler_errors_leave=False)
    assert asyncio.run(exchange_async(AsyncFake(response), steps)) == (
        200,
        response.headers,
        b"body",
    )
    assert response.raw.released == 1
