"""Commit handlers that claim versions through an external manifest store.

:class:`ExternalStoreCommitHandler` is the engine's :class:`CommitHandler` for
object stores without a trustworthy conditional PUT: the conditional insert in
the external store (DynamoDB) is the only linearization point.
:class:`AsyncExternalStoreCommitHandler` is its asyncio twin (aioboto3).

Both are thin: every method builds the steps of
:mod:`lancetx.externalstore.protocol` and drives them, the sync handler with
:func:`~lancetx.externalstore.protocol.run`, the async one with
:func:`~lancetx.externalstore.protocol.run_async`. That includes what involves
the object store's history: tables that have manifests but no entries yet
(written before DynamoDB, or by plain pylance) open through the listing, their
older versions are recorded when read, and the first commit through the store
continues their history.

Versions committed since a read version come from the external store (one
Query), not from listing the bucket: a legacy store's listing may be stale.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from lancetx.commit.errors import (
    LancetxError,
    ManifestFormatError,
    ObjectNotFoundError,
    UnsupportedOperationError,
)
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.manifest import (
    ManifestFile,
    check_reader_flags,
    decode_manifest,
    read_manifest_at,
    read_manifest_bulk_async,
)
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler
from lancetx.commit.handlers.queue import AsyncCommitQueue, CommitQueue, Turns
from lancetx.commit.storage.limits import MANIFEST, read_capped_async
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.externalstore.base import AsyncExternalManifestStore, ExternalManifestStore
from lancetx.externalstore.errors import AccessDeniedError, BadEntryError
from lancetx.externalstore.identity import (
    bucket_of,
    check_manifest,
    explain_unreadable_steps,
    guard_bucket,
)
from lancetx.externalstore.preflight import Preflight
from lancetx.externalstore.protocol import (
    COMMITTER,
    ONBOARD_PROBE_LIMIT,
    CommitOutcome,
    Steps,
    StoreInfo,
    Table,
    commit_steps,
    find_key_steps,
    list_versions_steps,
    look_steps,
    onboard_steps,
    resolve_latest_steps,
    resolve_version_steps,
    run,
    run_async,
)
from lancetx.externalstore.wedged import explain_wedge, table_uri

if TYPE_CHECKING:  # aioboto3 costs ~0.6 s to import; sync callers never need it
    from lancetx.commit.storage.s3store_async import AsyncObjectStore

__all__ = [
    "ONBOARD_PROBE_LIMIT",
    "AsyncExternalStoreCommitHandler",
    "AsyncStoreCommitQueue",
    "ExternalStoreCommitHandler",
    "StoreCommitQueue",
]

T = TypeVar("T")

log = logging.getLogger(__name__)


class _QueueFailures:
    """Whether a handler still uses its store's commit queue. The queue only
    orders writers; when it fails, writers fall back to random backoff, so its
    errors are logged (once per kind), never raised into a commit."""

    def __init__(self, entries: object) -> None:
        self.entries = entries
        self.enabled = True
        self.warned = False
        #: Whether waiters look by point reads (else they list, as before).
        self.looks = True

    def failed(self, exc: Exception, base: str) -> None:
        if isinstance(exc, UnsupportedOperationError):
            self.enabled = False
        elif isinstance(exc, AccessDeniedError):
            self.enabled = False
            log.warning(
                "the commit queue of %s is unusable (%s); writers under contention back off at "
                "random instead. Allow dynamodb:UpdateItem and dynamodb:GetItem on %s "
                "(lancetx-sync iam-policy prints the policy) to let them take turns",
                base,
                exc,
                _dynamodb_table(self.entries) or "the DynamoDB table",
            )
        elif not self.warned:
            self.warned = True
            log.warning("commit queue of %s: %s; backing off at random this time", base, exc)

    def look_failed(self, exc: Exception, base: str) -> None:
        """A look by point reads failed: the waiter lists the versions instead. Where
        the policy denies the reads, looks stay off (one warning): listing is what
        waiters did before they looked this way."""
        if isinstance(exc, (AccessDeniedError, UnsupportedOperationError)):
            if self.looks:
                log.warning(
                    "waiters in the commit queue of %s list the table's versions at each "
                    "look (%s); allow dynamodb:BatchGetItem on %s (lancetx-sync iam-policy "
                    "prints the policy) to let them read only the versions they expect",
                    base,
                    exc,
                    _dynamodb_table(self.entries) or "the DynamoDB table",
                )
            self.looks = False
        else:
            log.debug("commit queue of %s: a look failed (%s); listing instead", base, exc)


class StoreCommitQueue(_QueueFailures, CommitQueue):
    """The commit queue an external store keeps (DynamoDB: one item per table), as
    the :attr:`~ExternalStoreCommitHandler.queue` of its handler. Answers None
    (and stops asking) when the store keeps no queue or may not be asked.

    ``look``: the handler's point reads of the claims after a version (see
    :func:`~lancetx.externalstore.protocol.look_steps`), run with its checks."""

    def __init__(
        self,
        entries: ExternalManifestStore,
        look: Callable[[str, int, int], list[ManifestLocation]] | None = None,
    ) -> None:
        super().__init__(entries)
        self.store = entries
        self._look = look

    def _call(self, fn: Callable[[], T], base: str) -> T | None:
        if not self.enabled:
            return None
        try:
            return fn()
        except LancetxError as exc:
            self.failed(exc, base)
            return None

    def take_ticket(self, base: str) -> Turns | None:
        """Join the table's commit queue in the external store (None if it keeps none)."""
        return self._call(lambda: self.store.take_ticket(base), base)

    def read_turns(self, base: str) -> Turns | None:
        return self._call(lambda: self.store.read_turns(base), base)

    def end_turn(self, base: str, ticket: int, version: int | None = None) -> None:
        self._call(lambda: self.store.end_turn(base, ticket, version), base)

    def look(self, base: str, since: int, count: int) -> list[ManifestLocation] | None:
        """See :meth:`CommitQueue.look`. A look that fails answers None (the waiter
        lists instead, which raises what a listing raises); a policy denying the
        point reads (``dynamodb:BatchGetItem``) turns looks off for this handler."""
        if self._look is None or not self.looks:
            return None
        try:
            return self._look(base, since, count)
        except LancetxError as exc:
            self.look_failed(exc, base)
            return None


