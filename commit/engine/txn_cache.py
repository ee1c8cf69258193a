"""Committed transactions already loaded in this process, per table.

A committed version never changes, so once its transaction was loaded for a
conflict check, any later check in the process (another thread's commit, a
writer planned long ago) can reuse it instead of reading the manifest again.
The library that wrote the version's manifest (``writer_version.library``) is
kept with it: the commit loop tells versions of writers outside its commit
queue by it.
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
    """An LRU map from (table URI, manifest location) to the version's transaction
    and the library that wrote its manifest."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[_Key, tuple[Transaction, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(table_uri: str, location: ManifestLocation) -> _Key | None:
        if location.size is None:
            return None  # nothing to tell a recreated table's version N from the old one
        return (table_uri, location.version, location.key, location.size, location.etag)

    def get(self, table_uri: str, location: ManifestLocation) -> Transaction | None:
        """The cached transaction of ``location``'s version, or None."""
        found = self.get_with_writer(table_uri, location)
        return found[0] if found is not None else None

    def get_with_writer(
        self, table_uri: str, location: ManifestLocation
    ) -> tuple[Transaction, str | None] | None:
        """The cached transaction of ``location``'s version and the library that wrote
        its manifest (None if unknown), or None."""
        key = self._key(table_uri, location)
        if key is None:
            return None
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(
        self,
        table_uri: str,
        location: ManifestLocation,
        txn: Transaction,
        writer: str | None = None,
    ) -> None:
        """Remember ``txn`` as the transaction committed at ``location`` (in a manifest
        written by library ``writer``)."""
        key = self._key(table_uri, location)
        if key is None or self.capacity <= 0:
            return
        with self._lock:
            self._items[key] = (txn, writer)
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
