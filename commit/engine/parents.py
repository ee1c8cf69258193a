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
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler

__all__ = ["Parent", "load_parent", "load_parent_async", "load_parent_steps"]


@dataclass(frozen=True)
class Parent:
    """A version a transaction builds on: its location and decoded manifest."""

    location: ManifestLocation
    manifest: ManifestFile

    @property
    def version(self) -> int:
        return self.location.version


def load_parent_steps(
    names: Names, base: str, version: int | None = None, *, held: Parent | None = None
) -> Steps[Parent | None]:
    """The latest version (or ``version``) with its manifest; None for a table with none.

    ``held``: a version the caller already has; if the latest (or ``version``) is
    that version, its manifest is not read again (a committed version never changes).
    """
    if version is None:
        location: ManifestLocation | None = yield ResolveLatest(base)
        if location is None:
            return None
    else:
        location = yield ResolveVersion(base, version)
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
