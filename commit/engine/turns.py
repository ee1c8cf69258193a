"""Waiting for a turn in a table's commit queue, as steps.

Writers under contention take a ticket in the table's commit queue (the
handler's optional capability, :mod:`lancetx.commit.handlers.queue`) and wait
until every ticket before theirs was served, instead of claiming, losing and
backing off at random. The loop (:mod:`lancetx.commit.engine.committer`) and
``commit_many`` (:mod:`lancetx.externalstore.multi_table`) join the queue here;
how long a waiter sleeps between looks, and when it stops waiting, is the
policy of :mod:`lancetx.commit.engine.contention`.

Where the queue stands is read from three places: the claims since our parent
(a claim made from the queue carries its ticket, so one Query of the table's
versions says whose turn it is), the queue item (a writer whose turn ended
without a claim serves its ticket there), and the newest ticket this process
saw served (:class:`~lancetx.commit.engine.contention.TableContention`).

The look that shows the claim before ours is also what ours builds on: a claim
from the queue hands its manifest over in its entry
(:attr:`~lancetx.commit.format.location.ManifestLocation.handover`), so the
next in line reads nothing more before it stages and claims (the commit loop
checks the parent's final copy with one HEAD, see ``committer._finish_parent``).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

from lancetx.commit.engine import contention
from lancetx.commit.engine.effects import (
    EndTurn,
    ListVersions,
    LookVersions,
    Names,
    ReadTurns,
    Sleep,
    Steps,
    TakeTicket,
)
from lancetx.commit.engine.loading import Loaded, load_listed
from lancetx.commit.engine.operations import Transaction
from lancetx.commit.engine.retry import RetryPolicy
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.handlers.queue import Turns

log = logging.getLogger(__name__)

__all__ = [
    "MAX_LOOK",
    "QueueTurn",
    "end_turn_steps",
    "join_queue",
    "join_queue_steps",
    "look",
    "look_newer",
    "turn_served",
    "wait_for_turn",
    "wait_turn_steps",
]

#: The most versions one look reads (one BatchGetItem takes 100 keys).
MAX_LOOK = 64
#: How many versions a writer that knows nothing of the queue looks at after its
#: parent (it learned of contention moments ago; a few landed meanwhile, if any).
NEWER_LOOK = 2


@dataclass
class QueueTurn:
    """Our place in the table's commit queue, once we joined it."""

    ticket: int | None = None
    #: The highest ticket served, as last seen.
    served: int = 0
    #: The handler keeps no queue (or refused to): back off at random instead.
    unavailable: bool = False
    #: When our turn came (monotonic clock), once it did.
    turn_began: float | None = None
    #: The version the holder of ticket ``served`` claimed, as last seen.
    served_version: int = 0
    #: When ticket ``served`` was served (epoch seconds; 0 if unknown).
    served_at: float = 0.0

    @property
    def ahead(self) -> int:
        """How many tickets before ours were not served yet, as last seen."""
        assert self.ticket is not None
        return self.ticket - self.served - 1


# ------------------------------------------------------------------ front doors


def join_queue_steps(names: Names, base: str) -> Steps[QueueTurn | None]:
    """Take a ticket in the table's commit queue, for a writer that claims outside
    :func:`~lancetx.commit.engine.committer.commit_steps` (``commit_many``); None
    when the handler keeps no queue or writers outside the queue commit to the
    table now (see :meth:`~lancetx.commit.engine.contention.TableContention.queue_fair`).

    A claim whose entry records the ticket serves it; otherwise
    :func:`end_turn_steps` must."""
    turn = QueueTurn()
    joined = yield from join_queue(base, turn, contention.table_contention(names.uri(base)))
    return turn if joined else None


def wait_turn_steps(
    names: Names, base: str, turn: QueueTurn, policy: RetryPolicy, since: int
) -> Steps[None]:
    """Wait until every ticket before ``turn``'s was served (or the queue stalls),
    watching the versions after ``since`` (see :func:`join_queue_steps`)."""
    contended = contention.table_contention(names.uri(base))
    yield from wait_for_turn(names, base, turn, contended, policy, since, None)


def turn_served(names: Names, base: str, turn: QueueTurn, version: int) -> None:
    """``turn``'s ticket was served by the claim of ``version`` (its entry records it)."""
    if turn.ticket is not None:
        contention.table_contention(names.uri(base)).saw_served(turn.ticket, version, time.time())
    turn.ticket = None


