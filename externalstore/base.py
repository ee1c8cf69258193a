"""The external manifest store interface: where a version is claimed.

An external manifest store maps ``(base_uri, version)`` to the path of that
version's manifest. Its conditional insert (:meth:`put_if_not_exists`) is the
single point where a version is claimed when the object store cannot do an
atomic conditional PUT. The layout and semantics follow Lance's
``ExternalManifestStore`` (``rust/lance-table/src/io/commit/external_manifest.rs``)
so tables stay readable and writable by pylance through ``s3+ddb://``.

One addition: :attr:`ManifestEntry.commit_token`. A writer picks a UUID, uses it
as the ``-{uuid}`` suffix of its staged manifest name and stores it in the
entry. When a write's outcome is unknown (a timeout, a 5xx after the request
was sent) and the retry finds the version taken, the token tells "that item
is mine" from "another writer won" without guessing (see
:func:`ownership_of`). Lance ignores the extra attribute.

Another addition: **key items**. A commit that carries an idempotency key claims
its version and a key item in one all-or-nothing write
(:meth:`ExternalManifestStore.put_with_key_if_not_exists`), each only if absent: a
second commit with the key is refused by the store itself, at any history length
and under any concurrency, and the refusal names the version the key went to. Key
items live in a partition of their own, ``base_uri`` = the table's ``base_uri`` +
:data:`KEYS_SUFFIX`, keyed by :func:`key_slot` (a 63-bit hash of the key); Lance
and pylance only query their table's own ``base_uri``, so they never see them, and
nothing that removes old versions' items (cleanup) touches them.

All reads are strongly consistent: a read issued after a write returned sees it.
"""

from __future__ import annotations

import abc
import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from lancetx.commit.errors import UnsupportedOperationError
from lancetx.commit.format.location import TransactionSummary
from lancetx.commit.format.naming import MANIFEST_SUFFIX
from lancetx.commit.handlers.queue import Turns

__all__ = [
    "KEYS_SUFFIX",
    "AsyncExternalManifestStore",
    "ExternalManifestStore",
    "KeyRecord",
    "ManifestEntry",
    "Ownership",
    "key_record_of",
    "key_slot",
    "keys_base_uri",
    "ownership_of",
    "pointer_flip_done",
]

#: Appended to a table's ``base_uri`` to name the partition of its key items.
KEYS_SUFFIX = "#lancetx-keys"


@dataclass(frozen=True)
class ManifestEntry:
    """One row of an external manifest store.

    ``base_uri`` is the canonical table key (see :mod:`lancetx.externalstore.dynamodb.uri`);
    ``path`` is the bucket-relative key of the manifest, either staged
    (``…/_versions/{name}.manifest-{uuid}``) or final (``….manifest``).
    ``size`` and ``e_tag`` describe the manifest object when known.
    ``committer`` names the writing software (Lance writes ``"lancedb"``).
    ``commit_token`` is the UUID of the writer's staged manifest (lancetx only).
    ``bucket`` is the bucket the manifest lives in (lancetx only): Lance's key
    omits it, so it tells two buckets' tables at the same path apart.
    ``summary`` is the claimed version's transaction in brief (lancetx only):
    a concurrent writer judges most conflicts from it without reading the
    manifest (see :class:`~lancetx.commit.format.location.TransactionSummary`).
    ``removed_at`` (lancetx only) marks the item of a version whose manifest a
    cleanup removed (epoch milliseconds): the item stays as a fence, and the mark
    tells every reader the version is gone on purpose, wherever it lies (a
    tagged version a cleanup kept below it may lose its tag later).
    """

    base_uri: str
    version: int
    path: str
    size: int | None = None
    e_tag: str | None = None
    committer: str | None = None
    commit_token: str | None = None
    bucket: str | None = None
    summary: TransactionSummary | None = None
    removed_at: int | None = None
    #: lancetx only, on a staged entry claimed from the commit queue: the staged
    #: manifest, packed (:func:`~lancetx.commit.format.location.pack_handover`), so
    #: that the next writer in the queue builds on it without reading the object.
    #: Dropped when the entry is pointed at the final manifest.
    handover: bytes | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.base_uri:
            raise ValueError(
                "ManifestEntry.base_uri must not be empty (DynamoDB rejects empty keys)"
            )
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError(
                f"ManifestEntry.version must be a non-negative int, got {self.version!r}"
            )
        if not self.path:
            raise ValueError("ManifestEntry.path must not be empty")
        if self.size is not None and self.size < 0:
            raise ValueError(f"ManifestEntry.size must be >= 0, got {self.size}")

    @property
    def is_staged(self) -> bool:
        """True while the entry points at a staged manifest (Lance's test: the
        path's extension is not exactly ``manifest``), i.e. the copy to the
        final name and the pointer flip have not both happened yet."""
        return not self.path.endswith(MANIFEST_SUFFIX)

    @property
    def is_removed(self) -> bool:
        """True when a cleanup marked this item's version removed (see ``removed_at``)."""
        return self.removed_at is not None


