"""Commit handlers that claim versions through an external manifest store.

:class:`ExternalStoreCommitHandler` is the engine's :class:`CommitHandler` for
object stores without a trustworthy conditional PUT: the conditional insert in
the external store (DynamoDB) is the only linearization point. The protocol
itself lives in :mod:`lancetx.externalstore.protocol`; this module drives it and
adds what involves the object store's history: tables that have manifests but
no entries yet (written before DynamoDB, or by plain pylance) open through the
listing, and the first commit through the store continues their history.

Versions committed since a read version come from the external store (one
Query), not from listing the bucket: a legacy store's listing may be stale.
"""

from __future__ import annotations

import contextlib
import logging

from lancetx.commit.errors import ObjectNotFoundError, VersionNotFoundError
from lancetx.commit.handler import CommitHandler, ManifestLocation
from lancetx.commit.listing import (
    MixedNamingSchemesError,
    latest_manifest_location,
    list_manifest_locations,
    versions_prefix,
)
from lancetx.commit.naming import NamingScheme, manifest_key, parse_manifest_name
from lancetx.commit.objectstore import ObjectStore
from lancetx.commit.s3store_async import AsyncObjectStore
from lancetx.externalstore.base import (
    AsyncExternalManifestStore,
    ExternalManifestStore,
    ManifestEntry,
)
from lancetx.externalstore.errors import EntryExistsError, EntryNotFoundError
from lancetx.externalstore.protocol import (
    COMMITTER,
    CommitOutcome,
    Table,
    commit_steps,
    location_of,
    resolve_steps,
    run,
    run_async,
)

log = logging.getLogger(__name__)

#: How far past a (possibly stale) listing we probe with HEAD when onboarding.
ONBOARD_PROBE_LIMIT = 1000


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

    def _table(self, base: str) -> Table:
        return Table(base_uri=base, base_key=base)

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        """The newest version: one consistent Query; finalizes it if still staged.

        A table with no entries is onboarded: its newest manifest is found by
        listing, confirmed by probing the next names (a stale listing must not
        hide a newer version), and recorded in the external store so that every
        later commit is claimed there.
        """
        location = run(resolve_steps(self._table(base)), self.store, self.entries)
        if location is not None:
            return location
        return self._onboard(base)

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """``version``'s manifest, finalizing it if staged; falls back to the object store
        for versions committed before the table used the external store."""
        location = run(resolve_steps(self._table(base), version), self.store, self.entries)
        if location is not None:
            return location
        for scheme in (NamingScheme.V2, NamingScheme.V1):
            key = manifest_key(base, version, scheme)
            try:
                meta = self.store.head(key)
            except ObjectNotFoundError:
                continue
            location = ManifestLocation(version, key, scheme, size=meta.size, etag=meta.etag)
            if self.entries.latest(base) is None:
                # Onboard first: backfilled entries alone would make the store's
                # latest entry the newest version backfilled, not the table's.
                self._onboard(base)
            self._backfill_from(base, location)
            return location
        raise VersionNotFoundError(
            self.store.uri(base), version, "no external-store entry and no manifest"
        )

    def _backfill_from(self, base: str, location: ManifestLocation) -> None:
        """Record ``location`` and the versions after it that exist only in the object store.

        Versions written before the table used the external store have no
        entry, so nothing stops a claim on them: a writer building on
        ``location`` would claim the next version and, if that one predates the
        store too, its copy would overwrite that version's manifest. Recorded,
        such a claim loses like any other. Stops at the first version that has
        an entry (or no manifest): three requests per version in between, and
        only when a pre-external-store version is read.

        A version with no manifest below the store's latest entry was committed
        and has been deleted since (cleanup; versions are contiguous): it is
        recorded too, pointing at its (missing) final name, so that a writer
        building on the version before it loses its claim instead of committing
        a version below the latest, which no reader would ever see.
        """
        current = location
        while True:
            entry = ManifestEntry(
                base_uri=base,
                version=current.version,
                path=current.key,
                size=current.size,
                committer=self.committer,
            )
            try:
                self.entries.put_if_not_exists(entry)
            except EntryExistsError:
                return
            try:
                self.entries.get(base, current.version + 1)
                return  # the external store takes over from here
            except EntryNotFoundError:
                pass
            following = manifest_key(base, current.version + 1, current.scheme)
            try:
                meta = self.store.head(following)
            except ObjectNotFoundError:
                latest = self.entries.latest(base)
                if latest is not None and latest.version > current.version + 1:
                    deleted = ManifestEntry(
                        base_uri=base,
                        version=current.version + 1,
                        path=following,
                        committer=self.committer,
                    )
                    with contextlib.suppress(EntryExistsError):
                        self.entries.put_if_not_exists(deleted)
                return
            current = ManifestLocation(
                current.version + 1, following, current.scheme, size=meta.size, etag=meta.etag
            )

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """Committed versions after ``since``, from the external store; versions
        without an entry (pre-onboarding history) come from the listing, and those
        a stale listing misses from a HEAD of their name (reads of one key are
        consistent where listings are not)."""
        table = self._table(base)
        found = [location_of(table, e) for e in self.entries.list_entries(base, since)]
        have = {loc.version for loc in found}
        top = found[-1].version if found else None
        if top is None or len(have) < top - since:
            older = [
                loc
                for loc in list_manifest_locations(self.store, base)
                if loc.version > since
                and loc.version not in have
                and (top is None or loc.version < top)
            ]
            have |= {loc.version for loc in older}
            found = sorted(found + older, key=lambda loc: loc.version)
            if top is not None:
                scheme = found[-1].scheme
                for version in range(since + 1, top):
                    if version in have:
                        continue
                    key = manifest_key(base, version, scheme)
                    try:
                        meta = self.store.head(key)
                    except ObjectNotFoundError:
                        continue  # deleted: the caller sees the gap
                    found.append(
                        ManifestLocation(version, key, scheme, size=meta.size, etag=meta.etag)
                    )
                found.sort(key=lambda loc: loc.version)
        return found

    def commit(
        self, base: str, version: int, manifest: bytes, scheme: NamingScheme
    ) -> ManifestLocation:
        """The four-step commit of ``version``; see :func:`protocol.commit_steps`."""
        outcome = run(
            commit_steps(self._table(base), version, scheme, manifest, committer=self.committer),
            self.store,
            self.entries,
        )
        self.last_outcome = outcome
        return outcome.location

    def _onboard(self, base: str) -> ManifestLocation | None:
        latest = latest_manifest_location(self.store, base)
        if latest is None:
            return None
        latest = _probe_newer(self.store, base, latest)
        entry = ManifestEntry(
            base_uri=base,
            version=latest.version,
            path=latest.key,
            size=latest.size,
            committer=self.committer,
        )
        try:
            self.entries.put_if_not_exists(entry)
            log.info(
                "onboarded %s at version %d into the external store",
                self.store.uri(base),
                latest.version,
            )
        except EntryExistsError:
            pass  # another process onboarded it, or committed meanwhile: both fine
        return latest


