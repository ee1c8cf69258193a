"""Keeping credentials out of messages, reprs and logs.

A secret access key or session token handed to lancetx (as a storage option, a
config field or an environment variable) must never be printed: not in an
exception's text, a ``repr``, a log record or the CLI's output, where it would be
copied into tickets, CI logs and screenshots.

* :func:`is_secret_option` tells which option names hold a secret (pylance's and
  boto3's spellings, the ``_dynamodb`` variants, other stores' keys and tokens);
  :func:`redact_options` is an options dict fit for display.
* Config objects :func:`remember_secrets` they were given, so :func:`redact_text`
  can scrub them wherever they appear, together with those in the environment and
  the ``x-amz-security-token`` header botocore prints at DEBUG (credentials of a
  profile or instance role are never known to lancetx, but only the token travels
  in a request: the secret key only signs).
* :class:`RedactingFilter` applies :func:`redact_text` to every log record that
  passes a handler; :func:`install_log_redaction` puts it on the root logger's
  handlers (the CLI does at start-up).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping

#: What a secret is shown as.
REDACTED = "***"

#: Words that make an option name a secret's (case-insensitive substring match):
#: ``aws_secret_access_key``, ``aws_session_token``/``token``, ``google_service_account_key``,
#: ``azure_storage_account_key``, ``azure_storage_sas_key``, ``client_secret``, ...
_SECRET_WORDS = ("secret", "token", "password", "passwd", "account_key", "sas_key", "private_key")
#: Option names whose value is a credential though no word above says so.
_SECRET_NAMES = frozenset({"sas", "google_service_account", "service_account_key", "credentials"})

#: Environment variables whose values are secrets (read when redacting, so a
#: value set after start-up is covered too).
SECRET_ENV_VARS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_SECRET_ACCESS_KEY_DYNAMODB",
    "AWS_SESSION_TOKEN_DYNAMODB",
)

#: Shorter values are not scrubbed by value (they would blank out ordinary words);
#: real secret keys are 40 characters, session tokens hundreds.
_MIN_SECRET_LENGTH = 6

#: The session token as botocore prints a request at DEBUG: a header dict entry
#: (``'X-Amz-Security-Token': b'…'``), a canonical header line
#: (``x-amz-security-token:…``) or a query parameter (``X-Amz-Security-Token=…``).
_HEADER_PATTERNS = (
    re.compile(r"""(?i)(x-amz-security-token['"]?\s*[:=]\s*b?['"]?)([^\s'",}&]+)"""),
    # A request's signature is derived from the secret key: replayable for a while.
    re.compile(r"(?i)(signature=)([0-9a-f]{16,})"),
)

_known: set[str] = set()
_lock = threading.Lock()


def is_secret_option(name: str) -> bool:
    """Whether a storage option (or config field) named ``name`` holds a secret."""
    lowered = name.strip().lower()
    return lowered in _SECRET_NAMES or any(word in lowered for word in _SECRET_WORDS)


def redact_options(options: Mapping[str, str] | None) -> dict[str, str]:
    """``options`` with every secret's value replaced by :data:`REDACTED`."""
    return {k: REDACTED if is_secret_option(k) else v for k, v in (options or {}).items()}


def remember_secrets(*values: str | None) -> None:
    """Record secret values so :func:`redact_text` scrubs them from any text."""
    fresh = {v for v in values if isinstance(v, str) and len(v) >= _MIN_SECRET_LENGTH}
    if fresh and not fresh <= _known:
        with _lock:
            _known.update(fresh)


def remember_secret_options(options: Mapping[str, str] | None) -> None:
    """:func:`remember_secrets` for every secret among ``options``."""
    remember_secrets(*(v for k, v in (options or {}).items() if is_secret_option(k)))


def _secret_values() -> list[str]:
    with _lock:
        values = set(_known)
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name)
        if value and len(value) >= _MIN_SECRET_LENGTH:
            values.add(value)
    # Longest first: a secret that contains another is replaced whole.
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every known secret value (remembered, in the environment, or
    ``extra``) and every session-token header replaced by :data:`REDACTED`."""
    for value in [*(v for v in extra if v and len(v) >= _MIN_SECRET_LENGTH), *_secret_values()]:
        if value in text:
            text = text.replace(value, REDACTED)
    for pattern in _HEADER_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


class RedactingFilter(logging.Filter):
    """A handler filter: each record's message and traceback pass :func:`redact_text`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: logging reports it itself
            return True
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Put a :class:`RedactingFilter` on every handler of ``logger`` (default: the
    root logger), once."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


__all__ = [
    "REDACTED",
    "SECRET_ENV_VARS",
    "RedactingFilter",
    "install_log_redaction",
    "is_secret_option",
    "redact_options",
    "redact_text",
    "remember_secret_options",
    "remember_secrets",
]
