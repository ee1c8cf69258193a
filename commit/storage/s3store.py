"""An :class:`~lancetx.commit.storage.objectstore.ObjectStore` over S3 (boto3).

Two kinds of bucket are served by the same class:

* a **modern** S3 (AWS since 2024, MinIO, ...) honours ``If-None-Match: *`` on
  PutObject, so :meth:`S3ObjectStore.put_if_not_exists` is an atomic
  create-if-absent and a table can be committed by conditional PUT;
* a **legacy** S3-compatible store (``legacy=True``) may silently ignore
  conditional headers, which would let two writers both "win" a version. Such a
  store never sends a conditional header at all, reports
  ``conditional_put=False`` and refuses ``put_if_not_exists``: tables on it
  are committed through DynamoDB (``s3+ddb://``).

Every botocore failure is translated into the lancetx error hierarchy by one
function, :func:`translate_s3_error`, which the asyncio store
(:mod:`lancetx.commit.storage.s3store_async`) uses as well.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import botocore.exceptions as bce
from botocore.config import Config

from lancetx.commit.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    StorageOptionError,
    TransientObjectStoreError,
    UnsupportedOperationError,
)
from lancetx.commit.storage.aws_clients import NOT_A_REGION, is_region_name
from lancetx.commit.storage.aws_clients import make_client as make_shared_client
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore, StoreCapabilities
from lancetx.commit.storage.secrets import is_secret_option, remember_secrets

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

    from lancetx.commit.storage.s3_lean.writes import LeanWrites

#: ``ObjectMeta.size`` of a copy whose response does not tell the size (S3
#: CopyObject never does). Call ``head()`` if the size is needed.
UNKNOWN_SIZE: Final = -1

#: The default (and S3's maximum) number of keys per ListObjectsV2 page.
DEFAULT_PAGE_SIZE: Final = 1000

# --------------------------------------------------------------------------- config

_OPTION_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "endpoint_url": ("endpoint_url", "aws_endpoint", "aws_endpoint_url", "endpoint"),
    "region": ("region", "region_name", "aws_region", "aws_default_region"),
    "access_key_id": ("aws_access_key_id", "access_key_id"),
    "secret_access_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "session_token", "aws_token", "token"),
    "profile": ("profile", "profile_name", "aws_profile"),
    "max_attempts": ("max_attempts", "aws_max_attempts"),
    "connect_timeout": ("connect_timeout", "aws_connect_timeout"),
    "read_timeout": ("read_timeout", "timeout", "aws_read_timeout"),
    "addressing_style": ("addressing_style", "s3_addressing_style"),
    "max_pool_connections": ("max_pool_connections",),
    "request_checksum_calculation": ("request_checksum_calculation",),
    "response_checksum_validation": ("response_checksum_validation",),
}
_CHECKSUM_MODES: Final = ("when_supported", "when_required")
_VIRTUAL_HOSTED_KEYS: Final = ("aws_virtual_hosted_style_request", "virtual_hosted_style_request")
_ADDRESSING_STYLES: Final = ("auto", "path", "virtual")
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|min)?\s*$")


def parse_bool_option(name: str, value: str) -> bool:
    """``"true"``/``"1"``/``"yes"``/``"on"`` (and their negations), case-insensitive."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise StorageOptionError(f"option {name}={value!r} is not a boolean; use true or false")


def _parse_seconds(name: str, value: str) -> float:
    match = _DURATION.match(value)
    if match is None:
        raise StorageOptionError(
            f"option {name}={value!r} is not a duration; use seconds (30, 30s or 500ms)"
        )
    number = float(match.group(1))
    unit = match.group(2) or "s"
    return number / 1000 if unit == "ms" else number * 60 if unit in ("m", "min") else number


