"""The object-store interface the commit layer is written against.

A store is rooted at a *container* (an S3 bucket, or ``/`` on local disk) and
addresses objects by *key*: a ``/``-separated path inside the container with no
leading slash, the same notion as Rust ``object_store``'s ``Path``. A table at
``s3://bucket/a/t.lance`` therefore lives in the store for ``bucket`` under the
base key ``a/t.lance``; its manifests are ``a/t.lance/_versions/...``. Keys in
this form are what Lance's DynamoDB handler stores, so both sides agree.

Capabilities are explicit so the commit layer can pick a strategy: a store
whose ``conditional_put`` is False (a legacy S3 bucket) must commit through an
external manifest store.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from lancetx.commit.storage.limits import ReadLimits


@dataclass(frozen=True)
class StoreCapabilities:
    """What a store guarantees.

    ``conditional_put``: ``put_if_not_exists`` is atomic (exactly one of N racing
    writers succeeds). ``atomic_rename``: a rename-if-not-exists primitive exists
    (local filesystems). ``lexically_ordered_list``: ``list`` returns keys in
    lexical order, so the newest V2 manifest is the first one listed.
    ``consistent_list``: a listing reflects every completed write (false for
    some legacy S3-compatible stores; such stores must not be listed to find
    the latest version).
    """

    conditional_put: bool
    atomic_rename: bool
    lexically_ordered_list: bool
    consistent_list: bool = True


@dataclass(frozen=True)
class ObjectMeta:
    """Metadata of one object. ``etag`` is None where the store has none."""

    key: str
    size: int
    etag: str | None = None
    last_modified: datetime | None = None


class ObjectStore(abc.ABC):
    """Byte storage addressed by key. Implementations must be thread-safe."""

    capabilities: StoreCapabilities
    #: Caps on objects read whole (:mod:`lancetx.commit.storage.limits`); None: the
    #: environment's or the defaults.
    read_limits: ReadLimits | None = None

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """The full URI of ``key`` (``s3://bucket/key``, ``file:///key``), for messages."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes (fewer if the object is smaller) and the
        object's total size, in one request. Raises ObjectNotFoundError."""

    def get_tail_bulk(self, key: str, length: int) -> tuple[bytes, int] | None:
        """:meth:`get_tail` for one of many reads made together (a writer catching up
        on many versions), sent a cheaper way where the store has one; None when it
        was not read that way (no cheaper way, or any failure): then call
        :meth:`get_tail`, whose answer or error is the definitive one."""
        del key, length
        return None

    @abc.abstractmethod
    def head(self, key: str) -> ObjectMeta:
        """Metadata without the body. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> ObjectMeta:
        """Write (or overwrite) an object."""

    @abc.abstractmethod
    def put_if_not_exists(self, key: str, data: bytes) -> ObjectMeta:
        """Create an object only if ``key`` is absent, atomically.

        Raises ObjectExistsError when it exists, and UnsupportedOperationError
        when ``capabilities.conditional_put`` is False: a store that cannot make
        this atomic must not pretend to.
        """

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> ObjectMeta:
        """Server-side copy, overwriting ``dst``. Raises ObjectNotFoundError if
        ``src`` is absent. Returns the metadata of ``dst`` as far as the copy
        response tells it (size may need a head() on some stores)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete an object; a missing object is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix`` (a directory prefix should end in ``/``)."""

    def list_page(self, prefix: str, start_after: str = "") -> tuple[Sequence[ObjectMeta], bool]:
        """One request of :meth:`list`: the objects under ``prefix`` whose keys sort after
        ``start_after``, in lexical order, as many as one request returns; and whether
        more may follow. This default serves every object at once, from :meth:`list`
        (for stores whose listing is not paged: local disk, test doubles)."""
        found = sorted(
            (meta for meta in self.list(prefix) if meta.key > start_after), key=lambda m: m.key
        )
        return found, False
