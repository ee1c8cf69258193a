"""Audit (issue 3, scope 3): transactions committed since ours' read version are
loaded *in parallel*.

A store whose manifest reads under ``_versions/`` meet at a barrier proves the
loads overlap: with sequential loading (``LOAD_PARALLELISM = 1``) the first read
waits alone until the barrier times out, and the commit fails. The rebase that
follows (three committed deletes on one fragment; ours deletes another row of
it) must still land with the union of the deletions.
(Version order of the verdicts is covered by test_conflict_matrix's
``test_classify_all_stops_at_the_first_blocking_verdict``.)
"""

from __future__ import annotations

import threading
from pathlib import Path

from engine_helpers import delete_transaction, make_table

from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.storage.localstore import LocalObjectStore

COMMITTED = 3  # versions committed after ours was planned


class BarrierStore(LocalObjectStore):
    """Local files; once ``arm``-ed, the next ``parties`` manifest reads wait for each other."""

    def __init__(self, root: str = "/") -> None:
        super().__init__(root)
        self.barrier: threading.Barrier | None = None
        self.waited: list[str] = []
        self.lock = threading.Lock()

    def arm(self, parties: int, timeout: float = 10.0) -> None:
        self.barrier = threading.Barrier(parties, timeout=timeout)

    def _maybe_wait(self, key: str) -> None:
        barrier = self.barrier
        if barrier is not None and "/_versions/" in key:
            with self.lock:
                self.waited.append(key)
            barrier.wait()  # BrokenBarrierError if the loads do not overlap
            self.barrier = None  # one round: later reads (the read version's manifest) go through

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        self._maybe_wait(key)
        return super().get_tail(key, length)

    def get(self, key: str) -> bytes:
        self._maybe_wait(key)
        return super().get(key)


def test_committed_transactions_are_loaded_in_parallel(tmp_path: Path) -> None:
    table = make_table(str(tmp_path / "t.lance"), sizes=(10, 10))  # v2
    read = table.latest()
    ours = delete_transaction(table, read, {0: [7]}, "a = 7")
    for row in range(COMMITTED):  # v3..v5, each planned on the version before
        table.commit(delete_transaction(table, table.latest(), {0: [row]}, f"a = {row}"))

    store = BarrierStore("/")
    handler = ConditionalPutCommitHandler(store)
    parent = load_parent(handler, table.base)  # the latest (v5), read before arming
    assert parent is not None and parent.version == 2 + COMMITTED
    store.arm(COMMITTED)

    committed = commit_transaction(handler, table.base, ours, parent=parent)

    assert len(store.waited) == COMMITTED, store.waited  # the committed versions, together
    assert committed.version == 3 + COMMITTED
    assert table.dataset().get_fragment(0).count_rows() == 10 - (COMMITTED + 1)
    assert table.values() == [r for r in range(20) if r not in {0, 1, 2, 7}]
