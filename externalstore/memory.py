"""An in-memory external manifest store with fault injection.

Same semantics as the DynamoDB store (conditional writes atomic under one
lock, the same ownership resolution, the same errors), for fast unit tests and
the fault-injection harness:

* ``fail_next(op, error)``: the next call of ``op`` raises ``error`` without
  touching the state (a request that never arrived).
* ``land_then_fail(op)``: the next call of ``op`` applies its write, then
  raises :class:`AmbiguousWriteError` (the write landed, the caller cannot
  know: a timeout after sending).
* ``on_call(op, hook)``: run ``hook(store)`` just before each ``op`` takes
  effect, to interleave another actor deterministically.

``op`` is a method name: ``get``, ``latest``, ``put_if_not_exists``,
``put_with_key_if_not_exists``, ``put_all_if_not_exists``, ``put_if_exists``,
``list_entries``, ``get_key``, ``delete_all``. ``calls`` counts them.

It keeps key items as the DynamoDB store does (one per idempotency key and table,
at the key's slot, written with the version in one atomic step), so two keys
sharing a slot can be simulated by patching :func:`~lancetx.externalstore.base.key_slot`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lancetx.commit.errors import IdempotencyKeyCollisionError
from lancetx.commit.handlers.queue import Turns
from lancetx.externalstore import base as _base
from lancetx.externalstore.base import (
    AsyncExternalManifestStore,
    ExternalManifestStore,
    KeyRecord,
    ManifestEntry,
    Ownership,
    keys_base_uri,
    ownership_of,
    pointer_flip_done,
)
from lancetx.externalstore.errors import (
    AmbiguousWriteError,
    BatchEntryExistsError,
    EntryExistsError,
    EntryMismatchError,
    EntryNotFoundError,
    KeyExistsError,
)

__all__ = ["OPERATIONS", "AsyncMemoryManifestStore", "MemoryManifestStore"]

OPERATIONS = frozenset(
    {
        "get",
        "latest",
        "put_if_not_exists",
        "put_with_key_if_not_exists",
        "put_all_if_not_exists",
        "put_if_exists",
        "list_entries",
        "get_key",
        "delete_all",
    }
)
_WRITES = frozenset(
    {
        "put_if_not_exists",
        "put_with_key_if_not_exists",
        "put_all_if_not_exists",
        "put_if_exists",
        "delete_all",
    }
)
_ACTIONS = {
    "get": "GetItem",
    "latest": "Query",
    "get_entries": "BatchGetItem",
    "put_if_not_exists": "PutItem",
    "put_with_key_if_not_exists": "TransactWriteItems",
    "get_key": "GetItem",
    "put_all_if_not_exists": "TransactWriteItems",
    "put_if_exists": "PutItem",
    "list_entries": "Query",
    "delete_all": "DeleteItem",
    "take_ticket": "UpdateItem",
    "read_turns": "GetItem",
    "end_turn": "UpdateItem",
}


@dataclass
class _Fault:
    error: BaseException | None  # None: land, then raise AmbiguousWriteError
    remaining: int


def _turns(queue: list[float]) -> Turns:
    return Turns(
        issued=int(queue[0]),
        served=int(queue[1]),
        served_version=int(queue[2]),
        served_at=queue[3],
    )


class MemoryManifestStore(ExternalManifestStore):
    """A thread-safe in-memory external manifest store (``name`` appears in errors)."""

    keeps_keys = True

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self._lock = threading.RLock()
        self._tables: dict[str, dict[int, ManifestEntry]] = {}
        #: Key items: key partition (see keys_base_uri) -> slot -> record.
        self._keys: dict[str, dict[int, KeyRecord]] = {}
        #: Commit queues: base_uri -> [issued, served, served_version, served_at].
        self._queues: dict[str, list[float]] = {}
        self._faults: dict[str, collections.deque[_Fault]] = collections.defaultdict(
            collections.deque
        )
        self._hooks: dict[str, list[Callable[[MemoryManifestStore], None]]] = (
            collections.defaultdict(list)
        )
        self.calls: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ faults

    def fail_next(self, op: str, error: BaseException, *, times: int = 1) -> None:
        """The next ``times`` calls of ``op`` raise ``error`` and change nothing."""
        self._check_op(op)
        with self._lock:
            self._faults[op].append(_Fault(error, times))

    def land_then_fail(self, op: str, *, times: int = 1) -> None:
        """The next ``times`` calls of write ``op`` take effect, then raise AmbiguousWriteError."""
        self._check_op(op)
        if op not in _WRITES:
            raise ValueError(f"land_then_fail needs a write operation, not {op!r}")
        with self._lock:
            self._faults[op].append(_Fault(None, times))

    def on_call(self, op: str, hook: Callable[[MemoryManifestStore], None]) -> None:
        """Run ``hook(self)`` at the start of every ``op`` call (outside the
        condition check, so the hook can act as a concurrent writer)."""
        self._check_op(op)
        with self._lock:
            self._hooks[op].append(hook)

    def clear_faults(self) -> None:
        """Remove pending faults and hooks."""
        with self._lock:
            self._faults.clear()
            self._hooks.clear()

    @staticmethod
    def _check_op(op: str) -> None:
        if op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}; one of {sorted(OPERATIONS)}")

    def _begin(self, op: str) -> _Fault | None:
        """Count the call, run hooks, and pop the fault for this call (if any)."""
        with self._lock:
            self.calls[op] += 1
            hooks = list(self._hooks.get(op, ()))
        for hook in hooks:
            hook(self)
        with self._lock:
            queue = self._faults.get(op)
            if not queue:
                return None
            fault = queue[0]
            fault.remaining -= 1
            if fault.remaining <= 0:
                queue.popleft()
        if fault.error is not None:
            raise fault.error
        return fault

    def _resource(self) -> str:
        return f"memory:{self.name}"

    def _action(self, op: str) -> str:
        return f"dynamodb:{_ACTIONS[op]}"

    # ------------------------------------------------------------------ inspection

    def entries(self) -> list[ManifestEntry]:
        """Every entry of every table, sorted by (base_uri, version)."""
        with self._lock:
            return [e for _, rows in sorted(self._tables.items()) for _, e in sorted(rows.items())]

    def key_records(self) -> list[KeyRecord]:
        """Every key item of every table, sorted by (base_uri, key)."""
        with self._lock:
            return sorted(
                (r for rows in self._keys.values() for r in rows.values()),
                key=lambda r: (r.base_uri, r.key),
            )

    # ------------------------------------------------------------------ interface

    def get(self, base_uri: str, version: int) -> ManifestEntry:
        self._begin("get")
        with self._lock:
            entry = self._tables.get(base_uri, {}).get(version)
        if entry is None:
            raise EntryNotFoundError(self._action("get"), self._resource(), base_uri, version)
        return entry

    def get_entries(self, base_uri: str, versions: Sequence[int]) -> list[ManifestEntry]:
        self._begin("get_entries")
        with self._lock:
            rows = self._tables.get(base_uri, {})
            return [rows[v] for v in sorted(set(versions)) if v in rows]

    def latest(self, base_uri: str) -> ManifestEntry | None:
        self._begin("latest")
        with self._lock:
            rows = self._tables.get(base_uri)
            return rows[max(rows)] if rows else None

    def put_if_not_exists(self, entry: ManifestEntry) -> None:
        fault = self._begin("put_if_not_exists")
        action = self._action("put_if_not_exists")
        with self._lock:
            rows = self._tables.setdefault(entry.base_uri, {})
            existing = rows.get(entry.version)
            if existing is None:
                rows[entry.version] = entry
        if existing is not None:
            if ownership_of(existing, entry) is Ownership.MINE:
                return
            raise EntryExistsError(
                action, self._resource(), entry.base_uri, entry.version, existing
            )
        if fault is not None:
            raise AmbiguousWriteError(
                action, self._resource(), entry, "injected: landed, then the answer was lost"
            )

    def put_with_key_if_not_exists(self, entry: ManifestEntry, key: KeyRecord) -> None:
        fault = self._begin("put_with_key_if_not_exists")
        action = self._action("put_with_key_if_not_exists")
        slot = _base.key_slot(key.key)
        with self._lock:
            rows = self._tables.setdefault(entry.base_uri, {})
            keys = self._keys.setdefault(keys_base_uri(key.base_uri), {})
            existing, taken = rows.get(entry.version), keys.get(slot)
            if existing is None and taken is None:
                rows[entry.version] = entry
                keys[slot] = key
        if taken is not None:
            if taken.commit_token is not None and taken.commit_token == entry.commit_token:
                return  # our own earlier attempt landed (both items: one write)
            raise KeyExistsError(action, self._resource(), key, taken)
        if existing is not None:
            if ownership_of(existing, entry) is Ownership.MINE:
                return
            raise EntryExistsError(
                action, self._resource(), entry.base_uri, entry.version, existing
            )
        if fault is not None:
            raise AmbiguousWriteError(
                action, self._resource(), entry, "injected: landed, then the answer was lost"
            )

    def get_key(self, base_uri: str, key: str) -> KeyRecord | None:
        self._begin("get_key")
        with self._lock:
            found = self._keys.get(keys_base_uri(base_uri), {}).get(_base.key_slot(key))
        if found is not None and found.key != key:
            raise IdempotencyKeyCollisionError(
                base_uri, key, found.key, found.version, _base.key_slot(key)
            )
        return found

    def put_all_if_not_exists(
        self, entries: Sequence[ManifestEntry], *, request_token: str
    ) -> None:
        fault = self._begin("put_all_if_not_exists")
        action = self._action("put_all_if_not_exists")
        with self._lock:
            existing = [self._tables.get(e.base_uri, {}).get(e.version) for e in entries]
            applied = all(found is None for found in existing)
            if applied:
                for entry in entries:
                    self._tables.setdefault(entry.base_uri, {})[entry.version] = entry
        if not applied:
            failed = [i for i, found in enumerate(existing) if found is not None]
            raise BatchEntryExistsError(action, self._resource(), list(entries), failed, existing)
        if fault is not None:
            raise AmbiguousWriteError(
                action, self._resource(), entries[0], "injected: landed, then the answer was lost"
            )

    def put_if_exists(
        self, entry: ManifestEntry, *, expected_path: str | None = None
    ) -> ManifestEntry | None:
        fault = self._begin("put_if_exists")
        action = self._action("put_if_exists")
        with self._lock:
            rows = self._tables.get(entry.base_uri, {})
            existing = rows.get(entry.version)
            applied = existing is not None and (
                expected_path is None or existing.path == expected_path
            )
            if applied:
                rows[entry.version] = entry
        if existing is None:
            raise EntryNotFoundError(action, self._resource(), entry.base_uri, entry.version)
        if not applied:
            if pointer_flip_done(existing, entry):
                return existing
            raise EntryMismatchError(action, self._resource(), entry, expected_path, existing)
        if fault is not None:
            raise AmbiguousWriteError(
                action, self._resource(), entry, "injected: landed, then the answer was lost"
            )
        return None

    def list_entries(self, base_uri: str, since: int = 0) -> list[ManifestEntry]:
        self._begin("list_entries")
        with self._lock:
            rows = self._tables.get(base_uri, {})
            return [rows[v] for v in sorted(rows) if v > since]

    def delete_all(self, base_uri: str) -> None:
        fault = self._begin("delete_all")
        with self._lock:
            self._tables.pop(base_uri, None)
            self._keys.pop(keys_base_uri(base_uri), None)
        if fault is not None:
            raise AmbiguousWriteError(
                self._action("delete_all"),
                self._resource(),
                ManifestEntry(base_uri, 0, "(all versions)"),
                "injected: landed, then the answer was lost",
            )

    def take_ticket(self, base_uri: str) -> Turns:
        self._begin("take_ticket")
        with self._lock:
            queue = self._queues.setdefault(base_uri, [0, 0, 0, 0.0])
            queue[0] += 1
            return _turns(queue)

    def read_turns(self, base_uri: str) -> Turns:
        self._begin("read_turns")
        with self._lock:
            return _turns(self._queues.get(base_uri, [0, 0, 0, 0.0]))

    def end_turn(self, base_uri: str, ticket: int, version: int | None = None) -> None:
        self._begin("end_turn")
        with self._lock:
            queue = self._queues.setdefault(base_uri, [0, 0, 0, 0.0])
            if ticket > queue[1]:
                queue[1] = ticket
                queue[2] = max(queue[2], version or 0)
                queue[3] = time.time()

    def as_async(self) -> AsyncMemoryManifestStore:
        """An asyncio view sharing this store's state and faults."""
        return AsyncMemoryManifestStore(self)