def keys_base_uri(base_uri: str) -> str:
    """The partition holding the key items of the table at ``base_uri``."""
    return base_uri + KEYS_SUFFIX


def key_slot(key: str) -> int:
    """Where ``key``'s item lives in its table's key partition: the first 63 bits of
    the key's SHA-256 (a number every DynamoDB client and int64 parser reads exactly).
    Two keys may share a slot; the item holds its key, so a reader tells them apart."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class KeyRecord:
    """A key item: idempotency ``key`` was committed to the table at ``base_uri`` as
    ``version``, by transaction ``transaction_uuid`` (whose staged manifest carried
    ``commit_token``: the claim's own mark, as in :class:`ManifestEntry`)."""

    base_uri: str
    key: str
    version: int
    transaction_uuid: str | None = None
    commit_token: str | None = None

    def __post_init__(self) -> None:
        if not self.base_uri:
            raise ValueError("KeyRecord.base_uri must not be empty")
        if not self.key:
            raise ValueError("KeyRecord.key must not be empty")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"KeyRecord.version must be a non-negative int, got {self.version!r}")

    @property
    def slot(self) -> int:
        return key_slot(self.key)


def key_record_of(entry: ManifestEntry) -> KeyRecord | None:
    """The key item a claim of ``entry`` writes beside it: one when the claimed
    transaction carries an idempotency key (its summary says), else None."""
    summary = entry.summary
    if summary is None or not summary.idempotency_key:
        return None
    return KeyRecord(
        base_uri=entry.base_uri,
        key=summary.idempotency_key,
        version=entry.version,
        transaction_uuid=summary.uuid,
        commit_token=entry.commit_token,
    )


class Ownership(enum.Enum):
    """Whose is an existing entry, relative to an entry we tried to insert."""

    MINE = "mine"
    THEIRS = "theirs"
    UNKNOWN = "unknown"


def ownership_of(existing: ManifestEntry, attempted: ManifestEntry) -> Ownership:
    """Decide whether ``existing`` (found at ``attempted``'s key) is ``attempted``.

    * both carry a commit token: equal tokens mean MINE, different THEIRS;
    * the same path: MINE (a staged path embeds a UUID; a final path is the
      same pointer whoever wrote it, as in Lance's onboarding backfill);
    * ``existing`` is a different staged path: THEIRS (another UUID);
    * ``existing`` is a final path without a token: UNKNOWN. A finalizer that
      does not know tokens (pylance) rewrites the item without one, so our own
      commit, already finalized, looks like this. Only the manifest's content
      (its transaction UUID) can settle it, and only if one of our attempts
      may have landed; otherwise the caller treats it as THEIRS.
    """
    if existing.commit_token is not None and attempted.commit_token is not None:
        return (
            Ownership.MINE if existing.commit_token == attempted.commit_token else Ownership.THEIRS
        )
    if existing.path == attempted.path:
        return Ownership.MINE
    if existing.is_staged:
        return Ownership.THEIRS
    return Ownership.UNKNOWN


def pointer_flip_done(existing: ManifestEntry, attempted: ManifestEntry) -> bool:
    """Whether a pointer flip to ``attempted`` already happened (so repeating
    it, e.g. by a second finalizer or our own retry, is a no-op success)."""
    return existing.path == attempted.path


