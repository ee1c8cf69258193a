"""Loading a version to build on or read: :func:`load_parent` and its async twin.

Apart from the commit loop (:mod:`lancetx.commit.engine.committer`, which
re-exports both) so that opening a table — the front door's ``lancetx.open``,
every CLI call and Spark task — loads its latest version without importing the
engine that builds and claims manifests (``tests/test_import_cost.py``).
"""

from __future__ import annotations

from lancetx.commit.engine.effects import run, run_async
from lancetx.commit.engine.loading import Parent, load_parent_steps
from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler

__all__ = ["load_parent", "load_parent_async"]


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
