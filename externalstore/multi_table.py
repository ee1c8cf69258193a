"""Atomic commits to several tables: every new version claimed in one write.

:func:`commit_many` publishes one transaction per table so that readers see
all of the new versions or none. It is the four-step protocol of
:mod:`lancetx.externalstore.protocol` with step 2 shared by all tables:

1. **Prepare** each table with the ordinary commit loop
   (:func:`~lancetx.commit.engine.committer.commit_transaction`: conflict checks
   against versions committed since the transaction's read version, rebase,
   manifest build, transaction file), through a handler whose ``commit`` only
   *stages* the manifest (:func:`~lancetx.externalstore.protocol.stage_steps`).
2. **Claim** every staged version in one DynamoDB ``TransactWriteItems`` with
   Lance's condition on each item
   (:func:`~lancetx.externalstore.protocol.claim_all_steps`): all versions or
   none. This is the only commit point.
3. **Finalize** each table (:func:`~lancetx.externalstore.protocol.finalize_steps`:
   copy to the final name, flip the item). A failure here is logged, not
   raised: the versions are committed, and any reader finishes them, as for a
   single-table commit.

Readers that resolve versions through DynamoDB (lancetx, pylance
``s3+ddb://``) see every claimed version at once: a reader finding a staged
item finalizes it. (A reader that only lists the object store may see some
tables one commit behind until they are finalized, as the spec allows.)

A lost claim (another writer took one of the versions) writes nothing: the
round's staged manifests, transaction files and merged deletion files are
removed. A table with an expected version then fails with
ExpectedVersionMismatchError naming it; otherwise every table is prepared
again on its new latest version (its conflicts checked again) and claimed
again, within the retry policy (a time budget, like a single commit's).

**Beside single-table writers.** Writers under contention take turns in each
table's commit queue (:mod:`lancetx.commit.engine.contention`) and claim back to
back; a round of this commit (every table prepared, then one claim) outside the
queue would lose nearly every time. So after its first lost round (or at once,
when this process met contention on one of the tables moments ago) it takes a
ticket in every table's queue that keeps one, waits until its turn has come in
each (tables in a fixed order), prepares and claims; the claimed entries record
the tickets, which serves them, as a single-table claim does. A turn that ends
without a claim is served in the queue item.

**A retry after an unknown outcome.** A transaction already committed (its
uuid found among the versions since its read version: the claim of an earlier
call landed) is not prepared again; its version is returned with
``deduplicated=True``, and only the others are claimed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from lancetx.commit.engine.committer import CommitOptions, Committed, commit_transaction
from lancetx.commit.engine.contention import TableContention, table_contention
from lancetx.commit.engine.effects import run as run_engine
from lancetx.commit.engine.operations import Transaction
from lancetx.commit.engine.retry import RetryPolicy
from lancetx.commit.engine.turns import (
    QueueTurn,
    end_turn_steps,
    join_queue_steps,
    turn_served,
    wait_turn_steps,
)
from lancetx.commit.engine.unreferenced import Claim, release
from lancetx.commit.errors import (
    ExpectedVersionMismatchError,
    InvalidCommitError,
    LancetxError,
    RetriesExhaustedError,
)
from lancetx.commit.format.deletion import deletion_file_key
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme, transaction_key
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.externalstore.base import ExternalManifestStore
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.connect import TableConnection
from lancetx.externalstore.errors import MultiTableClaimLostError, TablesNotColocatedError
from lancetx.externalstore.protocol import (
    Staged,
    Table,
    claim_all_steps,
    finalize_steps,
    location_of,
    run,
    stage_steps,
)

__all__ = ["TableCommit", "commit_many"]

log = logging.getLogger(__name__)

#: The budget when other writers keep winning: time (five minutes, like a single
#: commit's), with the waits between rounds of a multi-table commit.
DEFAULT_RETRY = RetryPolicy(base_delay=0.01, max_delay=1.0)


@dataclass(frozen=True)
class TableCommit:
    """One table's part of a multi-table commit.

    ``expected_version``: commit only if the table is still at this version
    (strict mode; no rebase). ``options`` carry the commit message and
    properties; their ``expected_version`` is ignored in favour of the field.
    """

    connection: TableConnection
    transaction: Transaction
    expected_version: int | None = None
    options: CommitOptions = field(default_factory=CommitOptions)

    @property
    def uri(self) -> str:
        return self.connection.uri


class _StagingHandler(CommitHandler):
    """A handler whose ``commit`` stages the manifest instead of claiming it:
    the claim happens later, for every table at once. Reads go to the table's
    own handler (which finalizes a staged parent as usual)."""

    def __init__(self, inner: ExternalStoreCommitHandler) -> None:
        self.inner = inner
        self.store = inner.store
        self.staged: Staged | None = None

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        return self.inner.resolve_latest(base)

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        return self.inner.resolve_version(base, version)

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        return self.inner.list_versions(base, since)

    def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        staged = run(
            stage_steps(
                _table(base),
                version,
                scheme,
                manifest,
                committer=self.inner.committer,
                summary=summary,
            ),
            self.inner.store,
            self.inner.entries,
        )
        self.staged = staged
        return location_of(staged.table, staged.entry)


@dataclass
class _Prepared:
    commit: TableCommit
    handler: ExternalStoreCommitHandler
    #: None when the transaction is committed already (``done.deduplicated``).
    staged: Staged | None
    done: Committed
    #: Its place in the caller's list.
    index: int


def _table(base: str) -> Table:
    # Lance's convention: the external store's base_uri is the path inside the bucket.
    return Table(base_uri=base, base_key=base)


def _handler(commit: TableCommit) -> ExternalStoreCommitHandler:
    handler = commit.connection.handler
    if not isinstance(handler, ExternalStoreCommitHandler):
        raise TablesNotColocatedError({commit.uri: _where(handler)})
    return handler


def _where(handler: CommitHandler) -> str:
    if isinstance(handler, ExternalStoreCommitHandler):
        target = getattr(handler.entries, "target", None)
        if target is not None:
            return f"DynamoDB table {target.table!r} ({target.location})"
        return f"{type(handler.entries).__name__}"
    return f"the object store itself ({type(handler).__name__}, no DynamoDB table)"


def _store_key(entries: ExternalManifestStore) -> object:
    """What identifies the place versions are claimed: DynamoDB table, region, endpoint."""
    target = getattr(entries, "target", None)
    if target is not None:
        return (type(entries).__name__, target.table, target.region, target.endpoint)
    return id(entries)


def _validate(commits: Sequence[TableCommit]) -> list[ExternalStoreCommitHandler]:
    if not commits:
        raise ValueError("commit_many needs at least one table")
    handlers = [c.connection.handler for c in commits]
    limits = {
        (type(h.entries).__name__, h.entries.max_claim_entries)
        for h in handlers
        if isinstance(h, ExternalStoreCommitHandler) and h.entries.max_claim_entries is not None
    }
    for store, limit in sorted(limits, key=lambda pair: pair[1]):
        if len(commits) > limit:
            raise InvalidCommitError(
                ", ".join(c.uri for c in commits[:3]) + ", ...",
                f"{len(commits)} tables in one atomic commit; {store} claims at most "
                f"{limit} versions at once",
            )
    keys = {
        _store_key(h.entries) if isinstance(h, ExternalStoreCommitHandler) else None
        for h in handlers
    }
    if None in keys or len(keys) > 1:
        raise TablesNotColocatedError({c.uri: _where(c.connection.handler) for c in commits})
    bases: dict[str, str] = {}
    for c in commits:
        if c.connection.base in bases:
            raise InvalidCommitError(
                c.uri,
                f"the table appears twice (also as {bases[c.connection.base]!r}); give each table "
                "one transaction",
            )
        bases[c.connection.base] = c.uri
    return [_handler(c) for c in commits]


def commit_many(
    commits: Sequence[TableCommit], *, retry: RetryPolicy = DEFAULT_RETRY
) -> list[Committed]:
    """Commit one transaction per table, atomically: all new versions or none.

    Returns the committed versions in the order given (each ``Committed`` holds
    the transaction as committed, after any rebase). A transaction found already
    committed (the same uuid: a retry after CommitStateUnknownError whose claim
    landed) is not committed again: its version is returned with
    ``deduplicated=True``. Raises TablesNotColocatedError (the tables' versions
    are not claimed in one DynamoDB table), ExpectedVersionMismatchError (a
    table with an expected version has moved; it names the table, expected and
    actual version), RetryableConflictError / IncompatibleConflictError (from one
    table's conflict checks), RetriesExhaustedError (``retry``'s budget, time
    first, ran out), or CommitStateUnknownError (the claim may have landed;
    staged manifests are kept). In every case but the last nothing stays written.

    Under contention it takes its turn in every table's commit queue, as a
    single-table writer does (see :mod:`lancetx.commit.engine.contention`): a
    ticket per table after its first lost round (or at once when this process
    met contention on one of the tables moments ago), the claim made once every
    table's turn has come, each table's ticket served by the claim itself.
    """
    handlers = _validate(commits)
    claimer = handlers[0]
    turns: dict[int, QueueTurn] = {}
    since = {i: c.transaction.read_version for i, c in enumerate(commits)}
    began = time.perf_counter()
    attempt = 0
    try:
        while True:
            if attempt > 0 and _out_of_budget(retry, attempt, began):
                raise RetriesExhaustedError(
                    ", ".join(c.uri for c in commits),
                    commits[0].transaction.uuid,
                    attempt,
                    max(since.values()) + 1,
                    time.perf_counter() - began,
                )
            attempt += 1
            if attempt == 1 and _contended(commits, handlers):
                _join_queues(commits, handlers, turns)
            _wait_for_turns(commits, handlers, turns, since, retry)
            started = time.perf_counter()
            prepared = _prepare(commits, handlers)
            claiming = [p for p in prepared if p.staged is not None]
            if not claiming:
                # Every transaction is committed already (a retry after an unknown outcome).
                log.info(
                    "multi-table commit of %s: every transaction is committed already (versions "
                    "%s); not committing them again",
                    ", ".join(c.uri for c in commits),
                    [p.done.version for p in prepared],
                )
                return [p.done for p in prepared]
            _stamp(claiming, turns)
            try:
                run(
                    claim_all_steps(
                        [_staged(p) for p in claiming], request_token=str(uuidlib.uuid4())
                    ),
                    claimer.store,
                    claimer.entries,
                )
            except MultiTableClaimLostError as lost:
                # Staged manifests are already deleted; remove what the round wrote.
                _discard(claiming)
                _raise_if_expected(claiming, lost)
                slot = time.perf_counter() - started
                for p in claiming:
                    since[p.index] = _staged(p).entry.version - 1
                    if _staged(p).table.base_uri in lost.taken:
                        _contention(p.handler, p.commit).lost(time.monotonic(), slot)
                log.info(
                    "multi-table commit lost round %d to another writer (%s); preparing again",
                    attempt,
                    lost,
                )
                if not turns:
                    _join_queues(commits, handlers, turns)
                # In the queue, our turn comes when the tickets before ours are served
                # (waited for above); at its head we lost to a writer outside it and go
                # again soon. Without a queue, a lost claim names the winner: wait a
                # random part of a round.
                time.sleep(retry.delay(1 if turns else attempt, slot / 4))
                continue
            except BaseException as error:
                # Refused outright: nothing was claimed, delete. Unknown, Ctrl-C, a
                # cancellation: the claim may have landed, keep everything and say so.
                _discard(claiming, staged_too=True, error=error)
                raise
            for p in claiming:
                turn = turns.get(p.index)
                if turn is not None:
                    turn_served(p.handler.store, p.commit.connection.base, turn, _version(p))
            return [_finalize(p, attempt) if p.staged is not None else p.done for p in prepared]
    finally:
        for i, turn in turns.items():
            # A turn that ended without a claim (or whose claim's outcome is unknown):
            # serve it in the queue item, so the writers behind need not wait it out.
            run_engine(
                end_turn_steps(handlers[i].store, commits[i].connection.base, turn), handlers[i]
            )


def _out_of_budget(policy: RetryPolicy, attempt: int, began: float) -> bool:
    if attempt >= policy.max_attempts:
        return True
    return policy.max_elapsed is not None and time.perf_counter() - began >= policy.max_elapsed


def _contention(handler: ExternalStoreCommitHandler, commit: TableCommit) -> TableContention:
    return table_contention(handler.store.uri(commit.connection.base))


def _contended(
    commits: Sequence[TableCommit], handlers: Sequence[ExternalStoreCommitHandler]
) -> bool:
    """Whether this process met contention on one of the tables moments ago."""
    now = time.monotonic()
    return any(_contention(h, c).refresh_first(now) for c, h in zip(commits, handlers, strict=True))


def _join_queues(
    commits: Sequence[TableCommit],
    handlers: Sequence[ExternalStoreCommitHandler],
    turns: dict[int, QueueTurn],
) -> None:
    """A ticket in every table's commit queue that keeps one (tables in a fixed order)."""
    for i in sorted(range(len(commits)), key=lambda i: commits[i].connection.base):
        if i in turns:
            continue
        turn = run_engine(
            join_queue_steps(handlers[i].store, commits[i].connection.base), handlers[i]
        )
        if turn is not None:
            turns[i] = turn


