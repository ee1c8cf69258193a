"""Finding the version an idempotency key was committed as, before a commit.

Two sources, in this order:

1. **The key item** (handlers that claim keys, ``s3+ddb://`` tables): one read
   names the version, however old, also when ``cleanup`` has removed it since. A
   commit that carries a key claims this item with its version, so this is where
   every key committed by this release is.
2. **The history after ``since``**: keys committed without a key item — by an
   older lancetx, or on a table whose handler keeps none (a store with conditional
   PUT: local disks, S3 with ``If-None-Match``) — are found in the versions'
   transaction properties. Every version is looked at, however many there are.
   A version claimed by lancetx names its key in its DynamoDB entry (no read);
   others are read once per process (``seen``). A version whose manifest is gone
   (removed by ``cleanup``) is skipped: on a table without key items its key is
   forgotten with it.

The look-up is the fast path only. What makes a key land at most once under
concurrency is the claim (the key item is claimed with the version, atomically)
and, where there is no key item, the commit loop, which checks every version
committed after the parent the look-up covered (the caller looks up only after
it holds that parent).
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from concurrent.futures import ThreadPoolExecutor

from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.history import HISTORY_PARALLELISM, VersionInfo, version_info

__all__ = ["find_committed_key"]


def find_committed_key(
    handler: CommitHandler,
    base: str,
    key: str,
    *,
    since: int = 0,
    seen: MutableMapping[int, VersionInfo | None] | None = None,
    lock: threading.Lock | None = None,
) -> int | None:
    """The version idempotency ``key`` was committed as, or None (see the module
    docstring). ``since``: versions up to it cannot hold the key (the caller knows);
    the key item is believed wherever it points. ``seen`` caches versions read (None:
    unreadable), guarded by ``lock``. The newest version with the key wins, should an
    older lancetx have committed it twice."""
    found = handler.find_key(base, key)
    if found is not None:
        return found
    newest_first = sorted(
        (loc for loc in handler.list_versions(base, since) if loc.version > since),
        key=lambda loc: -loc.version,
    )
    # Entries lancetx claimed name their key: settled without a read.
    by_summary = max(
        (
            loc.version
            for loc in newest_first
            if loc.summary is not None and loc.summary.idempotency_key == key
        ),
        default=None,
    )
    unread = [
        loc
        for loc in newest_first
        if loc.summary is None and (by_summary is None or loc.version > by_summary)
    ]
    seen = seen if seen is not None else {}
    lock = lock or threading.Lock()
    for start in range(0, len(unread), HISTORY_PARALLELISM):
        batch = unread[start : start + HISTORY_PARALLELISM]
        with lock:
            missing = [loc for loc in batch if loc.version not in seen]
        for loc, info in zip(missing, _read(handler, base, missing), strict=True):
            with lock:
                seen[loc.version] = info
        with lock:
            infos = [seen[loc.version] for loc in batch]
        for info in infos:
            if info is not None and info.idempotency_key == key:
                return info.version
    return by_summary


def _read(
    handler: CommitHandler, base: str, locations: list[ManifestLocation]
) -> list[VersionInfo | None]:
    """Each version's info, read in parallel; None for one whose manifest is gone."""

    def one(location: ManifestLocation) -> VersionInfo | None:
        try:
            return version_info(handler, base, location)
        except ObjectNotFoundError:
            return None  # removed (cleanup): nothing to read a key from

    if not locations:
        return []
    with ThreadPoolExecutor(max_workers=min(HISTORY_PARALLELISM, len(locations))) as pool:
        return list(pool.map(one, locations))