@dataclass(frozen=True)
class S3Config:
    """How to reach S3. ``None`` fields fall back to boto3's standard sources.

    boto3 reads the environment (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``,
    ``AWS_REGION``/``AWS_DEFAULT_REGION``, credentials, ``AWS_PROFILE``,
    ``AWS_MAX_ATTEMPTS``) and ``~/.aws/config`` for anything left ``None``
    here. Retries always use botocore's ``standard`` mode (exponential backoff
    with jitter on 5xx, throttling and connection errors).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    #: Never in the repr (nor in any message): see :mod:`lancetx.commit.storage.secrets`.
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    #: Total attempts per request, first one included (botocore's default is 3).
    max_attempts: int | None = None
    connect_timeout: float | None = None
    read_timeout: float | None = None
    #: ``"path"``, ``"virtual"`` or ``"auto"``.
    addressing_style: str | None = None
    #: Size of the HTTP connection pool (botocore's default is 10).
    max_pool_connections: int | None = None
    #: ``"when_supported"`` (botocore's default: CRC32 on every upload) or
    #: ``"when_required"``; some older S3-compatible stores reject the former.
    request_checksum_calculation: str | None = None
    #: ``"when_supported"`` or ``"when_required"``, for checksums on downloads.
    response_checksum_validation: str | None = None

    def __post_init__(self) -> None:
        remember_secrets(self.secret_access_key, self.session_token)
        if self.region is not None and not is_region_name(self.region):
            raise StorageOptionError(f"aws_region={self.region!r} is {NOT_A_REGION}")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise StorageOptionError(
                "S3 credentials need both an access key id and a secret access key; "
                "give both, or neither to use boto3's credential chain"
            )
        if self.max_attempts is not None and self.max_attempts < 1:
            raise StorageOptionError(f"max_attempts must be at least 1, got {self.max_attempts}")
        for name in ("request_checksum_calculation", "response_checksum_validation"):
            value = getattr(self, name)
            if value is not None and value not in _CHECKSUM_MODES:
                raise StorageOptionError(
                    f"{name} {value!r} is not one of {', '.join(_CHECKSUM_MODES)}"
                )
        if self.addressing_style is not None and self.addressing_style not in _ADDRESSING_STYLES:
            raise StorageOptionError(
                f"addressing_style {self.addressing_style!r} is not one of {', '.join(_ADDRESSING_STYLES)}"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, str] | None = None) -> S3Config:
        """Build a config from storage options in boto3 or pylance style.

        Accepted keys (case-insensitive): ``endpoint_url``/``aws_endpoint``/
        ``aws_endpoint_url``/``endpoint``; ``region``/``region_name``/
        ``aws_region``; ``aws_access_key_id``; ``aws_secret_access_key``;
        ``aws_session_token``/``session_token``/``token``; ``profile``/
        ``aws_profile``; ``max_attempts``; ``connect_timeout``;
        ``read_timeout``/``timeout`` (seconds, or ``"30s"``/``"500ms"``);
        ``addressing_style`` or pylance's ``aws_virtual_hosted_style_request``;
        ``max_pool_connections``; ``request_checksum_calculation`` and
        ``response_checksum_validation``. Other keys (``allow_http``, the DynamoDB
        settings, ...) belong to other components and are ignored. Missing
        values fall back to boto3's environment (see the class docstring).
        """
        lowered: dict[str, str] = {}
        for key, value in (options or {}).items():
            lowered[key.lower()] = value

        def pick(field_name: str, aliases: tuple[str, ...]) -> str | None:
            found = {alias: lowered[alias] for alias in aliases if alias in lowered}
            if len(set(found.values())) > 1:
                if is_secret_option(field_name):
                    remember_secrets(*found.values())
                    raise StorageOptionError(
                        f"conflicting storage options for the S3 {field_name}: "
                        + " and ".join(found)
                        + " are given with different values (not shown: they are secrets); "
                        "give one of them"
                    )
                raise StorageOptionError(
                    f"conflicting storage options for the S3 {field_name}: "
                    + ", ".join(f"{k}={v!r}" for k, v in found.items())
                )
            return next(iter(found.values()), None)

        values = {name: pick(name, aliases) for name, aliases in _OPTION_ALIASES.items()}
        addressing = values["addressing_style"]
        virtual = pick("addressing style", _VIRTUAL_HOSTED_KEYS)
        if virtual is not None:
            style = (
                "virtual"
                if parse_bool_option("aws_virtual_hosted_style_request", virtual)
                else "path"
            )
            if addressing is not None and addressing != style:
                raise StorageOptionError(
                    f"conflicting storage options: addressing_style={addressing!r} and "
                    f"aws_virtual_hosted_style_request={virtual!r}"
                )
            addressing = style

        def integer(name: str) -> int | None:
            raw = values[name]
            if raw is None:
                return None
            try:
                return int(raw)
            except ValueError:
                raise StorageOptionError(f"option {name}={raw!r} is not an integer") from None

        def seconds(name: str) -> float | None:
            raw = values[name]
            return None if raw is None else _parse_seconds(name, raw)

        return cls(
            endpoint_url=values["endpoint_url"] or None,
            region=values["region"] or None,
            access_key_id=values["access_key_id"],
            secret_access_key=values["secret_access_key"],
            session_token=values["session_token"],
            profile=values["profile"],
            max_attempts=integer("max_attempts"),
            connect_timeout=seconds("connect_timeout"),
            read_timeout=seconds("read_timeout"),
            addressing_style=addressing,
            max_pool_connections=integer("max_pool_connections"),
            request_checksum_calculation=values["request_checksum_calculation"],
            response_checksum_validation=values["response_checksum_validation"],
        )

    def session_kwargs(self) -> dict[str, str]:
        """Keyword arguments for ``boto3.session.Session`` / ``aioboto3.Session``."""
        kwargs: dict[str, str] = {}
        if self.profile is not None:
            kwargs["profile_name"] = self.profile
        if self.access_key_id is not None and self.secret_access_key is not None:
            kwargs["aws_access_key_id"] = self.access_key_id
            kwargs["aws_secret_access_key"] = self.secret_access_key
        if self.session_token is not None:
            kwargs["aws_session_token"] = self.session_token
        if self.region is not None:
            kwargs["region_name"] = self.region
        return kwargs

    def config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``botocore.config.Config`` (or aiobotocore's ``AioConfig``)."""
        retries: dict[str, Any] = {"mode": "standard"}
        if self.max_attempts is not None:
            # botocore's "max_attempts" counts retries only; "total_max_attempts"
            # counts the first attempt too, as AWS_MAX_ATTEMPTS and this field do.
            retries["total_max_attempts"] = self.max_attempts
        kwargs: dict[str, Any] = {"retries": retries}
        if self.connect_timeout is not None:
            kwargs["connect_timeout"] = self.connect_timeout
        if self.read_timeout is not None:
            kwargs["read_timeout"] = self.read_timeout
        if self.addressing_style is not None:
            kwargs["s3"] = {"addressing_style": self.addressing_style}
        if self.max_pool_connections is not None:
            kwargs["max_pool_connections"] = self.max_pool_connections
        if self.request_checksum_calculation is not None:
            kwargs["request_checksum_calculation"] = self.request_checksum_calculation
        if self.response_checksum_validation is not None:
            kwargs["response_checksum_validation"] = self.response_checksum_validation
        return kwargs

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``session.client("s3", ...)`` other than ``config``."""
        kwargs: dict[str, Any] = {}
        if self.endpoint_url is not None:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.region is not None:
            kwargs["region_name"] = self.region
        return kwargs

    def create_client(self, *, legacy_guard: bool = False) -> S3Client:
        """The process's boto3 S3 client for this configuration (built once, then shared
        by every store configured the same way; safe from any thread). With
        ``legacy_guard`` it is the variant that refuses conditional headers. With the AWS
        model cache on (the default) it has only the operations lancetx needs (see
        :mod:`lancetx.commit.storage.aws_service_models`)."""
        credentials = {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_session_token": self.session_token,
            "region_name": self.region,
        }
        kwargs = {k: v for k, v in credentials.items() if v is not None}
        kwargs.update(self.client_kwargs())
        client: S3Client = make_shared_client(
            "s3",
            profile=self.profile,
            variant="legacy" if legacy_guard else "",
            setup=_install_legacy_guard if legacy_guard else None,
            config=Config(**self.config_kwargs()),
            **kwargs,
        )
        return client


def _install_legacy_guard(client: Any) -> None:
    client.meta.events.register(
        "before-send.s3", refuse_conditional_headers, unique_id="lancetx-legacy-guard"
    )


# ------------------------------------------------------------------- error mapping

# Which IAM action (and on which resource) each request needs, for AccessDenied messages.
_OBJECT, _BUCKET, _SOURCE = "object", "bucket", "source"
_PERMISSIONS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "GetObject": (("s3:GetObject", _OBJECT),),
    "HeadObject": (("s3:GetObject", _OBJECT),),
    "PutObject": (("s3:PutObject", _OBJECT),),
    "CopyObject": (("s3:GetObject", _SOURCE), ("s3:PutObject", _OBJECT)),
    "DeleteObject": (("s3:DeleteObject", _OBJECT),),
    "ListObjectsV2": (("s3:ListBucket", _BUCKET),),
}
_NOT_FOUND_CODES: Final = frozenset({"NoSuchKey", "NotFound", "404"})
_ACCESS_DENIED_CODES: Final = frozenset({"AccessDenied", "AllAccessDisabled", "403"})
_CREDENTIAL_CODES: Final = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
    }
)
_CONDITION_CODES: Final = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_TRANSIENT_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
_TRANSIENT_BOTOCORE: Final[tuple[type[Exception], ...]] = (
    bce.ConnectionError,  # connect failures, connect timeouts, SSL, proxy
    bce.HTTPClientError,  # connection closed, read timeouts, broken response streams
    bce.IncompleteReadError,
)
_CREDENTIAL_BOTOCORE: Final[tuple[type[Exception], ...]] = (
    bce.NoCredentialsError,
    bce.PartialCredentialsError,
    bce.CredentialRetrievalError,
    bce.TokenRetrievalError,
)


def s3_uri(bucket: str, key: str) -> str:
    """``s3://bucket/key``."""
    return f"s3://{bucket}/{key}"


