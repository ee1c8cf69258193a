"""Loading a version to build on or read: :class:`Parent`, its steps, :func:`load_parent`
and its async twin.

Apart from the commit loop (:mod:`lancetx.commit.engine.committer`, which
re-exports both) and from loading what was committed since
(:mod:`lancetx.commit.engine.loading`, which builds on these steps) so that opening a
table — the front door's ``lancetx.open``, every CLI call and Spark task — loads its
latest version without importing the engine that builds, checks and claims manifests
(its operations and conflict rules: ``tests/test_import_cost.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lancetx.commit.engine.effects import (
    Names,
    ReadManifest,
    ResolveLatest,
    ResolveVersion,
    Steps,
    run,
    run_async,
)
from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler

log = logging.getLogger(__name__)

__all__ = ["Parent", "load_parent", "load_parent_async", "load_parent_steps"]


@dataclass(frozen=True)
class Parent:
    """A version a transaction builds on: its location and decoded manifest."""

    location: ManifestLocation
    manifest: ManifestFile

    @property
    def version(self) -> int:
        return self.location.version


#: How many times loading the latest version follows a newer one after the version it
#: resolved was cleaned up before its manifest could be read (each time the table moved
#: on: a commit landed and a cleanup with no age floor removed what was the latest).
LATEST_READ_ATTEMPTS = 8


def load_parent_steps(
    names: Names, base: str, version: int | None = None, *, held: Parent | None = None
) -> Steps[Parent | None]:
    """The latest version (or ``version``) with its manifest; None for a table with none.

    ``held``: a version the caller already has; if the latest (or ``version``) is
    that version, its manifest is not read again (a committed version never changes).

    The latest can move between resolving it and reading its manifest: a commit lands
    and a cleanup without an age floor removes what was the latest. Its manifest is then
    not found, and the newer latest is loaded instead (up to
    :data:`LATEST_READ_ATTEMPTS` times; then, and whenever no newer version is there,
    the ObjectNotFoundError stands). A version asked for by number is never replaced.
    """
    if version is not None:
        asked: ManifestLocation = yield ResolveVersion(base, version)
        return (yield from _read_parent(base, asked, held))
    gone: ObjectNotFoundError | None = None
    gone_version = -1
    for _ in range(LATEST_READ_ATTEMPTS):
        location: ManifestLocation | None = yield ResolveLatest(base)
        if location is None:
            return None
        if gone is not None and location.version <= gone_version:
            # Not found, and no newer version took its place: the error stands.
            raise gone
        try:
            return (yield from _read_parent(base, location, held))
        except ObjectNotFoundError as exc:
            gone, gone_version = exc, location.version
            log.info(
                "version %d of %s was cleaned up before its manifest was read; "
                "loading the table's newer latest version",
                location.version,
                names.uri(base),
            )
    assert gone is not None
    raise gone


def _read_parent(base: str, location: ManifestLocation, held: Parent | None) -> Steps[Parent]:
    if held is not None and _same_manifest(held.location, location):
        # The same version's manifest, wherever it is read from now (a staged
        # manifest since finalized is the same bytes under its final name).
        return Parent(location, held.manifest)
    manifest: ManifestFile = yield ReadManifest(base, location)
    return Parent(location, manifest)


def _same_manifest(held: ManifestLocation, found: ManifestLocation) -> bool:
    """Whether ``found`` is the manifest ``held`` was read from: the same version, and
    neither its size, its ETag nor its transaction (the uuid an entry claimed by lancetx
    records) known to differ: a table deleted and written again has its versions again,
    with other manifests. Lance's own manifest cache is keyed by version and ETag."""
    if held.version != found.version:
        return False
    if held.size is not None and found.size is not None and held.size != found.size:
        return False
    if held.etag is not None and found.etag is not None and held.etag != found.etag:
        return False
    ours, theirs = held.summary, found.summary
    return ours is None or theirs is None or ours.uuid == theirs.uuid


def load_parent(
    handler: CommitHandler, base: str, version: int | None = None, *, held: Parent | None = None
) -> Parent | None:
    """The latest version (or ``version``), or None for a table with no versions.

    ``held``: a version the caller already has; if the latest (or ``version``) is
    that version, its manifest is not read again (a committed version never changes).
    """
    return run(load_parent_steps(handler.store, base, version, held=held), handler)


async def load_parent_async(
    handler: AsyncCommitHandler,
    base: str,
    version: int | None = None,
    *,
    held: Parent | None = None,
) -> Parent | None:
    """:func:`load_parent` through an :class:`AsyncCommitHandler`."""
    return await run_async(load_parent_steps(handler.store, base, version, held=held), handler)
