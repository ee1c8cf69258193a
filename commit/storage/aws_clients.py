"""AWS clients: one shared session per profile, one client per configuration.

A new ``boto3.Session`` re-reads botocore's service models, which costs
150-400 ms per client (measured in ``benchmarks/``); a client from an existing
session still costs a few ms, and the first one in a process ~80 ms. So a
process builds each distinct client once (:func:`make_client` caches it by
service, profile and every keyword argument, credentials and botocore config
included) and every store configured the same way shares it: opening a table
again in the same process builds nothing. Creating clients from one session is
not thread-safe, so it happens under a lock; the clients themselves are
thread-safe. Per-client credentials and region are passed to ``session.client``
rather than fixed on the session, so one session serves every configuration of
a profile.

A shared client's event handlers are shared too: whoever registers one on it
(a request counter, a guard) sees the requests of every store using it. Guards
that must apply to some stores only belong in the cache key (``variant``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.exceptions import InvalidRegionError
from botocore.utils import validate_region_name

from lancetx.commit.errors import StorageOptionError
from lancetx.commit.package_version import NOT_INSTALLED, installed_version
from lancetx.commit.storage import aws_handlers, aws_model_cache, aws_user_agent

_lock = threading.Lock()
_sessions: dict[tuple[str | None, bool], botocore.session.Session] = {}
_clients: dict[tuple[str, str | None, str, str], Any] = {}


def shared_session(profile: str | None = None, *, lean: bool = True) -> botocore.session.Session:
    """The process-wide botocore session for ``profile`` (created on first use).

    A botocore session rather than boto3's: boto3 adds its S3 transfer methods
    (``upload_file``…) to every S3 client, which imports ``s3transfer`` and
    ``multiprocessing`` (~20 ms in a fresh process) for methods lancetx never calls.
    The clients are the same botocore clients; their User-Agent names lancetx.

    The ``lean`` session builds lancetx's own clients (and its credential providers'):
    with the model cache on, from trimmed service models and with only the built-in
    event handlers that can fire for them (see :mod:`.aws_service_models` and
    :mod:`.aws_handlers`), so it must only build clients of
    :data:`.aws_handlers.SESSION_SERVICES` (:func:`make_client` sees to it). The
    other session is botocore's own, for any other service.
    """
    with _lock:
        session = _sessions.get((profile, lean))
        if session is None:
            session = _sessions[(profile, lean)] = new_session(profile, lean=lean)
        return session


def new_session(profile: str | None = None, *, lean: bool = True) -> botocore.session.Session:
    """A new session set up as :func:`shared_session`'s (which shares one per process)."""
    if lean and aws_handlers.list_understood():
        session = botocore.session.Session(profile=profile, include_builtin_handlers=False)
        # Service data from the on-disk copy (see :mod:`.aws_model_cache`): the first
        # client of a process is most of a fresh process's table open.
        trimmed = aws_model_cache.install(session)
        if trimmed:
            aws_handlers.narrow_aliases(session)
        aws_handlers.register(session, trimmed=trimmed)
    else:
        session = botocore.session.Session(profile=profile)
        if lean:
            aws_model_cache.install(session)
    session.user_agent_name = "lancetx"
    session.user_agent_version = _version()
    return session


def session_region(profile: str | None = None) -> str | None:
    """The region ``profile`` (or the environment) configures, if any."""
    region = shared_session(profile).get_config_variable("region")
    return region if isinstance(region, str) and region else None


def _version() -> str:
    found = installed_version()
    return "0" if found == NOT_INSTALLED else found


def _config_key(value: Any) -> Any:
    if isinstance(value, Config):
        # A Config compares by identity; what it was built from says what it does.
        return ("Config", sorted((k, repr(v)) for k, v in vars(value).items()))
    return repr(value)


def client_key(kwargs: Mapping[str, Any]) -> str:
    """What makes two clients of one service and profile interchangeable: every
    argument they were built from."""
    return repr(sorted((k, _config_key(v)) for k, v in kwargs.items()))


def make_client(
    service: str,
    *,
    profile: str | None = None,
    variant: str = "",
    setup: Callable[[Any], None] | None = None,
    **kwargs: Any,
) -> Any:
    """The process's client for ``session.client(service, **kwargs)`` from the shared
    session of ``profile``: built on first use, then shared by every caller asking for
    the same service, profile, ``variant`` and keyword arguments. ``setup`` runs once
    on a new client (e.g. to register an event guard); callers whose clients need
    different setups pass different ``variant`` names.

    Raises StorageOptionError when the region (from the options, the environment or
    the profile) is not a region name, instead of botocore's InvalidRegionError.
    """
    key = (service, profile, variant, client_key(kwargs))
    with _lock:
        client = _clients.get(key)
    if client is not None:
        return client
    session = shared_session(profile, lean=service in aws_handlers.SESSION_SERVICES)
    with _lock:
        client = _clients.get(key)
        if client is not None:
            return client
        try:
            client = session.create_client(service, **kwargs)
        except InvalidRegionError as exc:
            region = kwargs.get("region_name") or session.get_config_variable("region")
            raise StorageOptionError(
                f"the {service} client's region {region!r} is not an AWS region name "
                "(e.g. 'us-east-1'); set the storage option aws_region (for DynamoDB: "
                "dynamodb_region) or the environment variable AWS_REGION"
                + (f", or fix the region of AWS profile {profile!r}" if profile else "")
            ) from exc
        aws_user_agent.cache_user_agent(client)
        if setup is not None:
            setup(client)
        _clients[key] = client
        return client


def clear_client_cache() -> None:
    """Forget the shared clients (tests; after changing credentials in the environment):
    the next :func:`make_client` builds new ones. Clients already handed out keep working."""
    with _lock:
        _clients.clear()


def is_region_name(region: str) -> bool:
    """Whether botocore accepts ``region`` as a region name (it refuses to build a client otherwise)."""
    try:
        validate_region_name(region)
    except InvalidRegionError:
        return False
    return True


#: What to say about a value :func:`is_region_name` refuses.
NOT_A_REGION = "not an AWS region name (letters, digits and '-', e.g. 'us-east-1')"
