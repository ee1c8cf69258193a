"""How a writer that meets contention waits: its turn in a queue, or a random backoff.

Each round of claims has exactly one winner. If every loser retried at once,
N writers would keep N claimants per round, and N - 1 of them would rebuild,
re-stage and lose again; on a small machine they also steal the CPU the next
winner needs. Random backoff spreads them out but is unfair: a writer that
lost often waits longest while fresh writers slip past it, which makes the
tail (and so the time until the last writer is done) long.

**The commit queue (handlers that keep one: DynamoDB).** A writer that meets
contention — it lost a round to a writer that claimed while it tried (the
entries record when each claim was made), or its process saw others commit or
wait on this table moments ago — takes a ticket (one UpdateItem) and waits
until every earlier ticket was served. A claim made from the queue records its
ticket in its entry, which serves it: the waiters watch the table's entries
(each look reads by key the versions the tickets ahead can claim next: one
GetItem next in line, one BatchGetItem far back — never a Query from the parent
on, whose cost grows with the history), so serving costs no request, and the
look that shows the claim of the ticket before ours completes exactly the
versions we build on (Appends
are settled by the entries' summaries, so only the newest manifest is read).
When to look (:func:`turn_wait`): far back, by the median time between recent
claims, aiming just short of the turn before ours; next in line, by the
measured work of a turn, then a quarter turn at a time. The transaction file
is written while waiting. The queue is advisory: the conditional claim still
decides. A writer outside it (pylance, or a lancetx writer that saw no
contention) may win a round; the queued writer at the head then simply tries
again after a short random wait. A writer whose turn ends without a claim
(refused, gave up) serves its ticket in the queue item, which waiters read
when the queue stands still for a while; a queue that stands still for
:func:`stall_limit` (its head died) is passed, and the next claim's higher
ticket skips the dead one. While a writer that keeps no queue (pylance)
commits to the table, nobody queues (:meth:`TableContention.queue_fair`):
turns taken back to back would leave its slower attempts no gap, and it would
give up. Such a version is told by the library that wrote its manifest, not by
its entry lacking lancetx's attributes: a pylance *reader* finalizing one of our
staged versions rewrites its entry with Lance's attributes only. Whoever
finalizes an entry and finds it stripped that way puts them back; one stripped
after its writer's flip stays so, and waiters count each version without a
ticket, newer than the last claim they saw serve one, as serving the next ticket
(one too many costs a lost round; one too few, a stall).

**Random backoff (handlers without a queue, or without the IAM action).** A
loser waits a random time (full jitter) from a window sized by what it measured:

* ``slot`` — how long its lost attempt took (the time one attempt occupies,
  which is also how long a competitor's attempt occupies the table);
* ``losses`` — how many rounds in a row it lost: each loss is one more
  claimant seen, and the window doubles per loss.

``window = min(cap, max(base_delay, slot) * FIRST_WINDOW_SLOTS * 2**(losses - 1))``,
``cap`` = ``RetryPolicy.max_delay``: the losers of one round are spread over
4, 8, 16 … attempt-sized slots (Lance's slot backoff starts at 4 slots too), so
the expected number of claimants per slot falls towards one within a few
rounds whatever N is. The loss streak is the measure of contention, and a
process remembers it per table (:class:`TableContention`): a commit on a table
contended moments ago starts its backoff at the recent level (lost rounds per
commit, moving average) instead of learning it again from four slots.

Tried and dropped: letting a writer that lost more than 4 rounds in a row
retry within one slot (priority for the starving). With 16 writers most of
them were "starving" at once and retried together: 6 claimants per round, 5
retries per commit. Scaling the window by the number of versions that landed
since the lost attempt's parent: that number mixes contention with staleness
(a writer 128 versions behind is not competing with 128 writers).

A writer whose process met contention on the table recently asks for newer
versions before its next first attempt, so a writer appending back to back
under contention does not start each commit by staging a manifest that is
already stale; without a queue it first waits a random part of one slot
(:func:`yield_delay`): the last winner holds the newest manifest and would
otherwise claim again before the losers' windows end.

The figures behind these choices are in ``benchmarks/README.md``.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from lancetx.commit.engine.retry import RetryPolicy

#: Slots in the window after the first lost round (doubling per further loss).
FIRST_WINDOW_SLOTS = 4
#: Most remembered contention level a commit starts from (2**LEVEL_CAP times the first window).
LEVEL_CAP = 4


def window(policy: RetryPolicy, losses: int, slot: float) -> float:
    """The longest wait after ``losses`` lost rounds in a row (``losses >= 1``)."""
    growth = FIRST_WINDOW_SLOTS * 2.0 ** min(max(losses - 1, 0), 60)
    return float(min(policy.max_delay, max(policy.base_delay, slot) * growth))


def delay(policy: RetryPolicy, losses: int, slot: float, rng: random.Random | None = None) -> float:
    """A wait drawn from :func:`window`: its jittered part is uniform (full jitter at 1.0)."""
    span = window(policy, losses, slot)
    spread: float = (rng or random).uniform(0, span * policy.jitter)
    return span * (1 - policy.jitter) + spread


# ------------------------------------------------------------------ per-table memory


#: How many recent turns the median turn length is taken over.
TURN_SAMPLES = 24
#: How long after a lost round a table counts as contended in this process.
CONTENDED_FOR = 2.0
#: How long after a version by a writer outside the queue the queue stays unused.
OUTSIDERS_FOR = 10.0


@dataclass(frozen=True)
class ServedMark:
    """A served ticket of a table's commit queue, and the claim that served it."""

    served: int
    served_version: int
    #: When it was served (epoch seconds).
    served_at: float


