"""The commit loop: check, rebase, build, claim — bounded, for any CommitHandler.

One attempt (Lance's ``commit_transaction``, read top to bottom):

1. Classify ours against every transaction committed after its read version
   (loaded in parallel, judged in version order). Incompatible or retryable →
   a typed error, nothing written. Rebasable → merge (``commit.rebase``).
2. Build the next manifest from the latest one (a transaction the builder
   refuses writes nothing), write our transaction file, encode the manifest
   with the transaction inline.
3. Ask the handler to claim ``latest + 1``. Won → done. Lost → the handler
   names the winner; load what was committed since our latest, and go to 1.

A writer that holds the latest manifest (the one it read, or the one it just
committed) tries ``latest + 1`` straight away: no listing, no extra read. A
lost race says who won, so the loser needs no long sleep: it waits a random
part of one attempt's duration (doubling per further loss), just enough that
the losers of one round do not all collide again in the next.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lancetx.commit.engine.builder import build_manifest
from lancetx.commit.engine.conflicts import ConflictContext, Outcome, RebaseNeeded, classify_all
from lancetx.commit.engine.operations import (
    COMMIT_MESSAGE_KEY,
    FRAG_REUSE_INDEX_NAME,
    Restore,
    Rewrite,
    Transaction,
)
from lancetx.commit.engine.rebase import rebase_transaction
from lancetx.commit.engine.retry import RetryPolicy
from lancetx.commit.errors import (
    ExpectedVersionMismatchError,
    IncompatibleConflictError,
    InvalidCommitError,
    LancetxError,
    ObjectNotFoundError,
    RetriesExhaustedError,
    RetryableConflictError,
)
from lancetx.commit.format.deletion import deletion_file_key
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import (
    ManifestFile,
    check_writer_flags,
    encode_manifest,
)
from lancetx.commit.format.naming import NamingScheme, transaction_key
from lancetx.commit.format.transaction_file import (
    read_transaction_of,
    transaction_file_name,
    write_transaction_file,
)
from lancetx.commit.handlers.interface import (
    CommitHandler,
    CommitStateUnknownError,
    VersionAlreadyExistsError,
)
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import table_pb2

log = logging.getLogger(__name__)

#: How many committed versions are loaded at once while checking conflicts.
LOAD_PARALLELISM = 8


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
    """

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    expected_version: int | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    commit_message: str | None = None
    naming: NamingScheme = NamingScheme.V2
    inline_transaction: bool = True


@dataclass(frozen=True)
class Committed:
    """A committed version: where it is, its manifest, and the transaction as committed
    (after any rebase). Keep it: it is the parent of the next commit, no read needed."""

    location: ManifestLocation
    manifest: ManifestFile
    transaction: Transaction
    attempts: int

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


def load_parent(handler: CommitHandler, base: str, version: int | None = None) -> Parent | None:
    """The latest version (or ``version``), or None for a table with no versions."""
    if version is None:
        location = handler.resolve_latest(base)
        if location is None:
            return None
    else:
        location = handler.resolve_version(base, version)
    return Parent(location, handler.read_manifest(base, location))


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
    options = options or CommitOptions()
    store = handler.store
    uri = store.uri(base)
    ours = _with_properties(transaction, options)
    current = _as_parent(parent) if parent is not None else load_parent(handler, base)
    _validate(uri, ours, current, options)
    restore_source = _restore_source(handler, base, ours)

    # Versions committed between our read version and the parent we hold.
    pending: list[tuple[int, Transaction]] = []
    read_fragments: dict[int, table_pb2.DataFragment] = {}
    if current is not None and current.version > ours.read_version:
        pending = _load_committed(handler, base, ours.read_version, current.version)
    if current is not None and ours.read_version > 0:
        read_fragments = _read_fragments(handler, base, ours, current)

    # Objects this commit wrote that no committed version references yet: removed
    # when the commit fails (or they were superseded by a rebase), so a refused or
    # conflicting transaction leaves nothing behind. Never after an unknown outcome.
    written: list[str] = []
    try:
        committed = _attempts(
            handler, base, ours, current, pending, read_fragments, restore_source, options, written
        )
    except CommitStateUnknownError:
        raise
    except LancetxError:
        _discard(store, written)
        raise
    _discard(store, [k for k in written if k not in _referenced(base, committed.transaction)])
    return committed


