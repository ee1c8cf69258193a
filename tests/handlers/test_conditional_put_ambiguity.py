"""A create-if-absent PUT whose outcome is ambiguous is never reported as not
committed: the conditional-PUT handler reads the object back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from protocol_helpers import (
    FaultyObjectStore,
    batch,
    lancetx_append,
    pylance_create,
    verify_history,
)

from lancetx.commit.errors import (
    CommitStateUnknownError,
    TransientObjectStoreError,
)
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.storage.localstore import LocalObjectStore

ROWS = 10
V2 = NamingScheme.V2


def _base(path: str) -> str:
    return os.path.abspath(path).lstrip("/")


@pytest.mark.parametrize("landed", [True, False])
def test_conditional_put_that_may_have_landed_is_never_not_committed(
    tmp_path: Path, landed: bool
) -> None:
    """A create-if-absent PUT answered by a transient error (5xx/timeout after the
    request was sent): the handler reads the object back. Ours → committed;
    absent → unknown (a delayed request may still land), never a plain
    transient error the caller would retry into a duplicate commit."""
    path = str(tmp_path / "t.lance")
    pylance_create(path, None, batch("setup", 0, ROWS))
    store = FaultyObjectStore(LocalObjectStore("/"))
    handler = ConditionalPutCommitHandler(store)
    base = _base(path)
    store.fail_next(
        "put_if_not_exists",
        TransientObjectStoreError("PutObject", "x", "injected 500 after sending"),
        landed=landed,
    )
    if landed:
        done = lancetx_append(handler, base, path, None, batch("w", 0, ROWS))
        assert done.version == 2 and done.attempts == 1
        verify_history(path, None, handler, base, {("setup", 0): ROWS, ("w", 0): ROWS}, versions=2)
    else:
        with pytest.raises(CommitStateUnknownError):
            lancetx_append(handler, base, path, None, batch("w", 0, ROWS))
        assert [loc.version for loc in handler.list_versions(base)] == [1]
