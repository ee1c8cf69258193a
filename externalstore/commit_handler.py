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

from typing import TypeVar

from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.commit.storage.s3store_async import AsyncObjectStore
from lancetx.externalstore.base import AsyncExternalManifestStore, ExternalManifestStore
from lancetx.externalstore.protocol import (
    COMMITTER,
    ONBOARD_PROBE_LIMIT,
    CommitOutcome,
    Steps,
    Table,
    commit_steps,
    list_versions_steps,
    onboard_steps,
    resolve_latest_steps,
    resolve_version_steps,
    run,
    run_async,
)

__all__ = [
    "ONBOARD_PROBE_LIMIT",
    "AsyncExternalStoreCommitHandler",
    "ExternalStoreCommitHandler",
]

T = TypeVar("T")


def _table(base: str) -> Table:
    # Lance's convention: the external store's base_uri is the path inside the bucket.
    return Table(base_uri=base, base_key=base)


class ExternalStoreCommitHandler(CommitHandler):
    """Claims versions with a conditional insert into ``entries``; manifests live in ``store``.

    ``base`` arguments are table base keys in ``store``; the external store's
    ``base_uri`` for a table is the same string (Lance's convention: the path
    inside the bucket, see :mod:`lancetx.externalstore.uri`).
    """

    def __init__(
        self, store: ObjectStore, entries: ExternalManifestStore, *, committer: str = COMMITTER
    ) -> None:
        self.store = store
        self.entries = entries
        self.committer = committer
        #: Outcome of the last commit (for callers that want to know about finalization).
        self.last_outcome: CommitOutcome | None = None

    def _run(self, steps: Steps[T]) -> T:
        return run(steps, self.store, self.entries)

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        """The newest version: one consistent Query; finalizes it if still staged.

        A table with no entries is onboarded: its newest manifest is found by
        listing, confirmed by probing the next names (a stale listing must not
        hide a newer version), and recorded in the external store so that every
        later commit is claimed there. See :func:`protocol.resolve_latest_steps`.
        """
        return self._run(resolve_latest_steps(_table(base), self.store, committer=self.committer))

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """``version``'s manifest, finalizing it if staged; falls back to the object store
        for versions committed before the table used the external store, and records
        them. See :func:`protocol.resolve_version_steps`."""
        return self._run(
            resolve_version_steps(_table(base), version, self.store, committer=self.committer)
        )

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """Committed versions after ``since``, from the external store; versions
        without an entry (pre-onboarding history) come from the listing, and those
        a stale listing misses from a HEAD of their name. See
        :func:`protocol.list_versions_steps`."""
        return self._run(list_versions_steps(_table(base), since, self.store))

    def commit(
        self, base: str, version: int, manifest: bytes, scheme: NamingScheme
    ) -> ManifestLocation:
        """The four-step commit of ``version``; see :func:`protocol.commit_steps`."""
        outcome = self._run(
            commit_steps(_table(base), version, scheme, manifest, committer=self.committer)
        )
        self.last_outcome = outcome
        return outcome.location

    def _onboard(self, base: str) -> ManifestLocation | None:
        """Onboard a table without entries now (see :func:`protocol.onboard_steps`)."""
        return self._run(onboard_steps(_table(base), self.store, committer=self.committer))


class AsyncExternalStoreCommitHandler(AsyncCommitHandler):
    """The asyncio twin of :class:`ExternalStoreCommitHandler` (aioboto3): the same
    steps, driven by :func:`~lancetx.externalstore.protocol.run_async`."""

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
        self.last_outcome: CommitOutcome | None = None

    async def _run(self, steps: Steps[T]) -> T:
        return await run_async(steps, self.store, self.entries)

    async def resolve_latest(self, base: str) -> ManifestLocation | None:
        """See :meth:`ExternalStoreCommitHandler.resolve_latest`."""
        return await self._run(
            resolve_latest_steps(_table(base), self.store, committer=self.committer)
        )

    async def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """See :meth:`ExternalStoreCommitHandler.resolve_version`."""
        return await self._run(
            resolve_version_steps(_table(base), version, self.store, committer=self.committer)
        )

    async def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """See :meth:`ExternalStoreCommitHandler.list_versions`."""
        return await self._run(list_versions_steps(_table(base), since, self.store))

    async def commit(
        self, base: str, version: int, manifest: bytes, scheme: NamingScheme
    ) -> ManifestLocation:
        """See :meth:`ExternalStoreCommitHandler.commit`."""
        outcome = await self._run(
            commit_steps(_table(base), version, scheme, manifest, committer=self.committer)
        )
        self.last_outcome = outcome
        return outcome.location

    async def _onboard(self, base: str) -> ManifestLocation | None:
        """See :meth:`ExternalStoreCommitHandler._onboard`."""
        return await self._run(onboard_steps(_table(base), self.store, committer=self.committer))
