"""Deletion files this process wrote or read, by URI: a delete or an update that
touches a fragment again reads its current deletion file from here, not the store.

A delete writes a fragment's *cumulative* deletion vector (Lance's rule), so the next
delete of rows in the same fragment first reads the file the last one wrote. A held
``Table`` that wrote that file knows its bytes: reading it back is one GET per touched
fragment that pylance's own ``delete`` does not send (its scan already read the file).

Sound because a deletion file is immutable: Lance and lancetx name each one
``_deletions/{fragment}-{read_version}-{random u64}.{arrow|bin}`` and never write
another content under a name (a rebase writes a new file). The bytes are decoded
and checked against the manifest's ``DeletionFile`` exactly as bytes read from the
store are. Only bytes a PUT or GET returned from are kept (a write whose outcome is
unknown is not). Bounded by size (least recently used out), thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["CAPACITY_BYTES", "DELETION_FILES", "LARGEST_BYTES", "DeletionFileCache"]

#: Bytes kept in all (all tables of the process together).
CAPACITY_BYTES = 16 * 1024 * 1024
#: A file larger than this is not kept (a bitmap of many millions of rows).
LARGEST_BYTES = 4 * 1024 * 1024


class DeletionFileCache:
    """An LRU map from a deletion file's URI to its bytes."""

    def __init__(self, capacity: int = CAPACITY_BYTES, largest: int = LARGEST_BYTES) -> None:
        self.capacity = capacity
        self.largest = largest
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, uri: str) -> bytes | None:
        """The bytes of the deletion file at ``uri``, if kept."""
        with self._lock:
            found = self._items.get(uri)
            if found is not None:
                self._items.move_to_end(uri)
            return found

    def put(self, uri: str, data: bytes) -> None:
        """Keep ``data`` as the content of the deletion file at ``uri``."""
        if len(data) > self.largest or len(data) > self.capacity:
            return
        with self._lock:
            old = self._items.pop(uri, None)
            if old is not None:
                self._size -= len(old)
            self._items[uri] = data
            self._size += len(data)
            while self._size > self.capacity:
                _, dropped = self._items.popitem(last=False)
                self._size -= len(dropped)

    def clear(self) -> None:
        """Forget everything (tests, or a process that wants the memory back)."""
        with self._lock:
            self._items.clear()
            self._size = 0


#: The process-wide cache ``delete`` and ``update`` use.
DELETION_FILES = DeletionFileCache()
