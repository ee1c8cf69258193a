"""Interleavings of the external-store protocol without I/O: a dict world that
performs effects with production semantics, actors stepped one effect at a time,
pylance's finalizer as steps, an exhaustive explorer, and a store whose listing
goes stale."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from protocol_helpers import (
    FaultyObjectStore,
)

from lancetx.commit.errors import (
    LancetxError,
    ObjectNotFoundError,
)
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.memory import MemoryManifestStore
from lancetx.externalstore.protocol import (
    ClaimEntry,
    CopyObject,
    DeleteObject,
    Effect,
    FlipEntry,
    GetEntry,
    GetObject,
    HeadObject,
    LatestEntry,
    PutObject,
    Steps,
    Table,
    final_key_of,
)


class StaleListingStore(FaultyObjectStore):
    """A store whose listing omits ``hidden`` keys (a legacy store's stale listing);
    GET/HEAD of a single key stay consistent."""

    def __init__(self, inner: ObjectStore, hidden: set[str] | None = None) -> None:
        super().__init__(inner)
        self.hidden: set[str] = hidden or set()

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        self.calls["list"] += 1
        return iter([m for m in self.inner.list(prefix) if m.key not in self.hidden])


class DictWorld:
    """Objects in a dict, entries in a MemoryManifestStore: the production effect
    semantics without I/O (for exhaustive interleavings)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.entries = MemoryManifestStore()

    def __call__(self, effect: Effect) -> Any:
        if isinstance(effect, PutObject):
            self.objects[effect.key] = effect.data
            return ObjectMeta(effect.key, len(effect.data), None)
        if isinstance(effect, CopyObject):
            if effect.src not in self.objects:
                raise ObjectNotFoundError("CopyObject", effect.src)
            data = self.objects[effect.dst] = self.objects[effect.src]
            return ObjectMeta(effect.dst, len(data), None)
        if isinstance(effect, GetObject):
            if effect.key not in self.objects:
                raise ObjectNotFoundError("GetObject", effect.key)
            return self.objects[effect.key]
        if isinstance(effect, HeadObject):
            if effect.key not in self.objects:
                raise ObjectNotFoundError("HeadObject", effect.key)
            return ObjectMeta(effect.key, len(self.objects[effect.key]), None)
        if isinstance(effect, DeleteObject):
            self.objects.pop(effect.key, None)
            return None
        if isinstance(effect, ClaimEntry):
            return self.entries.put_if_not_exists(effect.entry)
        if isinstance(effect, FlipEntry):
            return self.entries.put_if_exists(effect.entry, expected_path=effect.expected_path)
        if isinstance(effect, GetEntry):
            return self.entries.get(effect.base_uri, effect.version)
        if isinstance(effect, LatestEntry):
            return self.entries.latest(effect.base_uri)
        raise AssertionError(f"unexpected effect {effect!r}")


class Stepper:
    """One actor: a protocol generator advanced one effect at a time."""

    def __init__(self, steps: Steps[Any]) -> None:
        self.steps = steps
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.pending: Effect | None = None
        self._resume(lambda: steps.send(None))

    def _resume(self, how: Callable[[], Effect]) -> None:
        try:
            self.pending = how()
        except StopIteration as stop:
            self.done, self.result, self.pending = True, stop.value, None
        except LancetxError as exc:
            self.done, self.error, self.pending = True, exc, None

    def step(self, world: Callable[[Effect], Any]) -> None:
        assert self.pending is not None
        try:
            result = world(self.pending)
        except LancetxError as exc:
            error = exc
            self._resume(lambda: self.steps.throw(error))
            return
        self._resume(lambda: self.steps.send(result))


def pylance_finalizer(table: Table) -> Steps[None]:
    """Lance's ``finalize_manifest``: read the entry, unconditional copy (a 404 means
    "someone finalized": stop), PutItem ``attribute_exists`` without a path check
    and without our token, delete the staged object."""
    entry: ManifestEntry | None = yield LatestEntry(table.base_uri)
    if entry is None or not entry.is_staged:
        return
    final = final_key_of(table, entry)
    try:
        yield CopyObject(entry.path, final)
    except ObjectNotFoundError:
        return
    yield HeadObject(final)
    # A PutItem of the whole item with Lance's attributes only: lancetx's are gone.
    done = ManifestEntry(entry.base_uri, entry.version, final, size=entry.size, committer="lancedb")
    yield FlipEntry(done, expected_path=None)  # type: ignore[arg-type]
    yield DeleteObject(entry.path)


def _touches(effect: Effect) -> tuple[set[str], set[str]] | None:
    """The resources ``effect`` reads and writes (None: unknown, depends on everything).
    ``obj:*`` and ``ent:<table>:*`` stand for every object / every entry of a table."""
    if isinstance(effect, PutObject | DeleteObject):
        return set(), {f"obj:{effect.key}"}
    if isinstance(effect, CopyObject):
        return {f"obj:{effect.src}"}, {f"obj:{effect.dst}"}
    if isinstance(effect, GetObject | HeadObject):
        return {f"obj:{effect.key}"}, set()
    if isinstance(effect, ClaimEntry | FlipEntry):
        return set(), {f"ent:{effect.entry.base_uri}:{effect.entry.version}"}
    if isinstance(effect, GetEntry):
        return {f"ent:{effect.base_uri}:{effect.version}"}, set()
    if isinstance(effect, LatestEntry):
        return {f"ent:{effect.base_uri}:*"}, set()
    return None


def _overlap(a: set[str], b: set[str]) -> bool:
    for x in a:
        for y in b:
            if x == y:
                return True
            for wide, narrow in ((x, y), (y, x)):
                if wide.endswith(":*") and narrow.startswith(wide[:-1]):
                    return True
    return False


def independent(first: Effect | None, second: Effect | None) -> bool:
    """Whether two actors' next effects commute: performed in either order they
    leave the same world and give each actor the same result."""
    if first is None or second is None:
        return False
    a, b = _touches(first), _touches(second)
    if a is None or b is None:
        return False
    (read_a, write_a), (read_b, write_b) = a, b
    return not (_overlap(write_a, read_b | write_b) or _overlap(write_b, read_a | write_a))


def explore(make: Callable[[], tuple[DictWorld, list[Stepper]]], check: Callable[..., None]) -> int:
    """Run every interleaving of the actors ``make`` returns, up to the order of
    effects that commute (stateless model checking by replay, with sleep sets:
    of the orders that differ only by swapping independent effects, one is run);
    ``check(world, actors)`` after each. Returns how many ran.

    Sound for these checks: swapping two adjacent independent effects changes
    neither the final world nor any actor's results, so every outcome of the full
    exploration is reached by some interleaving run here."""
    count = 0

    def visit(prefix: list[int], sleep: frozenset[int]) -> None:
        nonlocal count
        world, actors = make()
        for who in prefix:
            actors[who].step(world)
        live = [i for i, a in enumerate(actors) if not a.done]
        if not live:
            check(world, actors)
            count += 1
            return
        asleep = set(sleep)
        for who in live:
            if who in asleep:
                continue
            moved = actors[who].pending
            visit(
                [*prefix, who],
                frozenset(s for s in asleep if independent(actors[s].pending, moved)),
            )
            asleep.add(who)

    visit([], frozenset())
    return count