def s3_arn(bucket: str, key: str | None = None) -> str:
    """The IAM resource of a bucket (``key`` None) or of an object."""
    return f"arn:aws:s3:::{bucket}" if key is None else f"arn:aws:s3:::{bucket}/{key}"


def _access_denied_message(operation: str, bucket: str, key: str, source_key: str | None) -> str:
    needed: list[str] = []
    for action, resource in _PERMISSIONS.get(operation, ()):
        if resource == _BUCKET:
            needed.append(f"{action} on {s3_arn(bucket)} (prefix {key!r})")
        elif resource == _SOURCE and source_key is not None:
            needed.append(f"{action} on {s3_arn(bucket, source_key)}")
        else:
            needed.append(f"{action} on {s3_arn(bucket, key)}")
    grant = " and ".join(needed) if needed else f"the permission {operation} needs"
    hint = ""
    if operation in ("GetObject", "HeadObject", "CopyObject"):
        # S3 answers 403 rather than 404 for a missing key when listing is not allowed.
        hint = (
            f"; note that S3 also answers 403 for a missing object when s3:ListBucket "
            f"on {s3_arn(bucket)} is not granted"
        )
    return f"access denied; grant {grant} to the credentials in use{hint}"


def translate_s3_error(
    exc: BaseException,
    *,
    operation: str,
    bucket: str,
    key: str,
    source_key: str | None = None,
    transient_types: tuple[type[BaseException], ...] = (),
) -> ObjectStoreError | None:
    """The lancetx error for a failed S3 request, or None if ``exc`` is not a
    request failure (a programming error such as invalid parameters, which the
    caller should let propagate).

    ``operation`` is the S3 API name (``GetObject``...), ``key`` the object (or,
    for ``ListObjectsV2``, the prefix), ``source_key`` the source of a
    ``CopyObject``. ``transient_types`` adds exception types (e.g. aiohttp's)
    to treat as transient. The synchronous and the asyncio store both use this
    so their errors are the same.

    A failure after botocore's own retries (``standard`` mode) is raised as
    :class:`TransientObjectStoreError` when retrying later may succeed.
    """
    uri = s3_uri(bucket, key)
    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {})
        metadata = exc.response.get("ResponseMetadata", {})
        code = str(error.get("Code", ""))
        text = str(error.get("Message", "")) or code
        status = int(metadata.get("HTTPStatusCode", 0) or 0)
        detail = f"{code or 'HTTP ' + str(status)}: {text} (HTTP {status})"
        if code == "NoSuchBucket":
            return ObjectStoreError(
                operation, uri, f"bucket {bucket!r} does not exist; create it or correct the URI"
            )
        if code in _NOT_FOUND_CODES or status == 404:
            if operation == "CopyObject" and source_key is not None:
                return ObjectNotFoundError(
                    operation,
                    s3_uri(bucket, source_key),
                    f"copy source not found (destination {uri})",
                )
            return ObjectNotFoundError(operation, uri)
        if code in _CONDITION_CODES or status == 412:
            return ObjectExistsError(operation, uri, f"object already exists ({detail})")
        if code in _CREDENTIAL_CODES:
            return ObjectStoreError(
                operation,
                uri,
                f"the credentials were rejected ({detail}); check the access key, secret and "
                f"session token, and refresh them if they expired",
            )
        if code in _ACCESS_DENIED_CODES or status == 403:
            return ObjectStoreError(
                operation, uri, _access_denied_message(operation, bucket, key, source_key)
            )
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientObjectStoreError(
                operation, uri, f"transient failure, safe to retry later: {exc}"
            )
        return ObjectStoreError(operation, uri, detail)
    if isinstance(exc, _TRANSIENT_BOTOCORE) or (
        transient_types and isinstance(exc, transient_types)
    ):
        return TransientObjectStoreError(
            operation, uri, f"connection failure, safe to retry later: {type(exc).__name__}: {exc}"
        )
    if isinstance(exc, _CREDENTIAL_BOTOCORE):
        return ObjectStoreError(
            operation,
            uri,
            f"no usable AWS credentials ({exc}); pass aws_access_key_id/aws_secret_access_key "
            f"in the storage options or configure the standard AWS credential chain",
        )
    return None


