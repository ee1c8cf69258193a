"""An S3 store's configuration for the embedded server, shared by the lean-request tests."""

from __future__ import annotations

from typing import Any

from lancetx.commit.storage.s3store import S3Config
from lancetx.demo.embedded import DEFAULT_REGION, FAKE_ACCESS_KEY, FAKE_SECRET_KEY


def s3_config(endpoint: str, **overrides: Any) -> S3Config:
    """The embedded server's region and fake credentials at ``endpoint``, with ``overrides``."""
    values: dict[str, Any] = {
        "endpoint_url": endpoint,
        "region": DEFAULT_REGION,
        "access_key_id": FAKE_ACCESS_KEY,
        "secret_access_key": FAKE_SECRET_KEY,
    }
    values.update(overrides)
    return S3Config(**values)