def end_turn_steps(
    names: Names, base: str, turn: QueueTurn, version: int | None = None
) -> Steps[None]:
    """Serve ``turn``'s ticket in the queue item (a turn that ends without a claim
    recording it; ``version``: the version it claimed, if it won), unless it was
    served already. Errors are logged, never raised: the queue only orders
    writers, and a commit's outcome stands whatever serving its ticket raises."""
    if turn.ticket is None:
        return
    ticket, turn.ticket = turn.ticket, None
    try:
        yield EndTurn(base, ticket, version)
    except Exception as exc:  # the waiters behind go after their stall limit
        log.warning(
            "could not end turn %d in the commit queue of %s (%s)", ticket, names.uri(base), exc
        )


# ------------------------------------------------------------------------ steps


def look(base: str, since: int, count: int) -> Steps[tuple[list[ManifestLocation], bool]]:
    """The versions claimed after ``since``: the queue's point reads of the next
    ``count`` (a look whose cost does not grow with the history, as a listing's
    may), else the handler's listing of every one. Returns them, and whether more
    may have been claimed beyond them (the look read as many as it asked for)."""
    count = max(1, min(count, MAX_LOOK))
    looked: list[ManifestLocation] | None = yield LookVersions(base, since, count)
    if looked is None:
        listed: list[ManifestLocation] = yield ListVersions(base, since)
        return listed, False
    return looked, len(looked) >= count


def look_newer(names: Names, base: str, since: int, ours: Transaction) -> Steps[list[Loaded]]:
    """The versions committed after ``since``, loaded (see
    :func:`~lancetx.commit.engine.loading.load_listed`), found by looks: what a
    queued writer learns when its turn comes without a look that showed them."""
    seen: list[ManifestLocation] = []
    more = True
    while more:
        found, more = yield from look(base, seen[-1].version if seen else since, NEWER_LOOK)
        seen.extend(found)
    return (yield from load_listed(names, base, since, seen, ours=ours))


def join_queue(base: str, turn: QueueTurn, contended: contention.TableContention) -> Steps[bool]:
    """Take a ticket unless we hold one; False when the handler keeps no queue.

    Where the queue stands comes from two places: the queue item (tickets
    served by writers whose turn ended without a claim) and the newest ticket
    this process saw served by a claim (claims serve their tickets in their
    entries, not in the queue item).
    """
    if turn.ticket is not None:
        return True
    if turn.unavailable or not contended.queue_fair(time.monotonic()):
        return False
    turns: Turns | None = yield TakeTicket(base)
    if turns is None:
        turn.unavailable = True
        return False
    turn.ticket, turn.served = turns.issued, turns.served
    turn.served_version = turns.served_version
    turn.served_at = turns.served_at
    seen = contended.served
    if seen is not None:
        if seen.served >= turns.issued:
            contended.served = None  # from before the queue item was reset
        elif seen.served > turn.served:
            turn.served, turn.served_version = seen.served, seen.served_version
            turn.served_at = seen.served_at
    if turns.issued - turn.served > 1:
        contended.queued(time.monotonic())
    return True


