"""The commit loop: check, rebase, build, claim — for any commit handler, sync or async.

Written once as steps (:mod:`lancetx.commit.engine.effects`): the loop yields
effects (read this object, list these versions, claim this version, sleep…)
and a driver performs them — :func:`commit_transaction` with blocking I/O
through a :class:`CommitHandler`, :func:`commit_transaction_async` with asyncio
through an :class:`AsyncCommitHandler`. There is no second copy of the loop.

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

One attempt, read top to bottom in :func:`_attempts`:

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
import itertools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lancetx.commit.engine import contention
from lancetx.commit.engine.builder import build_manifest
from lancetx.commit.engine.conflicts import (
    ConflictContext,
    Outcome,
    RebaseNeeded,
    classify_all,
    compatible_by_kind,
)
from lancetx.commit.engine.effects import (
    ClaimVersion,
    DeleteObject,
    EndTurn,
    Gather,
    GetObject,
    ListVersions,
    Names,
    PutObject,
    ReadManifest,
    ReadTurns,
    ResolveLatest,
    ResolveVersion,
    Sleep,
    Steps,
    TakeTicket,
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
from lancetx.commit.engine.operations import (
    COMMIT_MESSAGE_KEY,
    FRAG_REUSE_INDEX_NAME,
    OperationKind,
    Restore,
    Rewrite,
    Transaction,
)
from lancetx.commit.engine.rebase import rebase_steps
from lancetx.commit.engine.retry import RetryPolicy
from lancetx.commit.engine.txn_cache import TRANSACTIONS
from lancetx.commit.engine.unreferenced import Claim, keep, may_delete, note_claim
from lancetx.commit.errors import (
    CommitStateUnknownError,
    ExpectedVersionMismatchError,
    IncompatibleConflictError,
    InvalidCommitError,
    KeyAlreadyCommittedError,
    LancetxError,
    ObjectNotFoundError,
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
from lancetx.commit.format.transaction_file import decode_transaction, transaction_file_name
from lancetx.commit.format.versioning import LIBRARY_NAME
from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler, Turns
from lancetx.commit.storage.limits import TRANSACTION
from lancetx.protos import table_pb2, transaction_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How many committed versions are loaded at once while checking conflicts.
LOAD_PARALLELISM = 8

#: The transaction property holding ``CommitOptions.idempotency_key``.
IDEMPOTENCY_KEY = "lancetx.idempotency_key"

__all__ = [
    "IDEMPOTENCY_KEY",
    "LOAD_PARALLELISM",
    "CommitOptions",
    "Committed",
    "Parent",
    "QueueTurn",
    "RetryPolicy",
    "commit_steps",
    "commit_transaction",
    "commit_transaction_async",
    "end_turn_steps",
    "join_queue_steps",
    "load_parent",
    "load_parent_async",
    "load_parent_steps",
    "turn_served",
    "wait_turn_steps",
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


@dataclass(frozen=True)
class Parent:
    """A version a transaction builds on: its location and decoded manifest."""

    location: ManifestLocation
    manifest: ManifestFile

    @property
    def version(self) -> int:
        return self.location.version


# ------------------------------------------------------------------ front doors


def load_parent(
    handler: CommitHandler, base: str, version: int | None = None, *, held: Parent | None = None
) -> Parent | None:
    """The latest version (or ``version``), or None for a table with no versions.

    ``held``: a version the caller already has; if the latest (or ``version``) is
    that version, its manifest is not read again (a committed version never changes).
    """
    return run(load_parent_steps(handler.store, base, version, held=held), handler)


async def load_parent_async(
    handler: AsyncCommitHandler,
    base: str,
    version: int | None = None,
    *,
    held: Parent | None = None,
) -> Parent | None:
    """:func:`load_parent` through an :class:`AsyncCommitHandler`."""
    return await run_async(load_parent_steps(handler.store, base, version, held=held), handler)


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


def load_parent_steps(
    names: Names, base: str, version: int | None = None, *, held: Parent | None = None
) -> Steps[Parent | None]:
    """The latest version (or ``version``) with its manifest; None for a table with none.
    The manifest of ``held`` is reused when it is that version (see :func:`load_parent`)."""
    if version is None:
        location: ManifestLocation | None = yield ResolveLatest(base)
        if location is None:
            return None
    else:
        location = yield ResolveVersion(base, version)
    if held is not None and _same_manifest(held.location, location):
        # The same version's manifest, wherever it is read from now (a staged
        # manifest since finalized is the same bytes under its final name).
        return Parent(location, held.manifest)
    manifest: ManifestFile = yield ReadManifest(base, location)
    return Parent(location, manifest)


def _same_manifest(held: ManifestLocation, found: ManifestLocation) -> bool:
    """Whether ``found`` is the manifest ``held`` was read from: the same version, and
    neither its size, its ETag nor its transaction (the uuid an entry claimed by lancetx
    records) known to differ: a table deleted and written again has its versions again,
    with other manifests. Lance's own manifest cache is keyed by version and ETag."""
    if held.version != found.version:
        return False
    if held.size is not None and found.size is not None and held.size != found.size:
        return False
    if held.etag is not None and found.etag is not None and held.etag != found.etag:
        return False
    ours, theirs = held.summary, found.summary
    return ours is None or theirs is None or ours.uuid == theirs.uuid


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

    # Versions committed between our read version and the parent we hold.
    pending: list[_Loaded] = []
    read_fragments: dict[int, table_pb2.DataFragment] = {}
    if current is not None and current.version > ours.read_version:
        # A parent we just read ourselves need not be read again; one the caller
        # handed us is read with the others (it is checked like any version).
        known = current if parent is None else None
        pending = yield from _load_committed(
            names, base, ours.read_version, current.version, known, ours
        )
    if current is not None and ours.read_version > 0:
        read_fragments = yield from _read_fragments(names, base, ours, current)

    # Objects this commit wrote that no committed version references yet: removed
    # when the commit fails (or they were superseded by a rebase), so a refused or
    # conflicting transaction leaves nothing behind. Kept whenever the claim may
    # have landed (see lancetx.commit.engine.unreferenced).
    written: list[str] = []
    counter = _Counter()
    turn = QueueTurn()
    try:
        committed: Committed = yield from counter.wrap(
            _attempts(
                names,
                base,
                ours,
                current,
                pending,
                read_fragments,
                restore_source,
                options,
                written,
                counter,
                turn,
            )
        )
    except KeyAlreadyCommittedError as taken:
        # Deduplicated by the claim, the key's version unreadable: our transaction file
        # is unreferenced unless that version is this very transaction (same file).
        yield from _end_turn(names, base, turn)
        if taken.transaction_uuid is not None and taken.transaction_uuid != ours.uuid:
            yield from _discard(names, written)
        raise
    except LancetxError as error:
        yield from _end_turn(names, base, turn)
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
    yield from _end_turn(names, base, turn)
    yield from _discard(
        names, [k for k in written if k not in _referenced(base, committed.transaction)]
    )
    return committed


