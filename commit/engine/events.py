"""What the commit loop reports about each attempt, for metrics and logs.

``CommitOptions(observer=...)`` receives one :class:`CommitEvent` per attempt,
in order, from the thread (or task) that runs the commit. The last event of a
successful commit has outcome ``"won"``, ``"rebased"`` or ``"deduplicated"``,
and the number of events equals ``Committed.attempts``. An observer that
raises is logged and ignored: metrics must never decide whether a commit lands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger("lancetx.commit.engine.committer")

#: How one attempt ended.
#:
#: * ``won`` — this attempt claimed ``attempted_version``;
#: * ``rebased`` — it claimed ``attempted_version`` after ours was rebased onto
#:   versions committed since it read the table (deletion vectors merged);
#: * ``lost`` — another writer claimed ``attempted_version`` first; the loop waits and retries;
#: * ``conflict`` — a version committed since ours read the table conflicts with it
#:   (the commit raises Retryable/IncompatibleConflictError, nothing of ours is kept);
#: * ``unknown`` — the claim's outcome could not be settled (CommitStateUnknownError);
#: * ``deduplicated`` — a version committed since ours read the table carries our
#:   idempotency key (or is our very transaction): that version is returned.
Outcome = Literal["won", "rebased", "lost", "conflict", "unknown", "deduplicated"]


@dataclass(frozen=True)
class CommitEvent:
    """One attempt of one commit.

    ``table_uri`` is the URI the caller named the table by
    (``CommitOptions.table_uri``, else the object store's URI of the table).
    ``attempted_version`` is the version the attempt tried to claim (for
    ``deduplicated``: the version that already holds the transaction; None when
    the attempt ended before choosing one). ``duration_s`` is the attempt's wall
    time, including a rebase but not the wait before it. ``requests`` counts the
    storage requests the attempt issued as the loop sees them (a handler's claim
    counts once, although a DynamoDB claim is several requests); None if unknown.
    ``committed_since_read`` is how many versions other writers committed
    between ours' read version and the version attempted (the contention measure).
    """

    table_uri: str
    attempt: int
    outcome: Outcome
    read_version: int
    attempted_version: int | None
    duration_s: float
    requests: int | None = None
    transaction_uuid: str = ""
    operation: str = ""
    committed_since_read: int = 0


#: The type of ``CommitOptions.observer``.
CommitObserver = Callable[[CommitEvent], None]


def notify(observer: CommitObserver | None, event: CommitEvent) -> None:
    """Hand ``event`` to ``observer``; an observer's error is logged, never raised."""
    if observer is None:
        return
    try:
        observer(event)
    except Exception:  # a broken metrics hook must not fail a commit
        log.warning(
            "commit observer %r raised on %s event for %s; ignored",
            observer,
            event.outcome,
            event.table_uri,
            exc_info=True,
        )


__all__ = ["CommitEvent", "CommitObserver", "Outcome", "notify"]