class TableContention:
    """What this process saw of one table's contention, shared by its writers.

    ``refresh_first()`` is true while a lost round is recent: a writer holding
    its last commit as parent then asks the handler for newer versions (one
    Query) before staging anything, instead of staging, claiming, losing and
    deleting (three requests more). An uncontended table never pays that Query.
    """

    __slots__ = (
        "last_lost",
        "last_outsider",
        "level",
        "served",
        "slot",
        "turn_interval",
        "turn_samples",
        "turn_work",
    )

    def __init__(self) -> None:
        self.last_lost = -float("inf")
        #: Duration of the last lost attempt (an attempt's time on this table).
        self.slot = 0.0
        #: Lost rounds per commit lately (moving average): where the next
        #: commit's backoff starts, instead of learning the contention again.
        self.level = 0.0
        #: Seconds per turn of the table's commit queue lately (moving average).
        self.turn_interval = 0.0
        #: When a version committed by a writer outside the queue (pylance) was last seen.
        self.last_outsider = -float("inf")
        #: Seconds from our turn to our won claim lately (moving average): how
        #: long the writer before us needs once its turn has come.
        self.turn_work = 0.0
        #: The newest ticket of the table's commit queue this process saw served
        #: (claims serve their tickets in their entries, which the queue item
        #: does not show): where a writer joining the queue starts counting.
        self.served: ServedMark | None = None
        #: Recent times between consecutive claims from the queue (seconds per
        #: turn, from the claims' own stamps): their median times far-back waits.
        self.turn_samples: deque[float] = deque(maxlen=TURN_SAMPLES)

    def saw_served(self, ticket: int, version: int, at: float) -> None:
        """Ticket ``ticket`` was served by the claim of ``version`` at ``at`` (epoch s)."""
        if self.served is None or ticket > self.served.served:
            self.served = ServedMark(ticket, version, at)

    def lost(self, now: float, slot: float) -> None:
        self.last_lost = now
        self.slot = slot

    def queued(self, now: float) -> None:
        """Others were waiting in the commit queue when we joined it: the table
        is contended even though, thanks to the queue, nobody lost a round."""
        self.last_lost = now

    def outsider(self, now: float) -> None:
        """A version was committed by a writer that keeps no queue (pylance)."""
        self.last_outsider = now

    def queue_fair(self, now: float) -> bool:
        """Whether taking turns is fair to every writer of the table: not while
        writers outside the queue commit to it. Queued writers claim back to back,
        and an outsider's attempts — which take longer — would lose nearly every
        round until its own retry budget runs out; random backoff leaves it gaps."""
        return now - self.last_outsider > OUTSIDERS_FOR

    def worked(self, seconds: float) -> None:
        """Our turn came and our claim was won ``seconds`` later."""
        self.turn_work = seconds if self.turn_work == 0.0 else 0.5 * self.turn_work + 0.5 * seconds

    def turns_served(self, turns: int, seconds: float) -> None:
        """``turns`` tickets were served in ``seconds``."""
        if turns <= 0:
            return
        measured = seconds / turns
        self.turn_interval = (
            measured if self.turn_interval == 0.0 else 0.5 * self.turn_interval + 0.5 * measured
        )

    def claims_timed(self, samples: Iterable[float]) -> None:
        """Seconds per turn between consecutive claims from the queue."""
        self.turn_samples.extend(x for x in samples if x > 0)

    def typical_turn(self) -> float:
        """The median of the recent turn samples (0.0 before any): a turn whose
        holder overslept its start is an outlier here, not a new normal."""
        if not self.turn_samples:
            return 0.0
        import statistics  # here: opening a table loads this module, never this

        return float(statistics.median(self.turn_samples))

    def committed(self, losses: int) -> None:
        self.level = 0.5 * self.level + 0.5 * losses

    def refresh_first(self, now: float) -> bool:
        return now - self.last_lost < CONTENDED_FOR

    def start_level(self, now: float) -> int:
        """Lost rounds a commit starting now counts as already seen."""
        if not self.refresh_first(now):
            return 0
        return min(LEVEL_CAP, int(self.level))


def yield_delay(
    policy: RetryPolicy, contended: TableContention, rng: random.Random | None = None
) -> float:
    """The wait before a first attempt on a contended table: up to one slot."""
    span = min(policy.max_delay, contended.slot)
    return float((rng or random).uniform(0, span * policy.jitter))


# ------------------------------------------------------------------ commit queue


