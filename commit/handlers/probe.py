"""Does this store really honour ``If-None-Match``? Asked once per process per bucket.

Some S3-compatible stores accept ``If-None-Match: *`` and silently ignore it: two
writers then both "create" version N and one commit is lost without a word.
Before the first commit through a conditional PUT to a bucket, the handler
writes a probe object twice with ``If-None-Match: *`` under the table's
``_lancetx_probe/`` and deletes it: three requests. A store that accepts the
second PUT cannot claim versions by itself and is refused with
:class:`ConditionalPutIgnoredError`, before any manifest is written; the answer
is cached per (endpoint, bucket) for the life of the process.

Users who know their store can turn the probe off with the storage option
``lancetx_probe_conditional_put=false``.
"""

from __future__ import annotations

import contextlib
import threading
import uuid as uuidlib
from typing import Final

from lancetx.commit.errors import LancetxError, ObjectExistsError, UnsupportedOperationError
from lancetx.commit.format.naming import join
from lancetx.commit.storage.objectstore import ObjectStore

__all__ = [
    "PROBE_DIR",
    "PROBE_OPTION",
    "ConditionalPutIgnoredError",
    "clear_probe_cache",
    "probe_conditional_put",
]

#: Storage option turning the probe off (``false``); on by default.
PROBE_OPTION: Final = "lancetx_probe_conditional_put"
#: Folder of the table the probe object is written to (and deleted from).
PROBE_DIR: Final = "_lancetx_probe"

_RESULTS: dict[tuple[str | None, str], bool] = {}
_LOCK = threading.Lock()


class ConditionalPutIgnoredError(UnsupportedOperationError):
    """The store accepted a second ``If-None-Match: *`` PUT of an existing object."""

    def __init__(self, uri: str) -> None:
        super().__init__(
            "put_if_not_exists",
            uri,
            "this store accepted a second PUT with If-None-Match: * of an object that already "
            "existed (probed before the first commit): it ignores conditional writes, so two "
            "writers could both create the same version and one commit would be lost. Nothing "
            "was committed. Commit through DynamoDB instead: s3+ddb://BUCKET/PATH?ddbTableName="
            "TABLE (lancetx.externalstore); or, if the store is known to be safe, set the "
            f"storage option {PROBE_OPTION}=false",
        )


def _endpoint(store: ObjectStore) -> str | None:
    client = getattr(store, "client", None)
    meta = getattr(client, "meta", None)
    endpoint = getattr(meta, "endpoint_url", None)
    return endpoint if isinstance(endpoint, str) else None


def probe_conditional_put(store: ObjectStore, base: str) -> None:
    """Refuse ``store`` if it ignores ``If-None-Match``; probes S3 stores once per
    (endpoint, bucket) per process (≤ 3 requests). Other stores are not probed.

    Raises ConditionalPutIgnoredError; a request error is raised as is (and the
    store is probed again next time).
    """
    root = store.uri("")
    if not root.startswith("s3://"):
        return  # a local disk's create-if-absent is a hard link: nothing to doubt
    key = (_endpoint(store), root)
    with _LOCK:
        known = _RESULTS.get(key)
        if known is None:
            known = _probe(store, base)
            _RESULTS[key] = known
    if not known:
        raise ConditionalPutIgnoredError(store.uri(base))


def _probe(store: ObjectStore, base: str) -> bool:
    probe = join(base, PROBE_DIR, f"{uuidlib.uuid4()}.probe")
    store.put_if_not_exists(probe, b"1")
    try:
        # Different bytes: a store that answers 412 to a retried request of its own
        # may report success when the object holds the bytes it was sent.
        store.put_if_not_exists(probe, b"2")
    except ObjectExistsError:
        return True
    finally:
        # A stray probe object is harmless: nothing reads that folder.
        with contextlib.suppress(LancetxError):
            store.delete(probe)
    return False


def clear_probe_cache() -> None:
    """Forget every probe result (tests)."""
    with _LOCK:
        _RESULTS.clear()
