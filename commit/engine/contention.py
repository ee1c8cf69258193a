"""How long a writer that lost a round waits before its next attempt.

Each round has exactly one winner. If every loser retried at once, N writers
would keep N claimants per round, and N - 1 of them would rebuild, re-stage
and lose again: on a small machine they also steal the CPU the next winner
needs. So a loser waits a random time (full jitter) from a window sized by
what it measured:

* ``slot`` — how long its lost attempt took (the time one attempt occupies);
* ``advanced`` — how many versions other writers committed during that
  attempt (at least the one it lost to). Versions landing faster than our
  attempts complete means several writers are contending;
* ``losses`` — how many rounds in a row it lost: the window doubles per loss.

``window = min(cap, max(base_delay, slot) * advanced * 2**(losses - 1))``,
where ``cap`` is ``RetryPolicy.max_delay``. Spreading the losers over about
``advanced * slot`` puts about one claimant in each attempt-sized slot; the
doubling corrects an estimate that was too low. A winner that is not visible
yet (no newer version listed) gets the same window with ``advanced = 1``.

A writer that lost a round recently (in this process, on this table) asks for
newer versions before its next first attempt (:class:`TableContention`).

The figures behind this choice are in ``benchmarks/README.md`` (contention matrix).
"""

from __future__ import annotations

import random
import threading

from lancetx.commit.engine.retry import RetryPolicy


def window(policy: RetryPolicy, losses: int, slot: float, advanced: int = 1) -> float:
    """The longest wait after ``losses`` lost rounds in a row (``losses >= 1``)."""
    growth = 2.0 ** min(max(losses - 1, 0), 62)
    unit = max(policy.base_delay, slot)
    return float(min(policy.max_delay, unit * max(1, advanced) * growth))


def delay(
    policy: RetryPolicy,
    losses: int,
    slot: float,
    advanced: int = 1,
    rng: random.Random | None = None,
) -> float:
    """A wait drawn from :func:`window`: its jittered part is uniform (full jitter at 1.0)."""
    span = window(policy, losses, slot, advanced)
    spread: float = (rng or random).uniform(0, span * policy.jitter)
    return span * (1 - policy.jitter) + spread


# ------------------------------------------------------------------ per-table memory


#: How long after a lost round a table counts as contended in this process.
CONTENDED_FOR = 2.0


class TableContention:
    """What this process saw of one table's contention, shared by its writers.

    ``refresh_first()`` is true while a lost round is recent: a writer holding
    its last commit as parent then asks the handler for newer versions (one
    Query) before staging anything, instead of staging, claiming, losing and
    deleting (three requests more). An uncontended table never pays that Query.
    """

    __slots__ = ("last_lost",)

    def __init__(self) -> None:
        self.last_lost = -float("inf")

    def lost(self, now: float) -> None:
        self.last_lost = now

    def refresh_first(self, now: float) -> bool:
        return now - self.last_lost < CONTENDED_FOR


_tables: dict[str, TableContention] = {}
_tables_lock = threading.Lock()


def table_contention(table_uri: str) -> TableContention:
    """The process-wide record of ``table_uri``'s contention."""
    with _tables_lock:
        found = _tables.get(table_uri)
        if found is None:
            found = _tables[table_uri] = TableContention()
        return found


__all__ = ["CONTENDED_FOR", "TableContention", "delay", "table_contention", "window"]
