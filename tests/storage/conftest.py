"""Fixtures of the storage tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest


@pytest.fixture
def seen(aws: EmbeddedAws) -> Iterator[list[InterceptedRequest]]:
    """Every request the server receives during the test."""
    requests: list[InterceptedRequest] = []
    aws.set_interceptor(lambda request: requests.append(request) or None)
    try:
        yield requests
    finally:
        aws.set_interceptor(None)