class AsyncStoreCommitQueue(_QueueFailures, AsyncCommitQueue):
    """The asyncio twin of :class:`StoreCommitQueue`."""

    def __init__(
        self,
        entries: AsyncExternalManifestStore,
        look: Callable[[str, int, int], Awaitable[list[ManifestLocation]]] | None = None,
    ) -> None:
        super().__init__(entries)
        self.store = entries
        self._look = look

    async def _call(self, fn: Callable[[], Awaitable[T]], base: str) -> T | None:
        if not self.enabled:
            return None
        try:
            return await fn()
        except LancetxError as exc:
            self.failed(exc, base)
            return None

    async def take_ticket(self, base: str) -> Turns | None:
        """See :meth:`StoreCommitQueue.take_ticket`."""
        return await self._call(lambda: self.store.take_ticket(base), base)

    async def read_turns(self, base: str) -> Turns | None:
        return await self._call(lambda: self.store.read_turns(base), base)

    async def end_turn(self, base: str, ticket: int, version: int | None = None) -> None:
        await self._call(lambda: self.store.end_turn(base, ticket, version), base)

    async def look(self, base: str, since: int, count: int) -> list[ManifestLocation] | None:
        """See :meth:`StoreCommitQueue.look`."""
        if self._look is None or not self.looks:
            return None
        try:
            return await self._look(base, since, count)
        except LancetxError as exc:
            self.look_failed(exc, base)
            return None


def _handed_over(store: StoreInfo, location: ManifestLocation) -> ManifestFile | None:
    """The manifest its claim carried in its entry (a claim from the commit queue
    hands it to the next writer, see :func:`~lancetx.commit.format.location.pack_handover`),
    decoded and checked like one read from ``location.key``; None without one (or
    when it does not decode: the object is read then)."""
    data = location.handed_over()
    if data is None:
        return None
    path = store.uri(location.key)
    try:
        manifest = decode_manifest(data, path=path)
    except ManifestFormatError:
        return None
    check_reader_flags(manifest.manifest, path)
    return manifest


def _table(base: str) -> Table:
    # Lance's convention: the external store's base_uri is the path inside the bucket.
    return Table(base_uri=base, base_key=base)


