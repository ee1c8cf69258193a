"""boto3 clients built from one shared session per profile.

A new ``boto3.Session`` re-reads botocore's service models, which costs
150-400 ms per client (measured in ``benchmarks/``); a client from an existing
session costs a few ms. Creating clients from one session is not thread-safe,
so it happens under a lock; the clients themselves are thread-safe. Per-client
credentials and region are passed to ``session.client`` rather than fixed on
the session, so one session serves every configuration of a profile.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.exceptions import InvalidRegionError
from botocore.utils import validate_region_name

from lancetx.commit.errors import StorageOptionError

_lock = threading.Lock()
_sessions: dict[str | None, boto3.session.Session] = {}


def shared_session(profile: str | None = None) -> boto3.session.Session:
    """The process-wide session for ``profile`` (created on first use)."""
    with _lock:
        session = _sessions.get(profile)
        if session is None:
            session = boto3.session.Session(profile_name=profile)
            _sessions[profile] = session
        return session


def make_client(service: str, *, profile: str | None = None, **kwargs: Any) -> Any:
    """``session.client(service, **kwargs)`` from the shared session of ``profile``.

    Raises StorageOptionError when the region (from the options, the environment or
    the profile) is not a region name, instead of botocore's InvalidRegionError.
    """
    session = shared_session(profile)
    with _lock:
        try:
            return session.client(service, **kwargs)  # type: ignore[call-overload]
        except InvalidRegionError as exc:
            region = kwargs.get("region_name") or session.region_name
            raise StorageOptionError(
                f"the {service} client's region {region!r} is not an AWS region name "
                "(e.g. 'us-east-1'); set the storage option aws_region (for DynamoDB: "
                "dynamodb_region) or the environment variable AWS_REGION"
                + (f", or fix the region of AWS profile {profile!r}" if profile else "")
            ) from exc


def is_region_name(region: str) -> bool:
    """Whether botocore accepts ``region`` as a region name (it refuses to build a client otherwise)."""
    try:
        validate_region_name(region)
    except InvalidRegionError:
        return False
    return True


#: What to say about a value :func:`is_region_name` refuses.
NOT_A_REGION = "not an AWS region name (letters, digits and '-', e.g. 'us-east-1')"