class AsyncMemoryManifestStore(AsyncExternalManifestStore):
    """The asyncio face of a :class:`MemoryManifestStore` (same state, same faults)."""

    keeps_keys = True

    def __init__(self, store: MemoryManifestStore | None = None) -> None:
        self.store = store or MemoryManifestStore()

    async def get(self, base_uri: str, version: int) -> ManifestEntry:
        return self.store.get(base_uri, version)

    async def get_entries(self, base_uri: str, versions: Sequence[int]) -> list[ManifestEntry]:
        return self.store.get_entries(base_uri, versions)

    async def latest(self, base_uri: str) -> ManifestEntry | None:
        return self.store.latest(base_uri)

    async def put_if_not_exists(self, entry: ManifestEntry) -> None:
        self.store.put_if_not_exists(entry)

    async def put_with_key_if_not_exists(self, entry: ManifestEntry, key: KeyRecord) -> None:
        self.store.put_with_key_if_not_exists(entry, key)

    async def get_key(self, base_uri: str, key: str) -> KeyRecord | None:
        return self.store.get_key(base_uri, key)

    async def put_all_if_not_exists(
        self, entries: Sequence[ManifestEntry], *, request_token: str
    ) -> None:
        self.store.put_all_if_not_exists(entries, request_token=request_token)

    async def put_if_exists(
        self, entry: ManifestEntry, *, expected_path: str | None = None
    ) -> ManifestEntry | None:
        return self.store.put_if_exists(entry, expected_path=expected_path)

    async def list_entries(self, base_uri: str, since: int = 0) -> list[ManifestEntry]:
        return self.store.list_entries(base_uri, since)

    async def delete_all(self, base_uri: str) -> None:
        self.store.delete_all(base_uri)

    async def take_ticket(self, base_uri: str) -> Turns:
        return self.store.take_ticket(base_uri)

    async def read_turns(self, base_uri: str) -> Turns:
        return self.store.read_turns(base_uri)

    async def end_turn(self, base_uri: str, ticket: int, version: int | None = None) -> None:
        self.store.end_turn(base_uri, ticket, version)
