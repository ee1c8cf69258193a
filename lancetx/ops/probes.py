"""Probes of what a bucket really does (as opposed to what it claims)."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

from lancetx.commit.errors import LancetxError, ObjectExistsError
from lancetx.commit.format import naming
from lancetx.commit.storage.stores import open_object_store
from lancetx.ops.table import OpsTable

#: Folder of the probes' objects inside the table (nothing of Lance's lives there).
PROBE_DIR = "_lancetx_probe"


@dataclass(frozen=True)
class ConditionalPutProbe:
    """``honoured``: True if a second ``If-None-Match: *`` PUT of one key was refused,
    False if the store accepted it (it ignores the header), None if the probe failed."""

    honoured: bool | None
    key: str
    detail: str


def conditional_put_probe(table: OpsTable) -> ConditionalPutProbe:
    """PUT one probe key twice with ``If-None-Match: *``, then delete it (3 requests)."""
    if table.bucket is None:
        return ConditionalPutProbe(True, "", "a local table: link-if-not-exists is atomic")
    s3_uri = table.s3_uri or table.uri
    store, base = open_object_store(s3_uri, table.options, legacy=False)
    key = naming.join(base, PROBE_DIR, f"conditional-put-{uuid.uuid4()}")
    try:
        store.put_if_not_exists(key, b"first")
    except LancetxError as exc:
        return ConditionalPutProbe(None, key, f"the first conditional PUT failed: {exc}")
    try:
        try:
            store.put_if_not_exists(key, b"second")
        except ObjectExistsError:
            return ConditionalPutProbe(
                True, key, "the second conditional PUT of the same key was refused (412)"
            )
        except LancetxError as exc:
            return ConditionalPutProbe(None, key, f"the second conditional PUT failed: {exc}")
        return ConditionalPutProbe(
            False,
            key,
            "the store accepted a second PUT with If-None-Match: * on an existing key: it "
            "ignores the header, so two s3:// writers can both create the same version",
        )
    finally:
        with contextlib.suppress(LancetxError):
            store.delete(key)
