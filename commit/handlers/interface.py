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

from lancetx.commit.errors import CommitError
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    # Only for annotations: the sync import graph never imports aioboto3.
    from lancetx.commit.storage.s3store_async import AsyncObjectStore


class VersionAlreadyExistsError(CommitError):
    """Another writer claimed ``version`` first (the commit loop's signal to rebase).

    ``winner`` is the location the winner committed, when the handler learned it
    without extra requests (for example from a DynamoDB condition failure), so
    the loser can load the winner's transaction at once.
    """

    def __init__(self, uri: str, version: int, winner: ManifestLocation | None = None) -> None:
        self.uri = uri
        self.version = version
        self.winner = winner
        super().__init__(f"version {version} of {uri!r} was committed by another writer")


class CommitStateUnknownError(CommitError):
    """The outcome of a commit request could not be determined (e.g. a timeout
    after the request may have landed). The version may or may not be ours: do
    not retry blindly; re-open the table and check whether the transaction with
    ``transaction_uuid`` is present."""

    def __init__(self, uri: str, version: int, transaction_uuid: str | None, detail: str) -> None:
        self.uri = uri
        self.version = version
        self.transaction_uuid = transaction_uuid
        super().__init__(
            f"outcome of committing version {version} of {uri!r} is unknown ({detail}); "
            f"re-open the table and look for transaction {transaction_uuid} before retrying"
        )


class CommitHandler(abc.ABC):
    """Resolves manifest locations and claims new versions for tables in one object store.

    ``base`` arguments are table base keys inside ``store`` (see
    :mod:`lancetx.commit.storage.objectstore`).
    """

    store: ObjectStore

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
        self, base: str, version: int, manifest: bytes, scheme: NamingScheme
    ) -> ManifestLocation:
        """Make ``manifest`` (already encoding ``version``) the manifest of
        ``version``, atomically. Raises VersionAlreadyExistsError if another
        writer holds ``version``; CommitStateUnknownError if that cannot be told."""


class AsyncCommitHandler(abc.ABC):
    """The asyncio twin of :class:`CommitHandler`: the same four operations,
    awaitable, over an :class:`~lancetx.commit.storage.s3store_async.AsyncObjectStore`.

    :func:`lancetx.commit.engine.committer.commit_transaction_async` drives the
    same commit loop through it as :func:`commit_transaction` drives through a
    :class:`CommitHandler`.
    """

    store: AsyncObjectStore

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
        self, base: str, version: int, manifest: bytes, scheme: NamingScheme
    ) -> ManifestLocation:
        """See :meth:`CommitHandler.commit`."""
