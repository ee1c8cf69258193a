"""A table's commit queue: an optional capability a commit handler may offer.

Writers under contention take a ticket and wait for their turn instead of
colliding (the waiting policy: :mod:`lancetx.commit.engine.contention`; the
waiting itself: :mod:`lancetx.commit.engine.turns`). A handler that keeps one
offers it as its ``queue`` attribute (:attr:`CommitHandler.queue
<lancetx.commit.handlers.interface.CommitHandler.queue>`); a handler without one
leaves it None and the commit loop backs off at random instead.

The queue is advisory only: a version is still claimed by
:meth:`~lancetx.commit.handlers.interface.CommitHandler.commit` alone, and the
queue's failures must never fail a commit (an implementation logs them and
answers None: the writers fall back to random backoff).

Waiters watch the claims after the newest version they know
(:meth:`CommitQueue.look`: point reads of the versions they expect next, whose
cost does not grow with the history), falling back to the handler's listing.

A ticket is served in one of two ways. A claim serves its own: the loop puts
the ticket in the claim's summary
(:attr:`~lancetx.commit.format.location.TransactionSummary.ticket`), and a
handler offering a queue records it with the claimed version, where the
writers waiting behind see it when they list the versions — so serving costs
no request, and the next writer starts while this one finishes its commit. A
handler may also hand the claimed manifest over in the entry
(:attr:`ManifestLocation.handover
<lancetx.commit.format.location.ManifestLocation.handover>`): the next writer
then builds on it without reading it. A
turn that ends without a claim (refused, given up, lost) is served by
:meth:`CommitQueue.end_turn`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from lancetx.commit.format.location import ManifestLocation

__all__ = ["AsyncCommitQueue", "CommitQueue", "Turns"]


@dataclass(frozen=True)
class Turns:
    """A table's commit queue item as last read: how many tickets were handed out
    (``issued``, the newest ticket) and the highest ticket served there
    (``served``: by a holder whose turn ended without a claim; a claim serves
    its ticket in its own entry instead, see :class:`TransactionSummary
    <lancetx.commit.format.location.TransactionSummary>`). The holder of ticket
    ``t`` is next when every ticket up to ``t - 1`` was served.
    See :mod:`lancetx.commit.engine.contention`."""

    issued: int
    served: int
    #: The version the holder of ticket ``served`` claimed (0 if unknown): the
    #: next holder builds on it or on a later one.
    served_version: int = 0
    #: When ticket ``served`` was served (seconds since the epoch; 0 if unknown):
    #: the turn after it began then.
    served_at: float = 0.0


class CommitQueue(abc.ABC):
    """The commit queues of the tables a handler commits to (``base``: a table's
    base key, as in :class:`~lancetx.commit.handlers.interface.CommitHandler`).

    Each method answers None (or does nothing) when the queue cannot be used
    right now; it raises nothing a commit should fail on."""

    @abc.abstractmethod
    def take_ticket(self, base: str) -> Turns | None:
        """Join the table's commit queue: the queue with our ticket as ``issued``."""

    @abc.abstractmethod
    def read_turns(self, base: str) -> Turns | None:
        """The table's commit queue as it stands."""

    @abc.abstractmethod
    def end_turn(self, base: str, ticket: int, version: int | None = None) -> None:
        """Our turn with ``ticket`` ended without a claim recording it — refused,
        given up, lost (or won, claiming ``version``, by a claim that carried no
        summary): the next may go."""

    def look(self, base: str, since: int, count: int) -> list[ManifestLocation] | None:
        """The versions ``since + 1`` … ``since + count`` claimed so far, ascending, up
        to the first one that is not: what a waiter watches, read by point reads
        whose cost does not grow with the table's history. None (the default) when
        the queue cannot look that way now: the waiter lists the versions through
        the handler instead."""
        del base, since, count
        return None


class AsyncCommitQueue(abc.ABC):
    """The asyncio twin of :class:`CommitQueue`, offered by an
    :class:`~lancetx.commit.handlers.interface.AsyncCommitHandler`."""

    @abc.abstractmethod
    async def take_ticket(self, base: str) -> Turns | None:
        """See :meth:`CommitQueue.take_ticket`."""

    @abc.abstractmethod
    async def read_turns(self, base: str) -> Turns | None:
        """See :meth:`CommitQueue.read_turns`."""

    @abc.abstractmethod
    async def end_turn(self, base: str, ticket: int, version: int | None = None) -> None:
        """See :meth:`CommitQueue.end_turn`."""

    async def look(self, base: str, since: int, count: int) -> list[ManifestLocation] | None:
        """See :meth:`CommitQueue.look`."""
        del base, since, count
        return None
