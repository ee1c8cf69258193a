"""One lean request and its answer, as steps, and the two drivers that run them.

A lean GET and a lean write exchange the same way: freeze the client's
credentials and build the signed request, let the client's ``before-send``
handlers see it (one may answer it), send it through the client's HTTP session,
judge the status and headers, read the body, give the connection back. Written
once here as steps (:mod:`lancetx.commit.sansio`); :func:`exchange` runs them on
a botocore client (sending on a connection of its pool, see :mod:`.wire`),
:func:`exchange_async` on an aiobotocore one (through its HTTP session).

Invariant: the steps never raise what a request did. Every failure of an effect
(credentials, the send, the body) ends them with None, and the caller makes the
ordinary botocore call, whose answer is the definitive one. Only a ``before-send``
handler's own error may leave, where the caller says so (a write leaves as
botocore's call would). Errors that are not an :class:`Exception` (Ctrl-C, a
cancellation) leave the driver, and the answer's connection is dropped on the way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import HTTPClientError

from lancetx.commit.sansio import Steps, drive, drive_async
from lancetx.commit.storage.s3_lean.kit import (
    before_send,
    before_send_async,
    close_response,
    content_async,
    credentials,
    transmit,
    transport,
)

__all__ = [
    "Answer",
    "BeforeSend",
    "FrozenCredentials",
    "LeanEffect",
    "ReadBody",
    "Transmit",
    "exchange",
    "exchange_async",
    "exchange_steps",
]

#: An answer heard in full: its status, headers and body.
Answer = tuple[int, Any, bytes]


@dataclass(frozen=True)
class FrozenCredentials:
    """The client's credentials, frozen for one request."""


@dataclass(frozen=True)
class BeforeSend:
    """The client's ``before-send`` handlers see ``prepared``: one's answer, or None."""

    operation: str
    prepared: Any


@dataclass(frozen=True)
class Transmit:
    """``prepared`` sent through the client's HTTP session: the response."""

    prepared: Any


@dataclass(frozen=True)
class ReadBody:
    """The whole body of ``response``."""

    response: Any


LeanEffect = FrozenCredentials | BeforeSend | Transmit | ReadBody


def exchange_steps(
    operation: str,
    prepare: Callable[[Any], Any],
    answered: Callable[[int], None],
    *,
    wanted: Callable[[int, Any], bool] = lambda status, headers: True,
    handler_errors_leave: bool,
) -> Steps[LeanEffect, Answer | None]:
    """Send what ``prepare(frozen credentials)`` builds as an ``operation`` request.

    ``answered`` counts each answer's status (a template is learned again after
    refusals); ``wanted`` says from the status and headers whether the body is worth
    reading (if not, the connection is dropped unread). ``handler_errors_leave``: a
    ``before-send`` handler's error other than a connection failure (which botocore
    retries) leaves, as it leaves botocore's call; otherwise it too ends with None.
    Returns the answer heard in full, or None: make the ordinary call."""
    try:
        prepared = prepare((yield FrozenCredentials()))
    except Exception:
        return None
    try:
        response = yield BeforeSend(operation, prepared)
    except HTTPClientError:
        return None
    except Exception:
        if handler_errors_leave:
            raise
        return None
    if response is None:
        try:
            response = yield Transmit(prepared)
        except Exception:
            return None  # the ordinary call sends it again, as botocore would retry
    read = False
    try:
        answered(response.status_code)
        if not wanted(response.status_code, response.headers):
            return None
        body: bytes = yield ReadBody(response)
        read = True
        return response.status_code, response.headers, body
    except Exception:
        return None
    finally:
        close_response(response, read=read)


def exchange(client: Any, steps: Steps[LeanEffect, Answer | None]) -> Answer | None:
    """Run :func:`exchange_steps` on a botocore ``client``."""

    def perform(effect: LeanEffect) -> Any:
        if isinstance(effect, FrozenCredentials):
            return credentials(client).get_frozen_credentials()
        if isinstance(effect, BeforeSend):
            return before_send(client, effect.operation, effect.prepared)
        if isinstance(effect, Transmit):
            return transmit(client, effect.prepared)
        return bytes(effect.response.content)

    try:
        return drive(steps, perform, passes=Exception)
    finally:
        steps.close()  # an interrupt left the driver: drop the connection now


async def exchange_async(client: Any, steps: Steps[LeanEffect, Answer | None]) -> Answer | None:
    """Run :func:`exchange_steps` on an aiobotocore ``client``."""

    async def perform(effect: LeanEffect) -> Any:
        if isinstance(effect, FrozenCredentials):
            return await credentials(client).get_frozen_credentials()
        if isinstance(effect, BeforeSend):
            return await before_send_async(client, effect.operation, effect.prepared)
        if isinstance(effect, Transmit):
            return await transport(client).send(effect.prepared)
        return await content_async(effect.response)

    try:
        return await drive_async(steps, perform, passes=Exception)
    finally:
        steps.close()
