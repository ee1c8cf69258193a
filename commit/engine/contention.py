"""How long a writer that lost a round waits before its next attempt.

Each round has exactly one winner. If every loser retried at once, N writers
would keep N claimants per round, and N - 1 of them would rebuild, re-stage
and lose again: on a small machine they also steal the CPU the next winner
needs. So a loser waits a random time (full jitter) from a window sized by
what it measured:

* ``slot`` — how long its lost attempt took (the time one attempt occupies,
  which is also how long a competitor's attempt occupies the table);
* ``losses`` — how many rounds in a row it lost: each loss is one more
  claimant seen, and the window doubles per loss.

``window = min(cap, max(base_delay, slot) * FIRST_WINDOW_SLOTS * 2**(losses - 1))``,
``cap`` = ``RetryPolicy.max_delay``: the losers of one round are spread over
4, 8, 16 … attempt-sized slots (Lance's slot backoff starts at 4 slots too), so
the expected number of claimants per slot falls towards one within a few
rounds whatever N is. A writer that lost more than ``STARVING_AFTER`` rounds in
a row is starving and retries within one slot instead: it then claims ahead of
fresh losers (4+ slots) and of the last winner (which yields up to one slot
after writing its next data files), which bounds the tail.

Tried and dropped: scaling the window by the number of versions that landed
since the lost attempt's parent. That number mixes contention with staleness
— a writer 128 versions behind is not competing with 128 writers — and made
such a writer sleep up to ``max_delay`` before a retry that could not collide
(``benchmarks/conflict_check.py``).

A writer that lost a round recently (in this process, on this table) asks for
newer versions before its next first attempt (:class:`TableContention`), so a
writer appending back to back under contention does not start each commit by
staging a manifest that is already stale. It also first waits a random part of
one slot (:func:`yield_delay`): the last winner holds the newest manifest and
would otherwise claim again before the losers' windows end, round after round
(a starved loser reached 38 retries without it).

The figures behind this choice are in ``benchmarks/README.md`` (contention matrix).
"""

from __future__ import annotations

import random
import threading

from lancetx.commit.engine.retry import RetryPolicy

#: Slots in the window after the first lost round (doubling per further loss).
FIRST_WINDOW_SLOTS = 4
#: A writer that lost this many rounds in a row is starving: it stops backing off.
STARVING_AFTER = 4


def window(policy: RetryPolicy, losses: int, slot: float) -> float:
    """The longest wait after ``losses`` lost rounds in a row (``losses >= 1``)."""
    if losses > STARVING_AFTER:
        # Fairness: fresh losers spread over 4+ slots and the last winner yields
        # up to one, so a starving writer retrying within one slot claims first.
        growth = 1.0
    else:
        growth = FIRST_WINDOW_SLOTS * 2.0 ** min(max(losses - 1, 0), 60)
    return float(min(policy.max_delay, max(policy.base_delay, slot) * growth))


def delay(policy: RetryPolicy, losses: int, slot: float, rng: random.Random | None = None) -> float:
    """A wait drawn from :func:`window`: its jittered part is uniform (full jitter at 1.0)."""
    span = window(policy, losses, slot)
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

    __slots__ = ("last_lost", "slot")

    def __init__(self) -> None:
        self.last_lost = -float("inf")
        #: Duration of the last lost attempt (an attempt's time on this table).
        self.slot = 0.0

    def lost(self, now: float, slot: float) -> None:
        self.last_lost = now
        self.slot = slot

    def refresh_first(self, now: float) -> bool:
        return now - self.last_lost < CONTENDED_FOR


def yield_delay(
    policy: RetryPolicy, contended: TableContention, rng: random.Random | None = None
) -> float:
    """The wait before a first attempt on a contended table: up to one slot."""
    span = min(policy.max_delay, contended.slot)
    return float((rng or random).uniform(0, span * policy.jitter))


_tables: dict[str, TableContention] = {}
_tables_lock = threading.Lock()


def table_contention(table_uri: str) -> TableContention:
    """The process-wide record of ``table_uri``'s contention."""
    with _tables_lock:
        found = _tables.get(table_uri)
        if found is None:
            found = _tables[table_uri] = TableContention()
        return found


__all__ = [
    "CONTENDED_FOR",
    "FIRST_WINDOW_SLOTS",
    "STARVING_AFTER",
    "TableContention",
    "delay",
    "table_contention",
    "window",
    "yield_delay",
]
