"""botocore's built-in event handlers, only those that can fire for lancetx's clients.

A botocore session registers ~120 built-in handlers when it is created: for S3 and STS,
but also for EC2, RDS, Glacier, CloudSearch and two dozen other services, for S3
operations lancetx never calls, and for writing documentation. Each registration
inspects the handler's signature and rewrites its event name through botocore's alias
table, and every client then copies the session's whole handler tree. In a fresh
process that was ~5 ms of the ~40 ms it took to open a table (measured in
``benchmarks/commit_requests.py``, scenario ``open-cold``).

:func:`register` registers exactly botocore's own list
(``botocore.handlers.BUILTIN_HANDLERS``), in its order and with its first/last
placement, leaving out only the handlers that cannot fire for a client of
:data:`SESSION_SERVICES` built from lancetx's trimmed models (see
:mod:`.aws_service_models`): those of other services, those of operations the
trimmed models leave out, and those that write documentation (the trimmed models have
none). A client of a kept service therefore sees the very handlers botocore would give
it for every request it can send; a session set up this way must only build clients of
those services (:mod:`.aws_clients` gives any other service a session with every
handler) and only from trimmed models (:mod:`.aws_model_cache` serves them). For the
same reason :func:`narrow_aliases` keeps only the event-name aliases of those services.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from botocore import handlers
from botocore.hooks import EVENT_ALIASES, EventAliaser

from lancetx.commit.storage.aws_service_models import CLIENT_OPERATIONS

#: The services of a trimmed session: lancetx's own clients, and those botocore's
#: credential providers build from the same session (an assumed role calls STS; SSO
#: profiles call SSO and SSO-OIDC; console-login profiles call Sign-In).
SESSION_SERVICES = frozenset({"dynamodb", "s3", "sts", "sso", "sso-oidc", "signin"})


def _named(parts: list[str], index: int) -> str | None:
    # None: the part is missing or a wildcard (every service, every operation).
    return None if len(parts) <= index or "*" in parts[index] else parts[index]


def event_service(event_name: str) -> str | None:
    """The service an event name is about (None: every service, or none in particular).

    Event names read ``<event>.<service>.<operation>…``; documentation events read
    ``docs.<section>.<service>.<operation>…``.
    """
    parts = event_name.split(".")
    return _named(parts, 2 if parts[0] == "docs" else 1)


def is_kept(event_name: str, services: Iterable[str] = SESSION_SERVICES) -> bool:
    """Whether a handler of ``event_name`` may fire for a client of one of ``services``
    built from a trimmed model."""
    parts = event_name.split(".")
    if parts[0] == "docs":
        return False  # writes docstrings, from documentation the trimmed models lack
    service = _named(parts, 1)
    if service is None:
        return True
    # botocore renames some services' events (e.g. ``autoscaling`` → ``auto-scaling``)
    # when it registers them; either spelling of a kept service keeps the handler.
    service = next((s for s in (service, EVENT_ALIASES.get(service)) if s in set(services)), None)
    if service is None:
        return False
    operation, operations = _named(parts, 2), CLIENT_OPERATIONS.get(service)
    return operation is None or operations is None or operation in operations


def narrow_aliases(session: Any, services: Iterable[str] = SESSION_SERVICES) -> bool:
    """Keep, of the alias table ``session`` rewrites event names through, only the
    entries that name one of ``services``; return whether the table was narrowed.

    botocore's aliases map renamed services' old event names to new ones
    (``autoscaling`` → ``auto-scaling``: ~65 entries, none of them S3, DynamoDB or
    STS). Every event name a client registers or emits is scanned against the whole
    table the first time, in each client's own copy of the table: ~2.5 ms of a fresh
    process's table open, for rewrites that never apply to lancetx's clients. The
    table is an attribute of botocore's ``EventAliaser`` (no public setter); if a
    botocore release moves it, nothing is narrowed and nothing else changes.
    """
    events = session.get_component("event_emitter")
    table = getattr(events, "_event_aliases", None)
    if not isinstance(events, EventAliaser) or not isinstance(table, dict):
        return False
    kept = set(services)
    narrowed = {old: new for old, new in table.items() if kept & {*old.split("."), *new.split(".")}}
    setattr(events, "_event_aliases", narrowed)  # noqa: B010 (no such attribute in botocore's stubs)
    return True


def _understood(spec: Any) -> bool:
    return (
        isinstance(spec, tuple)
        and len(spec) in (2, 3)
        and isinstance(spec[0], str)
        and callable(spec[1])
        and (len(spec) == 2 or spec[2] in (handlers.REGISTER_FIRST, handlers.REGISTER_LAST))
    )


def list_understood() -> bool:
    """Whether botocore's built-in handler list has the form :func:`register` reads
    (``(event, handler)`` or ``(event, handler, REGISTER_FIRST | REGISTER_LAST)``).

    It has had that form for a decade; should a botocore release change it, lancetx's
    sessions register the built-ins botocore's own way instead (see
    :func:`lancetx.commit.storage.aws_clients.new_session`).
    """
    return all(_understood(spec) for spec in handlers.BUILTIN_HANDLERS)


def register(session: Any, *, trimmed: bool, services: Iterable[str] = SESSION_SERVICES) -> int:
    """Register on ``session`` (created with ``include_builtin_handlers=False``) the
    built-in handlers: with ``trimmed`` models, those that may fire for a client of
    ``services`` (see :func:`is_kept`); otherwise all of them, as botocore does.
    Returns how many were registered."""
    kept = frozenset(services)
    emitter = session.get_component("event_emitter")
    count = 0
    for spec in handlers.BUILTIN_HANDLERS:
        event_name, handler = spec[0], spec[1]
        if trimmed and not is_kept(event_name, kept):
            continue
        if len(spec) == 2:
            emitter.register(event_name, handler)
        elif spec[2] is handlers.REGISTER_FIRST:
            emitter.register_first(event_name, handler)
        elif spec[2] is handlers.REGISTER_LAST:
            emitter.register_last(event_name, handler)
        else:
            continue  # as botocore: a placement it does not know registers nothing
        count += 1
    return count


__all__ = [
    "SESSION_SERVICES",
    "event_service",
    "is_kept",
    "list_understood",
    "narrow_aliases",
    "register",
]