@dataclass
class QueueTurn:
    """Our place in the table's commit queue, once we joined it."""

    ticket: int | None = None
    #: The highest ticket served, as last seen.
    served: int = 0
    #: The handler keeps no queue (or refused to): back off at random instead.
    unavailable: bool = False
    #: When our turn came (monotonic clock), once it did.
    turn_began: float | None = None
    #: The version the holder of ticket ``served`` claimed, as last seen.
    served_version: int = 0
    #: When ticket ``served`` was served (epoch seconds; 0 if unknown).
    served_at: float = 0.0


def join_queue_steps(names: Names, base: str) -> Steps[QueueTurn | None]:
    """Take a ticket in the table's commit queue, for a writer that claims outside
    :func:`commit_steps` (``commit_many``); None when the handler keeps no queue or
    writers outside the queue commit to the table now (see
    :meth:`~lancetx.commit.engine.contention.TableContention.queue_fair`).

    A claim whose entry records the ticket serves it; otherwise
    :func:`end_turn_steps` must."""
    turn = QueueTurn()
    joined = yield from _join_queue(base, turn, contention.table_contention(names.uri(base)))
    return turn if joined else None


def wait_turn_steps(
    names: Names, base: str, turn: QueueTurn, policy: RetryPolicy, since: int
) -> Steps[None]:
    """Wait until every ticket before ``turn``'s was served (or the queue stalls),
    watching the versions after ``since`` (see :func:`join_queue_steps`)."""
    contended = contention.table_contention(names.uri(base))
    yield from _wait_for_turn(names, base, turn, contended, policy, since, None)


def turn_served(names: Names, base: str, turn: QueueTurn, version: int) -> None:
    """``turn``'s ticket was served by the claim of ``version`` (its entry records it)."""
    if turn.ticket is not None:
        contention.table_contention(names.uri(base)).saw_served(turn.ticket, version, time.time())
    turn.ticket = None


def end_turn_steps(names: Names, base: str, turn: QueueTurn) -> Steps[None]:
    """Serve ``turn``'s ticket in the queue item (a turn that ends without a claim
    recording it), unless it was served already. Errors are logged, never raised."""
    yield from _end_turn(names, base, turn)