class ExternalManifestStore(abc.ABC):
    """A synchronous external manifest store. Implementations are thread-safe.

    Errors are :class:`lancetx.externalstore.errors.ExternalStoreError`
    subclasses; each names the failing action and resource.
    """

    @abc.abstractmethod
    def get(self, base_uri: str, version: int) -> ManifestEntry:
        """The entry of ``version``. Raises ``EntryNotFoundError``."""

    @abc.abstractmethod
    def latest(self, base_uri: str) -> ManifestEntry | None:
        """The entry with the highest version, or None if the table has none."""

    def get_entries(self, base_uri: str, versions: Sequence[int]) -> list[ManifestEntry]:
        """The entries of ``versions`` that exist, ascending: consistent point reads,
        whose cost does not grow with the table's history (the commit queue's waiters
        look at the versions they expect next this way). DynamoDB reads them in one
        ``GetItem`` or ``BatchGetItem``; by default they are taken from
        :meth:`list_entries` (a store without point reads lists, as before)."""
        wanted = set(versions)
        if not wanted:
            return []
        return [e for e in self.list_entries(base_uri, min(wanted) - 1) if e.version in wanted]

    @abc.abstractmethod
    def put_if_not_exists(self, entry: ManifestEntry) -> None:
        """Claim ``entry.version``: insert only if no entry exists for the key.

        Returns normally when the insert happened, or when the existing entry is
        this very write (same commit token or path: a retried request whose
        first attempt landed). Raises ``EntryExistsError`` carrying the existing
        entry when another writer holds the version, and ``AmbiguousWriteError``
        when the outcome cannot be told.
        """

    #: Whether this store keeps key items (:meth:`put_with_key_if_not_exists` claims
    #: the key with the version, :meth:`get_key` reads it back).
    keeps_keys: bool = False

    #: The most versions :meth:`put_all_if_not_exists` claims at once (None: no limit).
    max_claim_entries: int | None = None

    def put_with_key_if_not_exists(self, entry: ManifestEntry, key: KeyRecord) -> None:
        """Claim ``entry.version`` and ``key`` at once, all or nothing: each is
        inserted only if absent (the key at its :func:`key_slot` in the table's key
        partition).

        Returns normally when both were inserted, or when either found is this very
        write (same commit token: a retried request whose first attempt landed).
        Raises ``KeyExistsError`` carrying the key item found when the key is
        taken (whatever the version's fate: nothing was written), ``EntryExistsError``
        when only the version is taken (then the key item provably does not exist,
        so no attempt of ours landed), ``AmbiguousWriteError`` when the outcome
        cannot be told.

        A store without key items (:attr:`keeps_keys` False) claims the version
        only: then a key is checked by reading the history before the claim and
        by the commit loop after it.
        """
        self.put_if_not_exists(entry)

    def get_key(self, base_uri: str, key: str) -> KeyRecord | None:
        """The key item of ``key`` in the table at ``base_uri`` (a consistent read),
        or None. Raises ``IdempotencyKeyCollisionError`` when ``key``'s slot holds
        another key's item. A store without key items returns None."""
        del base_uri, key
        return None

    def put_all_if_not_exists(
        self, entries: Sequence[ManifestEntry], *, request_token: str
    ) -> None:
        """Claim every entry's version at once, all or nothing (a multi-table commit).

        Each entry is inserted only if no entry exists for its key, and either
        every insert happens or none does. ``request_token`` identifies this
        request across retries (DynamoDB's ``ClientRequestToken``), so a retry
        of a request that landed is recognised. Raises ``BatchEntryExistsError``
        when a version is held, ``AmbiguousWriteError`` when the outcome
        cannot be told, and ``UnsupportedOperationError`` for a store that
        cannot write several entries atomically.
        """
        raise UnsupportedOperationError(
            "put_all_if_not_exists",
            type(self).__name__,
            "this external store cannot claim several versions atomically; use a DynamoDB "
            "manifest store (s3+ddb://) for a multi-table commit",
        )

    @abc.abstractmethod
    def put_if_exists(
        self, entry: ManifestEntry, *, expected_path: str | None = None
    ) -> ManifestEntry | None:
        """Replace an existing entry (the pointer flip from staged to final path).

        With ``expected_path`` the replacement happens only while the entry
        still points there, so a flip never clobbers a different commit. If the
        entry already points at ``entry.path`` this is a no-op success that
        returns the entry as found (another finalizer's: it may lack attributes
        ``entry`` has); otherwise None. Raises ``EntryNotFoundError`` if there
        is no entry and ``EntryMismatchError`` if it points elsewhere.
        """

    @abc.abstractmethod
    def list_entries(self, base_uri: str, since: int = 0) -> list[ManifestEntry]:
        """All entries with ``version > since``, ascending by version."""

    @abc.abstractmethod
    def delete_all(self, base_uri: str) -> None:
        """Delete every entry of ``base_uri`` and its key items (used when a table is
        dropped: a table written again at the path must not find the old one's keys)."""

    # The commit queue (optional; see :mod:`lancetx.externalstore.dynamodb.commit_queue`).
    # A store without one raises UnsupportedOperationError, and writers back off
    # at random instead.

    def take_ticket(self, base_uri: str) -> Turns:
        """Join ``base_uri``'s commit queue: the queue with our ticket as ``issued``."""
        raise UnsupportedOperationError(
            "commit queue", type(self).__name__, "this external store keeps no commit queue"
        )

    def read_turns(self, base_uri: str) -> Turns:
        """``base_uri``'s commit queue as it stands."""
        raise UnsupportedOperationError(
            "commit queue", type(self).__name__, "this external store keeps no commit queue"
        )

    def end_turn(self, base_uri: str, ticket: int, version: int | None = None) -> None:
        """Serve ``ticket`` (whose holder claimed ``version``, if it did): raise the
        queue's ``served`` mark to it (never lower it)."""
        raise UnsupportedOperationError(
            "commit queue", type(self).__name__, "this external store keeps no commit queue"
        )