def _wait_for_turns(
    commits: Sequence[TableCommit],
    handlers: Sequence[ExternalStoreCommitHandler],
    turns: dict[int, QueueTurn],
    since: dict[int, int],
    policy: RetryPolicy,
) -> None:
    """Wait until our turn came in every table's queue we hold a ticket in."""
    for i in sorted(turns, key=lambda i: commits[i].connection.base):
        base = commits[i].connection.base
        run_engine(
            wait_turn_steps(handlers[i].store, base, turns[i], policy, since[i]), handlers[i]
        )


def _stamp(claiming: Sequence[_Prepared], turns: dict[int, QueueTurn]) -> None:
    """Record in each entry when it is claimed and, in the queue, the ticket the claim serves."""
    now = time.time()
    for p in claiming:
        staged = _staged(p)
        summary = staged.entry.summary
        if summary is None:
            continue
        turn = turns.get(p.index)
        stamped = dataclasses.replace(
            summary, ticket=turn.ticket if turn is not None else None, claimed_at=now
        )
        p.staged = dataclasses.replace(
            staged, entry=dataclasses.replace(staged.entry, summary=stamped)
        )


def _staged(p: _Prepared) -> Staged:
    assert p.staged is not None  # only prepared tables that stage a manifest are claimed
    return p.staged


