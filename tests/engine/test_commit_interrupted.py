"""The commit loop interrupted while its claim is in flight keeps what it wrote.

A ``KeyboardInterrupt`` (or a cancellation, or the steps abandoned: GeneratorExit)
may arrive after the claim landed and before its answer was read: the version may
refer to our transaction file and rebased deletion files, so the loop must not
delete them — it records which, and which version and transaction settle it, on the
exception (see :mod:`lancetx.commit.engine.unreferenced`). A claim refused outright
still removes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import EngineTable, append_transaction, make_table, rows

from lancetx.commit.engine.committer import commit_steps, commit_transaction
from lancetx.commit.engine.effects import ClaimVersion, DeleteObject, run
from lancetx.commit.engine.unreferenced import kept_on
from lancetx.commit.errors import CommitError
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.handlers.interface import CommitHandler


class InterruptedAfterClaim(CommitHandler):
    """Claims for real, then raises ``error`` as if it arrived before the answer."""

    def __init__(self, inner: CommitHandler, error: BaseException, *, land: bool = True) -> None:
        self.inner = inner
        self.store = inner.store
        self.error = error
        self.land = land

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
        if self.land:
            self.inner.commit(base, version, manifest, scheme, summary)
        raise self.error


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    return make_table(str(tmp_path / "t.lance"), sizes=(10,))


def test_ctrl_c_after_the_claim_landed_keeps_the_transaction_file(table: EngineTable) -> None:
    parent = table.latest()
    txn = append_transaction(table, rows(10, 5, writer="w"), parent)
    handler = InterruptedAfterClaim(table.handler, KeyboardInterrupt())
    before = table.listing("_transactions")
    with pytest.raises(KeyboardInterrupt) as info:
        commit_transaction(handler, table.base, txn, parent=parent)
    written = [key for key, _ in table.listing("_transactions") if (key, _) not in before]
    assert len(written) == 1 and txn.uuid in written[0]  # ours, kept
    assert table.versions() == [1, 2]
    assert table.values() == list(range(15))  # the landed version reads in full
    kept = kept_on(info.value)
    assert kept is not None and kept.claim.version == 2 and kept.claim.transaction_uuid == txn.uuid
    assert [f.endswith(written[0].rsplit("/", 1)[1]) for f in kept.files] == [True]
    notes = getattr(info.value, "__notes__", [])
    assert any("version 2" in n and "may have landed" in n and "gc" in n for n in notes), notes


def test_steps_abandoned_at_the_claim_delete_nothing(table: EngineTable) -> None:
    """GeneratorExit (the steps closed while the claim is in flight, e.g. the task
    running them was destroyed): no further effect, no delete."""
    parent = table.latest()
    txn = append_transaction(table, rows(10, 5, writer="w"), parent)
    steps = commit_steps(table.handler.store, table.base, txn, parent=parent)
    effect = next(steps)
    while not isinstance(effect, ClaimVersion):
        effect = steps.send(run(_one(effect), table.handler))
    steps.close()  # GeneratorExit at the claim: nothing more is yielded
    assert len(table.listing("_transactions")) == 2  # pylance's create + ours


def test_keyboard_interrupt_thrown_at_the_claim_yields_no_delete(table: EngineTable) -> None:
    parent = table.latest()
    txn = append_transaction(table, rows(10, 5, writer="w"), parent)
    steps = commit_steps(table.handler.store, table.base, txn, parent=parent)
    effect = next(steps)
    while not isinstance(effect, ClaimVersion):
        effect = steps.send(run(_one(effect), table.handler))
    with pytest.raises(KeyboardInterrupt):
        effect = steps.throw(KeyboardInterrupt())
        assert not isinstance(effect, DeleteObject), effect


def test_a_refused_claim_still_removes_the_transaction_file(table: EngineTable) -> None:
    parent = table.latest()
    txn = append_transaction(table, rows(10, 5, writer="w"), parent)
    before = table.listing("_transactions")
    refused = InterruptedAfterClaim(
        table.handler, CommitError("refused: access denied"), land=False
    )
    with pytest.raises(CommitError):
        commit_transaction(refused, table.base, txn, parent=parent)
    assert table.listing("_transactions") == before
    assert table.versions() == [1]


def _one(effect: object):  # type: ignore[no-untyped-def]
    """Steps performing one effect (to drive the steps by hand)."""
    return (yield effect)