class AsyncExternalManifestStore(abc.ABC):
    """The asyncio twin of :class:`ExternalManifestStore`; same semantics."""

    @abc.abstractmethod
    async def get(self, base_uri: str, version: int) -> ManifestEntry:
        """See :meth:`ExternalManifestStore.get`."""

    @abc.abstractmethod
    async def latest(self, base_uri: str) -> ManifestEntry | None:
        """See :meth:`ExternalManifestStore.latest`."""

    async def get_entries(self, base_uri: str, versions: Sequence[int]) -> list[ManifestEntry]:
        """See :meth:`ExternalManifestStore.get_entries`."""
        wanted = set(versions)
        if not wanted:
            return []
        listed = await self.list_entries(base_uri, min(wanted) - 1)
        return [e for e in listed if e.version in wanted]

    @abc.abstractmethod
    async def put_if_not_exists(self, entry: ManifestEntry) -> None:
        """See :meth:`ExternalManifestStore.put_if_not_exists`."""

    #: See :attr:`ExternalManifestStore.keeps_keys`.
    keeps_keys: bool = False

    #: See :attr:`ExternalManifestStore.max_claim_entries`.
    max_claim_entries: int | None = None

    async def put_with_key_if_not_exists(self, entry: ManifestEntry, key: KeyRecord) -> None:
        """See :meth:`ExternalManifestStore.put_with_key_if_not_exists`."""
        await self.put_if_not_exists(entry)

    async def get_key(self, base_uri: str, key: str) -> KeyRecord | None:
        """See :meth:`ExternalManifestStore.get_key`."""
        del base_uri, key
        return None

    async def put_all_if_not_exists(
        self, entries: Sequence[ManifestEntry], *, request_token: str
    ) -> None:
        """See :meth:`ExternalManifestStore.put_all_if_not_exists`."""
        raise UnsupportedOperationError(
            "put_all_if_not_exists",
            type(self).__name__,
            "this external store cannot claim several versions atomically; use a DynamoDB "
            "manifest store (s3+ddb://) for a multi-table commit",
        )

    @abc.abstractmethod
    async def put_if_exists(
        self, entry: ManifestEntry, *, expected_path: str | None = None
    ) -> ManifestEntry | None:
        """See :meth:`ExternalManifestStore.put_if_exists`."""

    @abc.abstractmethod
    async def list_entries(self, base_uri: str, since: int = 0) -> list[ManifestEntry]:
        """See :meth:`ExternalManifestStore.list_entries`."""

    @abc.abstractmethod
    async def delete_all(self, base_uri: str) -> None:
        """See :meth:`ExternalManifestStore.delete_all`."""

    async def take_ticket(self, base_uri: str) -> Turns:
        """See :meth:`ExternalManifestStore.take_ticket`."""
        raise UnsupportedOperationError(
            "commit queue", type(self).__name__, "this external store keeps no commit queue"
        )

    async def read_turns(self, base_uri: str) -> Turns:
        """See :meth:`ExternalManifestStore.read_turns`."""
        raise UnsupportedOperationError(
            "commit queue", type(self).__name__, "this external store keeps no commit queue"
        )

    async def end_turn(self, base_uri: str, ticket: int, version: int | None = None) -> None:
        """See :meth:`ExternalManifestStore.end_turn`."""
        raise UnsupportedOperationError(
            "commit queue", type(self).__name__, "this external store keeps no commit queue"
        )
