"""How lancetx reaches DynamoDB: configuration (independent of S3), clients, and the
target (table, region, endpoint) that every error names."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.config import Config as BotoConfig

from lancetx.commit.storage.aws_clients import NOT_A_REGION, is_region_name, session_region
from lancetx.commit.storage.aws_clients import make_client as make_shared_client
from lancetx.commit.storage.secrets import remember_secrets
from lancetx.externalstore.dynamodb.retry import BOTOCORE_RETRIES, DYNAMODB_RETRY, RetryPolicy
from lancetx.externalstore.errors import DynamoDBTarget, InvalidConfigError

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_COMMITTER",
    "DEFAULT_REGION",
    "DEFAULT_REGION_NOTE",
    "REGION_NOTE_ATTRIBUTE",
    "DynamoDBConfig",
    "make_client",
    "mark_default_region",
    "target_of",
    "warn_if_sdk_retries",
]

#: ``committer`` written by lancetx (Lance writes ``"lancedb"``).
DEFAULT_COMMITTER = "lancetx"
#: Lance's fallback when no region is configured anywhere.
DEFAULT_REGION = "us-west-2"


def _first(sources: list[tuple[Mapping[str, str], tuple[str, ...]]]) -> tuple[str, str] | None:
    for mapping, keys in sources:
        for key in keys:
            value = mapping.get(key)
            if value not in (None, ""):
                return key, str(value)
    return None


def _number(key: str, raw: str, kind: Callable[[str], float]) -> float:
    try:
        value = kind(raw)
    except ValueError:
        raise InvalidConfigError(key, raw, "expected a number") from None
    if value <= 0:
        raise InvalidConfigError(key, raw, "must be > 0")
    return value


@dataclass(frozen=True)
class DynamoDBConfig:
    """How to reach DynamoDB, independently of S3.

    ``None`` fields fall back to boto3's defaults (credential chain, profile
    region); a missing region finally falls back to Lance's ``us-west-2``.
    The generic ``AWS_ENDPOINT_URL`` (often an S3-compatible store's endpoint)
    is never used for DynamoDB, as in Lance.
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    retry: RetryPolicy = field(default=DYNAMODB_RETRY)
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    max_pool_connections: int = 32
    committer: str = DEFAULT_COMMITTER

    def __post_init__(self) -> None:
        # Messages and logs scrub what they were given (lancetx.commit.storage.secrets).
        remember_secrets(self.secret_access_key, self.session_token)

    @classmethod
    def from_options(
        cls, options: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None
    ) -> DynamoDBConfig:
        """Build from pylance-style storage options and the environment.

        Option keys are case-insensitive. Precedence, first found wins:

        * endpoint: ``dynamodb_endpoint`` (Lance), ``aws_endpoint_url_dynamodb``;
          env ``DYNAMODB_ENDPOINT`` (Lance), ``AWS_ENDPOINT_URL_DYNAMODB`` (boto3, delta-rs).
        * region: ``dynamodb_region``, ``aws_region_dynamodb``; env
          ``AWS_REGION_DYNAMODB``; then S3's ``aws_region`` / ``region``; env
          ``AWS_REGION``, ``AWS_DEFAULT_REGION``.
        * credentials: the ``_dynamodb`` set (``aws_access_key_id_dynamodb``,
          ``aws_secret_access_key_dynamodb``, ``aws_session_token_dynamodb``,
          as options or upper-case env vars) if any of it is given, else S3's
          (``aws_access_key_id`` / ``access_key_id``, ``aws_secret_access_key`` /
          ``secret_access_key``, ``aws_session_token`` / ``session_token`` /
          ``token``), else boto3's default chain.
        * ``dynamodb_profile``; ``dynamodb_max_attempts``,
          ``dynamodb_connect_timeout``, ``dynamodb_read_timeout`` (seconds),
          ``dynamodb_committer``.
        """
        opts = {k.lower(): v for k, v in (options or {}).items() if v is not None}
        environ = os.environ if env is None else env

        endpoint = _first(
            [
                (opts, ("dynamodb_endpoint", "aws_endpoint_url_dynamodb")),
                (environ, ("DYNAMODB_ENDPOINT", "AWS_ENDPOINT_URL_DYNAMODB")),
            ]
        )
        region = _first(
            [
                (opts, ("dynamodb_region", "aws_region_dynamodb")),
                (environ, ("AWS_REGION_DYNAMODB",)),
                (opts, ("aws_region", "region")),
                (environ, ("AWS_REGION", "AWS_DEFAULT_REGION")),
            ]
        )
        if region is not None and not is_region_name(region[1]):
            raise InvalidConfigError(region[0], region[1], NOT_A_REGION)
        ddb_creds = {
            name: _first([(opts, (f"{name}_dynamodb",)), (environ, (f"{name.upper()}_DYNAMODB",))])
            for name in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
        }
        if any(ddb_creds.values()):
            key_id, secret, token = (
                ddb_creds["aws_access_key_id"],
                ddb_creds["aws_secret_access_key"],
                ddb_creds["aws_session_token"],
            )
            origin = "aws_access_key_id_dynamodb / aws_secret_access_key_dynamodb"
        else:
            key_id = _first([(opts, ("aws_access_key_id", "access_key_id"))])
            secret = _first([(opts, ("aws_secret_access_key", "secret_access_key"))])
            token = _first([(opts, ("aws_session_token", "session_token", "token"))])
            origin = "aws_access_key_id / aws_secret_access_key"
        if (key_id is None) != (secret is None):
            raise InvalidConfigError(
                origin, "(one of the pair)", "give both the key id and the secret, or neither"
            )

        retry = DYNAMODB_RETRY
        if (raw := opts.get("dynamodb_max_attempts")) is not None:
            retry = replace(retry, max_attempts=int(_number("dynamodb_max_attempts", raw, int)))
        kwargs: dict[str, Any] = {}
        if (raw := opts.get("dynamodb_connect_timeout")) is not None:
            kwargs["connect_timeout"] = _number("dynamodb_connect_timeout", raw, float)
        if (raw := opts.get("dynamodb_read_timeout")) is not None:
            kwargs["read_timeout"] = _number("dynamodb_read_timeout", raw, float)
        if (raw := opts.get("dynamodb_committer")) is not None:
            kwargs["committer"] = raw
        return cls(
            endpoint_url=endpoint[1] if endpoint else None,
            region=region[1] if region else None,
            access_key_id=key_id[1] if key_id else None,
            secret_access_key=secret[1] if secret else None,
            session_token=token[1] if token else None,
            profile=opts.get("dynamodb_profile"),
            retry=retry,
            **kwargs,
        )

    def client_kwargs(
        self, session_region: str | None = None, config_class: type[BotoConfig] = BotoConfig
    ) -> dict[str, Any]:
        """Keyword arguments for ``session.client("dynamodb", **kwargs)``.

        botocore's own retries are off (``total_max_attempts=1``): our loop owns
        them, see :mod:`.retry`.
        """
        botocore_options: dict[str, Any] = {
            "retries": BOTOCORE_RETRIES,
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "max_pool_connections": self.max_pool_connections,
            # Never send DynamoDB requests to AWS_ENDPOINT_URL (usually S3's).
            "ignore_configured_endpoint_urls": True,
        }
        kwargs: dict[str, Any] = {
            "region_name": self.region or session_region or DEFAULT_REGION,
            "config": config_class(**botocore_options),
        }
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.access_key_id:
            kwargs["aws_access_key_id"] = self.access_key_id
            kwargs["aws_secret_access_key"] = self.secret_access_key
            if self.session_token:
                kwargs["aws_session_token"] = self.session_token
        return kwargs


def warn_if_sdk_retries(client: Any) -> None:
    """Warn when ``client`` retries inside botocore: our retry loop must see every
    attempt to tell a landed claim from a lost one (see :mod:`.retry`)."""
    retries = getattr(getattr(getattr(client, "meta", None), "config", None), "retries", None)
    if isinstance(retries, dict) and retries.get("total_max_attempts") == 1:
        return
    log.warning(
        "DynamoDB client %r retries inside botocore (retries=%r): a claim whose first attempt "
        "landed and whose retries were then throttled would be reported as not applied. Build "
        "clients with lancetx.externalstore.dynamodb.make_client, or pass "
        "botocore Config(retries=%r)",
        client,
        retries,
        BOTOCORE_RETRIES,
    )


def make_client(config: DynamoDBConfig | None = None) -> Any:
    """The process's boto3 DynamoDB client for ``config`` (built on first use, then
    shared by every store configured the same way; thread-safe).

    With the AWS model cache on (the default) the client has only the operations
    lancetx needs (see :mod:`lancetx.commit.storage.aws_service_models`); use your own
    boto3 client for others (Scan, ListTables…)."""
    config = config or DynamoDBConfig.from_options()
    configured = config.region or session_region(config.profile)
    return make_shared_client(
        "dynamodb",
        profile=config.profile,
        # A client on the fallback region says so in every error naming its target.
        variant="" if configured else "default-region",
        setup=None if configured else mark_default_region,
        **config.client_kwargs(configured),
    )


#: Attribute of a DynamoDB client whose region nobody configured (see :func:`target_of`).
REGION_NOTE_ATTRIBUTE = "_lancetx_region_note"
#: What errors say about such a region.
DEFAULT_REGION_NOTE = (
    "not configured, Lance's default: set the storage option dynamodb_region or "
    "aws_region, or AWS_REGION"
)


def mark_default_region(client: Any) -> None:
    """Note on ``client`` that its region is the fallback, not one anybody configured."""
    setattr(client, REGION_NOTE_ATTRIBUTE, DEFAULT_REGION_NOTE)


def target_of(client: Any, table_name: str) -> DynamoDBTarget:
    """The target of ``table_name`` as reached through ``client``."""
    meta = getattr(client, "meta", None)
    return DynamoDBTarget(
        table=table_name,
        region=getattr(meta, "region_name", None),
        endpoint=getattr(meta, "endpoint_url", None),
        region_note=getattr(client, REGION_NOTE_ATTRIBUTE, None),
    )