def wait_for_turn(
    names: Names,
    base: str,
    turn: QueueTurn,
    contended: contention.TableContention,
    policy: RetryPolicy,
    since: int,
    ours: Transaction | None,
) -> Steps[list[Loaded] | None]:
    """Wait until every ticket before ours was served (or the queue stalls).

    It watches the table (:func:`contention.turn_wait` says when; each look
    reads the versions after the newest seen that the tickets ahead can claim,
    by key: one GetItem next in line, one BatchGetItem far back, see
    :func:`look`): a claim made from the queue carries its ticket, so the
    claims since our parent say whose turn it is, and the look that shows the
    claim of the ticket before ours completes exactly the versions we must
    build on. While the
    queue stands still it also reads the queue item now and then: a writer
    whose turn ended without a claim (refused, gave up) serves its ticket
    there. Returns the versions committed after ``since`` when it loaded
    them (never without ``ours``), else None.
    """
    assert turn.ticket is not None
    last_served, last_change = turn.served, time.monotonic()
    began, ahead = last_change, turn.ahead
    if ahead > 0:
        log.debug("%s: ticket %d, %d ahead in the commit queue", base, turn.ticket, ahead)
    newer: list[Loaded] | None = None
    looks = 0
    watching = False  # next in line, looking again within its predecessor's turn
    checked = last_change  # when we last read the queue item
    seen: list[ManifestLocation] = []  # the versions after ``since`` listed so far
    more = False  # the last look read all it asked for: more may follow at once
    while turn.ahead > 0:
        ahead_now = turn.ahead
        into_turn = time.time() - turn.served_at if turn.served_at else None
        if not more:
            yield Sleep(
                contention.turn_wait(
                    policy, contended, ahead_now, into_turn, first_look=not watching
                )
            )
        watching = ahead_now == 1
        now = time.monotonic()
        looks += 1
        standing = now - last_change
        served_at_before = turn.served_at
        # Only what is new since the last look, and only as many versions as
        # the tickets ahead can claim before our turn (the next in line: one).
        listed, more = yield from look(base, seen[-1].version if seen else since, ahead_now)
        seen.extend(listed)
        moved = _served_by_claims(turn, listed, contended)
        moved = _served_by_unmarked(turn, listed) or moved
        if moved and turn.ahead <= 0 and ours is not None:
            newer = yield from load_listed(names, base, since, seen, ours=ours)
        elif not moved and min(standing, now - checked) > contention.queue_check_after(contended):
            # Standing still: did the holder end its turn without a claim? It
            # serves its ticket in the queue item then, where claims cannot show it.
            checked = now
            turns: Turns | None = yield ReadTurns(base)
            if turns is None:
                break
            moved = _served_in_queue_item(turn, turns)
        if moved:
            if served_at_before and turn.served_at > served_at_before:
                # Timed by the serving writers' own clocks: exact, however
                # seldom we look. (Timing it by our looks would count our own
                # sleep as the queue's, and every waiter would sleep longer.)
                contended.turns_served(turn.served - last_served, turn.served_at - served_at_before)
            contended.saw_served(turn.served, turn.served_version, turn.served_at)
            last_served, last_change = turn.served, now
            watching = False
            continue
        if standing <= contention.stall_limit(contended):
            continue
        # The holder ahead is slow or gone. Go anyway: the claim still decides,
        # and our claim serves our ticket, which moves the mark past its one.
        log.debug(
            "commit queue of %s stands at %d for %.1f s; ticket %d goes ahead",
            base,
            turn.served,
            standing,
            turn.ticket,
        )
        break
    turn.turn_began = time.monotonic()
    if ahead > 0:
        log.debug(
            "%s: ticket %d's turn after %.3f s (%d ahead, %d looks)",
            base,
            turn.ticket,
            time.monotonic() - began,
            ahead,
            looks,
        )
    return newer


def _served_in_queue_item(turn: QueueTurn, turns: Turns) -> bool:
    """Move ``turn`` on by the queue item's ``served`` mark; True if it moved."""
    if turns.served <= turn.served:
        return False
    turn.served = turns.served
    turn.served_version = max(turn.served_version, turns.served_version)
    turn.served_at = turns.served_at
    return True


def _served_by_claims(
    turn: QueueTurn, listed: list[ManifestLocation], contended: contention.TableContention
) -> bool:
    """Move ``turn`` on by the tickets the listed claims served; True if it moved.
    The stamps of the claims new to us time the queue's turns."""
    claims = sorted(
        (loc.summary.ticket, loc.version, loc.summary.claimed_at)
        for loc in listed
        if loc.summary is not None and loc.summary.ticket is not None
    )
    if not claims:
        return False
    ticket, version, claimed_at = claims[-1]
    if ticket <= turn.served:
        return False
    timed = [(t, at) for t, _, at in claims if at is not None and t >= turn.served]
    if turn.served_at and (not timed or timed[0][0] > turn.served):
        timed.insert(0, (turn.served, turn.served_at))
    contended.claims_timed(
        (at2 - at1) / (t2 - t1) for (t1, at1), (t2, at2) in itertools.pairwise(timed) if t2 > t1
    )
    turn.served = ticket
    turn.served_version = max(turn.served_version, version)
    turn.served_at = claimed_at or time.time()
    return True


def _served_by_unmarked(turn: QueueTurn, listed: list[ManifestLocation]) -> bool:
    """Count each listed version that shows no ticket at all (no summary) and is newer
    than the last claim known to serve one as serving the next ticket (never ours);
    True if it moved ``turn``.

    Such an entry is mostly one of ours that a pylance reader finalized after its
    writer's flip: pylance's full-item PutItem keeps only Lance's attributes, and
    nobody can tell the ticket it carried. Waiting for tickets we can no longer see
    would stand the queue still until the stall limit; counting one too many (the
    version was an outsider's, or a claim made outside the queue) costs at worst one
    lost round against the holder, who claims right after."""
    assert turn.ticket is not None
    unmarked = [loc for loc in listed if loc.summary is None and loc.version > turn.served_version]
    served = min(turn.ticket - 1, turn.served + len(unmarked))
    if served <= turn.served:
        return False
    turn.served = served
    turn.served_version = unmarked[-1].version
    turn.served_at = time.time()
    return True