def _join_queue(base: str, turn: QueueTurn, contended: contention.TableContention) -> Steps[bool]:
    """Take a ticket unless we hold one; False when the handler keeps no queue.

    Where the queue stands comes from two places: the queue item (tickets
    served by writers whose turn ended without a claim) and the newest ticket
    this process saw served by a claim (claims serve their tickets in their
    entries, not in the queue item).
    """
    if turn.ticket is not None:
        return True
    if turn.unavailable or not contended.queue_fair(time.monotonic()):
        return False
    turns: Turns | None = yield TakeTicket(base)
    if turns is None:
        turn.unavailable = True
        return False
    turn.ticket, turn.served = turns.issued, turns.served
    turn.served_version = turns.served_version
    turn.served_at = turns.served_at
    seen = contended.served
    if seen is not None:
        if seen.served >= turns.issued:
            contended.served = None  # from before the queue item was reset
        elif seen.served > turn.served:
            turn.served, turn.served_version = seen.served, seen.served_version
            turn.served_at = seen.served_at
    if turns.issued - turn.served > 1:
        contended.queued(time.monotonic())
    return True


def _served_by_claims(
    turn: QueueTurn, listed: list[ManifestLocation], contended: contention.TableContention
) -> bool:
    """Move ``turn`` on by the tickets the listed claims served; True if it moved.
    The stamps of the claims new to us time the queue's turns."""
    claims = sorted(
        (loc.summary.ticket, loc.version, loc.summary.claimed_at)
        for loc in listed
        if loc.summary is not None and loc.summary.ticket is not None
    )
    if not claims:
        return False
    ticket, version, claimed_at = claims[-1]
    if ticket <= turn.served:
        return False
    timed = [(t, at) for t, _, at in claims if at is not None and t >= turn.served]
    if turn.served_at and (not timed or timed[0][0] > turn.served):
        timed.insert(0, (turn.served, turn.served_at))
    contended.claims_timed(
        (at2 - at1) / (t2 - t1) for (t1, at1), (t2, at2) in itertools.pairwise(timed) if t2 > t1
    )
    turn.served = ticket
    turn.served_version = max(turn.served_version, version)
    turn.served_at = claimed_at or time.time()
    return True


def _served_by_unmarked(turn: QueueTurn, listed: list[ManifestLocation]) -> bool:
    """Count each listed version that shows no ticket at all (no summary) and is newer
    than the last claim known to serve one as serving the next ticket (never ours);
    True if it moved ``turn``.

    Such an entry is mostly one of ours that a pylance reader finalized after its
    writer's flip: pylance's full-item PutItem keeps only Lance's attributes, and
    nobody can tell the ticket it carried. Waiting for tickets we can no longer see
    would stand the queue still until the stall limit; counting one too many (the
    version was an outsider's, or a claim made outside the queue) costs at worst one
    lost round against the holder, who claims right after."""
    assert turn.ticket is not None
    unmarked = [loc for loc in listed if loc.summary is None and loc.version > turn.served_version]
    served = min(turn.ticket - 1, turn.served + len(unmarked))
    if served <= turn.served:
        return False
    turn.served = served
    turn.served_version = unmarked[-1].version
    turn.served_at = time.time()
    return True


def _wait_for_turn(
    names: Names,
    base: str,
    turn: QueueTurn,
    contended: contention.TableContention,
    policy: RetryPolicy,
    since: int,
    ours: Transaction | None,
) -> Steps[list[_Loaded] | None]:
    """Wait until every ticket before ours was served (or the queue stalls).

    It watches the table (one Query a look, :func:`contention.turn_wait` says
    when): a claim made from the queue carries its ticket, so the claims since
    our parent say whose turn it is, and the Query that shows the claim of the
    ticket before ours lists exactly the versions we must build on. While the
    queue stands still it also reads the queue item now and then: a writer
    whose turn ended without a claim (refused, gave up) serves its ticket
    there. Returns the versions committed after ``since`` when it loaded
    them (never without ``ours``), else None.
    """
    assert turn.ticket is not None
    last_served, last_change = turn.served, time.monotonic()
    began, ahead = last_change, turn.ticket - turn.served - 1
    if ahead > 0:
        log.debug("%s: ticket %d, %d ahead in the commit queue", base, turn.ticket, ahead)
    newer: list[_Loaded] | None = None
    looks = 0
    watching = False  # next in line, looking again within its predecessor's turn
    checked = last_change  # when we last read the queue item
    seen: list[ManifestLocation] = []  # the versions after ``since`` listed so far
    while turn.ticket - turn.served - 1 > 0:
        ahead_now = turn.ticket - turn.served - 1
        into_turn = time.time() - turn.served_at if turn.served_at else None
        yield Sleep(
            contention.turn_wait(policy, contended, ahead_now, into_turn, first_look=not watching)
        )
        watching = ahead_now == 1
        now = time.monotonic()
        looks += 1
        standing = now - last_change
        served_at_before = turn.served_at
        # Only what is new since the last look: a far-back waiter would
        # otherwise fetch every claim of the wait again at each look.
        listed: list[ManifestLocation] = yield ListVersions(
            base, seen[-1].version if seen else since
        )
        seen.extend(listed)
        moved = _served_by_claims(turn, listed, contended)
        moved = _served_by_unmarked(turn, listed) or moved
        if moved and turn.ticket - turn.served - 1 <= 0 and ours is not None:
            newer = yield from _load_listed(names, base, since, seen, ours=ours)
        elif not moved and min(standing, now - checked) > contention.queue_check_after(contended):
            # Standing still: did the holder end its turn without a claim? It
            # serves its ticket in the queue item then, where claims cannot show it.
            checked = now
            turns: Turns | None = yield ReadTurns(base)
            if turns is None:
                break
            moved = turns.served > turn.served
            if moved:
                turn.served = turns.served
                turn.served_version = max(turn.served_version, turns.served_version)
                turn.served_at = turns.served_at
        if moved:
            if served_at_before and turn.served_at > served_at_before:
                # Timed by the serving writers' own clocks: exact, however
                # seldom we look. (Timing it by our looks would count our own
                # sleep as the queue's, and every waiter would sleep longer.)
                contended.turns_served(turn.served - last_served, turn.served_at - served_at_before)
            contended.saw_served(turn.served, turn.served_version, turn.served_at)
            last_served, last_change = turn.served, now
            watching = False
            continue
        if standing <= contention.stall_limit(contended):
            continue
        # The holder ahead is slow or gone. Go anyway: the claim still decides,
        # and our claim serves our ticket, which moves the mark past its one.
        log.debug(
            "commit queue of %s stands at %d for %.1f s; ticket %d goes ahead",
            base,
            turn.served,
            standing,
            turn.ticket,
        )
        break
    turn.turn_began = time.monotonic()
    if ahead > 0:
        log.debug(
            "%s: ticket %d's turn after %.3f s (%d ahead, %d looks)",
            base,
            turn.ticket,
            time.monotonic() - began,
            ahead,
            looks,
        )
    return newer


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