def _retry_attempts(exc: BaseException) -> int:
    if isinstance(exc, bce.ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)
    return 0


def is_ambiguous_conflict(exc: BaseException) -> bool:
    """A 412 to a conditional create that botocore sent more than once.

    An earlier attempt may have created the object and then lost its response
    (5xx, timeout), so "already exists" may be our own write. The caller
    resolves it by comparing the stored bytes with its own.
    """
    if not isinstance(exc, bce.ClientError) or _retry_attempts(exc) == 0:
        return False
    code = exc.response.get("Error", {}).get("Code")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in _CONDITION_CODES or status == 412


def legacy_put_if_not_exists_error(bucket: str, key: str) -> UnsupportedOperationError:
    """The refusal of a create-if-absent write on a legacy store (no request is sent)."""
    table = key.split("/_versions/", 1)[0] if "/_versions/" in key else key.rsplit("/", 1)[0]
    return UnsupportedOperationError(
        "PutObject",
        s3_uri(bucket, key),
        "this bucket is declared legacy (it may ignore If-None-Match), so a create-if-absent "
        "write cannot be atomic and is not attempted; commit through DynamoDB instead: "
        f"s3+ddb://{bucket}/{table}?ddbTableName=<your table>",
    )


_CONDITIONAL_HEADER_PREFIXES: Final = ("if-", "x-amz-copy-source-if-")


