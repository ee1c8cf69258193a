"""Retry policy for DynamoDB requests: data, a pure classifier, pure bookkeeping.

Who owns retries
----------------
Our code does; botocore is configured with ``total_max_attempts=1`` (see
:data:`BOTOCORE_RETRIES`). Reasons:

* **Ambiguity.** A conditional PutItem whose first attempt landed but whose
  answer was lost (timeout, 5xx) fails its retry with
  ConditionalCheckFailed *on our own item*. Inside botocore that retry is
  invisible and the write looks like a lost race (Iceberg PR #7198; Lance maps
  it to a conflict and deletes the staged manifest, leaving DynamoDB pointing
  at a deleted file). Seeing every attempt lets the store remember "an
  attempt may have landed" and resolve the retry's result with the commit
  token (:func:`lancetx.externalstore.base.ownership_of`).
* **One policy for sync and async.** boto3 and aiobotocore would each apply
  their own; here one :class:`RetryPolicy` and one classifier drive both.
* **Typed outcomes.** Exhaustion is reported as ThrottledError,
  EndpointUnreachableError, ServiceUnavailableError or AmbiguousWriteError with
  the attempt count, never a generic SDK error and never a crash.

Nothing here sleeps or does I/O: :class:`Attempts` only decides whether and how
long to wait; the drivers (:mod:`.drivers`) sleep.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterator

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
)
from botocore.exceptions import (
    ConnectionError as BotocoreConnectionError,
)

from lancetx.commit.engine.retry import RetryPolicy
from lancetx.externalstore.dynamodb.botocore_errors import (
    THROTTLING_CODES,
    error_code,
    http_status,
    never_connected,
)
from lancetx.externalstore.errors import CONDITION_FAILED_CODE

__all__ = [
    "BOTOCORE_RETRIES",
    "DYNAMODB_RETRY",
    "Attempts",
    "ErrorKind",
    "RetryPolicy",
    "backoff_delays",
    "classify",
]

#: botocore client ``retries`` setting: exactly one HTTP request per API call,
#: so every attempt passes through :class:`Attempts`.
BOTOCORE_RETRIES: dict[str, object] = {"mode": "standard", "total_max_attempts": 1}


#: DynamoDB's defaults: throttling and 5xx clear within seconds.
DYNAMODB_RETRY = RetryPolicy(max_attempts=6, base_delay=0.05, max_delay=2.0)


def backoff_delays(policy: RetryPolicy, rng: random.Random | None = None) -> Iterator[float]:
    """The ``max_attempts - 1`` sleeps between attempts (full jitter)."""
    rng = rng or random.Random()
    for retry in range(1, policy.max_attempts):
        yield policy.delay(retry, rng=rng)


class ErrorKind(enum.Enum):
    """What a failed attempt means for retrying it."""

    #: Throttled / contention: rejected, not applied. Retry after a pause.
    THROTTLED = "throttled"
    #: Could not connect (refused, DNS, connect timeout, proxy, aiohttp TLS handshake):
    #: nothing was sent (see errors.never_connected).
    UNREACHABLE = "unreachable"
    #: 5xx, read timeout, connection dropped after sending: the request may have
    #: been applied. Retryable; for a write it makes the outcome ambiguous.
    MAYBE_APPLIED = "maybe_applied"
    #: ConditionalCheckFailedException: a definite answer, handled by the caller.
    CONDITION_FAILED = "condition_failed"
    #: Anything else (access denied, validation, missing table): not retried.
    FATAL = "fatal"


def classify(exc: BaseException) -> ErrorKind:
    """Classify a botocore exception (raised by boto3 or aiobotocore)."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == CONDITION_FAILED_CODE:
            return ErrorKind.CONDITION_FAILED
        if code in THROTTLING_CODES:
            return ErrorKind.THROTTLED
        if (http_status(exc) or 0) >= 500:
            return ErrorKind.MAYBE_APPLIED
        return ErrorKind.FATAL
    if isinstance(exc, BotocoreConnectionError):
        return ErrorKind.UNREACHABLE if never_connected(exc) else ErrorKind.MAYBE_APPLIED
    if isinstance(exc, HTTPClientError):  # ReadTimeoutError, ConnectionClosedError, …
        return ErrorKind.MAYBE_APPLIED
    if isinstance(exc, BotoCoreError):
        return ErrorKind.FATAL
    return ErrorKind.FATAL


class Attempts:
    """Bookkeeping for the attempts of one logical request.

    ``record(kind, write=...)`` after each failed attempt returns the sleep
    before the next attempt, or None when the error is not retryable or the
    policy is exhausted. ``ambiguous`` becomes True once a write attempt failed
    in a way that may have applied it.
    """

    def __init__(self, policy: RetryPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self._delays = backoff_delays(policy, rng)
        self.count = 0
        self.ambiguous = False
        self.last_kind: ErrorKind | None = None

    def record(self, kind: ErrorKind, *, write: bool) -> float | None:
        """Account for one failed attempt of kind ``kind``; the sleep before the
        next attempt, or None to give up."""
        self.count += 1
        self.last_kind = kind
        if write and kind is ErrorKind.MAYBE_APPLIED:
            self.ambiguous = True
        if kind not in (ErrorKind.THROTTLED, ErrorKind.UNREACHABLE, ErrorKind.MAYBE_APPLIED):
            return None
        return next(self._delays, None)

    def succeeded(self) -> None:
        """Account for the attempt that got an answer (success or a definite failure)."""
        self.count += 1

    def record_exception(self, exc: BaseException, *, write: bool) -> float | None:
        """``record(classify(exc), write=write)``."""
        return self.record(classify(exc), write=write)