def _attempts(
    handler: CommitHandler,
    base: str,
    ours: Transaction,
    current: Parent | None,
    pending: list[tuple[int, Transaction]],
    read_fragments: dict[int, table_pb2.DataFragment],
    restore_source: tuple[table_pb2.Manifest, list[table_pb2.IndexMetadata]] | None,
    options: CommitOptions,
    written: list[str],
) -> Committed:
    """The retry loop of :func:`commit_transaction`; records what it writes in ``written``."""
    store = handler.store
    uri = store.uri(base)
    policy = options.retry
    next_version = 1
    txn_bytes = b""
    for attempt in range(1, policy.max_attempts + 1):
        if pending and current is not None:
            rebased = _check_and_rebase(handler, base, ours, pending, read_fragments, current)
            written.extend(_new_deletion_files(base, ours, rebased))
            if rebased.read_version != ours.read_version:
                # Rebased onto ``current``: that is now what ours read. A later
                # rebase must diff against it, or the rows the winners deleted
                # (now in our merged vectors) would count as ours and overlap.
                wanted = rebased.operation.modified_fragment_ids
                read_fragments = {
                    f.id: f for f in current.manifest.manifest.fragments if f.id in wanted
                }
            ours = rebased
            pending = []
        if current is not None and current.location.alternate_key is not None:
            # The parent is still a staged manifest (its writer crashed or is still
            # finalizing): finish it before claiming on top of it, so the object store
            # never lags more than one commit behind (a reader that does not know the
            # external store, or a copy of the directory, would see a hole otherwise).
            current = Parent(handler.resolve_version(base, current.version), current.manifest)
        next_version = current.version + 1 if current is not None else 1
        started = time.perf_counter()
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
        if txn_pb.SerializeToString() != txn_bytes:  # unchanged after a compatible loss: reuse it
            written.append(transaction_key(base, write_transaction_file(store, base, txn_pb)))
            txn_bytes = txn_pb.SerializeToString()
        # Lance writes an index section only when there are indices.
        indices = list(built.indices) or None
        data = encode_manifest(
            built.manifest,
            indices=indices,
            transaction=txn_pb if options.inline_transaction else None,
        )
        scheme = current.location.scheme if current is not None else options.naming
        try:
            location = handler.commit(base, next_version, data, scheme)
        except CommitStateUnknownError as unknown:
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
        except VersionAlreadyExistsError:
            if options.expected_version is not None:
                raise ExpectedVersionMismatchError(
                    uri, options.expected_version, _latest_version(handler, base, next_version)
                ) from None
            log.debug("lost version %d of %s (attempt %d)", next_version, uri, attempt)
            slot = time.perf_counter() - started
            newer = _load_newer(handler, base, current.version if current is not None else 0)
            if not newer:  # the winner is not visible yet: wait a whole window, then look again
                time.sleep(policy.window(attempt, slot))
                continue
            pending = [(v, t) for v, t, _ in newer]
            current = newer[-1][2]
            time.sleep(policy.delay(attempt, slot))
            continue
        manifest = ManifestFile(
            manifest=built.manifest,
            indices=indices,
            transaction=txn_pb if options.inline_transaction else None,
            footer_major=0,
            footer_minor=2,
            size=len(data),
        )
        return Committed(location, manifest, ours, attempt)
    raise RetriesExhaustedError(uri, ours.uuid, policy.max_attempts, next_version)


# --------------------------------------------------------------------------- pieces


def _latest_version(handler: CommitHandler, base: str, at_least: int) -> int:
    """The table's latest version for an error message (``at_least`` if it cannot be read)."""
    try:
        latest = handler.resolve_latest(base)
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


def _discard(store: ObjectStore, keys: Sequence[str]) -> None:
    for key in keys:
        try:
            store.delete(key)
        except LancetxError as exc:  # an orphan is harmless: nothing references it
            log.warning("could not delete unreferenced %s (%s)", store.uri(key), exc)


def _as_parent(parent: Parent | Committed) -> Parent:
    return parent if isinstance(parent, Parent) else Parent(parent.location, parent.manifest)


def _with_properties(txn: Transaction, options: CommitOptions) -> Transaction:
    if not options.properties and options.commit_message is None:
        return txn
    props = dict(txn.properties)
    props.update(options.properties)
    if options.commit_message is not None:
        props[COMMIT_MESSAGE_KEY] = options.commit_message
    return dataclasses.replace(txn, properties=props)


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
    handler: CommitHandler, base: str, ours: Transaction
) -> tuple[table_pb2.Manifest, list[table_pb2.IndexMetadata]] | None:
    if not isinstance(ours.operation, Restore):
        return None
    source = load_parent(handler, base, ours.operation.version)  # VersionNotFoundError if missing
    assert source is not None
    return source.manifest.manifest, list(source.manifest.indices or [])