def conditional_headers(headers: Mapping[str, Any]) -> list[str]:
    """The conditional headers among ``headers`` (``If-*``, ``x-amz-copy-source-if-*``)."""
    return [name for name in headers if str(name).lower().startswith(_CONDITIONAL_HEADER_PREFIXES)]


def refuse_conditional_headers(request: Any, event_name: str = "", **_: Any) -> None:
    """botocore ``before-send`` handler installed on a legacy store's own client.

    Defence in depth: the store never asks for a condition, and this makes
    sure no code path can send one to a bucket that might ignore it.
    """
    found = conditional_headers(request.headers)
    if found:
        operation = event_name.rsplit(".", 1)[-1] or "request"
        raise UnsupportedOperationError(
            operation,
            str(request.url),
            f"refusing to send conditional header(s) {', '.join(found)} to a legacy S3 store; "
            "commit through DynamoDB (s3+ddb://) instead",
        )


def check_key(key: str, *, allow_empty: bool = False) -> None:
    """Keys are bucket-relative: no leading slash; empty only for list prefixes."""
    if key.startswith("/"):
        raise ValueError(f"object key {key!r} must not start with '/' (keys are bucket-relative)")
    if not key and not allow_empty:
        raise ValueError("object key must not be empty")


def check_range(start: int, end: int) -> None:
    """``0 <= start <= end``."""
    if start < 0 or end < start:
        raise ValueError(f"invalid byte range [{start}, {end}): need 0 <= start <= end")


def parse_content_range(value: str | None) -> tuple[int, int | None] | None:
    """``"bytes 10-19/20"`` → (first byte, total size or None if ``*``); None if absent."""
    if not value:
        return None
    match = re.match(r"^\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*$", value)
    if match is None:
        return None
    first = int(match.group(1)) if match.group(1) is not None else 0
    total = None if match.group(2) == "*" else int(match.group(2))
    return first, total


def tail_of_response(
    body: bytes, content_range: str | None, length: int
) -> tuple[bytes, int | None]:
    """The tail and total size from a ``Range: bytes=-N`` response. A server that
    ignored the range sent the whole object (no Content-Range)."""
    parsed = parse_content_range(content_range)
    if parsed is None:
        return body[-length:], len(body)
    return body, parsed[1]


#: Chunk size when a body is streamed rather than read at once.
STREAM_CHUNK: Final = 1 << 20


