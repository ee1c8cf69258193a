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
   the others are read once per process (the commit loop's transaction cache,
   :data:`~lancetx.commit.engine.txn_cache.TRANSACTIONS`, which also holds every
   version a commit loop of the process loaded). A version whose manifest is gone
   (removed by ``cleanup``) is skipped: on a table without key items its key is
   forgotten with it.

The look-up is the fast path only. What makes a key land at most once under
concurrency is the claim (the key item is claimed with the version, atomically)
and, where there is no key item, the commit loop, which checks every version
committed after the parent the look-up covered (the caller looks up only once it
holds that parent).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from lancetx.commit.engine.committer import IDEMPOTENCY_KEY
from lancetx.commit.engine.operations import Rewrite, Transaction
from lancetx.commit.engine.txn_cache import TRANSACTIONS
from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import read_manifest_at
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.handlers.interface import CommitHandler

__all__ = ["READ_PARALLELISM", "find_committed_key"]

#: Versions read at once while looking for a key in the history.
READ_PARALLELISM = 8


def find_committed_key(
    handler: CommitHandler, base: str, key: str, *, since: int = 0
) -> int | None:
    """The version idempotency ``key`` was committed as, or None (see the module
    docstring). ``since``: versions up to it cannot hold the key (the caller knows);
    the key item is believed wherever it points. The newest version with the key
    wins, should an older lancetx have committed it twice."""
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
    if not unread:
        return by_summary
    with ThreadPoolExecutor(max_workers=min(READ_PARALLELISM, len(unread))) as pool:
        for start in range(0, len(unread), READ_PARALLELISM):
            batch = unread[start : start + READ_PARALLELISM]
            for location, found_key in zip(
                batch, pool.map(lambda loc: _key_of(handler, base, loc), batch), strict=True
            ):
                if found_key == key:
                    return location.version
    return by_summary


def _key_of(handler: CommitHandler, base: str, location: ManifestLocation) -> str | None:
    """The idempotency key of the version at ``location`` (None: none, or its manifest
    is gone)."""
    uri = handler.store.uri(base)
    txn = TRANSACTIONS.get(uri, location)
    if txn is None:
        try:
            manifest = read_manifest_at(handler.store, location)
            pb = read_transaction_of(handler.store, base, manifest)
        except ObjectNotFoundError:
            return None  # removed (cleanup): nothing to read a key from
        if pb is None:
            return None
        txn = Transaction.from_proto(pb, source=handler.store.uri(location.key))
        if not isinstance(txn.operation, Rewrite):
            # A Rewrite's cached form carries its fragment-reuse index (the commit
            # loop adds it from the manifest); leave those to the loop.
            TRANSACTIONS.put(uri, location, txn)
    return txn.properties.get(IDEMPOTENCY_KEY) or None