def _load_one(
    handler: CommitHandler, base: str, location: ManifestLocation
) -> tuple[int, Transaction, Parent]:
    try:
        manifest = handler.read_manifest(base, location)
    except ObjectNotFoundError:
        raise InvalidCommitError(
            handler.store.uri(base),
            f"the manifest of version {location.version} is gone ({location.key!r}; cleaned up?), "
            "so concurrent commits cannot be checked against it; re-read the table at its "
            "latest version and plan the transaction again",
        ) from None
    pb = read_transaction_of(handler.store, base, manifest)
    if pb is None:
        raise InvalidCommitError(
            handler.store.uri(base),
            f"version {location.version} has no transaction (no inline section and no transaction "
            "file), so concurrent commits cannot be checked against it",
        )
    txn = Transaction.from_proto(pb, source=handler.store.uri(location.key))
    if isinstance(txn.operation, Rewrite):
        # Lance never serializes a rewrite's fragment-reuse index into the
        # transaction; the conflict rules need it, and the version's index
        # section has it.
        reuse = [i for i in manifest.indices or [] if i.name == FRAG_REUSE_INDEX_NAME]
        if reuse:
            txn = dataclasses.replace(
                txn, operation=dataclasses.replace(txn.operation, frag_reuse_index=reuse[0])
            )
    return location.version, txn, Parent(location, manifest)


def _load_newer(
    handler: CommitHandler, base: str, since: int
) -> list[tuple[int, Transaction, Parent]]:
    """Versions committed after ``since``, with their transactions, loaded in parallel.

    Raises InvalidCommitError when a version in between is missing (cleaned up,
    or hidden by a stale listing): ours cannot be checked against it.
    """
    locations = handler.list_versions(base, since)
    if not locations:
        return []
    versions = [loc.version for loc in locations]
    missing = sorted(set(range(since + 1, versions[-1] + 1)) - set(versions))
    if missing:
        raise InvalidCommitError(
            handler.store.uri(base),
            f"version(s) {missing} between {since} and {versions[-1]} cannot be found (cleaned "
            "up, or not listed yet), so concurrent commits cannot be checked against them; "
            "re-read the table at its latest version and plan the transaction again",
        )
    with ThreadPoolExecutor(max_workers=min(LOAD_PARALLELISM, len(locations))) as pool:
        loaded = list(pool.map(lambda loc: _load_one(handler, base, loc), locations))
    return sorted(loaded, key=lambda item: item[0])


def _load_committed(
    handler: CommitHandler, base: str, since: int, until: int
) -> list[tuple[int, Transaction]]:
    loaded = [(v, t) for v, t, _ in _load_newer(handler, base, since) if v <= until]
    if len(loaded) < until - since:  # contiguous from since + 1, but short of ``until``
        missing = list(range(since + 1 + len(loaded), until + 1))
        raise InvalidCommitError(
            handler.store.uri(base),
            f"version(s) {missing} up to the parent {until} are not listed, so concurrent "
            "commits cannot be checked against them; re-read the table and plan again",
        )
    return loaded


def _read_fragments(
    handler: CommitHandler, base: str, ours: Transaction, current: Parent
) -> dict[int, table_pb2.DataFragment]:
    wanted = ours.operation.modified_fragment_ids
    if not wanted:
        return {}
    if current.version == ours.read_version:
        manifest = current.manifest.manifest
    else:
        read = load_parent(handler, base, ours.read_version)
        assert read is not None
        manifest = read.manifest.manifest
    return {f.id: f for f in manifest.fragments if f.id in wanted}


def _check_and_rebase(
    handler: CommitHandler,
    base: str,
    ours: Transaction,
    pending: Sequence[tuple[int, Transaction]],
    read_fragments: Mapping[int, table_pb2.DataFragment],
    latest: Parent,
) -> Transaction:
    uri = handler.store.uri(base)
    stable = bool(latest.manifest.manifest.reader_feature_flags & 2)
    context = ConflictContext(stable_row_ids=stable, read_fragments=read_fragments)
    verdicts = classify_all(ours, pending, context=context)
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
        return rebase_transaction(
            handler.store,
            base,
            ours,
            needed,
            read_fragments=read_fragments,
            latest=latest.manifest.manifest,
            committed_operations={v.committed_version: v.theirs.value for v in verdicts},
        )
    # Compatible with everything: Lance keeps the read version for these
    # (it only names the transaction file); the manifest is built on the latest.
    return ours
