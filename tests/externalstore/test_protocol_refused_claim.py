"""A claim the service refuses outright leaves no staged manifest behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.errors import AccessDeniedError, ThrottledError
from lancetx.externalstore.memory import MemoryManifestStore


def _handler(
    tmp_path: Path,
) -> tuple[ExternalStoreCommitHandler, LocalObjectStore, MemoryManifestStore]:
    store = LocalObjectStore(str(tmp_path))
    entries = MemoryManifestStore()
    return ExternalStoreCommitHandler(store, entries), store, entries


def _objects(store: LocalObjectStore) -> list[str]:
    return sorted(meta.key for meta in store.list(""))


def test_refused_claim_deletes_its_staged_manifest(tmp_path: Path) -> None:
    handler, store, entries = _handler(tmp_path)
    denied = AccessDeniedError(
        "dynamodb:PutItem", "arn:aws:dynamodb:::table/t", "AccessDeniedException", "no"
    )
    entries.fail_next("put_if_not_exists", denied)
    with pytest.raises(AccessDeniedError):
        handler.commit("t", 1, b"manifest bytes", NamingScheme.V2)
    assert _objects(store) == []
    assert entries.latest("t") is None


def test_claim_that_may_have_been_retried_keeps_nothing_it_cannot_prove(tmp_path: Path) -> None:
    """Throttling after retries is not a refusal of the request's content: the
    staged object is kept (harmless; listing skips staged names) rather than
    deleted on a guess."""
    handler, store, entries = _handler(tmp_path)
    throttled = ThrottledError(
        "dynamodb:PutItem", "arn:aws:dynamodb:::table/t", "ThrottlingException", 3
    )
    entries.fail_next("put_if_not_exists", throttled)
    with pytest.raises(ThrottledError):
        handler.commit("t", 1, b"manifest bytes", NamingScheme.V2)
    assert len(_objects(store)) == 1 and "-" in _objects(store)[0].rsplit("/", 1)[-1]
