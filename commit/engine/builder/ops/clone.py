"""Clone: never built from a previous version of this table."""

from __future__ import annotations

from typing import NoReturn

from lancetx.commit.engine.builder.state import BuildState


def raise_clone(state: BuildState) -> NoReturn:
    """A clone creates the table from the source manifest, so build_manifest refuses it."""
    raise state.fail(
        "Clone operation should not enter build_manifest: a clone creates the "
        "table from the source manifest (shallow or deep copy), not from a previous "
        "version of this table"
    )
