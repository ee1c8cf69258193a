"""The botocore half of the external store's errors: reading botocore's exceptions
(code, HTTP status, whether anything was sent) and the one translation from them to
the tree of :mod:`lancetx.externalstore.errors`. The sync and async DynamoDB stores
both use it (aiobotocore raises botocore's exception classes)."""

from __future__ import annotations

import socket
import sys

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ProxyConnectionError,
)
from botocore.exceptions import (
    ConnectionError as BotocoreConnectionError,
)
from urllib3.exceptions import NewConnectionError

from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.errors import (
    ACCESS_CODES,
    AccessDeniedError,
    AmbiguousWriteError,
    DynamoDBTableNotFoundError,
    DynamoDBTarget,
    EndpointUnreachableError,
    ExternalStoreError,
    InvalidRequestError,
    OperationNotImplementedError,
    ServiceUnavailableError,
    ThrottledError,
    iam_action_of,
)

__all__ = [
    "THROTTLING_CODES",
    "error_code",
    "http_status",
    "never_connected",
    "translate_error",
]

#: Error codes meaning "not applied, try again later" (throttling and contention).
THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        # The item is part of an ongoing TransactWriteItems: rejected, not applied.
        "TransactionConflictException",
    }
)


def error_code(exc: BaseException) -> str:
    """The service error code of a ClientError, else the exception's class name."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code") or "Unknown")
    return type(exc).__name__


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a ClientError, else None."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def never_connected(exc: BotocoreConnectionError) -> bool:
    """Whether a botocore connection error proves the request was never sent.

    botocore's class alone does not: aiobotocore wraps any aiohttp
    ``ClientConnectionError`` in EndpointConnectionError, including a
    connection reset while reading the response (the request was sent and
    may have been applied), and urllib3 reports an SSL error while reading
    the response as SSLError. Only a failure to connect counts.
    """
    if isinstance(exc, (ConnectTimeoutError, ProxyConnectionError)):
        return True
    error = exc.kwargs.get("error")
    if error is None or isinstance(error, (NewConnectionError, socket.gaierror)):
        return True  # no cause to contradict the class; boto3's (urllib3) connect failures
    aiohttp = sys.modules.get("aiohttp")  # loaded if the error came from aiobotocore
    # ClientConnectorError covers refused, DNS and TLS handshake failures.
    return aiohttp is not None and isinstance(error, aiohttp.ClientConnectorError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        message = exc.response.get("Error", {}).get("Message") or str(exc)
        return f"{error_code(exc)} (HTTP {http_status(exc)}): {message}"
    return f"{type(exc).__name__}: {exc}"


def translate_error(
    exc: BaseException,
    target: DynamoDBTarget,
    operation: str,
    *,
    attempts: int = 1,
    ambiguous_entry: ManifestEntry | None = None,
) -> ExternalStoreError:
    """Map a botocore exception from ``operation`` (``PutItem``) to our tree.

    ``attempts`` is how many attempts were made. ``ambiguous_entry`` is set by
    a write that had at least one attempt which may have landed: whatever the
    last error, the result is then an :class:`AmbiguousWriteError`.
    """
    action = f"dynamodb:{operation}"
    resource = target.resource
    if ambiguous_entry is not None:
        return AmbiguousWriteError(
            action, resource, ambiguous_entry, f"{attempts} attempt(s), last {_describe(exc)}"
        )
    code = error_code(exc)
    if isinstance(exc, ClientError):
        status = http_status(exc) or 0
        detail = exc.response.get("Error", {}).get("Message") or str(exc)
        if code == "ResourceNotFoundException":
            return DynamoDBTableNotFoundError(action, resource, target)
        if code in ACCESS_CODES:
            return AccessDeniedError(
                iam_action_of(operation), resource, code, detail, operation, target
            )
        if code == "UnknownOperationException":
            return OperationNotImplementedError(action, resource, operation, target.endpoint)
        if code in THROTTLING_CODES:
            return ThrottledError(action, resource, code, attempts)
        if status >= 500:
            return ServiceUnavailableError(action, resource, _describe(exc), attempts, code)
        if 400 <= status < 500:
            return InvalidRequestError(action, resource, code, detail)
        return ExternalStoreError(action, resource, _describe(exc), code=code)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AccessDeniedError(
            iam_action_of(operation), resource, code, str(exc), operation, target
        )
    if isinstance(exc, BotocoreConnectionError) and never_connected(exc):
        return EndpointUnreachableError(action, resource, target.endpoint, str(exc), attempts)
    if isinstance(exc, (HTTPClientError, BotocoreConnectionError)):
        # ReadTimeoutError, ConnectionClosedError, a reset after sending
        return ServiceUnavailableError(action, resource, _describe(exc), attempts)
    if isinstance(exc, BotoCoreError):
        return ExternalStoreError(
            action, resource, f"{_describe(exc)}; check the DynamoDB configuration"
        )
    return ExternalStoreError(action, resource, _describe(exc))