def _dynamodb_table(entries: object) -> str | None:
    name = getattr(entries, "table_name", None)
    return name if isinstance(name, str) else None


def _explained(steps: Steps[T], base: str, store: StoreInfo, entries: object) -> Steps[T]:
    """``steps`` stamping and checking the bucket of items (see :mod:`.identity`), with a
    wedged version reported as such (see :mod:`.wedged`)."""
    ddb_table = _dynamodb_table(entries)
    uri = table_uri(store.uri(base), ddb_table)
    bucket = bucket_of(store)
    table = _table(base)
    guarded = guard_bucket(steps, table, bucket, dynamodb_table=ddb_table)
    explained = explain_wedge(guarded, table, uri, dynamodb_table=ddb_table, bucket=bucket)
    return _naming_table(explained, ddb_table)


def _naming_table(steps: Steps[T], ddb_table: str | None) -> Steps[T]:
    """``steps``, with an item the protocol refused named with its DynamoDB table (the
    protocol knows the table's key, not where the items live)."""
    try:
        return (yield from steps)
    except BadEntryError as refused:
        if refused.dynamodb_table is not None or ddb_table is None:
            raise
        raise type(refused)(
            refused.base_uri,
            refused.version,
            refused.path,
            refused.problem,
            dynamodb_table=ddb_table,
        ) from refused


def _stamped(summary: TransactionSummary | None) -> TransactionSummary | None:
    """``summary`` carrying the time of the claim. It tells a writer that lost this
    version whether we claimed while it tried (contention) or before it began (its
    parent was stale), and the writers waiting in the queue how long a turn takes."""
    if summary is None:
        return None
    return dataclasses.replace(summary, claimed_at=time.time())


def handler_commit_steps(
    store: StoreInfo,
    entries: object,
    base: str,
    version: int,
    manifest: bytes,
    scheme: NamingScheme,
    summary: TransactionSummary | None,
    *,
    committer: str = COMMITTER,
) -> Steps[CommitOutcome]:
    """The handler's commit as one piece of steps, as both twins drive it: the ticket
    (``summary``'s, our place in the commit queue) stamped with the claim's time, the
    claim, then the finish (copy, flip, clean up) — with the bucket guard and the
    wedge explanation every handler run has. The fault suite crashes these steps at
    each of their effects."""
    stamped = _stamped(summary)
    steps = commit_steps(
        _table(base), version, scheme, manifest, committer=committer, summary=stamped
    )
    return (yield from _explained(steps, base, store, entries))


