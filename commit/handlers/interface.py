"""The commit-handler interface: how one version is claimed atomically.

The engine (manifest building, conflict resolution, the retry loop) is written
once against :class:`CommitHandler`. Implementations differ only in how they
make "version N now exists" atomic: rename-if-not-exists on local disk, a
conditional PUT on S3 that supports it, or a conditional PutItem in DynamoDB
(``lancetx.externalstore``) for stores that do not.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.manifest import (
    ManifestFile,
    check_reader_flags,
    decode_manifest,
    read_manifest_at,
)
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.limits import MANIFEST, read_capped_async
from lancetx.commit.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    # Only for annotations: the sync import graph never imports aioboto3.
    from lancetx.commit.storage.s3store_async import AsyncObjectStore


@dataclass(frozen=True)
class Turns:
    """A table's commit queue item as last read: how many tickets were handed out
    (``issued``, the newest ticket) and the highest ticket served there
    (``served``: by a holder whose turn ended without a claim; a claim serves
    its ticket in its own entry instead, see :class:`TransactionSummary`). The
    holder of ticket ``t`` is next when every ticket up to ``t - 1`` was served.
    See :mod:`lancetx.commit.engine.contention`."""

    issued: int
    served: int
    #: The version the holder of ticket ``served`` claimed (0 if unknown): the
    #: next holder builds on it or on a later one.
    served_version: int = 0
    #: When ticket ``served`` was served (seconds since the epoch; 0 if unknown):
    #: the turn after it began then.
    served_at: float = 0.0


class CommitHandler(abc.ABC):
    """Resolves manifest locations and claims new versions for tables in one object store.

    ``base`` arguments are table base keys inside ``store`` (see
    :mod:`lancetx.commit.storage.objectstore`).
    """

    store: ObjectStore
    #: Whether :meth:`commit` serves the ``ticket`` it is given (with the claim,
    #: once it is won); the engine serves it after the claim otherwise.
    serves_ticket_on_claim: bool = False
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
        ticket: int | None = None,
    ) -> ManifestLocation:
        """Make ``manifest`` (already encoding ``version``) the manifest of
        ``version``, atomically. Raises VersionAlreadyExistsError if another
        writer holds ``version``; CommitStateUnknownError if that cannot be told.
        ``summary`` is the transaction in brief; a handler whose store can keep
        it next to the claim does (later :meth:`list_versions` return it), so
        concurrent writers can often judge conflicts without reading manifests.
        ``ticket`` is the caller's ticket in the table's commit queue: a handler
        with a queue serves it as soon as the claim is won, before finishing the
        commit, so the next writer in line can start (see :meth:`take_ticket`).
        A handler that :attr:`claims_keys` raises KeyAlreadyCommittedError when the
        summary's idempotency key was committed before."""

    def find_key(self, base: str, key: str) -> int | None:
        """The version idempotency ``key`` was committed as, by the handler's own
        record of keys (see :attr:`claims_keys`); None when it has none for ``key``."""
        del base, key
        return None

    def read_manifest(self, base: str, location: ManifestLocation) -> ManifestFile:
        """The manifest at ``location`` (one this handler resolved). A handler that
        knows where locations come from may check them and explain failures."""
        del base
        return read_manifest_at(self.store, location)

    # A commit queue is optional: writers under contention take a ticket and wait
    # for their turn instead of colliding. A handler without one returns None and
    # the loop backs off at random instead. Advisory only: a version is still
    # claimed by :meth:`commit` alone, and errors here must not fail a commit.

    def take_ticket(self, base: str) -> Turns | None:
        """Join the table's commit queue: the queue with our ticket as ``issued``."""
        del base
        return None

    def read_turns(self, base: str) -> Turns | None:
        """The table's commit queue as it stands."""
        del base
        return None

    def end_turn(self, base: str, ticket: int, version: int | None = None) -> None:
        """Our commit with ``ticket`` ended — won (claiming ``version``), refused or
        given up: the next may go."""
        del base, ticket, version


class AsyncCommitHandler(abc.ABC):
    """The asyncio twin of :class:`CommitHandler`: the same four operations,
    awaitable, over an :class:`~lancetx.commit.storage.s3store_async.AsyncObjectStore`.

    :func:`lancetx.commit.engine.committer.commit_transaction_async` drives the
    same commit loop through it as :func:`commit_transaction` drives through a
    :class:`CommitHandler`.
    """

    store: AsyncObjectStore
    #: See :attr:`CommitHandler.serves_ticket_on_claim`.
    serves_ticket_on_claim: bool = False
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
        ticket: int | None = None,
    ) -> ManifestLocation:
        """See :meth:`CommitHandler.commit`."""

    async def find_key(self, base: str, key: str) -> int | None:
        """See :meth:`CommitHandler.find_key`."""
        del base, key
        return None

    async def take_ticket(self, base: str) -> Turns | None:
        """See :meth:`CommitHandler.take_ticket`."""
        del base
        return None

    async def read_turns(self, base: str) -> Turns | None:
        """See :meth:`CommitHandler.read_turns`."""
        del base
        return None

    async def end_turn(self, base: str, ticket: int, version: int | None = None) -> None:
        """See :meth:`CommitHandler.end_turn`."""
        del base, ticket, version

    async def read_manifest(self, base: str, location: ManifestLocation) -> ManifestFile:
        """See :meth:`CommitHandler.read_manifest` (default: one GET of the whole file,
        refused before its body is read when it is over the manifest cap)."""
        del base
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
