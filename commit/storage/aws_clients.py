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
    """``session.client(service, **kwargs)`` from the shared session of ``profile``."""
    session = shared_session(profile)
    with _lock:
        return session.client(service, **kwargs)  # type: ignore[call-overload]
