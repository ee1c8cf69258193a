"""The effects the commit loop asks for, and the drivers that perform them.

The loop (:mod:`lancetx.commit.engine.committer`) and the rebase
(:mod:`lancetx.commit.engine.rebase`) are generators: they *yield* an effect
(read this object, claim this version, sleep, run these sub-steps side by
side…) and receive its result, or have its error thrown in. They do no I/O of
their own, so one implementation is driven by :func:`run` (blocking: a
:class:`CommitHandler`, threads for :class:`Gather`) and by :func:`run_async`
(an :class:`AsyncCommitHandler`, tasks for :class:`Gather`) — the same shape as
:mod:`lancetx.externalstore.protocol`, one level up.

An effect's error is thrown back into the steps: a
:class:`~lancetx.commit.errors.LancetxError` for them to handle, anything else
(``KeyboardInterrupt``, cancellation, a bug) only so that they can record what
it interrupted (e.g. a claim that may have landed) before it propagates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from lancetx.commit.errors import LancetxError
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.sansio import Outcome, drive, drive_async
from lancetx.commit.storage.limits import read_capped, read_capped_async
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from lancetx.commit.handlers.interface import AsyncCommitHandler
    from lancetx.commit.storage.s3store_async import AsyncObjectStore

T = TypeVar("T")


# ---------------------------------------------------------------- object store


@dataclass(frozen=True)
class GetObject:
    """A whole object (result: bytes; ObjectNotFoundError). With ``kind`` (a kind of
    :mod:`lancetx.commit.storage.limits`: a manifest, a transaction file) an object
    over that kind's cap is refused before its body is read (ObjectTooLargeError)."""

    key: str
    kind: str | None = None


@dataclass(frozen=True)
class GetRange:
    """Bytes ``[start, end)`` of an object (result: bytes)."""

    key: str
    start: int
    end: int


@dataclass(frozen=True)
class GetTail:
    """The last ``length`` bytes and the object's size, in one request (result: (bytes, int))."""

    key: str
    length: int


@dataclass(frozen=True)
class HeadObject:
    """An object's metadata (result: ObjectMeta; ObjectNotFoundError)."""

    key: str


@dataclass(frozen=True)
class PutObject:
    """Write (or overwrite) an object (result: its ObjectMeta)."""

    key: str
    data: bytes


@dataclass(frozen=True)
class DeleteObject:
    """Delete an object; missing is fine (result: None)."""

    key: str


# --------------------------------------------------------------------- handler


@dataclass(frozen=True)
class ResolveLatest:
    """The newest committed version (result: ManifestLocation | None)."""

    base: str


@dataclass(frozen=True)
class ResolveVersion:
    """The location of ``version`` (result: ManifestLocation; VersionNotFoundError)."""

    base: str
    version: int


@dataclass(frozen=True)
class ListVersions:
    """Committed versions after ``since``, ascending (result: list[ManifestLocation])."""

    base: str
    since: int


@dataclass(frozen=True)
class ReadManifest:
    """The handler's read of the manifest at ``location`` (result: ManifestFile);
    the handler may check it against what it resolved and explain a failure.
    ``bulk``: one of many reads made together (a catch-up), which the store may
    send its cheaper way (``ObjectStore.get_tail_bulk``)."""

    base: str
    location: ManifestLocation
    bulk: bool = False


@dataclass(frozen=True)
class ClaimVersion:
    """The handler's atomic commit of ``version`` (result: ManifestLocation;
    VersionAlreadyExistsError, CommitStateUnknownError)."""

    base: str
    version: int
    manifest: bytes
    scheme: NamingScheme
    #: Ours in brief; its ``ticket`` (our place in the commit queue) is served by
    #: the claim (see :mod:`lancetx.commit.handlers.queue`).
    summary: TransactionSummary | None = None


# ---------------------------------------------------------------- commit queue
# Performed through the handler's ``queue`` (see lancetx.commit.handlers.queue);
# without one, TakeTicket and ReadTurns answer None and EndTurn does nothing.


@dataclass(frozen=True)
class TakeTicket:
    """Join the table's commit queue (result: Turns, or None without a queue)."""

    base: str


@dataclass(frozen=True)
class ReadTurns:
    """The table's commit queue (result: Turns, or None without a queue)."""

    base: str


@dataclass(frozen=True)
class LookVersions:
    """The versions ``since + 1`` … ``since + count`` claimed so far, up to the first
    that is not, by the queue's point reads (result: list[ManifestLocation], or None
    without a queue that can look: list them with :class:`ListVersions` instead)."""

    base: str
    since: int
    count: int


@dataclass(frozen=True)
class EndTurn:
    """Our turn with ``ticket`` is over, won by claiming ``version`` if it was
    (result: None)."""

    base: str
    ticket: int
    version: int | None = None


# --------------------------------------------------------------------- control