def ignored_range(response: Mapping[str, Any], length: int) -> bool:
    """Whether a ``Range: bytes=-N`` answer is the whole object, larger than ``length``
    (a server that ignores ranges): its body must be streamed, not read at once."""
    if parse_content_range(response.get("ContentRange")) is not None:
        return False
    declared = response.get("ContentLength")
    return isinstance(declared, int) and declared > length


class TailBuffer:
    """The last ``length`` bytes of a stream fed chunk by chunk, and its total size:
    never more than ``length`` plus one chunk in memory."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.total = 0
        self._tail = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._tail += chunk
        if len(self._tail) > self.length:
            del self._tail[: len(self._tail) - self.length]

    def result(self) -> tuple[bytes, int]:
        return bytes(self._tail), self.total


def range_of_response(body: bytes, content_range: str | None, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` from a ranged GET, also when the server ignored the range."""
    if parse_content_range(content_range) is None:
        return body[start:end]
    return body[: end - start]


def invalid_range_total(exc: BaseException) -> int | None:
    """For a 416 InvalidRange, the object's size (S3 sends ``ActualObjectSize`` in
    the error body; some servers ``Content-Range: bytes */N``), -1 if not told;
    None if ``exc`` is not an InvalidRange."""
    if not isinstance(exc, bce.ClientError):
        return None
    metadata = exc.response.get("ResponseMetadata", {})
    code = exc.response.get("Error", {}).get("Code")
    if code != "InvalidRange" and metadata.get("HTTPStatusCode") != 416:
        return None
    actual = str(exc.response.get("Error", {}).get("ActualObjectSize", ""))
    if actual.isdigit():
        return int(actual)
    parsed = parse_content_range(metadata.get("HTTPHeaders", {}).get("content-range"))
    if parsed is not None and parsed[1] is not None:
        return parsed[1]
    return -1  # an InvalidRange whose size we do not know


def meta_from_head(key: str, response: Mapping[str, Any]) -> ObjectMeta:
    """ObjectMeta from a HeadObject response."""
    modified = response.get("LastModified")
    return ObjectMeta(
        key=key,
        size=int(response.get("ContentLength", 0)),
        etag=response.get("ETag"),
        last_modified=modified if isinstance(modified, datetime) else None,
    )


def meta_from_copy(key: str, response: Mapping[str, Any]) -> ObjectMeta:
    """ObjectMeta from a CopyObject response (size is :data:`UNKNOWN_SIZE`)."""
    result = response.get("CopyObjectResult", {})
    modified = result.get("LastModified")
    return ObjectMeta(
        key=key,
        size=UNKNOWN_SIZE,
        etag=result.get("ETag"),
        last_modified=modified if isinstance(modified, datetime) else None,
    )


def meta_from_listing(entry: Mapping[str, Any]) -> ObjectMeta:
    """ObjectMeta from one ``Contents`` entry of ListObjectsV2."""
    modified = entry.get("LastModified")
    return ObjectMeta(
        key=str(entry["Key"]),
        size=int(entry.get("Size", 0)),
        etag=entry.get("ETag"),
        last_modified=modified if isinstance(modified, datetime) else None,
    )


# --------------------------------------------------------------------------- store


