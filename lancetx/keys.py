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
   version a commit loop of the process loaded). A version ``cleanup`` removed is
   skipped (:func:`lancetx.version_history.map_versions`): on a table without key items its
   key is forgotten with it.

The look-up is the fast path only. What makes a key land at most once under
concurrency is the claim (the key item is claimed with the version, atomically)
and, where there is no key item, the commit loop, which checks every version
committed after the parent the look-up covered (the caller looks up only once it
holds that parent).
"""

from __future__ import annotations

from lancetx.commit.engine.committer import IDEMPOTENCY_KEY
from lancetx.commit.engine.operations import Rewrite, Transaction
from lancetx.commit.engine.txn_cache import TRANSACTIONS
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.version_history import map_versions

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
    uri = handler.store.uri(base)

    def read(location: ManifestLocation, manifest: ManifestFile) -> str | None:
        pb = read_transaction_of(handler.store, base, manifest)
        if pb is None:
            return None
        txn = Transaction.from_proto(pb, source=handler.store.uri(location.key))
        if not isinstance(txn.operation, Rewrite):
            # A Rewrite's cached form carries its fragment-reuse index (the commit
            # loop adds it from the manifest); leave those to the loop.
            TRANSACTIONS.put(uri, location, txn, manifest.manifest.writer_version.library or None)
        return _key_of(txn)

    for start in range(0, len(unread), READ_PARALLELISM):
        batch = unread[start : start + READ_PARALLELISM]
        keys: dict[int, str | None] = {}
        uncached: list[ManifestLocation] = []
        for location in batch:
            txn = TRANSACTIONS.get(uri, location)
            if txn is None:
                uncached.append(location)
            else:
                keys[location.version] = _key_of(txn)

        # Versions a cleanup removed are left out (their keys went with them).
        for location, found_key in map_versions(
            handler.store, base, uncached, read, parallelism=READ_PARALLELISM
        ):
            keys[location.version] = found_key
        for location in batch:  # newest first
            if keys.get(location.version) == key:
                return location.version
    return by_summary


def _key_of(txn: Transaction) -> str | None:
    return txn.properties.get(IDEMPOTENCY_KEY) or None