class _CommitSteps:
    """The commit both twins drive, defined once (see :func:`handler_commit_steps`)."""

    store: StoreInfo
    entries: object
    committer: str

    def commit_steps(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> Steps[CommitOutcome]:
        """The steps :meth:`commit` drives (see :func:`handler_commit_steps`)."""
        return handler_commit_steps(
            self.store,
            self.entries,
            base,
            version,
            manifest,
            scheme,
            summary,
            committer=self.committer,
        )


class ExternalStoreCommitHandler(_CommitSteps, CommitHandler):
    """Claims versions with a conditional insert into ``entries``; manifests live in ``store``.

    ``base`` arguments are table base keys in ``store``; the external store's
    ``base_uri`` for a table is the same string (Lance's convention: the path
    inside the bucket, see :mod:`lancetx.externalstore.dynamodb.uri`).
    """

    store: ObjectStore
    entries: ExternalManifestStore

    def __init__(
        self,
        store: ObjectStore,
        entries: ExternalManifestStore,
        *,
        committer: str = COMMITTER,
        preflight: Preflight | None = None,
    ) -> None:
        self.store = store
        self.entries = entries
        self.committer = committer
        #: A commit with an idempotency key claims a key item with its version.
        self.claims_keys = entries.keeps_keys
        #: Checks to pass beside the first request (see :mod:`.preflight`).
        self.preflight = preflight
        #: Outcome of the last commit (for callers that want to know about finalization).
        self.last_outcome: CommitOutcome | None = None
        #: The table's commit queue in the external store.
        self.queue: StoreCommitQueue = StoreCommitQueue(entries, self._look)

    def _run(self, steps: Steps[T], base: str) -> T:
        return self._drive(_explained(steps, base, self.store, self.entries))

    def _drive(self, steps: Steps[T], *, write: bool = False) -> T:
        def action() -> T:
            return run(steps, self.store, self.entries)

        if self.preflight is None:
            return action()
        return self.preflight.beside(action, write=write)

    def _look(self, base: str, since: int, count: int) -> list[ManifestLocation]:
        """The commit queue's look (see :func:`protocol.look_steps`), with the
        handler's checks."""
        return self._run(look_steps(_table(base), since, count), base)

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        """The newest version: one consistent Query; finalizes it if still staged.

        A table with no entries is onboarded: its newest manifest is found by
        listing, confirmed by probing the next names (a stale listing must not
        hide a newer version), and recorded in the external store so that every
        later commit is claimed there. See :func:`protocol.resolve_latest_steps`.
        """
        return self._run(
            resolve_latest_steps(_table(base), self.store, committer=self.committer), base
        )

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """``version``'s manifest, finalizing it if staged; falls back to the object store
        for versions committed before the table used the external store, and records
        them. See :func:`protocol.resolve_version_steps`."""
        return self._run(
            resolve_version_steps(_table(base), version, self.store, committer=self.committer), base
        )

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """Committed versions after ``since``, from the external store; versions
        without an entry (pre-onboarding history) come from the listing, and those
        a stale listing misses from a HEAD of their name. See
        :func:`protocol.list_versions_steps`."""
        return self._run(list_versions_steps(_table(base), since, self.store), base)

    def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        """The four-step commit of ``version``; see :func:`protocol.commit_steps`.

        A summary with an idempotency key claims the key's item with the version
        (one TransactWriteItems): a key committed before, however long ago, refuses
        the claim with KeyAlreadyCommittedError naming its version.

        The summary's ``ticket`` (our place in the table's commit queue) is served
        by the claim itself: it is recorded in the claimed entry with the claim's
        time, where the writers waiting behind see it (they watch the table's
        entries). So the next writer starts while this one copies and flips, and
        serving costs no request.
        """
        # A write: the claim waits for the table's checks and runs after them (see
        # Preflight.beside), so finishing a claim that landed is never refused, or
        # its outcome replaced, by a check.
        steps = self.commit_steps(base, version, manifest, scheme, summary)
        outcome = self._drive(steps, write=True)
        self.last_outcome = outcome
        return outcome.location

    def find_key(self, base: str, key: str) -> int | None:
        """The version idempotency ``key`` was committed as, from its key item (one
        GetItem; None without one). Raises IdempotencyKeyCollisionError when the
        key's slot holds another key's item."""
        if not self.claims_keys:
            return None
        found = self._run(find_key_steps(_table(base), key), base)
        return found.version if found is not None else None

    def _onboard(self, base: str) -> ManifestLocation | None:
        """Onboard a table without entries now (see :func:`protocol.onboard_steps`)."""
        return self._run(onboard_steps(_table(base), self.store, committer=self.committer), base)

    def read_manifest(
        self, base: str, location: ManifestLocation, *, bulk: bool = False
    ) -> ManifestFile:
        """The manifest an item points at, refusing what the item cannot vouch for.

        A staged manifest gone meanwhile is finalized (or reported wedged); a
        missing, corrupt, other-version or other-size manifest is a typed error
        naming the item (:mod:`.identity`), or a TableCollisionError when it
        belongs to another bucket's table. Nothing is written or deleted.
        ``bulk``: see :meth:`CommitHandler.read_manifest` (the same checks apply).
        """
        try:
            manifest = _handed_over(self.store, location) or read_manifest_at(
                self.store, location, bulk=bulk
            )
        except ObjectNotFoundError as exc:
            if location.alternate_key is None:
                raise self._explain(base, location, exc) from exc
            # The staged object and its final copy are both gone: finalizing settles it
            # (someone finished meanwhile) or reports the version wedged.
            location = self.resolve_version(base, location.version)
            try:
                manifest = read_manifest_at(self.store, location)
            except (ObjectNotFoundError, ManifestFormatError) as again:
                raise self._explain(base, location, again) from again
        except ManifestFormatError as exc:
            raise self._explain(base, location, exc) from exc
        check_manifest(_table(base), location, manifest, _dynamodb_table(self.entries))
        return manifest

    def _explain(self, base: str, location: ManifestLocation, error: LancetxError) -> LancetxError:
        steps = explain_unreadable_steps(
            _table(base),
            location,
            error,
            bucket_of(self.store),
            _dynamodb_table(self.entries),
        )
        return self._run(steps, base)


class AsyncExternalStoreCommitHandler(_CommitSteps, AsyncCommitHandler):
    """The asyncio twin of :class:`ExternalStoreCommitHandler` (aioboto3): the same
    steps, driven by :func:`~lancetx.externalstore.protocol.run_async`."""

    store: AsyncObjectStore
    entries: AsyncExternalManifestStore

    def __init__(
        self,
        store: AsyncObjectStore,
        entries: AsyncExternalManifestStore,
        *,
        committer: str = COMMITTER,
    ) -> None:
        self.store = store
        self.entries = entries
        self.committer = committer
        self.claims_keys = entries.keeps_keys
        self.last_outcome: CommitOutcome | None = None
        #: See :attr:`ExternalStoreCommitHandler.queue`.
        self.queue: AsyncStoreCommitQueue = AsyncStoreCommitQueue(entries, self._look)

    async def _run(self, steps: Steps[T], base: str) -> T:
        return await self._drive(_explained(steps, base, self.store, self.entries))

    async def _drive(self, steps: Steps[T]) -> T:
        return await run_async(steps, self.store, self.entries)

    async def _look(self, base: str, since: int, count: int) -> list[ManifestLocation]:
        return await self._run(look_steps(_table(base), since, count), base)

    async def resolve_latest(self, base: str) -> ManifestLocation | None:
        """See :meth:`ExternalStoreCommitHandler.resolve_latest`."""
        return await self._run(
            resolve_latest_steps(_table(base), self.store, committer=self.committer), base
        )

    async def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """See :meth:`ExternalStoreCommitHandler.resolve_version`."""
        return await self._run(
            resolve_version_steps(_table(base), version, self.store, committer=self.committer), base
        )

    async def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """See :meth:`ExternalStoreCommitHandler.list_versions`."""
        return await self._run(list_versions_steps(_table(base), since, self.store), base)

    async def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        """See :meth:`ExternalStoreCommitHandler.commit`."""
        steps = self.commit_steps(base, version, manifest, scheme, summary)
        outcome = await self._drive(steps)
        self.last_outcome = outcome
        return outcome.location

    async def find_key(self, base: str, key: str) -> int | None:
        """See :meth:`ExternalStoreCommitHandler.find_key`."""
        if not self.claims_keys:
            return None
        found = await self._run(find_key_steps(_table(base), key), base)
        return found.version if found is not None else None

    async def _onboard(self, base: str) -> ManifestLocation | None:
        """See :meth:`ExternalStoreCommitHandler._onboard`."""
        return await self._run(
            onboard_steps(_table(base), self.store, committer=self.committer), base
        )

    async def read_manifest(
        self, base: str, location: ManifestLocation, *, bulk: bool = False
    ) -> ManifestFile:
        """See :meth:`ExternalStoreCommitHandler.read_manifest` (one GET of the whole file)."""
        try:
            found = _handed_over(self.store, location)
            if found is None and bulk:
                found = await read_manifest_bulk_async(self.store, location.key, location.size)
            manifest = found if found is not None else await self._read(location.key)
        except ObjectNotFoundError as exc:
            if location.alternate_key is None:
                raise await self._explain(base, location, exc) from exc
            location = await self.resolve_version(base, location.version)
            try:
                manifest = await self._read(location.key)
            except (ObjectNotFoundError, ManifestFormatError) as again:
                raise await self._explain(base, location, again) from again
        except ManifestFormatError as exc:
            raise await self._explain(base, location, exc) from exc
        check_manifest(_table(base), location, manifest, _dynamodb_table(self.entries))
        return manifest

    async def _read(self, key: str) -> ManifestFile:
        path = self.store.uri(key)
        manifest = decode_manifest(await read_capped_async(self.store, key, MANIFEST), path=path)
        check_reader_flags(manifest.manifest, path)
        return manifest

    async def _explain(
        self, base: str, location: ManifestLocation, error: LancetxError
    ) -> LancetxError:
        steps = explain_unreadable_steps(
            _table(base),
            location,
            error,
            bucket_of(self.store),
            _dynamodb_table(self.entries),
        )
        return await self._run(steps, base)