class S3ObjectStore(ObjectStore):
    """Objects in one S3 bucket, addressed by bucket-relative key.

    ``client`` is an existing boto3 S3 client (used as is); otherwise one is
    made from ``config`` (default: boto3's environment). ``legacy=True``
    declares a store that may ignore conditional headers: none is ever sent,
    ``capabilities.conditional_put`` is False and ``put_if_not_exists`` raises
    :class:`UnsupportedOperationError`. Without ``client``, the store uses the
    process's shared client for ``config`` (built once per configuration, see
    :mod:`lancetx.commit.storage.aws_clients`); for a legacy store that is a client
    with a ``before-send`` guard that refuses any request carrying a conditional
    header. ``consistent_list=False`` declares a store
    whose listings may miss completed writes. ``page_size`` is ListObjectsV2's
    ``MaxKeys``.

    ETags are returned as S3 sends them (quoted). Thread-safe: boto3 clients
    are, and the store holds no other mutable state.
    """

    def __init__(
        self,
        bucket: str,
        *,
        client: S3Client | None = None,
        config: S3Config | None = None,
        legacy: bool = False,
        consistent_list: bool = True,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid S3 bucket name {bucket!r}")
        if client is not None and config is not None:
            raise ValueError("pass either an S3 client or an S3Config, not both")
        if not 1 <= page_size <= DEFAULT_PAGE_SIZE:
            raise ValueError(f"page_size must be in 1..{DEFAULT_PAGE_SIZE}, got {page_size}")
        self.bucket = bucket
        #: Table base key -> the URI the user opened it by (see :meth:`name_table`).
        self.table_uris: dict[str, str] = {}
        self.legacy = legacy
        self.page_size = page_size
        self.capabilities = StoreCapabilities(
            conditional_put=not legacy,
            atomic_rename=False,
            lexically_ordered_list=True,
            consistent_list=consistent_list,
        )
        # A client built from a config is the process's shared one for that config
        # (see :mod:`.aws_clients`): closing it would close it for every store.
        self._owns_client = False
        self._client: S3Client = (
            client
            if client is not None
            else (config or S3Config()).create_client(legacy_guard=legacy)
        )

    @property
    def client(self) -> S3Client:
        """The boto3 client (e.g. to register event handlers)."""
        return self._client

    def close(self) -> None:
        """Nothing to release: the store's client is shared with the process (or the
        caller's own), and outlives the store."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> S3ObjectStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.bucket!r}, legacy={self.legacy})"

    def uri(self, key: str) -> str:
        """``s3://bucket/key``; a table's base key named by :meth:`name_table` gives that name."""
        return self.table_uris.get(key) or s3_uri(self.bucket, key)

    def name_table(self, base: str, uri: str) -> None:
        """Messages about the table at ``base`` show ``uri`` (the URI the user passed,
        e.g. ``s3+ddb://bucket/t.lance?ddbTableName=T``) instead of ``s3://bucket/base``;
        objects inside the table keep their ``s3://`` URIs (they are what S3 acted on)."""
        self.table_uris[base] = uri

    def _error(
        self, exc: Exception, operation: str, key: str, source_key: str | None = None
    ) -> Exception:
        mapped = translate_s3_error(
            exc, operation=operation, bucket=self.bucket, key=key, source_key=source_key
        )
        return mapped if mapped is not None else exc

    def get(self, key: str) -> bytes:
        check_key(key)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key)
            return response["Body"].read()
        except Exception as exc:
            raise self._error(exc, "GetObject", key) from exc

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; fewer if the object ends first (none if it
        ends before ``start``)."""
        check_key(key)
        check_range(start, end)
        if start == end:
            self.head(key)  # an empty range still requires the object to exist
            return b""
        try:
            response = self._client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}"
            )
            body = response["Body"].read()
        except Exception as exc:
            if invalid_range_total(exc) is not None:
                return b""  # the object exists but ends before start
            raise self._error(exc, "GetObject", key) from exc
        return range_of_response(body, response.get("ContentRange"), start, end)

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes and the total size in one ``Range: bytes=-N``
        GET; never more than ``length`` bytes (and a chunk) buffered, also from a server
        that ignores the range. (A zero-length object, which S3 answers with 416, needs a HEAD
        when the 416 lacks ``Content-Range``.)"""
        check_key(key)
        if length < 0:
            raise ValueError(f"tail length must not be negative, got {length}")
        if length == 0:
            return b"", self.head(key).size
        try:
            response = self._client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes=-{length}"
            )
            if ignored_range(response, length):
                tail = TailBuffer(length)
                for chunk in iter(lambda: response["Body"].read(STREAM_CHUNK), b""):
                    tail.feed(chunk)
                return tail.result()
            body = response["Body"].read()
        except Exception as exc:
            total = invalid_range_total(exc)
            if total is None:
                raise self._error(exc, "GetObject", key) from exc
            return b"", total if total >= 0 else self.head(key).size
        data, size = tail_of_response(body, response.get("ContentRange"), length)
        return data, size if size is not None else self.head(key).size

    def get_tail_bulk(self, key: str, length: int) -> tuple[bytes, int] | None:
        """A lean GET (:mod:`.s3_lean`): signed and sent without botocore's per-request
        pipeline, at a fraction of its CPU; None on anything but a plain success."""
        check_key(key)
        # Imported by the first lean read (catching up on a history), not by opening.
        from lancetx.commit.storage.s3_lean.gets import lean_gets

        return lean_gets(self._client, self.bucket).get_tail(key, length)

    def head(self, key: str) -> ObjectMeta:
        check_key(key)
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            raise self._error(exc, "HeadObject", key) from exc
        return meta_from_head(key, response)

    def _lean_writes(self) -> LeanWrites:
        # Imported by the first write (a commit), not by opening.
        from lancetx.commit.storage.s3_lean.writes import lean_writes

        return lean_writes(self._client, self.bucket)

    def put(self, key: str, data: bytes) -> ObjectMeta:
        """``PutObject``: a lean write first (:mod:`.s3_lean.writes`), botocore's the
        definitive one on anything but its plain success."""
        check_key(key)
        try:
            lean = self._lean_writes().put(key, data)
            if lean is not None:
                return lean
            response = self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            raise self._error(exc, "PutObject", key) from exc
        return ObjectMeta(key=key, size=len(data), etag=response.get("ETag"))

    def put_if_not_exists(self, key: str, data: bytes) -> ObjectMeta:
        """``PutObject`` with ``If-None-Match: *``.

        Raises ObjectExistsError on 412/409. If botocore had retried the
        request (a previous attempt's response was lost), a 412 may be our own
        write: the stored object is read back and, if it holds exactly
        ``data``, the put counts as ours. A TransientObjectStoreError from
        this method is an unknown outcome: the object may have been created.
        On a legacy store raises UnsupportedOperationError without any request.
        """
        check_key(key)
        if self.legacy:
            raise legacy_put_if_not_exists_error(self.bucket, key)
        try:
            response = self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*"
            )
        except Exception as exc:
            if is_ambiguous_conflict(exc):
                try:
                    # At most len(data) bytes: a larger object is not ours anyway.
                    tail, total = self.get_tail(key, len(data))
                except ObjectNotFoundError:
                    tail, total = b"", -1
                if total == len(data) and tail == data:
                    return self.head(key)
            raise self._error(exc, "PutObject", key) from exc
        return ObjectMeta(key=key, size=len(data), etag=response.get("ETag"))

    def copy(self, src: str, dst: str) -> ObjectMeta:
        """Server-side ``CopyObject`` without conditions (a lean write first, as
        :meth:`put`). The size of the result is :data:`UNKNOWN_SIZE` (CopyObject does
        not report it); S3 copies objects up to 5 GB this way."""
        check_key(src)
        check_key(dst)
        try:
            lean = self._lean_writes().copy(src, dst)
            if lean is not None:
                return lean
            response = self._client.copy_object(
                Bucket=self.bucket, Key=dst, CopySource={"Bucket": self.bucket, "Key": src}
            )
        except Exception as exc:
            raise self._error(exc, "CopyObject", dst, source_key=src) from exc
        return meta_from_copy(dst, response)

    def delete(self, key: str) -> None:
        """``DeleteObject`` (a lean write first, as :meth:`put`)."""
        check_key(key)
        try:
            if self._lean_writes().delete(key):
                return
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            mapped = self._error(exc, "DeleteObject", key)
            if isinstance(mapped, ObjectNotFoundError):
                return
            raise mapped from exc

    def list_page(self, prefix: str, start_after: str = "") -> tuple[Sequence[ObjectMeta], bool]:
        """One ListObjectsV2 request (``StartAfter``, ``page_size`` keys at most)."""
        check_key(prefix, allow_empty=True)
        try:
            page = self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=prefix, MaxKeys=self.page_size, StartAfter=start_after
            )
        except Exception as exc:
            raise self._error(exc, "ListObjectsV2", prefix) from exc
        found = [meta_from_listing(entry) for entry in page.get("Contents", [])]
        return found, bool(page.get("IsTruncated"))

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        """ListObjectsV2 pages of ``page_size`` keys, in lexical order, fetched lazily."""
        check_key(prefix, allow_empty=True)
        token: str | None = None
        while True:
            try:
                if token is None:
                    page = self._client.list_objects_v2(
                        Bucket=self.bucket, Prefix=prefix, MaxKeys=self.page_size
                    )
                else:
                    page = self._client.list_objects_v2(
                        Bucket=self.bucket,
                        Prefix=prefix,
                        MaxKeys=self.page_size,
                        ContinuationToken=token,
                    )
            except Exception as exc:
                raise self._error(exc, "ListObjectsV2", prefix) from exc
            for entry in page.get("Contents", []):
                yield meta_from_listing(entry)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "UNKNOWN_SIZE",
    "S3Config",
    "S3ObjectStore",
    "parse_bool_option",
    "translate_s3_error",
]
