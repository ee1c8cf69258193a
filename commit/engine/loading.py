"""Loading what was committed: a parent to build on, and the versions committed since.

Steps (:mod:`lancetx.commit.engine.effects`) the commit loop
(:mod:`lancetx.commit.engine.committer`) and the queue
(:mod:`lancetx.commit.engine.turns`) run to learn the table's state:

* :func:`load_parent_steps` — the latest version (or a given one) with its manifest;
* :func:`load_newer` — every version committed after a given one, with its
  transaction, loaded in parallel and judged in version order; a version whose
  entry's summary already settles it against ours is not read at all, and a
  transaction loaded before comes from the process cache
  (:mod:`lancetx.commit.engine.txn_cache`);
* :func:`load_key_winner` — the version an idempotency key was committed as.

A version in between that cannot be found or read stops the commit
(InvalidCommitError): ours cannot be checked against it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lancetx.commit.engine import contention
from lancetx.commit.engine.conflicts import compatible_by_kind
from lancetx.commit.engine.effects import (
    Gather,
    GetObject,
    ListVersions,
    Names,
    ReadManifest,
    ResolveVersion,
    Steps,
)
from lancetx.commit.engine.operations import (
    FRAG_REUSE_INDEX_NAME,
    IDEMPOTENCY_KEY,
    OperationKind,
    Rewrite,
    Transaction,
)
from lancetx.commit.engine.parents import Parent, load_parent_steps
from lancetx.commit.engine.txn_cache import TRANSACTIONS
from lancetx.commit.errors import (
    InvalidCommitError,
    KeyAlreadyCommittedError,
    LancetxError,
    ObjectNotFoundError,
)
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.format.naming import transaction_key
from lancetx.commit.format.transaction_file import decode_transaction
from lancetx.commit.format.versioning import LIBRARY_NAME
from lancetx.commit.storage.limits import TRANSACTION
from lancetx.protos import table_pb2, transaction_pb2

log = logging.getLogger(__name__)

#: How many committed versions are loaded at once while checking conflicts.
LOAD_PARALLELISM = 8

__all__ = [
    "LOAD_PARALLELISM",
    "Loaded",
    "Parent",
    "load_key_winner",
    "load_listed",
    "load_newer",
    "load_parent_steps",
    "newest_parent",
    "read_fragments",
]


@dataclass
class Loaded:
    """A committed version: its transaction, and its manifest when it was read."""

    version: int
    transaction: Transaction
    location: ManifestLocation
    manifest: ManifestFile | None
    #: The library that wrote its manifest (``writer_version.library``), if known.
    writer: str | None = None


def newest_parent(loaded: Sequence[Loaded]) -> Parent:
    """The newest of ``loaded`` as a parent (the newest is always read in full)."""
    newest = loaded[-1]
    assert newest.manifest is not None  # the newest is always read in full
    return Parent(newest.location, newest.manifest)


def read_fragments(
    names: Names, base: str, ours: Transaction, current: Parent
) -> Steps[dict[int, table_pb2.DataFragment]]:
    """The fragments ours modifies as they were at its read version."""
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


def load_newer(
    names: Names,
    base: str,
    since: int,
    known: Parent | None = None,
    ours: Transaction | None = None,
    until: int | None = None,
) -> Steps[list[Loaded]]:
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
    return (yield from load_listed(names, base, since, locations, known, ours, until))


def load_listed(
    names: Names,
    base: str,
    since: int,
    locations: list[ManifestLocation],
    known: Parent | None = None,
    ours: Transaction | None = None,
    until: int | None = None,
) -> Steps[list[Loaded]]:
    """:func:`load_newer` for versions already listed."""
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
    wanted = [
        loc
        for loc in locations
        if loc.version == newest or not _settled_by_summary(ours, loc.summary)
    ]
    # Several reads at once (a catch-up): the store may send them its cheaper way.
    bulk = len(wanted) > 1
    loads = [
        _load_one(names, base, loc, need_manifest=loc.version == newest, known=known, bulk=bulk)
        for loc in wanted
    ]
    loaded: list[Loaded] = yield Gather(loads, LOAD_PARALLELISM)
    if any(_outsider(ld) for ld in loaded):
        contention.table_contention(names.uri(base)).outsider(time.monotonic())
    return sorted(loaded, key=lambda item: item.version)


def load_key_winner(
    names: Names, base: str, taken: KeyAlreadyCommittedError, shown: str
) -> Steps[Loaded | None]:
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


def _load_one(
    names: Names,
    base: str,
    location: ManifestLocation,
    *,
    need_manifest: bool,
    known: Parent | None = None,
    bulk: bool = False,
) -> Steps[Loaded]:
    """One committed version's transaction (from the process cache when it was
    loaded before and its manifest is not needed), else from its manifest
    (``known``'s, when that is this version's, else read)."""
    uri = names.uri(base)
    if not need_manifest:
        cached = TRANSACTIONS.get_with_writer(uri, location)
        # A summary-less version is judged by its manifest's writer: a cached
        # transaction that came without it is read again (see _outsider).
        if cached is not None and (location.summary is not None or cached[1] is not None):
            return Loaded(location.version, cached[0], location, None, writer=cached[1])
    try:
        if known is not None and known.location == location:
            manifest = known.manifest
        else:
            manifest = yield ReadManifest(base, location, bulk)
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
    return Loaded(location.version, txn, location, manifest, writer=writer)


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


def _outsider(loaded: Loaded) -> bool:
    """Whether a version was committed by a writer that keeps no queue (pylance): see
    TableContention.queue_fair. Its entry has no summary — but neither has one of
    ours that a pylance reader finalized (its full-item PutItem keeps only Lance's
    attributes), so the manifest's writer decides. Every summary-less version is
    loaded (its summary cannot settle it), so this costs no request."""
    return loaded.location.summary is None and loaded.writer != LIBRARY_NAME


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
