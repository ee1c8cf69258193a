"""The commit loop: check, rebase, build, claim — for any commit handler, sync or async.

Written once as steps (:mod:`lancetx.commit.engine.effects`): the loop yields
effects (read this object, list these versions, claim this version, sleep…)
and a driver performs them — :func:`commit_transaction` with blocking I/O
through a :class:`CommitHandler`, :func:`commit_transaction_async` with asyncio
through an :class:`AsyncCommitHandler`. There is no second copy of the loop.

Its rooms: this module is the loop; what was committed since is loaded by
:mod:`lancetx.commit.engine.loading`; a turn in the table's commit queue is
waited for in :mod:`lancetx.commit.engine.turns` (how long: the policy of
:mod:`lancetx.commit.engine.contention`); conflicts are judged by the rules of
:mod:`lancetx.commit.engine.conflicts` and rebased by
:mod:`lancetx.commit.engine.rebase`.

Invariants the steps keep:

* A version is only ever claimed through the handler; nothing else makes one.
* Ours is checked against every version committed after its read version
  before it is claimed on top of them (loaded in parallel, judged in version
  order); an incompatible one stops the commit with nothing of ours kept.
* A transaction already committed since its read version — same idempotency
  key, or the very same uuid (a retry after an unknown outcome) — is never
  committed again: that version is returned, ``deduplicated``. A handler that
  claims keys (``CommitHandler.claims_keys``) also refuses a key committed at
  any earlier version, in the claim itself (KeyAlreadyCommittedError): that
  version is returned the same way.
* Objects this commit wrote (its transaction file, rebased deletion files)
  are removed only when no version can reference them: after a conflict, a
  refusal or an exhausted budget, never after an unknown outcome or any other
  exception (``KeyboardInterrupt``, cancellation) — the rule and its messages
  live in :mod:`lancetx.commit.engine.unreferenced`. A staged manifest is the
  handler's business (it keeps one whose claim is ambiguous).
* The budget is time (``RetryPolicy.max_elapsed``); a loser waits in
  proportion to the contention it measured (:mod:`lancetx.commit.engine.contention`).

One attempt, read top to bottom in :func:`_attempts` (where the commit stands
between attempts is one :class:`_Attempts` object the steps read and move):

1. Classify ours against the versions committed since (idempotency first).
   Incompatible or retryable → a typed error. Rebasable → merge (``rebase``).
2. Build the next manifest from the latest one (a transaction the builder
   refuses writes nothing), write our transaction file (once, unless a rebase
   changed it), encode the manifest with the transaction inline.
3. Claim ``latest + 1``. Won → done. Lost → load what was committed since our
   latest (the handler named the winner), wait, and go to 1.

A writer that holds the latest manifest (the one it read, or the one it just
committed) tries ``latest + 1`` straight away: no listing, no extra read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from lancetx.commit.engine import contention
from lancetx.commit.engine.builder import build_manifest
from lancetx.commit.engine.conflicts import (
    ConflictContext,
    Outcome,
    RebaseNeeded,
    classify_all,
)
from lancetx.commit.engine.effects import (
    ClaimVersion,
    DeleteObject,
    Effect,
    Gather,
    GetObject,
    HeadObject,
    Names,
    PutObject,
    ReadManifest,
    ResolveLatest,
    ResolveVersion,
    Sleep,
    Steps,
    run,
    run_async,
)
from lancetx.commit.engine.events import (
    CommitEvent,
    CommitObserver,
    notify,
)
from lancetx.commit.engine.events import (
    Outcome as EventOutcome,
)
from lancetx.commit.engine.loading import (
    LOAD_PARALLELISM,
    Loaded,
    Parent,
    load_key_winner,
    load_newer,
    load_parent_steps,
    newest_parent,
    read_fragments,
)
from lancetx.commit.engine.operations import (
    COMMIT_MESSAGE_KEY,
    IDEMPOTENCY_KEY,
    Clone,
    Restore,
    Rewrite,
    Transaction,
)
from lancetx.commit.engine.parents import load_parent, load_parent_async
from lancetx.commit.engine.rebase import rebase_steps
from lancetx.commit.engine.retry import RetryPolicy
from lancetx.commit.engine.turns import (
    QueueTurn,
    end_turn_steps,
    join_queue,
    look_newer,
    wait_for_turn,
)
from lancetx.commit.engine.unreferenced import Claim, keep, may_delete, note_claim
from lancetx.commit.errors import (
    CommitStateUnknownError,
    ExpectedVersionMismatchError,
    IncompatibleConflictError,
    InvalidCommitError,
    KeyAlreadyCommittedError,
    LancetxError,
    RetriesExhaustedError,
    RetryableConflictError,
    UnfinishedParentError,
    VersionAlreadyExistsError,
)
from lancetx.commit.format.deletion import deletion_file_key
from lancetx.commit.format.fragments import unsafe_file_paths
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.manifest import (
    ManifestFile,
    check_writer_flags,
    encode_manifest,
)
from lancetx.commit.format.naming import NamingScheme, transaction_key
from lancetx.commit.format.transaction_file import transaction_file_name
from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler
from lancetx.commit.sansio import relay
from lancetx.commit.storage.limits import MANIFEST
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.protos import table_pb2, transaction_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "IDEMPOTENCY_KEY",
    "LOAD_PARALLELISM",
    "CommitOptions",
    "Committed",
    "Parent",
    "RetryPolicy",
    "commit_steps",
    "commit_transaction",
    "commit_transaction_async",
    "load_parent",
    "load_parent_async",
    "load_parent_steps",
]


@dataclass(frozen=True)
class CommitOptions:
    """How to commit.

    ``expected_version``: strict mode — commit only if the table is still at
    this version, else ExpectedVersionMismatchError with no rebase and nothing
    written (for callers that own their retries). ``properties`` are stored in
    the transaction (readable back from the version, visible to pylance);
    ``commit_message`` is stored under Lance's reserved key. ``naming`` applies
    to a new table (existing tables keep theirs; V2 is pylance 14's default).
    ``inline_transaction`` also embeds the transaction in the manifest, so a
    concurrent writer loads it with the manifest in one GET.

    ``idempotency_key`` (e.g. a Spark job id or a stream's batch id) is stored
    in the transaction under ``lancetx.idempotency_key``; if a version committed
    after ours' read version already carries it, that version is returned
    (``Committed.deduplicated``) instead of committing a second time. The loop
    checks before claiming and after every lost round; a transaction whose uuid
    was already committed (a retry after an unknown outcome) is found the same way.
    A handler that claims keys refuses the key in the claim itself when it was
    committed at any version (before ours' read version too): that version is
    returned the same way, or, when its manifest cannot be read any more (cleanup
    removed it), KeyAlreadyCommittedError naming it is raised.

    ``observer`` receives one :class:`~lancetx.commit.engine.events.CommitEvent`
    per attempt. ``table_uri`` is the URI to name the table by in logs and
    events (the one the user passed, e.g. ``s3+ddb://…``); default: the store's URI.

    ``stable_row_ids`` (Lance's ``enable_stable_row_ids``, a setting of the commit,
    not of the transaction) creates a new table with stable row ids: the commit
    gives every fragment its row-id sequence and keeps ``next_row_id``. A table
    keeps what it was created with; asking for them on an existing table without
    them is refused (InvalidTransactionError), as Lance refuses it.
    """

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    expected_version: int | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    commit_message: str | None = None
    naming: NamingScheme = NamingScheme.V2
    inline_transaction: bool = True
    idempotency_key: str | None = None
    observer: CommitObserver | None = None
    table_uri: str | None = None
    stable_row_ids: bool = False

    def __post_init__(self) -> None:
        # "" would read as "no key" further down (a falsy property), so a caller who
        # meant a key would get a commit that is never deduplicated.
        if self.idempotency_key is not None and (
            not isinstance(self.idempotency_key, str) or not self.idempotency_key
        ):
            raise ValueError(
                f"CommitOptions.idempotency_key={self.idempotency_key!r}: give a non-empty "
                "string, or None for a commit without one"
            )


@dataclass(frozen=True)
class Committed:
    """A committed version: where it is, its manifest, and the transaction as committed
    (after any rebase). Keep it: it is the parent of the next commit, no read needed.

    ``deduplicated``: the version was committed earlier with the same idempotency
    key (or this very transaction); nothing new was committed. ``rebased``: ours
    was rebased (deletion vectors merged) onto versions committed meanwhile."""

    location: ManifestLocation
    manifest: ManifestFile
    transaction: Transaction
    attempts: int
    deduplicated: bool = False
    rebased: bool = False

    @property
    def version(self) -> int:
        return self.location.version


# ------------------------------------------------------------------ front doors


def commit_transaction(
    handler: CommitHandler,
    base: str,
    transaction: Transaction,
    *,
    parent: Parent | Committed | None = None,
    options: CommitOptions | None = None,
) -> Committed:
    """Commit ``transaction`` to the table at ``base``.

    ``parent`` is the newest version the caller holds (what it read, or its last
    Committed); when omitted it is resolved through the handler. Raises
    RetryableConflictError / IncompatibleConflictError (nothing written for
    ours), ExpectedVersionMismatchError (strict mode), RetriesExhaustedError,
    InvalidCommitError, or the handler's CommitStateUnknownError.
    """
    steps = commit_steps(handler.store, base, transaction, parent=parent, options=options)
    return run(steps, handler)


async def commit_transaction_async(
    handler: AsyncCommitHandler,
    base: str,
    transaction: Transaction,
    *,
    parent: Parent | Committed | None = None,
    options: CommitOptions | None = None,
) -> Committed:
    """:func:`commit_transaction` through an :class:`AsyncCommitHandler` (same steps)."""
    steps = commit_steps(handler.store, base, transaction, parent=parent, options=options)
    return await run_async(steps, handler)


# ------------------------------------------------------------------------ steps


def commit_steps(
    names: Names,
    base: str,
    transaction: Transaction,
    *,
    parent: Parent | Committed | None = None,
    options: CommitOptions | None = None,
) -> Steps[Committed]:
    """The whole commit of ``transaction`` as steps (see :func:`commit_transaction`)."""
    options = options or CommitOptions()
    uri = names.uri(base)
    ours = _with_properties(transaction, options)
    _refuse_unsafe_paths(uri, ours)
    current = (
        _as_parent(parent) if parent is not None else (yield from load_parent_steps(names, base))
    )
    _validate(uri, ours, current, options)
    restore_source = yield from _restore_source(names, base, ours)
    clone_source = _clone_source(uri, ours)

    # Versions committed between our read version and the parent we hold.
    pending: list[Loaded] = []
    fragments: dict[int, table_pb2.DataFragment] = {}
    if current is not None and current.version > ours.read_version:
        # A parent we just read ourselves need not be read again; one the caller
        # handed us is read with the others (it is checked like any version).
        known = current if parent is None else None
        pending = yield from load_newer(
            names, base, ours.read_version, known, ours, until=current.version
        )
    if current is not None and ours.read_version > 0:
        fragments = yield from read_fragments(names, base, ours, current)

    state = _Attempts(
        names, base, options, ours, current, pending, fragments, restore_source, clone_source
    )
    # ``state.written``: objects this commit wrote that no committed version
    # references yet: removed when the commit fails (or they were superseded by a
    # rebase), so a refused or conflicting transaction leaves nothing behind. Kept
    # whenever the claim may have landed (see lancetx.commit.engine.unreferenced).
    written = state.written
    try:
        committed: Committed = yield from state.counter.wrap(_attempts(state))
    except KeyAlreadyCommittedError as taken:
        # Deduplicated by the claim, the key's version unreadable: our transaction file
        # is unreferenced unless that version is this very transaction (same file).
        yield from end_turn_steps(names, base, state.turn)
        if taken.transaction_uuid is not None and taken.transaction_uuid != ours.uuid:
            yield from _discard(names, written)
        raise
    except LancetxError as error:
        yield from end_turn_steps(names, base, state.turn)
        if not may_delete(error):
            keep(error, [names.uri(k) for k in written], claim=_claim_of(ours, options, error))
            raise
        yield from _discard(names, written)
        raise
    except BaseException as error:
        # A signal, a cancellation or a bug, possibly with our claim in flight: no
        # request now (the caller is leaving), and nothing deleted.
        keep(error, [names.uri(k) for k in written], claim=_claim_of(ours, options, error))
        raise
    yield from end_turn_steps(names, base, state.turn)
    yield from _discard(
        names, [k for k in written if k not in _referenced(base, committed.transaction)]
    )
    return committed


class _Counter:
    """Counts the storage effects a commit issues (sub-steps of a Gather included)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def _tick(self) -> None:
        with self._lock:
            self.count += 1

    def wrap(self, steps: Steps[T]) -> Steps[T]:
        """``steps``, re-yielding each effect and counting it."""

        def count(effect: Effect) -> Effect:
            if isinstance(effect, Gather):
                return Gather([self.wrap(s) for s in effect.steps], effect.limit)
            if not isinstance(effect, Sleep):
                self._tick()
            return effect

        # Every error is forwarded: the steps decide (or record and re-raise).
        return relay(steps, count, passes=BaseException)


@dataclass
class _Attempts:
    """Where a commit stands between its attempts: what it knows of the table, what
    it wrote, its place in the commit queue and how its attempts went. The steps of
    an attempt read and move it; :func:`commit_steps` reads ``written`` and ``turn``
    when the commit ends, however it ends."""

    names: Names
    base: str
    options: CommitOptions
    #: Ours as it will be claimed (after any rebase).
    ours: Transaction
    #: The newest version known, which the next claim builds on.
    current: Parent | None
    #: Versions committed since ours' read version, not judged yet.
    pending: list[Loaded]
    #: The fragments ours modifies, as they were at its read version.
    read_fragments: dict[int, table_pb2.DataFragment]
    restore_source: tuple[table_pb2.Manifest, list[table_pb2.IndexMetadata]] | None
    #: A Clone's source version (manifest, indices), from the operation.
    clone_source: tuple[table_pb2.Manifest, tuple[table_pb2.IndexMetadata, ...]] | None
    #: Objects this commit wrote that no committed version references yet.
    written: list[str] = field(default_factory=list)
    #: Our place in the table's commit queue, once we joined it.
    turn: QueueTurn = field(default_factory=QueueTurn)
    counter: _Counter = field(default_factory=_Counter)
    attempt: int = 0
    #: Lost rounds, as the backoff counts them.
    losses: int = 0
    #: The version the last attempt built (and claimed).
    next_version: int = 1
    #: Our transaction file as last written (b"": not yet).
    txn_bytes: bytes = b""
    rebased: bool = False
    #: Writers of this process met contention here moments before we began.
    expected_contention: bool = False
    #: Others committed while we waited or tried.
    still_contended: bool = False
    #: When the commit, and the current attempt, began (perf_counter), and the
    #: attempt by the clock (compared with winners' claim stamps).
    began: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    tried_at: float = 0.0
    #: ``counter.count`` when the current attempt began.
    requests_before: int = 0
    # Fixed for the whole commit, from the above.
    uri: str = field(init=False)
    #: The table as logs and events name it (the URI the user passed).
    shown: str = field(init=False)
    policy: RetryPolicy = field(init=False)
    #: Ours' read version before any rebase (what events report).
    first_read: int = field(init=False)
    #: What this process measured of the contention on the table.
    contended: contention.TableContention = field(init=False)

    def __post_init__(self) -> None:
        self.uri = self.names.uri(self.base)
        self.shown = self.options.table_uri or self.uri
        self.policy = self.options.retry
        self.first_read = self.ours.read_version
        self.contended = contention.table_contention(self.uri)
        self.started = self.began

    @property
    def current_version(self) -> int:
        return self.current.version if self.current is not None else 0

    def event(self, outcome: EventOutcome, version: int | None) -> None:
        notify(
            self.options.observer,
            CommitEvent(
                table_uri=self.shown,
                attempt=self.attempt,
                outcome=outcome,
                read_version=self.first_read,
                attempted_version=version,
                duration_s=time.perf_counter() - self.started,
                requests=self.counter.count - self.requests_before,
                transaction_uuid=self.ours.uuid,
                operation=self.ours.operation.name,
                committed_since_read=max(0, (version or 1) - 1 - self.first_read),
            ),
        )


@dataclass(frozen=True)
class _Built:
    """One attempt's next manifest, encoded for the claim."""

    manifest: table_pb2.Manifest
    indices: list[table_pb2.IndexMetadata] | None
    #: The transaction inlined in the manifest (None: not inlined).
    transaction: transaction_pb2.Transaction | None
    data: bytes
    scheme: NamingScheme


def _attempts(state: _Attempts) -> Steps[Committed]:
    """The retry loop of :func:`commit_steps`: judge, build, claim, until a claim
    is won, ours is found committed, or an error ends it."""
    while True:
        yield from _begin_attempt(state)
        if state.pending and state.current is not None:
            # 1. Judge ours against what was committed since: is it ours already?
            mine = yield from _judge(state)
            if mine is not None:
                return mine
        # 2. Build, write the transaction file, encode (beside the check of a
        # staged parent's final copy).
        built = yield from _finish_parent_and_build(state)
        # 3. Claim.
        committed = yield from _claim(state, built)
        if committed is not None:
            return committed


def _begin_attempt(state: _Attempts) -> Steps[None]:
    """Start the next attempt within the budget; a first attempt made where this
    process met contention moments ago queues up first."""
    if state.attempt > 0 and _out_of_budget(state.policy, state.attempt, state.began):
        raise RetriesExhaustedError(
            state.uri,
            state.ours.uuid,
            state.attempt,
            state.next_version,
            time.perf_counter() - state.began,
        )
    state.attempt += 1
    state.started = time.perf_counter()
    state.tried_at = time.time()
    state.requests_before = state.counter.count
    if state.attempt > 1:
        return
    state.expected_contention = state.contended.refresh_first(time.monotonic())
    state.losses = state.contended.start_level(time.monotonic())
    if (
        state.expected_contention
        and not state.pending
        and state.current is not None
        and state.options.expected_version is None
    ):
        yield from _queue_first(state, state.current)


def _queue_first(state: _Attempts, current: Parent) -> Steps[None]:
    """Writers of this process met contention on this table moments ago: queue up
    behind the writers already waiting (or, without a queue, let the losers'
    windows run a little: we may be the last winner, holding the newest
    manifest), then look: our parent is likely stale, and one Query is cheaper
    than staging, claiming, losing and deleting."""
    newer: list[Loaded] | None = None
    if (yield from join_queue(state.base, state.turn, state.contended)):
        # Our transaction file does not depend on the version we will claim:
        # write it now, off the table's critical path.
        state.txn_bytes = yield from _write_transaction(
            state.base, state.ours, state.txn_bytes, state.written
        )
        newer = yield from wait_for_turn(
            state.names,
            state.base,
            state.turn,
            state.contended,
            state.policy,
            current.version,
            state.ours,
        )
    else:
        yield Sleep(contention.yield_delay(state.policy, state.contended))
    state.started = time.perf_counter()  # the attempt's slot does not include the wait
    state.tried_at = time.time()
    if newer is None:
        newer = yield from look_newer(state.names, state.base, current.version, state.ours)
    if newer:
        state.pending = newer
        state.current = newest_parent(newer)
        state.still_contended = True


def _judge(state: _Attempts) -> Steps[Committed | None]:
    """Ours against the versions committed since: the version that is ours already
    (deduplicated), a typed error for a conflict, or None with ours rebased onto
    them when it must be (``state.ours``) and nothing left to judge."""
    current = state.current
    assert current is not None
    mine = next((p for p in state.pending if _is_ours(state.ours, p.transaction)), None)
    if mine is not None:
        at = mine.manifest
        if at is None:
            at = yield ReadManifest(state.base, mine.location)
        state.event("deduplicated", mine.version)
        _log_deduplicated(state, mine.version, state.ours.properties.get(IDEMPOTENCY_KEY))
        return Committed(mine.location, at, mine.transaction, state.attempt, deduplicated=True)
    try:
        rebased = yield from _check_and_rebase(
            state.names, state.base, state.ours, state.pending, state.read_fragments, current
        )
    except (RetryableConflictError, IncompatibleConflictError) as conflict:
        state.event("conflict", current.version + 1)
        log.info("%s: %s", state.shown, conflict)
        raise
    state.written.extend(_new_deletion_files(state.base, state.ours, rebased))
    if rebased.read_version != state.ours.read_version:
        # Rebased onto ``current``: that is now what ours read. A later
        # rebase must diff against it, or the rows the winners deleted
        # (now in our merged vectors) would count as ours and overlap.
        wanted = rebased.operation.modified_fragment_ids
        state.read_fragments = {
            f.id: f for f in current.manifest.manifest.fragments if f.id in wanted
        }
        state.rebased = True
    state.ours = rebased
    state.pending = []
    return None


def _finish_parent_and_build(state: _Attempts) -> Steps[_Built]:
    """:func:`_finish_parent`, then :func:`_build`; when the parent's claim handed
    its manifest over, the HEAD of its final copy is sent while ours is built."""
    current = state.current
    handed = current.location.handed_over() if current is not None else None
    if current is None or handed is None:
        yield from _finish_parent(state)
        return (yield from _build(state))
    copied, built = yield Gather([_copied_already(current.location), _build(state)], 2)
    if copied is not None:
        state.current = Parent(copied, current.manifest)
    else:
        yield from _finish_parent(state, checked=True)
        yield from _check_handed_over(state, handed)
    return built  # type: ignore[no-any-return]


def _check_handed_over(state: _Attempts, handed: bytes) -> Steps[None]:
    """Ours was judged and built on the bytes the parent's claim handed over, and
    the HEAD did not show them at the parent's final name: now that the parent is
    finished, its final copy must hold exactly those bytes (one GET, only on this
    path). Only an entry edited by another tool (or by hand), or a version rebuilt
    meanwhile, can carry others; claiming on them would commit a version built on
    a manifest that was never committed."""
    current = state.current
    assert current is not None
    final: bytes = yield GetObject(current.location.key, MANIFEST)
    if final != handed:
        raise InvalidCommitError(
            state.uri,
            f"the entry of version {current.version} hands over a manifest that is not the "
            f"one committed at {current.location.key!r} (the entry was edited by another tool "
            "or by hand, or the version was rebuilt meanwhile), so transaction "
            f"{state.ours.uuid} was not claimed on top of it; re-read the table at its latest "
            "version and plan the transaction again",
        )


def _finish_parent(state: _Attempts, *, checked: bool = False) -> Steps[None]:
    """The parent is still a staged manifest (its writer crashed or is still
    finalizing): finish it before claiming on top of it, so the object store
    never lags more than one commit behind (a reader that does not know the
    external store, or a copy of the directory, would see a hole otherwise).
    A parent whose bytes its claim handed over needs only its final copy in
    place (its writer's pointer flip follows; any reader finishes that): one
    HEAD, the next in line's usual case in the commit queue."""
    current = state.current
    if current is None or current.location.alternate_key is None:
        return
    copied = None if checked else (yield from _copied_already(current.location))
    if copied is not None:
        state.current = Parent(copied, current.manifest)
        return
    finished: ManifestLocation = yield ResolveVersion(state.base, current.version)
    if finished.alternate_key is not None:
        # Finishing it failed (the reader's side is best effort and said so
        # in the log): claiming on top now would leave it behind for good.
        raise UnfinishedParentError(state.uri, current.version, state.ours.uuid, finished.key)
    state.current = Parent(finished, current.manifest)


def _copied_already(staged: ManifestLocation) -> Steps[ManifestLocation | None]:
    """``staged``'s version at its final name, when its writer's copy is there
    already (one HEAD: the object holds exactly the bytes the claim handed over,
    by their MD5) — what a writer next in the commit queue usually finds, just
    after the claim it watched. None otherwise (no handover to compare with, not
    copied yet, another ETag): the version is finished the long way."""
    data = staged.handed_over()
    final = staged.alternate_key
    if data is None or final is None:
        return None
    try:
        meta: ObjectMeta = yield HeadObject(final)
    except LancetxError:
        return None
    if (
        meta.size != len(data)
        or _etag(meta.etag) != hashlib.md5(data, usedforsecurity=False).hexdigest()
    ):
        return None
    return dataclasses.replace(staged, key=final, etag=meta.etag, alternate_key=None, handover=None)


def _etag(value: str | None) -> str | None:
    return value.strip('"').lower() if value else None


def _build(state: _Attempts) -> Steps[_Built]:
    """The manifest of ``latest + 1``, with our transaction file written."""
    current = state.current
    state.next_version = current.version + 1 if current is not None else 1
    txn_pb = state.ours.to_proto()
    # Build first: a transaction the builder refuses must leave nothing behind.
    built = build_manifest(
        current.manifest.manifest if current is not None else None,
        (current.manifest.indices or []) if current is not None else [],
        txn_pb,
        version=state.next_version,
        transaction_file=transaction_file_name(txn_pb),
        restore_source=state.restore_source,
        clone_source=state.clone_source,
        enable_stable_row_ids=state.options.stable_row_ids,
        # Not in the protobuf (Lance does not serialize it either): handed over apart.
        frag_reuse_index=(
            state.ours.operation.frag_reuse_index
            if isinstance(state.ours.operation, Rewrite)
            else None
        ),
    )
    state.txn_bytes = yield from _write_transaction(
        state.base, state.ours, state.txn_bytes, state.written, txn_pb
    )
    # Lance writes an index section only when there are indices.
    indices = list(built.indices) or None
    inline = txn_pb if state.options.inline_transaction else None
    data = encode_manifest(built.manifest, indices=indices, transaction=inline)
    scheme = current.location.scheme if current is not None else state.options.naming
    return _Built(built.manifest, indices, inline, data, scheme)


def _claim(state: _Attempts, built: _Built) -> Steps[Committed | None]:
    """Claim ``next_version``: ours (won), the version our key was committed as
    (deduplicated), or None after a lost round (go again)."""
    summary = _summary(state.ours)
    if summary is not None and state.turn.ticket is not None:
        # The claim serves our ticket: its entry records it (see
        # lancetx.commit.handlers.queue).
        summary = dataclasses.replace(summary, ticket=state.turn.ticket)
    try:
        location: ManifestLocation = yield ClaimVersion(
            state.base, state.next_version, built.data, built.scheme, summary
        )
    except CommitStateUnknownError as unknown:
        _log_unknown(state, unknown)
        if unknown.transaction_uuid == state.ours.uuid:
            raise
        # The handler knows its own token (a staged-manifest UUID), not ours: the
        # caller must look for OUR transaction before retrying, or it commits twice.
        raise CommitStateUnknownError(
            state.uri,
            state.next_version,
            state.ours.uuid,
            f"the claim of version {state.next_version} (staged-manifest token "
            f"{unknown.transaction_uuid}) could not be settled; the chained error says why",
        ) from unknown
    except KeyAlreadyCommittedError as taken:
        deduplicated = yield from _key_taken(state, taken)
        if deduplicated is None:
            raise
        return deduplicated
    except VersionAlreadyExistsError:
        yield from _lost(state)
        return None
    except BaseException as interrupted:
        if not isinstance(interrupted, LancetxError):
            # KeyboardInterrupt, cancellation, GeneratorExit…: whoever handles it
            # must know which version's claim may have landed.
            note_claim(
                interrupted, Claim(version=state.next_version, transaction_uuid=state.ours.uuid)
            )
        raise
    return (yield from _won(state, built, location, served=summary is not None))


def _won(
    state: _Attempts, built: _Built, location: ManifestLocation, *, served: bool
) -> Steps[Committed]:
    """Ours is committed as ``next_version``; ``served``: the claim served our ticket."""
    turn, contended = state.turn, state.contended
    if turn.ticket is not None:
        if turn.turn_began is not None:
            contended.worked(time.monotonic() - turn.turn_began)
        contended.saw_served(turn.ticket, state.next_version, time.time())
        if served:
            turn.ticket = None  # served with the won claim
        else:  # no summary to record it in: serve it in the queue item
            yield from end_turn_steps(state.names, state.base, turn, state.next_version)
    manifest = ManifestFile(
        manifest=built.manifest,
        indices=built.indices,
        transaction=built.transaction,
        footer_major=0,
        footer_minor=2,
        size=len(built.data),
    )
    contended.committed(state.attempt - 1)
    if state.still_contended:
        # Others committed while we waited or tried: the next commit of this
        # process should expect them too (and queue), however long this took.
        contended.queued(time.monotonic())
    state.event("rebased" if state.rebased else "won", state.next_version)
    log.info(
        "%s: committed version %d (%s) in %d attempt(s), %.3f s%s",
        state.shown,
        state.next_version,
        state.ours.operation.name,
        state.attempt,
        time.perf_counter() - state.began,
        ", rebased" if state.rebased else "",
    )
    return Committed(location, manifest, state.ours, state.attempt, rebased=state.rebased)


def _key_taken(state: _Attempts, taken: KeyAlreadyCommittedError) -> Steps[Committed | None]:
    """Our key was committed before, at a version this loop never loaded (at any
    distance, or landed while we planned): that version is ours. None when it
    cannot be read any more (the refusal stands)."""
    state.event("deduplicated", taken.version)
    winner = yield from load_key_winner(state.names, state.base, taken, state.shown)
    if winner is None:
        return None
    _log_deduplicated(state, winner.version, taken.key)
    assert winner.manifest is not None  # loaded with need_manifest
    return Committed(
        winner.location, winner.manifest, winner.transaction, state.attempt, deduplicated=True
    )


def _lost(state: _Attempts) -> Steps[None]:
    """Another writer claimed ``next_version`` first: learn what was committed, and
    wait — in the queue when contended, at random without one, not at all when
    our parent was merely stale."""
    if state.options.expected_version is not None:
        state.event("lost", state.next_version)
        latest = yield from _latest_version(state.base, state.next_version)
        raise ExpectedVersionMismatchError(
            state.uri, state.options.expected_version, latest
        ) from None
    slot = time.perf_counter() - state.started
    state.contended.lost(time.monotonic(), slot)
    state.still_contended = True
    state.turn.turn_began = None  # a lost turn is not a measure of a turn's work
    log.debug("%s: lost version %d (attempt %d)", state.shown, state.next_version, state.attempt)
    stale_parent = state.attempt == 1 and not state.expected_contention
    loaded: list[Loaded] | None = None
    if stale_parent:
        loaded = yield from load_newer(
            state.names, state.base, state.current_version, ours=state.ours
        )
        if _claimed_since(loaded, state.tried_at):
            # A winner claimed while we tried: that is contention, not a
            # stale parent. Retrying at once would only lose again.
            stale_parent = False
    if not stale_parent and (yield from join_queue(state.base, state.turn, state.contended)):
        yield from _wait_in_queue(state, loaded, slot)
    else:
        yield from _back_off(state, loaded, slot, stale_parent=stale_parent)


def _wait_in_queue(state: _Attempts, loaded: list[Loaded] | None, slot: float) -> Steps[None]:
    """Contended: wait for our turn in the queue, then learn what was committed
    meanwhile (the winners of every turn before ours)."""
    state.event("lost", state.next_version)
    state.losses += 1
    since = loaded[-1].version if loaded else state.current_version
    newer: list[Loaded] | None = None
    if state.turn.ahead <= 0:
        # Our turn already, lost to a writer outside the queue
        # (pylance, or one that saw no contention): go again soon.
        yield Sleep(contention.delay(state.policy, 1, slot) / contention.FIRST_WINDOW_SLOTS)
    else:
        newer = yield from wait_for_turn(
            state.names, state.base, state.turn, state.contended, state.policy, since, state.ours
        )
    if newer is None:
        newer = yield from look_newer(state.names, state.base, since, state.ours)
    newer = (loaded or []) + newer
    if newer:
        state.pending = newer
        state.current = newest_parent(newer)


def _back_off(
    state: _Attempts, loaded: list[Loaded] | None, slot: float, *, stale_parent: bool
) -> Steps[None]:
    """Without a queue (or with a merely stale parent): load the winners, then
    back off in proportion to the contention measured (a stale parent: not at all)."""
    if loaded is not None:
        newer = loaded
    else:
        newer = yield from load_newer(
            state.names, state.base, state.current_version, ours=state.ours
        )
    state.event("lost", state.next_version)
    if not newer:  # the winner is not visible yet: wait a whole window, then look again
        state.losses += 1
        yield Sleep(contention.window(state.policy, state.losses, slot))
        return
    state.pending = newer
    state.current = newest_parent(newer)
    if stale_parent:
        # Nothing suggested contention: our parent was just stale (the
        # winners claimed before we began). They are known now, so retry
        # at once; back off from the next loss on.
        yield Sleep(0.0)
        return
    state.losses += 1
    yield Sleep(contention.delay(state.policy, state.losses, slot))


def _log_deduplicated(state: _Attempts, version: int, key: str | None) -> None:
    log.info(
        "%s: transaction %s is already committed as version %d (idempotency key "
        "%r); not committing it again",
        state.shown,
        state.ours.uuid,
        version,
        key,
    )


def _log_unknown(state: _Attempts, unknown: CommitStateUnknownError) -> None:
    state.event("unknown", state.next_version)
    log.warning(
        "%s: the outcome of claiming version %d for transaction %s is unknown (%s); "
        "re-open the table and look for the transaction before retrying",
        state.shown,
        state.next_version,
        state.ours.uuid,
        unknown,
    )


def _write_transaction(
    base: str,
    ours: Transaction,
    written_bytes: bytes,
    written: list[str],
    txn_pb: transaction_pb2.Transaction | None = None,
) -> Steps[bytes]:
    """Write our transaction file unless these very bytes were written already
    (unchanged after a compatible loss: the file is reused). Returns the bytes."""
    txn_pb = txn_pb if txn_pb is not None else ours.to_proto()
    serialized: bytes = txn_pb.SerializeToString()
    if serialized != written_bytes:
        key = transaction_key(base, transaction_file_name(txn_pb))
        yield PutObject(key, serialized)
        written.append(key)
    return serialized


# --------------------------------------------------------------------------- pieces


def _claimed_since(loaded: Sequence[Loaded], tried_at: float) -> bool:
    """Whether a lancetx winner among ``loaded`` claimed after our attempt began
    (its entry records when): then we lost to contention, not to a stale parent.
    Clocks of different machines differ a little; a wrong guess costs one
    immediate retry (taken for staleness) or one ticket (taken for contention)."""
    return any(
        ld.location.summary is not None
        and ld.location.summary.claimed_at is not None
        and ld.location.summary.claimed_at >= tried_at
        for ld in loaded
    )


def _out_of_budget(policy: RetryPolicy, attempt: int, began: float) -> bool:
    """True when no further attempt may start: the count cap or the time budget is spent."""
    if attempt >= policy.max_attempts:
        return True
    return policy.max_elapsed is not None and time.perf_counter() - began >= policy.max_elapsed


def _is_ours(ours: Transaction, theirs: Transaction) -> bool:
    """Whether a committed transaction is ours already: same uuid, or same idempotency key."""
    if theirs.uuid == ours.uuid:
        return True
    key = ours.properties.get(IDEMPOTENCY_KEY)
    return bool(key) and theirs.properties.get(IDEMPOTENCY_KEY) == key


def _latest_version(base: str, at_least: int) -> Steps[int]:
    """The table's latest version for an error message (``at_least`` if it cannot be read)."""
    try:
        latest: ManifestLocation | None = yield ResolveLatest(base)
    except LancetxError:
        return at_least
    return max(latest.version, at_least) if latest is not None else at_least


def _new_deletion_files(base: str, before: Transaction, after: Transaction) -> list[str]:
    """Keys of deletion files ``after`` references that ``before`` did not (a rebase wrote them)."""
    return sorted(_deletion_keys(base, after) - _deletion_keys(base, before))


def _deletion_keys(base: str, txn: Transaction) -> set[str]:
    fragments = getattr(txn.operation, "updated_fragments", ())
    return {
        deletion_file_key(base, f.id, f.deletion_file)
        for f in fragments
        if f.HasField("deletion_file")
    }


def _referenced(base: str, txn: Transaction) -> set[str]:
    """The objects a committed transaction refers to among those a commit writes."""
    return {transaction_key(base, transaction_file_name(txn.to_proto()))} | _deletion_keys(
        base, txn
    )


def _discard(names: Names, keys: Sequence[str]) -> Steps[None]:
    for key in keys:
        try:
            yield DeleteObject(key)
        except LancetxError as exc:  # an orphan is harmless: nothing references it
            log.warning("could not delete unreferenced %s (%s)", names.uri(key), exc)


def _claim_of(ours: Transaction, options: CommitOptions, error: BaseException) -> Claim:
    """What settles the outcome of ours, as far as the commit loop knows it."""
    return Claim(
        table_uri=options.table_uri,
        version=error.version if isinstance(error, CommitStateUnknownError) else None,
        transaction_uuid=ours.uuid,
        idempotency_key=options.idempotency_key,
    )


def _as_parent(parent: Parent | Committed) -> Parent:
    return parent if isinstance(parent, Parent) else Parent(parent.location, parent.manifest)


def _with_properties(txn: Transaction, options: CommitOptions) -> Transaction:
    if not options.properties and options.commit_message is None and not options.idempotency_key:
        return txn
    props = dict(txn.properties)
    props.update(options.properties)
    if options.commit_message is not None:
        props[COMMIT_MESSAGE_KEY] = options.commit_message
    if options.idempotency_key:
        props[IDEMPOTENCY_KEY] = options.idempotency_key
    return dataclasses.replace(txn, properties=props)


def _refuse_unsafe_paths(uri: str, ours: Transaction) -> None:
    """A data file path that could name an object outside the table's ``data/`` (``..``,
    absolute, a URI): refused before any request, as every reader and every
    maintenance tool refuses to follow it."""
    unsafe = unsafe_file_paths(ours.to_proto())
    if unsafe:
        path, problem = unsafe[0]
        raise InvalidCommitError(
            uri,
            f"the transaction names file {path!r} ({problem}): a data file's path must be "
            "relative to the table's data/ folder and stay inside it"
            + (f" ({len(unsafe) - 1} more such path(s))" if len(unsafe) > 1 else ""),
        )


def _validate(uri: str, ours: Transaction, current: Parent | None, options: CommitOptions) -> None:
    latest = current.version if current is not None else 0
    if ours.read_version > latest:
        raise InvalidCommitError(
            uri,
            f"the transaction read version {ours.read_version}, but the latest version is {latest}; "
            "it was planned against another table or a version that does not exist",
        )
    if current is not None:
        check_writer_flags(current.manifest.manifest, current.location.key)
    if options.expected_version is not None and options.expected_version != latest:
        raise ExpectedVersionMismatchError(uri, options.expected_version, latest)


def _restore_source(
    names: Names, base: str, ours: Transaction
) -> Steps[tuple[table_pb2.Manifest, list[table_pb2.IndexMetadata]] | None]:
    if not isinstance(ours.operation, Restore):
        return None
    # VersionNotFoundError if missing
    source = yield from load_parent_steps(names, base, ours.operation.version)
    assert source is not None
    return source.manifest.manifest, list(source.manifest.indices or [])


def _clone_source(
    uri: str, ours: Transaction
) -> tuple[table_pb2.Manifest, tuple[table_pb2.IndexMetadata, ...]] | None:
    """A Clone's source version, which the caller loaded from the source table (it may
    live in another store than this handler's)."""
    if not isinstance(ours.operation, Clone):
        return None
    if ours.operation.source is None:
        raise InvalidCommitError(
            uri,
            "a Clone needs the manifest of the version it clones (Clone.source); "
            "clone a table with lancetx.clone(source_uri, target_uri, version=...)",
        )
    return ours.operation.source


def _summary(ours: Transaction) -> TransactionSummary:
    return TransactionSummary(
        operation=ours.operation.name,
        uuid=ours.uuid,
        idempotency_key=ours.properties.get(IDEMPOTENCY_KEY) or None,
    )


def _check_and_rebase(
    names: Names,
    base: str,
    ours: Transaction,
    pending: Sequence[Loaded],
    read_fragments: Mapping[int, table_pb2.DataFragment],
    latest: Parent,
) -> Steps[Transaction]:
    uri = names.uri(base)
    stable = bool(latest.manifest.manifest.reader_feature_flags & 2)
    context = ConflictContext(stable_row_ids=stable, read_fragments=read_fragments)
    verdicts = classify_all(ours, [(p.version, p.transaction) for p in pending], context=context)
    blocking = [v for v in verdicts if v.blocks]
    if blocking:
        conflicts = [(v.committed_version, v.theirs.value, v.reason) for v in blocking]
        error = (
            IncompatibleConflictError
            if blocking[0].outcome is Outcome.INCOMPATIBLE
            else RetryableConflictError
        )
        raise error(uri, ours.uuid, ours.operation.name, ours.read_version, conflicts)
    needed: list[RebaseNeeded] = [v.rebase for v in verdicts if v.rebase is not None]
    if needed:
        return (
            yield from rebase_steps(
                names,
                base,
                ours,
                needed,
                read_fragments=read_fragments,
                latest=latest.manifest.manifest,
                committed_operations={v.committed_version: v.theirs.value for v in verdicts},
            )
        )
    # Compatible with everything: Lance keeps the read version for these
    # (it only names the transaction file); the manifest is built on the latest.
    return ours
