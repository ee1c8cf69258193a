"""The commit-handler interface: how one version is claimed atomically.

The engine (manifest building, conflict resolution, the retry loop) is written
once against :class:`CommitHandler`. Implementations differ only in how they
make "version N now exists" atomic: rename-if-not-exists on local disk, a
conditional PUT on S3 that supports it, or a conditional PutItem in DynamoDB
(``lancetx.externalstore``) for stores that do not.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.manifest import (
    ManifestFile,
    check_reader_flags,
    decode_manifest,
    read_manifest_at,
    read_manifest_bulk_async,
)
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.handlers.queue import AsyncCommitQueue, CommitQueue
from lancetx.commit.storage.limits import MANIFEST, read_capped_async
from lancetx.commit.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    # Only for annotations: the sync import graph never imports aioboto3.
    from lancetx.commit.storage.s3store_async import AsyncObjectStore


class CommitHandler(abc.ABC):
    """Resolves manifest locations and claims new versions for tables in one object store.

    ``base`` arguments are table base keys inside ``store`` (see
    :mod:`lancetx.commit.storage.objectstore`).
    """

    store: ObjectStore
    #: The tables' commit queue, when the handler keeps one (see
    #: :mod:`lancetx.commit.handlers.queue`); None: writers under contention back
    #: off at random instead.
    queue: CommitQueue | None = None
    #: Whether :meth:`commit` claims a summary's idempotency key with the version
    #: (refusing a key committed before, at any distance: KeyAlreadyCommittedError)
    #: and :meth:`find_key` reads it back. Without, a key is found by reading the
    #: history before the claim and by the commit loop after it.
    claims_keys: bool = False

    @abc.abstractmethod
    def resolve_latest(self, base: str) -> ManifestLocation | None:
        """The newest committed version, or None if the table has none."""

    @abc.abstractmethod
    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """The location of ``version``. Raises VersionNotFoundError."""

    @abc.abstractmethod
    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """Committed versions greater than ``since``, ascending."""

    @abc.abstractmethod
    def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        """Make ``manifest`` (already encoding ``version``) the manifest of
        ``version``, atomically. Raises VersionAlreadyExistsError if another
        writer holds ``version``; CommitStateUnknownError if that cannot be told.
        ``summary`` is the transaction in brief; a handler whose store can keep
        it next to the claim does (later :meth:`list_versions` return it), so
        concurrent writers can often judge conflicts without reading manifests;
        a handler with a :attr:`queue` records the summary's ``ticket`` with the
        claim, which serves it (see :mod:`lancetx.commit.handlers.queue`).
        A handler that :attr:`claims_keys` raises KeyAlreadyCommittedError when the
        summary's idempotency key was committed before."""

    def find_key(self, base: str, key: str) -> int | None:
        """The version idempotency ``key`` was committed as, by the handler's own
        record of keys (see :attr:`claims_keys`); None when it has none for ``key``."""
        del base, key
        return None

    def read_manifest(
        self, base: str, location: ManifestLocation, *, bulk: bool = False
    ) -> ManifestFile:
        """The manifest at ``location`` (one this handler resolved). A handler that
        knows where locations come from may check them and explain failures.
        ``bulk``: one of many reads made together (a catch-up), which the store may
        send its cheaper way (see ``ObjectStore.get_tail_bulk``)."""
        del base
        return read_manifest_at(self.store, location, bulk=bulk)


class AsyncCommitHandler(abc.ABC):
    """The asyncio twin of :class:`CommitHandler`: the same four operations,
    awaitable, over an :class:`~lancetx.commit.storage.s3store_async.AsyncObjectStore`.

    :func:`lancetx.commit.engine.committer.commit_transaction_async` drives the
    same commit loop through it as :func:`commit_transaction` drives through a
    :class:`CommitHandler`.
    """

    store: AsyncObjectStore
    #: See :attr:`CommitHandler.queue`.
    queue: AsyncCommitQueue | None = None
    #: See :attr:`CommitHandler.claims_keys`.
    claims_keys: bool = False

    @abc.abstractmethod
    async def resolve_latest(self, base: str) -> ManifestLocation | None:
        """The newest committed version, or None if the table has none."""

    @abc.abstractmethod
    async def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """The location of ``version``. Raises VersionNotFoundError."""

    @abc.abstractmethod
    async def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """Committed versions greater than ``since``, ascending."""

    @abc.abstractmethod
    async def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        """See :meth:`CommitHandler.commit`."""

    async def find_key(self, base: str, key: str) -> int | None:
        """See :meth:`CommitHandler.find_key`."""
        del base, key
        return None

    async def read_manifest(
        self, base: str, location: ManifestLocation, *, bulk: bool = False
    ) -> ManifestFile:
        """See :meth:`CommitHandler.read_manifest` (default: one GET of the whole file,
        refused before its body is read when it is over the manifest cap)."""
        del base
        if bulk:
            found = await read_manifest_bulk_async(self.store, location.key, location.size)
            if found is not None:
                return found
        try:
            data = await read_capped_async(self.store, location.key, MANIFEST)
            key = location.key
        except ObjectNotFoundError:
            if location.alternate_key is None:
                raise
            data = await read_capped_async(self.store, location.alternate_key, MANIFEST)
            key = location.alternate_key
        manifest = decode_manifest(data, path=self.store.uri(key))
        check_reader_flags(manifest.manifest, self.store.uri(key))
        return manifest