def _probe_newer(store: ObjectStore, base: str, latest: ManifestLocation) -> ManifestLocation:
    """HEAD the names after ``latest`` (reads of one key are consistent even where listings are not)."""
    current = latest
    for _ in range(ONBOARD_PROBE_LIMIT):
        key = manifest_key(base, current.version + 1, current.scheme)
        try:
            meta = store.head(key)
        except ObjectNotFoundError:
            return current
        current = ManifestLocation(
            current.version + 1, key, current.scheme, size=meta.size, etag=meta.etag
        )
    return current


class AsyncExternalStoreCommitHandler:
    """The asyncio twin of :class:`ExternalStoreCommitHandler` (aioboto3), driving the same protocol."""

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

    async def resolve_latest(self, base: str) -> ManifestLocation | None:
        """See :meth:`ExternalStoreCommitHandler.resolve_latest`, onboarding included."""
        location = await run_async(resolve_steps(Table(base, base)), self.store, self.entries)
        if location is not None:
            return location
        return await self._onboard(base)

    async def _onboard(self, base: str) -> ManifestLocation | None:
        # A table with manifests but no entries is not empty: reporting None would
        # have the caller commit version 1 over the existing one.
        prefix = versions_prefix(base)
        listed = [
            ManifestLocation(parsed[0], meta.key, parsed[1], size=meta.size, etag=meta.etag)
            for meta in await self.store.list(prefix)
            if meta.key.startswith(prefix)
            and "/" not in meta.key[len(prefix) :]
            and (parsed := parse_manifest_name(meta.key[len(prefix) :])) is not None
        ]
        if not listed:
            return None
        mixed = [loc for loc in listed if loc.scheme is not listed[0].scheme]
        if mixed:
            raise MixedNamingSchemesError(self.store.uri(prefix), listed[0], mixed[0])
        latest = max(listed, key=lambda loc: loc.version)
        for _ in range(ONBOARD_PROBE_LIMIT):  # a stale listing must not hide a newer version
            key = manifest_key(base, latest.version + 1, latest.scheme)
            try:
                meta = await self.store.head(key)
            except ObjectNotFoundError:
                break
            latest = ManifestLocation(
                latest.version + 1, key, latest.scheme, size=meta.size, etag=meta.etag
            )
        entry = ManifestEntry(
            base_uri=base,
            version=latest.version,
            path=latest.key,
            size=latest.size,
            committer=self.committer,
        )
        # EntryExistsError: another process onboarded it, or committed meanwhile: both fine.
        with contextlib.suppress(EntryExistsError):
            await self.entries.put_if_not_exists(entry)
        return latest

    async def resolve_version(self, base: str, version: int) -> ManifestLocation:
        """See :meth:`ExternalStoreCommitHandler.resolve_version`."""
        location = await run_async(
            resolve_steps(Table(base, base), version), self.store, self.entries
        )
        if location is None:
            raise VersionNotFoundError(self.store.uri(base), version, "no external-store entry")
        return location

    async def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        """Committed versions after ``since`` from the external store."""
        table = Table(base, base)
        return [location_of(table, e) for e in await self.entries.list_entries(base, since)]

    async def commit(
        self, base: str, version: int, manifest: bytes, scheme: NamingScheme
    ) -> ManifestLocation:
        """See :meth:`ExternalStoreCommitHandler.commit`."""
        outcome = await run_async(
            commit_steps(Table(base, base), version, scheme, manifest, committer=self.committer),
            self.store,
            self.entries,
        )
        self.last_outcome = outcome
        return outcome.location