def _end_turn(names: Names, base: str, turn: QueueTurn) -> Steps[None]:
    if turn.ticket is None:
        return
    ticket, turn.ticket = turn.ticket, None
    try:
        yield EndTurn(base, ticket)
    except LancetxError as exc:  # the waiters behind go after their stall limit
        log.warning(
            "could not end turn %d in the commit queue of %s (%s)", ticket, names.uri(base), exc
        )


@dataclass
class _Loaded:
    """A committed version: its transaction, and its manifest when it was read."""

    version: int
    transaction: Transaction
    location: ManifestLocation
    manifest: ManifestFile | None
    #: The library that wrote its manifest (``writer_version.library``), if known.
    writer: str | None = None


def _attempts(
    names: Names,
    base: str,
    ours: Transaction,
    current: Parent | None,
    pending: list[_Loaded],
    read_fragments: dict[int, table_pb2.DataFragment],
    restore_source: tuple[table_pb2.Manifest, list[table_pb2.IndexMetadata]] | None,
    options: CommitOptions,
    written: list[str],
    counter: _Counter,
    turn: QueueTurn,
) -> Steps[Committed]:
    """The retry loop of :func:`commit_steps`; records what it writes in ``written``
    and its place in the table's commit queue in ``turn``."""
    uri = names.uri(base)
    shown = options.table_uri or uri
    policy = options.retry
    first_read = ours.read_version
    next_version = 1
    txn_bytes = b""
    began = time.perf_counter()
    rebased_any = False
    attempt = 0
    losses = 0
    requests_before = 0
    started = began
    contended = contention.table_contention(uri)
    expected_contention = False
    still_contended = False

    def event(outcome: EventOutcome, version: int | None) -> None:
        notify(
            options.observer,
            CommitEvent(
                table_uri=shown,
                attempt=attempt,
                outcome=outcome,
                read_version=first_read,
                attempted_version=version,
                duration_s=time.perf_counter() - started,
                requests=counter.count - requests_before,
                transaction_uuid=ours.uuid,
                operation=ours.operation.name,
                committed_since_read=max(0, (version or 1) - 1 - first_read),
            ),
        )

    while True:
        if attempt > 0 and _out_of_budget(policy, attempt, began):
            raise RetriesExhaustedError(
                uri, ours.uuid, attempt, next_version, time.perf_counter() - began
            )
        attempt += 1
        started = time.perf_counter()
        tried_at = time.time()
        requests_before = counter.count
        if attempt == 1:
            expected_contention = contended.refresh_first(time.monotonic())
            losses = contended.start_level(time.monotonic())
        if (
            attempt == 1
            and expected_contention
            and not pending
            and current is not None
            and options.expected_version is None
        ):
            # Writers of this process met contention on this table moments ago:
            # queue up behind the writers already waiting (or, without a queue,
            # let the losers' windows run a little: we may be the last winner,
            # holding the newest manifest), then look: our parent is likely
            # stale, and one Query is cheaper than staging, claiming, losing
            # and deleting.
            if (yield from _join_queue(base, turn, contended)):
                # Our transaction file does not depend on the version we will
                # claim: write it now, off the table's critical path.
                txn_bytes = yield from _write_transaction(base, ours, txn_bytes, written)
                newer = yield from _wait_for_turn(
                    names, base, turn, contended, policy, current.version, ours
                )
            else:
                yield Sleep(contention.yield_delay(policy, contended))
                newer = None
            started = time.perf_counter()  # the attempt's slot does not include the wait
            tried_at = time.time()
            if newer is None:
                newer = yield from _load_newer(names, base, current.version, ours=ours)
            if newer:
                pending = newer
                current = _newest_parent(newer)
                still_contended = True
        if pending and current is not None:
            # 1. Judge ours against what was committed since: is it ours already?
            mine = next((p for p in pending if _is_ours(ours, p.transaction)), None)
            if mine is not None:
                at = mine.manifest
                if at is None:
                    at = yield ReadManifest(base, mine.location)
                event("deduplicated", mine.version)
                log.info(
                    "%s: transaction %s is already committed as version %d (idempotency key "
                    "%r); not committing it again",
                    shown,
                    ours.uuid,
                    mine.version,
                    ours.properties.get(IDEMPOTENCY_KEY),
                )
                return Committed(mine.location, at, mine.transaction, attempt, deduplicated=True)
            try:
                rebased = yield from _check_and_rebase(
                    names, base, ours, pending, read_fragments, current
                )
            except (RetryableConflictError, IncompatibleConflictError) as conflict:
                event("conflict", current.version + 1)
                log.info("%s: %s", shown, conflict)
                raise
            written.extend(_new_deletion_files(base, ours, rebased))
            if rebased.read_version != ours.read_version:
                # Rebased onto ``current``: that is now what ours read. A later
                # rebase must diff against it, or the rows the winners deleted
                # (now in our merged vectors) would count as ours and overlap.
                wanted = rebased.operation.modified_fragment_ids
                read_fragments = {
                    f.id: f for f in current.manifest.manifest.fragments if f.id in wanted
                }
                rebased_any = True
            ours = rebased
            pending = []
        if current is not None and current.location.alternate_key is not None:
            # The parent is still a staged manifest (its writer crashed or is still
            # finalizing): finish it before claiming on top of it, so the object store
            # never lags more than one commit behind (a reader that does not know the
            # external store, or a copy of the directory, would see a hole otherwise).
            finished: ManifestLocation = yield ResolveVersion(base, current.version)
            if finished.alternate_key is not None:
                # Finishing it failed (the reader's side is best effort and said so
                # in the log): claiming on top now would leave it behind for good.
                raise UnfinishedParentError(uri, current.version, ours.uuid, finished.key)
            current = Parent(finished, current.manifest)
        # 2. Build, write the transaction file, encode.
        next_version = current.version + 1 if current is not None else 1
        txn_pb = ours.to_proto()
        # Build first: a transaction the builder refuses must leave nothing behind.
        built = build_manifest(
            current.manifest.manifest if current is not None else None,
            (current.manifest.indices or []) if current is not None else [],
            txn_pb,
            version=next_version,
            transaction_file=transaction_file_name(txn_pb),
            restore_source=restore_source,
        )
        txn_bytes = yield from _write_transaction(base, ours, txn_bytes, written, txn_pb)
        # Lance writes an index section only when there are indices.
        indices = list(built.indices) or None
        data = encode_manifest(
            built.manifest,
            indices=indices,
            transaction=txn_pb if options.inline_transaction else None,
        )
        scheme = current.location.scheme if current is not None else options.naming
        # 3. Claim.
        try:
            location: ManifestLocation = yield ClaimVersion(
                base, next_version, data, scheme, _summary(ours), turn.ticket
            )
        except CommitStateUnknownError as unknown:
            event("unknown", next_version)
            log.warning(
                "%s: the outcome of claiming version %d for transaction %s is unknown (%s); "
                "re-open the table and look for the transaction before retrying",
                shown,
                next_version,
                ours.uuid,
                unknown,
            )
            if unknown.transaction_uuid == ours.uuid:
                raise
            # The handler knows its own token (a staged-manifest UUID), not ours: the
            # caller must look for OUR transaction before retrying, or it commits twice.
            raise CommitStateUnknownError(
                uri,
                next_version,
                ours.uuid,
                f"the claim of version {next_version} (staged-manifest token "
                f"{unknown.transaction_uuid}) could not be settled; the chained error says why",
            ) from unknown
        except KeyAlreadyCommittedError as taken:
            # Our key was committed before, at a version this loop never loaded (at
            # any distance, or landed while we planned): that version is ours.
            event("deduplicated", taken.version)
            winner = yield from _load_key_winner(names, base, taken, shown)
            if winner is None:
                raise
            log.info(
                "%s: transaction %s is already committed as version %d (idempotency key "
                "%r); not committing it again",
                shown,
                ours.uuid,
                winner.version,
                taken.key,
            )
            assert winner.manifest is not None  # loaded with need_manifest
            return Committed(
                winner.location, winner.manifest, winner.transaction, attempt, deduplicated=True
            )
        except VersionAlreadyExistsError:
            if options.expected_version is not None:
                event("lost", next_version)
                latest = yield from _latest_version(base, next_version)
                raise ExpectedVersionMismatchError(uri, options.expected_version, latest) from None
            slot = time.perf_counter() - started
            contended.lost(time.monotonic(), slot)
            still_contended = True
            turn.turn_began = None  # a lost turn is not a measure of a turn's work
            log.debug("%s: lost version %d (attempt %d)", shown, next_version, attempt)
            stale_parent = attempt == 1 and not expected_contention
            loaded: list[_Loaded] | None = None
            if stale_parent:
                loaded = yield from _load_newer(
                    names, base, current.version if current is not None else 0, ours=ours
                )
                if _claimed_since(loaded, tried_at):
                    # A winner claimed while we tried: that is contention, not a
                    # stale parent. Retrying at once would only lose again.
                    stale_parent = False
            if not stale_parent and (yield from _join_queue(base, turn, contended)):
                # Contended: wait for our turn in the queue, then learn what was
                # committed meanwhile (the winners of every turn before ours).
                event("lost", next_version)
                losses += 1
                since = loaded[-1].version if loaded else (current.version if current else 0)
                at_head = turn.ticket is not None and turn.ticket - turn.served - 1 <= 0
                if at_head:
                    # Our turn already, lost to a writer outside the queue
                    # (pylance, or one that saw no contention): go again soon.
                    yield Sleep(contention.delay(policy, 1, slot) / contention.FIRST_WINDOW_SLOTS)
                    newer = None
                else:
                    newer = yield from _wait_for_turn(
                        names, base, turn, contended, policy, since, ours
                    )
                if newer is None:
                    newer = yield from _load_newer(names, base, since, ours=ours)
                newer = (loaded or []) + newer
                if newer:
                    pending = newer
                    current = _newest_parent(newer)
                continue
            if loaded is not None:
                newer = loaded
            else:
                newer = yield from _load_newer(
                    names, base, current.version if current is not None else 0, ours=ours
                )
            event("lost", next_version)
            if not newer:  # the winner is not visible yet: wait a whole window, then look again
                losses += 1
                yield Sleep(contention.window(policy, losses, slot))
                continue
            pending = newer
            current = _newest_parent(newer)
            if stale_parent:
                # Nothing suggested contention: our parent was just stale (the
                # winners claimed before we began). They are known now, so retry
                # at once; back off from the next loss on.
                yield Sleep(0.0)
                continue
            losses += 1
            yield Sleep(contention.delay(policy, losses, slot))
            continue
        except BaseException as interrupted:
            if not isinstance(interrupted, LancetxError):
                # KeyboardInterrupt, cancellation, GeneratorExit…: whoever handles it
                # must know which version's claim may have landed.
                note_claim(interrupted, Claim(version=next_version, transaction_uuid=ours.uuid))
            raise
        if turn.ticket is not None:
            if turn.turn_began is not None:
                contended.worked(time.monotonic() - turn.turn_began)
            contended.saw_served(turn.ticket, next_version, time.time())
        turn.ticket = None  # served with the won claim
        manifest = ManifestFile(
            manifest=built.manifest,
            indices=indices,
            transaction=txn_pb if options.inline_transaction else None,
            footer_major=0,
            footer_minor=2,
            size=len(data),
        )
        contended.committed(attempt - 1)
        if still_contended:
            # Others committed while we waited or tried: the next commit of this
            # process should expect them too (and queue), however long this took.
            contended.queued(time.monotonic())
        event("rebased" if rebased_any else "won", next_version)
        log.info(
            "%s: committed version %d (%s) in %d attempt(s), %.3f s%s",
            shown,
            next_version,
            ours.operation.name,
            attempt,
            time.perf_counter() - began,
            ", rebased" if rebased_any else "",
        )
        return Committed(location, manifest, ours, attempt, rebased=rebased_any)