@dataclass(frozen=True)
class WithStore:
    """Run ``fn`` with a blocking object store (result: what ``fn`` returns).

    For the few steps written against :class:`ObjectStore` directly (the
    fragment-reuse index merge of a rebase). The async driver runs ``fn`` in a
    thread, on a blocking view of its async store."""

    fn: Callable[[ObjectStore], Any]


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds`` (result: None)."""

    seconds: float


@dataclass(frozen=True)
class Gather:
    """Run ``steps`` side by side, at most ``limit`` at once (result: their
    results, in order). If any fails, the first failure (in order) is thrown in
    once all have finished."""

    steps: Sequence[Generator[Any, Any, Any]]
    limit: int


Effect = (
    GetObject
    | GetRange
    | GetTail
    | HeadObject
    | PutObject
    | DeleteObject
    | ResolveLatest
    | ResolveVersion
    | ListVersions
    | ReadManifest
    | ClaimVersion
    | TakeTicket
    | ReadTurns
    | LookVersions
    | EndTurn
    | Sleep
    | Gather
    | WithStore
)
Steps = Generator[Effect, Any, T]


class Names(Protocol):
    """What steps may know of a store without I/O: the URI of a key, for messages."""

    def uri(self, key: str) -> str: ...


# --------------------------------------------------------------------- drivers


def _gathered(outcomes: Sequence[Outcome]) -> Outcome:
    for outcome in outcomes:
        if outcome.error is not None:
            return outcome
    return Outcome([o.value for o in outcomes])


#: Threads of the shared pool that runs Gather's sub-steps for the sync driver.
POOL_THREADS = 16
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_in_pool = threading.local()


def _shared_pool() -> ThreadPoolExecutor:
    """One pool per process, created on first use: starting threads for every
    conflict check cost more than the loads they ran on a busy machine."""
    global _pool
    with _pool_lock:
        if _pool is None:
            # concurrent.futures (and its exit hook) is loaded by the first Gather,
            # not by loading a version to open (``tests/test_import_cost.py``).
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="lancetx-load")
        return _pool


def _in_pool_thread(fn: Callable[[Any], Outcome]) -> Callable[[Any], Outcome]:
    def marked(arg: Any) -> Outcome:
        _in_pool.active = True
        try:
            return fn(arg)
        finally:
            _in_pool.active = False

    return marked


def run(steps: Steps[T], handler: CommitHandler) -> T:
    """Drive ``steps`` with blocking I/O through ``handler`` and its store."""
    return _run_with(steps, handler.store, handler)


def run_store(steps: Steps[T], store: ObjectStore) -> T:
    """Drive ``steps`` that only touch objects (a rebase) with blocking I/O."""
    return _run_with(steps, store, None)


def _run_with(steps: Steps[T], store: ObjectStore, handler: CommitHandler | None) -> T:
    def perform(effect: Effect) -> Any:
        match effect:
            case GetObject(key, kind):
                return store.get(key) if kind is None else read_capped(store, key, kind)
            case GetRange(key, start, end):
                return store.get_range(key, start, end)
            case GetTail(key, length):
                return store.get_tail(key, length)
            case HeadObject(key):
                return store.head(key)
            case PutObject(key, data):
                return store.put(key, data)
            case DeleteObject(key):
                return store.delete(key)
            case Sleep(seconds):
                time.sleep(seconds)
                return None
            case Gather(subs, limit):
                return _gather_threads(subs, limit)
            case WithStore(fn):
                return fn(store)
        if handler is None:
            raise TypeError(f"{type(effect).__name__} needs a commit handler")
        match effect:
            case ResolveLatest(base):
                return handler.resolve_latest(base)
            case ResolveVersion(base, version):
                return handler.resolve_version(base, version)
            case ListVersions(base, since):
                return handler.list_versions(base, since)
            case ReadManifest(base, location, bulk):
                return handler.read_manifest(base, location, bulk=bulk)
            case ClaimVersion(base, version, manifest, scheme, summary):
                return handler.commit(base, version, manifest, scheme, summary)
        queue = handler.queue
        match effect:
            case TakeTicket(base):
                return queue.take_ticket(base) if queue is not None else None
            case ReadTurns(base):
                return queue.read_turns(base) if queue is not None else None
            case LookVersions(base, since, count):
                return queue.look(base, since, count) if queue is not None else None
            case EndTurn(base, ticket, claimed):
                return queue.end_turn(base, ticket, claimed) if queue is not None else None
        raise TypeError(f"unknown effect {effect!r}")

    def one(sub: Steps[Any]) -> Outcome:
        try:
            return Outcome(_run_with(sub, store, handler))
        except LancetxError as exc:
            return Outcome(error=exc)

    def _gather_threads(subs: Sequence[Steps[Any]], limit: int) -> Outcome:
        if len(subs) <= 1 or limit <= 1 or getattr(_in_pool, "active", False):
            # Sequential inside a pool thread: a nested Gather must not wait for
            # workers that are all busy running its parents.
            return _gathered([one(sub) for sub in subs])
        pool = _shared_pool()
        outcomes: list[Outcome] = [Outcome()] * len(subs)
        pending = iter(enumerate(subs))
        taking = threading.Lock()

        stopped: list[BaseException] = []

        # At most ``limit`` at once, as a sliding window: ``limit`` workers each take
        # the next sub-step when done with theirs (a slow one holds up no other). An
        # error that is not a LancetxError (a bug, an interrupt) stops every worker
        # from taking more, and is raised here once they are all done.
        def worker(_: object) -> Outcome:
            while True:
                with taking:
                    found = None if stopped else next(pending, None)
                if found is None:
                    return Outcome()
                index, sub = found
                try:
                    outcomes[index] = one(sub)
                except BaseException as exc:
                    with taking:
                        stopped.append(exc)
                    return Outcome()

        list(pool.map(_in_pool_thread(worker), range(min(limit, len(subs)))))
        if stopped:
            raise stopped[0]
        return _gathered(outcomes)

    # BaseException: the steps record what it interrupted, then re-raise.
    return drive(steps, perform, passes=BaseException)


async def _nothing() -> None:
    return None


async def run_async(steps: Steps[T], handler: AsyncCommitHandler) -> T:
    """Drive ``steps`` with asyncio I/O through ``handler`` and its store."""
    import asyncio  # here: the sync driver's users (opening a table) never load it

    store, queue = handler.store, handler.queue
    performers: dict[type, Callable[[Any], Awaitable[Any]]] = {
        GetObject: lambda e: (
            store.get(e.key) if e.kind is None else read_capped_async(store, e.key, e.kind)
        ),
        GetRange: lambda e: store.get_range(e.key, e.start, e.end),
        GetTail: lambda e: store.get_tail(e.key, e.length),
        HeadObject: lambda e: store.head(e.key),
        PutObject: lambda e: store.put(e.key, e.data),
        DeleteObject: lambda e: store.delete(e.key),
        ResolveLatest: lambda e: handler.resolve_latest(e.base),
        ResolveVersion: lambda e: handler.resolve_version(e.base, e.version),
        ListVersions: lambda e: handler.list_versions(e.base, e.since),
        ReadManifest: lambda e: handler.read_manifest(e.base, e.location, bulk=e.bulk),
        ClaimVersion: lambda e: handler.commit(e.base, e.version, e.manifest, e.scheme, e.summary),
        TakeTicket: lambda e: queue.take_ticket(e.base) if queue is not None else _nothing(),
        ReadTurns: lambda e: queue.read_turns(e.base) if queue is not None else _nothing(),
        LookVersions: lambda e: (
            queue.look(e.base, e.since, e.count) if queue is not None else _nothing()
        ),
        EndTurn: lambda e: (
            queue.end_turn(e.base, e.ticket, e.version) if queue is not None else _nothing()
        ),
        Sleep: lambda e: asyncio.sleep(e.seconds),
    }

    async def one(sub: Steps[Any], gate: asyncio.Semaphore) -> Outcome:
        async with gate:
            try:
                return Outcome(await run_async(sub, handler))
            except LancetxError as exc:
                return Outcome(error=exc)

    async def perform(effect: Effect) -> Any:
        if isinstance(effect, WithStore):
            blocking = _BlockingStore(store, asyncio.get_running_loop())
            return await asyncio.to_thread(effect.fn, blocking)
        if isinstance(effect, Gather):
            gate = asyncio.Semaphore(max(1, effect.limit))
            return _gathered(await asyncio.gather(*(one(sub, gate) for sub in effect.steps)))
        return await performers[type(effect)](effect)

    # BaseException: the steps record what it interrupted, then re-raise.
    return await drive_async(steps, perform, passes=BaseException)


class _BlockingStore(ObjectStore):
    """A blocking view of an async store for code running in a worker thread:
    each call runs on the event loop that owns the store and waits for it."""

    def __init__(self, inner: AsyncObjectStore, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.loop = loop
        self.capabilities = inner.capabilities
        self.read_limits = inner.read_limits

    def _wait(self, coro: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def get(self, key: str) -> bytes:
        return self._wait(self.inner.get(key))  # type: ignore[no-any-return]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._wait(self.inner.get_range(key, start, end))  # type: ignore[no-any-return]

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        return self._wait(self.inner.get_tail(key, length))  # type: ignore[no-any-return]

    def head(self, key: str) -> ObjectMeta:
        return self._wait(self.inner.head(key))  # type: ignore[no-any-return]

    def put(self, key: str, data: bytes) -> ObjectMeta:
        return self._wait(self.inner.put(key, data))  # type: ignore[no-any-return]

    def put_if_not_exists(self, key: str, data: bytes) -> ObjectMeta:
        return self._wait(self.inner.put_if_not_exists(key, data))  # type: ignore[no-any-return]

    def copy(self, src: str, dst: str) -> ObjectMeta:
        return self._wait(self.inner.copy(src, dst))  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        self._wait(self.inner.delete(key))

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        return iter(self._wait(self.inner.list(prefix)))


__all__ = [
    "ClaimVersion",
    "DeleteObject",
    "Effect",
    "EndTurn",
    "Gather",
    "GetObject",
    "GetRange",
    "GetTail",
    "HeadObject",
    "ListVersions",
    "LookVersions",
    "Names",
    "PutObject",
    "ReadManifest",
    "ReadTurns",
    "ResolveLatest",
    "ResolveVersion",
    "Sleep",
    "Steps",
    "TakeTicket",
    "WithStore",
    "run",
    "run_async",
    "run_store",
]
