"""Probes of what a bucket really does (as opposed to what it claims), for doctor and migrate.

The conditional-PUT probe is the library's own (:mod:`lancetx.commit.handlers.probe`),
asked afresh: an operator wants the store's answer now, not one this process cached.
"""

from __future__ import annotations

from dataclasses import dataclass

from lancetx.commit.errors import LancetxError
from lancetx.commit.handlers.probe import (
    PROBE_DIR,
    ConditionalPutIgnoredError,
    clear_probe_cache,
    probe_conditional_put,
)
from lancetx.commit.storage.stores import open_object_store
from lancetx.ops.table import OpsTable

__all__ = ["PROBE_DIR", "ConditionalPutProbe", "conditional_put_probe"]


@dataclass(frozen=True)
class ConditionalPutProbe:
    """``honoured``: True if a second ``If-None-Match: *`` PUT of one key was refused,
    False if the store accepted it (it ignores the header), None if the probe failed."""

    honoured: bool | None
    detail: str


def conditional_put_probe(table: OpsTable) -> ConditionalPutProbe:
    """Two conditional PUTs of one probe key and a DELETE (3 requests)."""
    if table.bucket is None:
        return ConditionalPutProbe(True, "a local table: link-if-not-exists is atomic")
    store, base = open_object_store(table.s3_uri or table.uri, table.options, legacy=False)
    clear_probe_cache()
    try:
        probe_conditional_put(store, base)
    except ConditionalPutIgnoredError:
        return ConditionalPutProbe(
            False,
            "the store accepted a second PUT with If-None-Match: * of an existing object: it "
            "ignores the header, so two s3:// writers can both create the same version",
        )
    except LancetxError as exc:
        return ConditionalPutProbe(None, f"the probe failed: {exc}")
    return ConditionalPutProbe(
        True, "a second PUT with If-None-Match: * of an existing object was refused (412)"
    )