# --------------------------------------------------------------------------- pieces


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
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.throw(error) if error is not None else steps.send(result)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(effect, Gather):
                effect = Gather([self.wrap(s) for s in effect.steps], effect.limit)
            elif not isinstance(effect, Sleep):
                self._tick()
            try:
                result, error = (yield effect), None
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # forwarded: the steps decide (or record and re-raise)
                result, error = None, exc


def _claimed_since(loaded: Sequence[_Loaded], tried_at: float) -> bool:
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


def _newest_parent(loaded: Sequence[_Loaded]) -> Parent:
    newest = loaded[-1]
    assert newest.manifest is not None  # the newest is always read in full
    return Parent(newest.location, newest.manifest)


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


def _load_key_winner(
    names: Names, base: str, taken: KeyAlreadyCommittedError, shown: str
) -> Steps[_Loaded | None]:
    """The version a refused key names, with its manifest and transaction; None when
    it cannot be read (cleanup removed it): the key is committed all the same."""
    try:
        location: ManifestLocation = yield ResolveVersion(base, taken.version)
        winner = yield from _load_one(names, base, location, need_manifest=True)
    except LancetxError as exc:
        log.info(
            "%s: idempotency key %r is committed as version %d, which cannot be read (%s)",
            shown,
            taken.key,
            taken.version,
            exc,
        )
        return None
    if winner.transaction.properties.get(IDEMPOTENCY_KEY) != taken.key:
        raise InvalidCommitError(
            names.uri(base),
            f"the key item of idempotency key {taken.key!r} says version {taken.version} "
            f"(transaction {taken.transaction_uuid}), but that version is transaction "
            f"{winner.transaction.uuid} without the key: the key item outlived the versions "
            "it was written with (a table deleted and written again at this path, its "
            "DynamoDB items deleted by hand but not its key items). Delete the table's key "
            "items (lancetx.externalstore.base.keys_base_uri names their partition) and commit "
            "again",
        )
    return winner


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
    if isinstance(ours.operation, Rewrite) and ours.operation.frag_reuse_index is not None:
        # The builder works from the protobuf, which has no place for this index
        # (Lance does not serialize it either): committing would drop it silently.
        raise InvalidCommitError(
            uri,
            "the Rewrite carries a fragment reuse index (a compaction with deferred index "
            "remap), which lancetx cannot commit yet; compact without defer_index_remap "
            "(lancetx.Table.compact does), then rebuild or optimize the indices",
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


def _load_one(
    names: Names,
    base: str,
    location: ManifestLocation,
    *,
    need_manifest: bool,
    known: Parent | None = None,
) -> Steps[_Loaded]:
    """One committed version's transaction (from the process cache when it was
    loaded before and its manifest is not needed), else from its manifest
    (``known``'s, when that is this version's, else read)."""
    uri = names.uri(base)
    if not need_manifest:
        cached = TRANSACTIONS.get_with_writer(uri, location)
        # A summary-less version is judged by its manifest's writer: a cached
        # transaction that came without it is read again (see _outsider).
        if cached is not None and (location.summary is not None or cached[1] is not None):
            return _Loaded(location.version, cached[0], location, None, writer=cached[1])
    try:
        if known is not None and known.location == location:
            manifest = known.manifest
        else:
            manifest = yield ReadManifest(base, location)
    except ObjectNotFoundError:
        raise InvalidCommitError(
            uri,
            f"the manifest of version {location.version} is gone ({location.key!r}; cleaned up?), "
            "so concurrent commits cannot be checked against it; re-read the table at its "
            "latest version and plan the transaction again",
        ) from None
    pb: transaction_pb2.Transaction | None = manifest.transaction
    if pb is None and manifest.manifest.transaction_file:
        key = transaction_key(base, manifest.manifest.transaction_file)
        raw: bytes = yield GetObject(key, TRANSACTION)
        pb = decode_transaction(raw, path=names.uri(key))
    if pb is None:
        raise InvalidCommitError(
            uri,
            f"version {location.version} has no transaction (no inline section and no transaction "
            "file), so concurrent commits cannot be checked against it",
        )
    txn = Transaction.from_proto(pb, source=names.uri(location.key))
    if isinstance(txn.operation, Rewrite):
        # Lance never serializes a rewrite's fragment-reuse index into the
        # transaction; the conflict rules need it, and the version's index
        # section has it.
        reuse = [i for i in manifest.indices or [] if i.name == FRAG_REUSE_INDEX_NAME]
        if reuse:
            txn = dataclasses.replace(
                txn, operation=dataclasses.replace(txn.operation, frag_reuse_index=reuse[0])
            )
    writer = manifest.manifest.writer_version.library or None
    TRANSACTIONS.put(uri, location, txn, writer)
    return _Loaded(location.version, txn, location, manifest, writer=writer)


def _load_newer(
    names: Names,
    base: str,
    since: int,
    known: Parent | None = None,
    ours: Transaction | None = None,
    until: int | None = None,
) -> Steps[list[_Loaded]]:
    """Versions committed after ``since`` (up to ``until``), with their transactions,
    loaded in parallel (the newest with its manifest: it is the next parent).

    A version whose entry carries a summary that already settles it against
    ``ours`` — not ours, and compatible by the two operations' kinds alone — is
    not read at all: under contention an Append then reads only the newest
    manifest, not one per winner.

    Raises InvalidCommitError when a version in between is missing (cleaned up,
    or hidden by a stale listing): ours cannot be checked against it.
    """
    locations: list[ManifestLocation] = yield ListVersions(base, since)
    return (yield from _load_listed(names, base, since, locations, known, ours, until))


def _note_served(names: Names, base: str, listed: Sequence[ManifestLocation]) -> None:
    """Remember the newest ticket the listed claims served (their entries record it).

    A writer that loses a round loads the winners, then takes a ticket; the queue
    item knows nothing of tickets served by claims, and its looks for its turn list
    only the versions after those it loaded. Without this it would wait for a ticket
    a claim it had already loaded served, until the stall limit."""
    stamped = [
        (loc.summary.ticket, loc.version, loc.summary.claimed_at or 0.0)
        for loc in listed
        if loc.summary is not None and loc.summary.ticket is not None
    ]
    if stamped:
        ticket, version, at = max(stamped)
        contention.table_contention(names.uri(base)).saw_served(ticket, version, at)


def _load_listed(
    names: Names,
    base: str,
    since: int,
    locations: list[ManifestLocation],
    known: Parent | None = None,
    ours: Transaction | None = None,
    until: int | None = None,
) -> Steps[list[_Loaded]]:
    """:func:`_load_newer` for versions already listed."""
    _note_served(names, base, locations)
    if until is not None:
        locations = [loc for loc in locations if loc.version <= until]
    if not locations and until is None:
        return []
    last = until if until is not None else locations[-1].version
    missing = sorted(set(range(since + 1, last + 1)) - {loc.version for loc in locations})
    if missing:
        raise InvalidCommitError(
            names.uri(base),
            f"version(s) {missing} between {since} and {last} cannot be found "
            "(cleaned up, or not listed yet), so concurrent commits cannot be checked against "
            "them; re-read the table at its latest version and plan the transaction again",
        )
    newest = locations[-1].version
    loads = [
        _load_one(names, base, loc, need_manifest=loc.version == newest, known=known)
        for loc in locations
        if loc.version == newest or not _settled_by_summary(ours, loc.summary)
    ]
    loaded: list[_Loaded] = yield Gather(loads, LOAD_PARALLELISM)
    if any(_outsider(ld) for ld in loaded):
        contention.table_contention(names.uri(base)).outsider(time.monotonic())
    return sorted(loaded, key=lambda item: item.version)


def _outsider(loaded: _Loaded) -> bool:
    """Whether a version was committed by a writer that keeps no queue (pylance): see
    TableContention.queue_fair. Its entry has no summary — but neither has one of
    ours that a pylance reader finalized (its full-item PutItem keeps only Lance's
    attributes), so the manifest's writer decides. Every summary-less version is
    loaded (its summary cannot settle it), so this costs no request."""
    return loaded.location.summary is None and loaded.writer != LIBRARY_NAME


def _load_committed(
    names: Names,
    base: str,
    since: int,
    until: int,
    known: Parent | None = None,
    ours: Transaction | None = None,
) -> Steps[list[_Loaded]]:
    return (yield from _load_newer(names, base, since, known, ours, until))


def _summary(ours: Transaction) -> TransactionSummary:
    return TransactionSummary(
        operation=ours.operation.name,
        uuid=ours.uuid,
        idempotency_key=ours.properties.get(IDEMPOTENCY_KEY) or None,
    )


def _settled_by_summary(ours: Transaction | None, summary: TransactionSummary | None) -> bool:
    """Whether a committed version's summary alone shows it cannot matter to ours."""
    if ours is None or summary is None:
        return False
    if summary.uuid == ours.uuid:
        return False  # ours, committed by an earlier attempt: load it (deduplicated)
    key = ours.properties.get(IDEMPOTENCY_KEY)
    if key and summary.idempotency_key == key:
        return False
    try:
        theirs = OperationKind(summary.operation)
    except ValueError:
        return False  # a kind this version of lancetx does not know: read it
    return compatible_by_kind(ours.kind, theirs)


def _read_fragments(
    names: Names, base: str, ours: Transaction, current: Parent
) -> Steps[dict[int, table_pb2.DataFragment]]:
    wanted = ours.operation.modified_fragment_ids
    if not wanted:
        return {}
    if current.version == ours.read_version:
        manifest = current.manifest.manifest
    else:
        read = yield from load_parent_steps(names, base, ours.read_version)
        assert read is not None
        manifest = read.manifest.manifest
    return {f.id: f for f in manifest.fragments if f.id in wanted}


def _check_and_rebase(
    names: Names,
    base: str,
    ours: Transaction,
    pending: Sequence[_Loaded],
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