def _version(p: _Prepared) -> int:
    return _staged(p).entry.version


def _prepare(
    commits: Sequence[TableCommit], handlers: Sequence[ExternalStoreCommitHandler]
) -> list[_Prepared]:
    prepared: list[_Prepared] = []
    try:
        for index, (commit, handler) in enumerate(zip(commits, handlers, strict=True)):
            stager = _StagingHandler(handler)
            options = dataclasses.replace(commit.options, expected_version=commit.expected_version)
            try:
                done = commit_transaction(
                    stager, commit.connection.base, commit.transaction, options=options
                )
            except ExpectedVersionMismatchError as moved:
                # Name the table as the caller did (its s3+ddb:// URI).
                raise ExpectedVersionMismatchError(
                    commit.uri, moved.expected, moved.actual
                ) from None
            # Deduplicated (already committed): nothing staged, nothing to claim.
            assert (stager.staged is None) == done.deduplicated
            prepared.append(_Prepared(commit, handler, stager.staged, done, index))
    except BaseException:
        _discard(prepared, staged_too=True)
        raise
    return prepared


def _raise_if_expected(prepared: Sequence[_Prepared], lost: MultiTableClaimLostError) -> None:
    for p in prepared:
        staged = _staged(p)
        if p.commit.expected_version is not None and staged.table.base_uri in lost.taken:
            latest = p.handler.resolve_latest(p.commit.connection.base)
            actual = latest.version if latest is not None else staged.entry.version
            raise ExpectedVersionMismatchError(p.commit.uri, p.commit.expected_version, actual)