#: A turn's length before anything was measured (seconds).
DEFAULT_TURN = 0.05
#: Turns without progress after which a waiter stops waiting for the ticket ahead.
STALL_TURNS = 8
#: ...but never sooner than this (seconds): a live holder may be slow for a while.
MIN_STALL = 1.0


def turn_length(contended: TableContention) -> float:
    """How long one writer's turn lasts on this table, as measured."""
    return contended.turn_interval or contended.slot or DEFAULT_TURN


def turn_wait(
    policy: RetryPolicy,
    contended: TableContention,
    ahead: int,
    into_turn: float | None = None,
    first_look: bool = True,
) -> float:
    """The wait before looking again with ``ahead`` tickets before ours.

    Measured in *work*: how long a turn takes from its start to the won claim
    (:func:`turn_work`), not the observed time between turns — that includes
    the idle gaps of late looks, and sleeping by it would make every gap longer
    than the last. ``into_turn``: how long ago the current turn began (when the
    ticket before it was served), when known. Far back: until the turn before
    ours would begin if turns were pure work, a little early (an early look
    costs one small read, a late one leaves the table idle). Next in line: first
    until the current turn's claim is due, then a quarter turn at a time.
    """
    work = turn_work(contended)
    if ahead > 1:
        # Far back, by the measured time between turns (timed by the serving
        # writers' own stamps, so a late look does not stretch it). A look here
        # is late only if it comes after the turn ahead of ours is well under
        # way (the next in line watches that turn's claim); an early one costs
        # a read. So aim at the first half of that turn, short by a margin that
        # grows like the spread of a sum of ``turns`` turn lengths: one look
        # usually lands in the turn ahead of ours, and then it is ours.
        between = far_turn(contended)
        turns = ahead - 1
        done = min(into_turn, between) if into_turn is not None else 0.0
        aim = turns + FAR_SLACK - FAR_MARGIN * math.sqrt(turns)
        wait = max(between * aim - done, between / 4)
        if into_turn is not None and into_turn > between:
            # The current turn is overdue (a slow or dead holder): look less
            # often the longer it stands, instead of every turn.
            wait = max(wait, OVERDUE_SHARE * (into_turn - between))
    elif first_look:
        # Next in line, by work only: timing it by observed intervals would feed
        # every idle gap back into the next wait.
        done = min(into_turn, work) if into_turn is not None else 0.0
        wait = work - done
    else:
        wait = work / 4
    return float(min(policy.max_delay, max(work / 5, wait)))


#: Far back, how many standard spreads of a turn to aim short of the turn before
#: ours, per square root of the turns to wait (turn lengths vary by ~30%).
FAR_MARGIN = 0.35
#: Far back, how far into the turn before ours (in turns) a look may come.
FAR_SLACK = 0.4
#: While the current turn is overdue, a far-back waiter waits this share of the
#: time it is overdue before looking again.
OVERDUE_SHARE = 0.5


def far_turn(contended: TableContention) -> float:
    """A turn's length for waiters far back: the median time between recent
    claims from the queue (it includes the handoff from one writer to the next,
    which the work of a turn does not). A median, not a mean: the turns after
    a holder overslept its start are longer, and waiters sleeping by their mean
    would oversleep too, which lengthens the next turns — the queue would slow
    itself down. Before any claim was timed, a turn's work."""
    return contended.typical_turn() or turn_work(contended)


def turn_work(contended: TableContention) -> float:
    """A turn's work as measured; the smaller of our own turns' work and the
    time between turns when both are known, so that one slow turn of ours (a
    busy machine, a slow request) does not make us oversleep every turn after."""
    work = contended.turn_work
    observed = contended.typical_turn() or contended.turn_interval
    if work and observed:
        return min(work, observed)
    # Not the slot of a lost attempt: attempts that collide are slow, and a
    # waiter sleeping by one would oversleep its turn by many.
    return work or observed or DEFAULT_TURN


#: Turns the queue may stand still before a waiter reads the queue item too...
QUEUE_CHECK_TURNS = 4
#: ...but never sooner than this (seconds): slow turns are common, ended ones rare.
MIN_QUEUE_CHECK = 0.5


def queue_check_after(contended: TableContention) -> float:
    """How long the queue may stand still before a waiter also reads the queue
    item (every other look): a writer whose turn ended without a claim serves
    its ticket there, where watching the claims cannot see it."""
    return max(MIN_QUEUE_CHECK, QUEUE_CHECK_TURNS * turn_length(contended))


def stall_limit(contended: TableContention) -> float:
    """How long the queue may stand still before a waiter goes anyway (its holder
    may have died; serving ours then moves the mark past its ticket)."""
    return max(MIN_STALL, STALL_TURNS * turn_length(contended))


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
    "DEFAULT_TURN",
    "FIRST_WINDOW_SLOTS",
    "LEVEL_CAP",
    "MIN_STALL",
    "OUTSIDERS_FOR",
    "STALL_TURNS",
    "ServedMark",
    "TableContention",
    "delay",
    "far_turn",
    "queue_check_after",
    "stall_limit",
    "table_contention",
    "turn_length",
    "turn_wait",
    "turn_work",
    "window",
    "yield_delay",
]
