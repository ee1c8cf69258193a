"""A commit handler for stores with an atomic create-if-absent.

Local filesystems (hard-link based ``put_if_not_exists``) and S3 buckets that
honour ``If-None-Match: *`` make "version N exists" atomic by themselves: the
manifest is written straight to its final name and the first writer wins.
Versions are discovered by listing ``_versions/``.

A store declared legacy (``capabilities.conditional_put`` False) is refused:
there, two writers could both "create" the same version, so it must commit
through an external manifest store (``lancetx.externalstore``). A store that
claims conditional PUT but ignores it is caught by a probe before the first
commit (:mod:`lancetx.commit.handlers.probe`).
"""

from __future__ import annotations

from lancetx.commit.errors import (
    CommitStateUnknownError,
    LancetxError,
    ObjectExistsError,
    ObjectNotFoundError,
    TransientObjectStoreError,
    UnsupportedOperationError,
    VersionAlreadyExistsError,
    VersionNotFoundError,
)
from lancetx.commit.format.listing import latest_manifest_location, list_manifest_locations
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme, manifest_key
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.handlers.probe import probe_conditional_put
from lancetx.commit.storage.objectstore import ObjectStore


class ConditionalPutCommitHandler(CommitHandler):
    """Claims a version by creating its final manifest with ``put_if_not_exists``."""

    def __init__(self, store: ObjectStore, *, probe: bool = True) -> None:
        if not store.capabilities.conditional_put:
            raise UnsupportedOperationError(
                "put_if_not_exists",
                store.uri(""),
                "this store cannot create objects atomically (a legacy S3 store), so concurrent "
                "writers could overwrite each other's versions; commit through DynamoDB instead "
                "(s3+ddb://bucket/path?ddbTableName=TABLE, lancetx.externalstore)",
            )
        self.store = store
        #: Check once per process and bucket that the store honours If-None-Match
        #: (see :mod:`lancetx.commit.handlers.probe`) before the first commit.
        self.probe = probe

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        """The newest manifest, by listing ``_versions/``."""
        return latest_manifest_location(self.store, base)

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """``version``'s manifest: a HEAD per naming scheme, newest scheme first."""
        for scheme in (NamingScheme.V2, NamingScheme.V1):
            key = manifest_key(base, version, scheme)
            try:
                meta = self.store.head(key)
            except ObjectNotFoundError:
                continue
            return ManifestLocation(version, key, scheme, size=meta.size, etag=meta.etag)
        raise VersionNotFoundError(self.store.uri(base), version)

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """Versions after ``since``, by listing ``_versions/``."""
        return [loc for loc in list_manifest_locations(self.store, base) if loc.version > since]

    def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        """Create the final manifest of ``version`` if absent (after probing, once per
        process and bucket, that the store does not ignore If-None-Match). The store
        has no place for ``summary``: readers load transactions from manifests."""
        del summary
        if self.probe:
            probe_conditional_put(self.store, base)
        key = manifest_key(base, version, scheme)
        try:
            meta = self.store.put_if_not_exists(key, manifest)
        except ObjectExistsError:
            raise VersionAlreadyExistsError(
                self.store.uri(base), version, winner=ManifestLocation(version, key, scheme)
            ) from None
        except TransientObjectStoreError as unclear:
            # The PUT may have been applied (5xx or timeout after sending): reporting
            # this error would tell the caller "not committed", and a retry would
            # commit the transaction twice. The object, if any, settles it.
            return self._settle(base, version, key, scheme, manifest, unclear)
        return ManifestLocation(version, key, scheme, size=len(manifest), etag=meta.etag)

    def _settle(
        self,
        base: str,
        version: int,
        key: str,
        scheme: NamingScheme,
        manifest: bytes,
        unclear: TransientObjectStoreError,
    ) -> ManifestLocation:
        uri = self.store.uri(base)
        try:
            # At most len(manifest) bytes: a larger object is another writer's anyway.
            tail, total = self.store.get_tail(key, len(manifest))
        except ObjectNotFoundError:
            tail, total = b"", None
        except LancetxError as exc:
            raise CommitStateUnknownError(
                uri,
                version,
                None,
                f"PUT {key!r} failed ({unclear}) and reading it back failed ({exc})",
            ) from exc
        if total == len(manifest) and tail == manifest:
            return ManifestLocation(version, key, scheme, size=len(manifest))
        if total is not None:
            raise VersionAlreadyExistsError(
                uri, version, winner=ManifestLocation(version, key, scheme)
            ) from unclear
        # Absent now, but a delayed request may still create it.
        raise CommitStateUnknownError(
            uri, version, None, f"PUT {key!r} failed ({unclear}) and the object is absent for now"
        ) from unclear