def _finalize(p: _Prepared, attempt: int) -> Committed:
    staged = _staged(p)
    try:
        entry = run(
            finalize_steps(staged.table, staged.entry, staged_etag=staged.etag, ours=True),
            p.handler.store,
            p.handler.entries,
        )
        location = location_of(staged.table, entry)
    except LancetxError as exc:
        log.warning(
            "version %d of %s is committed (with the other tables) but finalizing it failed "
            "(%s); readers will finish it",
            staged.entry.version,
            p.commit.uri,
            exc,
        )
        location = location_of(staged.table, staged.entry)
    return Committed(location, p.done.manifest, p.done.transaction, attempt)


def _discard(
    prepared: Sequence[_Prepared],
    *,
    staged_too: bool = False,
    error: BaseException | None = None,
) -> None:
    """Remove what a round wrote for tables that were not committed: the
    transaction file, deletion files a rebase merged, and (if asked) the staged
    manifest — unless ``error`` leaves the claim open (see
    :mod:`lancetx.commit.engine.unreferenced`): then all is kept, and said so on it.
    The tables' data files are the caller's, never deleted here."""
    claim = _claim_of(prepared)
    for p in prepared:
        if p.staged is None:
            continue  # committed already: its files belong to that version
        store = p.handler.store
        base = p.commit.connection.base
        keys = [transaction_key(base, p.done.manifest.manifest.transaction_file)]
        keys += sorted(
            _deletion_keys(base, p.done.transaction) - _deletion_keys(base, p.commit.transaction)
        )
        if staged_too:
            keys.append(p.staged.entry.path)
        callers = len(getattr(p.commit.transaction.operation, "added_fragments", ()))
        release(keys, error, delete=store.delete, describe=store.uri, claim=claim, callers=callers)


def _claim_of(prepared: Sequence[_Prepared]) -> Claim:
    """What settles a multi-table claim: its first table's entry and transaction."""
    staging = [p for p in prepared if p.staged is not None]
    if not staging:
        return Claim()
    first = staging[0]
    versions = " and ".join(f"version {_version(p)} of {p.commit.uri!r}" for p in staging)
    return Claim(
        table_uri=first.commit.uri,
        version=_version(first),
        transaction_uuid=first.done.transaction.uuid,
        entry_base=_staged(first).entry.base_uri,
        what=f"the all-or-nothing claim of {versions}",
    )


def _deletion_keys(base: str, txn: Transaction) -> set[str]:
    fragments = getattr(txn.operation, "updated_fragments", ())
    return {
        deletion_file_key(base, f.id, f.deletion_file)
        for f in fragments
        if f.HasField("deletion_file")
    }
