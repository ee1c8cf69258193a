"""How a verb becomes one committed version: plan (pylance writes data), commit (ours).

A *plan* is a function of the version it reads (:class:`PlanContext`) returning the
transaction to commit. :func:`run_verb` runs it against the newest version the Table
knows, commits it through the commit loop, and — for verbs that can be re-planned
(delete/update by predicate, merge_insert, compact) — plans again against the new
latest version when the loop reports a retryable conflict, a bounded number of
times. Data files a plan wrote that no committed version references (the plan lost,
was refused, or a rebase or an earlier commit of the same key superseded them) are
deleted; after an unknown outcome, or any other exception while the claim may have
been in flight (``KeyboardInterrupt``, cancellation), nothing is deleted and the
error says which files were kept and what settles the outcome (the rule lives in
:mod:`lancetx.commit.engine.unreferenced`).

The pieces that do not wait on I/O (options, cleanup lists, the re-plan decision) are
shared with the async driver in :mod:`lancetx.aio`.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid as uuidlib
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lancetx.commit.engine.committer import (
    CommitOptions,
    Committed,
    Parent,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import (
    DataReplacement,
    Delete,
    Merge,
    Rewrite,
    Transaction,
    Update,
)
from lancetx.commit.engine.retry import RetryPolicy
from lancetx.commit.engine.unreferenced import Claim, release
from lancetx.commit.errors import (
    CommitStateUnknownError,
    DatasetNotFoundError,
    ExpectedVersionMismatchError,
    KeyAlreadyCommittedError,
    RetryableConflictError,
    VersionNotFoundError,
)
from lancetx.commit.format.deletion import deletion_file_key
from lancetx.commit.format.naming import DATA_DIR, INDICES_DIR, join
from lancetx.commit.sansio import drive
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.errors import (
    InvalidIdempotencyKeyError,
    TableExistsError,
    pylance_gist,
    says_not_found,
)
from lancetx.externalstore.connect import scheme_of
from lancetx.protos import table_pb2
from lancetx.state import TableState

if TYPE_CHECKING:
    from lance import LanceDataset

log = logging.getLogger(__name__)

#: How many times a re-plannable verb is planned again after a retryable conflict.
MAX_REPLANS = 10


class NothingToDo(Exception):
    """Raised by a plan that finds nothing to commit (e.g. no fragment needs
    compaction): the verb returns the version it read, committing nothing."""


@dataclass(frozen=True)
class CommitResult:
    """What a commit produced: the version, whether an earlier commit with the same
    idempotency key was found instead (nothing new committed), and how many claim
    attempts and plans it took."""

    version: int
    deduplicated: bool = False
    attempts: int = 0
    plans: int = 1


#: The longest idempotency key, in UTF-8 bytes: it is stored in the transaction and in
#: DynamoDB items (at most 400 KB each), and a key is a name, not a payload.
MAX_IDEMPOTENCY_KEY_BYTES = 64 * 1024


def check_idempotency_key(key: str | None) -> None:
    """Raise InvalidIdempotencyKeyError for a key that cannot name a commit (empty,
    not UTF-8, over :data:`MAX_IDEMPOTENCY_KEY_BYTES`); None is "no key"."""
    if key is None:
        return
    limit = MAX_IDEMPOTENCY_KEY_BYTES
    if not key:
        # The engine stores no key for "": every retry would commit again.
        raise InvalidIdempotencyKeyError(key, "is empty", limit)
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidIdempotencyKeyError(
            key, f"is not valid UTF-8 ({exc.reason} at character {exc.start})", limit
        ) from None
    if size > limit:
        raise InvalidIdempotencyKeyError(key, f"is {size} bytes long", limit)


@dataclass(frozen=True)
class CommitArgs:
    """The caller's metadata and strictness for one commit (every verb takes these).

    ``idempotency_since``: versions up to this one cannot hold ``idempotency_key``
    (e.g. the table's version when a job with a fresh key started), so the look-up
    before the first attempt skips them. ``retry``: the commit loop's budget
    (default: :class:`RetryPolicy`'s five minutes). ``stable_row_ids``: a table this
    commit creates gets stable row ids (see :class:`CommitOptions`).
    """

    commit_message: str | None = None
    properties: Mapping[str, str] | None = None
    idempotency_key: str | None = None
    expected_version: int | None = None
    idempotency_since: int = 0
    retry: RetryPolicy | None = None
    stable_row_ids: bool = False

    def __post_init__(self) -> None:
        check_idempotency_key(self.idempotency_key)

    def options(self, table_uri: str | None = None) -> CommitOptions:
        options = CommitOptions(
            properties=dict(self.properties or {}),
            commit_message=self.commit_message,
            expected_version=self.expected_version,
            idempotency_key=self.idempotency_key,
            table_uri=table_uri,
            stable_row_ids=self.stable_row_ids,
        )
        return options if self.retry is None else dataclasses.replace(options, retry=self.retry)


@dataclass
class PlanContext:
    """The version a plan reads, and pylance opened at it.

    ``meanwhile``: a version the plan committed itself before returning its
    transaction (a compaction's ReserveFragments): the commit starts from it, checking
    every version since ``parent`` as usual, instead of losing a round to it.
    """

    state: TableState
    parent: Parent | None
    meanwhile: Parent | None = None

    @property
    def uri(self) -> str:
        return self.state.uri

    @property
    def read_version(self) -> int:
        return self.parent.version if self.parent is not None else 0

    @property
    def store(self) -> ObjectStore:
        return self.state.conn.handler.store

    @property
    def base(self) -> str:
        return self.state.conn.base

    @cached_property
    def dataset(self) -> LanceDataset:
        assert self.parent is not None, "a plan on a new table has no dataset"
        return self.state.dataset(self.parent.version)

    @property
    def dataset_to_write(self) -> LanceDataset:
        """pylance to write data files with (see :meth:`TableState.dataset_to_write`)."""
        assert self.parent is not None
        return self.state.dataset_to_write(self.parent)

    @cached_property
    def schema(self) -> pa.Schema:
        assert self.parent is not None
        return self.state.schema_of(self.parent)

    @property
    def manifest(self) -> table_pb2.Manifest:
        assert self.parent is not None
        return self.parent.manifest.manifest


Plan = Callable[[PlanContext], Transaction]


# ------------------------------------------------------------------ cleanup lists


def _fragment_objects(base: str, fragment: table_pb2.DataFragment) -> set[str]:
    keys = {join(base, DATA_DIR, f.path) for f in fragment.files if not f.HasField("base_id")}
    if fragment.HasField("deletion_file") and not fragment.deletion_file.HasField("base_id"):
        keys.add(deletion_file_key(base, fragment.id, fragment.deletion_file))
    return keys


def _transaction_fragments(txn: Transaction) -> Iterable[table_pb2.DataFragment]:
    op = txn.operation
    yield from op.added_fragments
    if isinstance(op, Delete | Update):
        yield from op.updated_fragments
    if isinstance(op, Merge):
        yield from op.fragments
    if isinstance(op, DataReplacement):
        for group in op.replacements:
            yield table_pb2.DataFragment(id=group.fragment_id, files=[group.new_file])


def objects_of(base: str, txn: Transaction) -> set[str]:
    """Data and deletion files a transaction refers to, and the index files a
    compaction's remapped indices (and fragment reuse index) consist of."""
    out: set[str] = set()
    for fragment in _transaction_fragments(txn):
        out |= _fragment_objects(base, fragment)
    if isinstance(txn.operation, Rewrite):
        out |= rewrite_index_objects(base, txn.operation)
    return out


def rewrite_index_objects(base: str, rewrite: Rewrite) -> set[str]:
    """Keys of the index files a Rewrite brings: its remapped indices' files and an
    external fragment reuse index details file."""
    keys = {
        join(base, INDICES_DIR, str(uuidlib.UUID(bytes=bytes(item.new_id.uuid))), f.path)
        for item in rewrite.rewritten_indices
        for f in item.new_index_files
    }
    reuse = rewrite.frag_reuse_index
    if reuse is not None and not reuse.HasField("base_id"):
        details = table_pb2.FragmentReuseIndexDetails()
        details.ParseFromString(reuse.index_details.value)
        if details.WhichOneof("content") == "external":
            name = str(uuidlib.UUID(bytes=bytes(reuse.uuid.uuid)))
            keys.add(join(base, INDICES_DIR, name, details.external.path))
    return keys


def new_objects(base: str, txn: Transaction, parent: Parent | None) -> set[str]:
    """Files ``txn`` refers to that ``parent`` does not: the ones its plan wrote."""
    mine = objects_of(base, txn)
    if parent is None or not mine:
        return mine
    # Only the parent's fragments that can share a key with ours are named (a commit
    # on a table of thousands of fragments names a handful): a data file's key is its
    # path's, a deletion file's names its fragment's id.
    ids: set[int] = set()
    paths: set[str] = set()
    for fragment in _transaction_fragments(txn):
        ids.add(fragment.id)
        paths.update(f.path for f in fragment.files)
    existing: set[str] = set()
    for fragment in parent.manifest.manifest.fragments:
        if fragment.id in ids or any(f.path in paths for f in fragment.files):
            existing |= _fragment_objects(base, fragment)
    return mine - existing


def discard(
    store: ObjectStore,
    keys: Iterable[str],
    error: BaseException | None = None,
    *,
    claim: Claim | None = None,
    callers: int = 0,
) -> bool:
    """Delete objects a commit wrote if the way it ended (``error``; None: refused,
    never sent, superseded) proves no version references them; else keep them and say
    so on ``error`` (see :func:`lancetx.commit.engine.unreferenced.release`). Deleting
    is best effort: an orphan is harmless. Returns True when they were deleted."""
    return release(
        keys,
        error,
        delete=store.delete,
        describe=store.uri,
        claim=claim,
        callers=callers,
    )


def claim_of(state: TableState, txn: Transaction | None, args: CommitArgs) -> Claim:
    """What settles the outcome of committing ``txn`` to the table of ``state``."""
    external = scheme_of(state.uri).external
    return Claim(
        table_uri=state.uri,
        transaction_uuid=txn.uuid if txn is not None else None,
        idempotency_key=args.idempotency_key,
        entry_base=state.conn.base if external else None,
    )


def should_replan(
    error: RetryableConflictError, args: CommitArgs, replannable: bool, plans: int
) -> bool:
    """Whether a retryable conflict is answered by planning again (bounded; never in strict mode)."""
    return replannable and args.expected_version is None and plans <= MAX_REPLANS


# ------------------------------------------------------------------ steps (sans-IO)


@dataclass(frozen=True)
class FindKey:
    """Effect: the version committed with this idempotency key, or None: its key item,
    else the history after ``since`` (see :mod:`lancetx.keys`)."""

    key: str
    since: int = 0


@dataclass(frozen=True)
class LoadLatest:
    """Effect: the table's latest version (Parent or None)."""


@dataclass(frozen=True)
class RunPlan:
    """Effect: run a plan (pylance's data plane; may run in a worker thread):
    :func:`run_plan`."""

    plan: Plan
    ctx: PlanContext


class _PlannedOnRemoved(Exception):
    """A plan failed because a cleanup removed the version it read (its manifest, and
    maybe its data files, gone since the Table loaded it): ``error`` names it. Raised
    by :func:`run_plan` into the steps, which plan again on the latest version or
    raise ``error``; it never leaves them."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _chain_says_not_found(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # a plan wraps pylance's error once or twice; never a long chain
        if seen is None:
            return False
        if says_not_found(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def run_plan(effect: RunPlan) -> Transaction:
    """Perform :class:`RunPlan` (both drivers). A plan that fails on a version a
    cleanup removed meanwhile (pylance's "not found" of a file, or whatever a plan
    made of it: a predicate "that cannot be used") is told apart here."""
    try:
        return effect.plan(effect.ctx)
    except NothingToDo:
        raise
    except Exception as exc:
        parent, state = effect.ctx.parent, effect.ctx.state
        # Only a "not found" (pylance's, or under what a plan made of it) can be a
        # removed version's: any other failed plan is not looked into, at no cost.
        if parent is None or not _chain_says_not_found(exc):
            raise
        if not state.version_gone(parent.version):
            raise
        error = VersionNotFoundError(
            state.uri,
            parent.version,
            f"a cleanup removed it after this Table planned on it ({type(exc).__name__}: "
            f"{pylance_gist(exc)}); refresh() the Table and run the call again, or keep "
            "versions longer than your writes take (cleanup's older-than)",
        )
        raise _PlannedOnRemoved(error) from exc


@dataclass(frozen=True)
class Commit:
    """Effect: commit through the commit loop; its errors are thrown back into the steps."""

    txn: Transaction
    parent: Parent | None
    options: CommitOptions


@dataclass(frozen=True)
class Discard:
    """Effect: delete objects a commit wrote, if ``error`` (None: nothing references
    them) proves its claim did not land; else keep them and say so (:func:`discard`)."""

    keys: frozenset[str]
    error: BaseException | None = None
    claim: Claim | None = None
    #: Data files of the caller's the commit carried (never deleted; named if kept).
    callers: int = 0


Effect = FindKey | LoadLatest | RunPlan | Commit | Discard


@dataclass(frozen=True)
class VerbFlags:
    """How a verb may be retried.

    ``replannable``: a retryable conflict plans again on the new latest version.
    ``reusable``: the plan keeps the data it wrote across plans (writes: the same
    fragments are committed again), so it is not deleted between plans.
    ``on_exists``: for a plan creating the table — ``"append"`` turns a lost
    creation race into an append, ``"fail"`` raises TableExistsError.
    ``owns_data``: False when the data files came from the caller (commit_fragments,
    commit): they are never deleted, whatever happens.
    """

    replannable: bool = False
    reusable: bool = False
    needs_table: bool = True
    on_exists: str = "append"
    owns_data: bool = True


def verb_steps(
    state: TableState, plan: Plan, args: CommitArgs, flags: VerbFlags
) -> Generator[Effect, Any, CommitResult]:
    """The whole verb as steps: the sync and async drivers only perform the effects.

    With an idempotency key, the key is looked for once the parent is in hand, in
    every version up to it (and again up to a new parent before planning on it):
    the commit loop checks every version after the parent, and the claim itself
    refuses a key committed before (handlers that claim keys). Looked for before
    the parent was loaded, a same-key commit landing in between would be missed.
    """
    parent = state.parent
    if parent is None:
        parent = yield LoadLatest()
        state.remember(parent)
    key = args.idempotency_key
    checked = args.idempotency_since  # versions up to here cannot hold the key
    if key is not None:
        found = yield from _find_key(state, key, checked)
        if found is not None:
            return found
        checked = max(checked, parent.version if parent is not None else 0)
    if parent is None and flags.needs_table:
        raise DatasetNotFoundError(state.uri)
    plans = 0
    first: CommitResult | None = None  # set once a verb's first commit landed
    while True:
        plans += 1
        try:
            outcome = yield from _one_round(state, plan, args, flags, parent, plans)
        except Exception as exc:
            if first is None:
                raise
            # The verb's own commit landed; only its follow-up failed (e.g. indexing
            # the compacted fragments): report the commit, warn about the rest.
            log.warning(
                "%s: version %d committed, but its follow-up failed: %s",
                state.uri,
                first.version,
                exc,
            )
            return first
        if isinstance(outcome, CommitResult):
            return outcome if first is None else dataclasses.replace(outcome, plans=plans)
        if isinstance(outcome, _Again):
            parent = outcome.parent
            if (
                key is not None
                and first is None
                and parent is not None
                and parent.version > checked
            ):
                # Planning again on a newer parent (a creation race lost, a re-plan):
                # the versions up to it are looked at before the next claim.
                found = yield from _find_key(state, key, checked)
                if found is not None:
                    return dataclasses.replace(found, plans=plans)
                checked = parent.version
            continue
        committed = outcome
        follow_up = _follow_up(plan, committed, args)
        result = result_of(committed, plans)
        if follow_up is None:
            return result
        # A verb made of two commits (compact, then index its new fragments): the
        # second plans on the version the first committed, with no read.
        first = first or result
        plan, args = follow_up
        parent = Parent(committed.location, committed.manifest)


def _find_key(
    state: TableState, key: str, since: int
) -> Generator[Effect, Any, CommitResult | None]:
    found = yield FindKey(key, since)
    if found is None:
        return None
    log.info("%s: idempotency key %r already committed as version %d", state.uri, key, found)
    return CommitResult(found, deduplicated=True, attempts=0, plans=0)


@dataclass(frozen=True)
class _Again:
    """Plan again on ``parent``."""

    parent: Parent | None


def _one_round(
    state: TableState,
    plan: Plan,
    args: CommitArgs,
    flags: VerbFlags,
    parent: Parent | None,
    plans: int,
) -> Generator[Effect, Any, CommitResult | _Again | Committed]:
    """Plan once and commit: the committed version, a result without a commit, or
    the parent to plan again on."""
    creating = parent is None
    options = args.options(state.uri)
    if creating and options.expected_version is None:
        # Creating is strict: if another writer created the table first, ours
        # must not replace its rows; it becomes an append (or fails) below.
        options = dataclasses.replace(options, expected_version=0)
    ctx = PlanContext(state, parent)
    try:
        txn = yield RunPlan(plan, ctx)
    except NothingToDo:
        return CommitResult(parent.version if parent else 0, attempts=0, plans=plans)
    except _PlannedOnRemoved as gone:
        # Nothing was committed; as after a retryable conflict, a verb that may plan
        # again does so on the latest version (a Table plans on the newest it knows).
        if not (flags.replannable and args.expected_version is None and plans <= MAX_REPLANS):
            raise gone.error from gone.__cause__
        log.info("%s: %s; planning again on the latest version", state.uri, gone.error)
        latest = yield LoadLatest()
        state.remember(latest)
        return _Again(latest)
    wrote = frozenset(new_objects(state.conn.base, txn, parent)) if flags.owns_data else frozenset()
    try:
        committed: Committed = yield Commit(txn, ctx.meanwhile or parent, options)
    except CommitStateUnknownError as unknown:
        # Our files may be referenced by a version that landed: kept, and said so.
        yield _release(state, txn, args, flags, wrote, unknown)
        raise
    except KeyAlreadyCommittedError as taken:
        # Deduplicated, but the key's version is gone (cleanup): whether it refers to
        # our files cannot be read, so they are kept (gc removes them if unreferenced).
        log.info("%s: %s", state.uri, taken)
        return CommitResult(taken.version, deduplicated=True, attempts=1, plans=plans)
    except ExpectedVersionMismatchError:
        if not (creating and args.expected_version is None and flags.reusable):
            yield Discard(wrote)
            raise
        if flags.on_exists != "append":
            yield Discard(wrote)
            latest = yield LoadLatest()
            raise TableExistsError(state.uri, latest.version if latest else 1) from None
        log.info("%s: another writer created the table first; appending", state.uri)
        latest = yield LoadLatest()
        state.remember(latest)
        return _Again(latest)
    except RetryableConflictError as conflict:
        if not should_replan(conflict, args, flags.replannable, plans):
            yield Discard(wrote)
            raise
        if not flags.reusable:
            yield Discard(wrote)
        log.info("%s: %s; planning again on the latest version", state.uri, conflict)
        latest = yield LoadLatest()
        state.remember(latest)
        return _Again(latest)
    except BaseException as error:
        # Refused or never sent (an error of ours): deleted. A KeyboardInterrupt, a
        # cancellation or a bug may have stopped us with the claim in flight: kept.
        yield _release(state, txn, args, flags, wrote, error)
        raise
    # Deduplicated (an earlier commit holds the key) or rebased: what the committed
    # version does not reference is ours alone.
    leftovers = wrote - objects_of(state.conn.base, committed.transaction)
    if leftovers:
        yield Discard(leftovers)
    state.remember(committed)
    return committed


def _release(
    state: TableState,
    txn: Transaction,
    args: CommitArgs,
    flags: VerbFlags,
    wrote: frozenset[str],
    error: BaseException,
) -> Discard:
    callers = 0 if flags.owns_data else len(objects_of(state.conn.base, txn))
    return Discard(wrote, error, claim_of(state, txn, args), callers)


def _follow_up(
    plan: Plan, committed: Committed, args: CommitArgs
) -> tuple[Plan, CommitArgs] | None:
    then = getattr(plan, "then", None)
    if then is None or getattr(committed, "deduplicated", False):
        return None
    nxt: Plan | None = then(Parent(committed.location, committed.manifest))
    if nxt is None:
        return None
    # Same message and properties; the key belongs to the first commit only.
    return nxt, dataclasses.replace(args, idempotency_key=None, expected_version=None)


def run_verb(state: TableState, plan: Plan, args: CommitArgs, flags: VerbFlags) -> CommitResult:
    """Plan and commit one verb (see the module docstring), synchronously."""
    conn = state.conn

    def perform(effect: Effect) -> Any:
        if isinstance(effect, FindKey):
            return state.find_idempotency_key(effect.key, since=effect.since)
        if isinstance(effect, LoadLatest):
            return load_parent(conn.handler, conn.base)
        if isinstance(effect, RunPlan):
            return run_plan(effect)
        if isinstance(effect, Commit):
            return commit_transaction(
                conn.handler, conn.base, effect.txn, parent=effect.parent, options=effect.options
            )
        discard(
            conn.handler.store,
            effect.keys,
            effect.error,
            claim=effect.claim,
            callers=effect.callers,
        )
        return None

    # BaseException: thrown into the steps, which decide (an interrupt keeps the files).
    result: CommitResult = drive(
        verb_steps(state, plan, args, flags), perform, passes=BaseException
    )
    return result


def result_of(committed: Committed, plans: int) -> CommitResult:
    return CommitResult(
        committed.version,
        deduplicated=bool(getattr(committed, "deduplicated", False)),
        attempts=committed.attempts,
        plans=plans,
    )


__all__ = [
    "MAX_REPLANS",
    "CommitArgs",
    "CommitResult",
    "NothingToDo",
    "Plan",
    "PlanContext",
    "VerbFlags",
    "claim_of",
    "discard",
    "new_objects",
    "objects_of",
    "run_plan",
    "run_verb",
    "verb_steps",
]
