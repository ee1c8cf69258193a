"""Committed transactions already loaded in this process, per table.

A committed version never changes, so once its transaction was loaded for a
conflict check, any later check in the process (another thread's commit, a
writer planned long ago) can reuse it instead of reading the manifest again.
Entries are keyed by the table's URI, the version and the manifest's key, size
and ETag as its location names them, so a table recreated under the same URI
(whose version N is another file) does not hit an old entry. Bounded (least
recently used first out), thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from lancetx.commit.engine.operations import Transaction
from lancetx.commit.format.location import ManifestLocation

#: Transactions kept per process (all tables together).
CAPACITY = 4096

_Key = tuple[str, int, str, int, str | None]


class TransactionCache:
    """An LRU map from (table URI, manifest location) to the version's transaction."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[_Key, Transaction] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(table_uri: str, location: ManifestLocation) -> _Key | None:
        if location.size is None:
            return None  # nothing to tell a recreated table's version N from the old one
        return (table_uri, location.version, location.key, location.size, location.etag)

    def get(self, table_uri: str, location: ManifestLocation) -> Transaction | None:
        """The cached transaction of ``location``'s version, or None."""
        key = self._key(table_uri, location)
        if key is None:
            return None
        with self._lock:
            txn = self._items.get(key)
            if txn is not None:
                self._items.move_to_end(key)
            return txn

    def put(self, table_uri: str, location: ManifestLocation, txn: Transaction) -> None:
        """Remember ``txn`` as the transaction committed at ``location``."""
        key = self._key(table_uri, location)
        if key is None or self.capacity <= 0:
            return
        with self._lock:
            self._items[key] = txn
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (tests, or a process that wants to drop the memory)."""
        with self._lock:
            self._items.clear()


#: The process-wide cache the commit loop uses.
TRANSACTIONS = TransactionCache()

__all__ = ["CAPACITY", "TRANSACTIONS", "TransactionCache"]
