"""The commit loop over the external store after an unknown outcome (the staged
manifest is kept and the claim is not retried) and after a stale winner."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from interleavings import DictWorld, Stepper
from protocol_helpers import (
    Crash,
    CrashingHandler,
    FaultyObjectStore,
    batch,
    lancetx_append,
    pylance_create,
    verify_history,
)

from lancetx.commit.engine.committer import load_parent
from lancetx.commit.errors import (
    CommitStateUnknownError,
    TransientObjectStoreError,
    UnfinishedParentError,
    VersionAlreadyExistsError,
)
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme, manifest_key
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.errors import (
    AmbiguousWriteError,
    ServiceUnavailableError,
    ThrottledError,
)
from lancetx.externalstore.memory import MemoryManifestStore
from lancetx.externalstore.protocol import (
    ClaimEntry,
    Effect,
    Table,
    commit_steps,
)

ROWS = 10
V2 = NamingScheme.V2


def _base(path: str) -> str:
    return os.path.abspath(path).lstrip("/")


@pytest.fixture
def local(tmp_path: Path) -> tuple[str, str, FaultyObjectStore, MemoryManifestStore]:
    path = str(tmp_path / "t.lance")
    pylance_create(path, None, batch("setup", 0, ROWS))
    store = FaultyObjectStore(LocalObjectStore("/"))
    entries = MemoryManifestStore()
    base = _base(path)
    assert ExternalStoreCommitHandler(store, entries).resolve_latest(base) is not None  # onboard
    return path, base, store, entries


def test_unknown_outcome_keeps_the_staged_manifest_names_our_transaction_and_is_not_retried(
    local: tuple[str, str, FaultyObjectStore, MemoryManifestStore],
) -> None:
    path, base, store, entries = local
    handler = ExternalStoreCommitHandler(store, entries)
    parent = load_parent(handler, base)
    assert parent is not None
    entries.land_then_fail("put_if_not_exists")
    entries.fail_next("get", ServiceUnavailableError("dynamodb:GetItem", "m", "down", 6), times=9)
    claims_before = entries.calls["put_if_not_exists"]
    with pytest.raises(CommitStateUnknownError) as info:
        lancetx_append(handler, base, path, None, batch("w", 0, ROWS), parent)
    entries.clear_faults()
    # Not retried as a conflict: one claim, no second version attempted.
    assert entries.calls["put_if_not_exists"] - claims_before == 1
    (claimed,) = [e for e in entries.entries() if e.version == 2]
    assert claimed.is_staged and store.inner.head(claimed.path) is not None  # staged kept
    # The error names OUR transaction, so "look for it before retrying" works.
    fresh = ExternalStoreCommitHandler(store, entries)
    latest = load_parent(fresh, base)
    assert latest is not None and latest.version == 2
    assert latest.manifest.transaction is not None
    assert info.value.transaction_uuid == latest.manifest.transaction.uuid
    assert info.value.version == 2


def test_a_resent_claim_failing_after_an_ambiguous_one_is_unknown() -> None:
    """The first claim timed out (it may still land: a delayed request), a
    consistent read found nothing, the claim sent again is throttled through
    every retry. That is not "not committed": the delayed first attempt can
    still land, so the outcome is unknown and the staged manifest is kept."""
    world = DictWorld()
    table = Table("t", "t")
    entry_box: list[ManifestEntry] = []

    def claim(effect: Effect) -> Any:
        if isinstance(effect, ClaimEntry):
            entry_box.append(effect.entry)
            if len(entry_box) == 1:
                raise AmbiguousWriteError("dynamodb:PutItem", "m", effect.entry, "timeout")
            raise ThrottledError("dynamodb:PutItem", "m", "ThrottlingException", 6)
        return world(effect)

    writer = Stepper(commit_steps(table, 1, V2, b"m"))
    while not writer.done:
        writer.step(claim)
    assert isinstance(writer.error, CommitStateUnknownError), repr(writer.error)
    assert entry_box[0].path in world.objects  # staged manifest kept


class StaleWinnerHandler(CommitHandler):
    """Loses its first claim naming a stale winner, after two other writers committed."""

    def __init__(self, inner: CommitHandler, others: Callable[[], None]) -> None:
        self.inner = inner
        self.store = inner.store
        self.others: Callable[[], None] | None = others
        self.attempts: list[int] = []

    def resolve_latest(self, base: str) -> ManifestLocation | None:
        return self.inner.resolve_latest(base)

    def resolve_version(self, base: str, version: int) -> ManifestLocation:
        return self.inner.resolve_version(base, version)

    def list_versions(self, base: str, since: int = 0) -> list[ManifestLocation]:
        return self.inner.list_versions(base, since)

    def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        self.attempts.append(version)
        if self.others is not None:
            run_others, self.others = self.others, None
            run_others()
            stale = ManifestLocation(version - 1, manifest_key(base, version - 1, scheme), scheme)
            raise VersionAlreadyExistsError(self.store.uri(base), version, winner=stale)
        return self.inner.commit(base, version, manifest, scheme, summary)


def test_a_stale_winner_still_converges(
    local: tuple[str, str, FaultyObjectStore, MemoryManifestStore],
) -> None:
    path, base, store, entries = local
    handler = ExternalStoreCommitHandler(store, entries)
    parent = load_parent(handler, base)
    assert parent is not None

    def two_others() -> None:
        first = lancetx_append(handler, base, path, None, batch("o", 0, ROWS))
        lancetx_append(handler, base, path, None, batch("o", 1, ROWS), first)

    racing = StaleWinnerHandler(handler, two_others)
    done = lancetx_append(racing, base, path, None, batch("w", 0, ROWS), parent)
    assert racing.attempts == [2, 4]
    assert done.version == 4 and done.attempts == 2
    expected = {("setup", 0): ROWS, ("o", 0): ROWS, ("o", 1): ROWS, ("w", 0): ROWS}
    verify_history(path, None, handler, base, expected, versions=4)


def test_a_writer_never_claims_on_top_of_a_version_it_could_not_finish(
    local: tuple[str, str, FaultyObjectStore, MemoryManifestStore],
) -> None:
    """Version 2's writer died after its claim; reading it finishes it best effort
    (the copy fails here, so the reader reads the staged manifest), but a writer
    claims on top of it only once it is finished: otherwise the object store would
    lag two versions behind for good. It raises UnfinishedParentError, naming the
    version, with nothing claimed and nothing of its own left; once the store
    answers again the same append lands on a finished version 2."""
    path, base, store, entries = local
    crashing = CrashingHandler(store, entries, crash_after=2)
    with pytest.raises(Crash):
        lancetx_append(crashing, base, path, None, batch("crashed", 0, ROWS))
    (staged,) = [e for e in entries.entries() if e.version == 2]
    assert staged.is_staged
    handler = ExternalStoreCommitHandler(store, entries)
    store.fail_next("copy", TransientObjectStoreError("CopyObject", "x", "injected 503"))
    read = load_parent(handler, base)
    assert read is not None and read.version == 2 and read.location.key == staged.path
    store.fail_next("copy", TransientObjectStoreError("CopyObject", "x", "injected 503"))
    before = set(store.inner.list(f"{base}/_transactions/"))
    with pytest.raises(UnfinishedParentError) as refused:
        lancetx_append(handler, base, path, None, batch("w", 0, ROWS), read)
    assert refused.value.version == 2 and staged.path in str(refused.value)
    assert [e.version for e in entries.entries()] == [1, 2]
    assert set(store.inner.list(f"{base}/_transactions/")) == before  # its file was removed
    done = lancetx_append(handler, base, path, None, batch("w", 0, ROWS), read)
    assert done.version == 3
    assert not entries.get(base, 2).is_staged
    expected = {("setup", 0): ROWS, ("crashed", 0): ROWS, ("w", 0): ROWS}
    verify_history(path, None, handler, base, expected, versions=3)
