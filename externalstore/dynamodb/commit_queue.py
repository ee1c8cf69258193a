"""A table's commit queue in DynamoDB: first come, first served under contention.

Each round of claims has exactly one winner. Without coordination, writers
under contention collide, back off at random and collide again; a writer that
lost often waits longest (its window doubled) while fresh writers slip past it.
The queue gives them an order instead:

* a writer that meets contention takes a ticket — one ``UpdateItem`` adding 1
  to the table's ``issued`` counter, which returns the new value (our ticket)
  and ``served``;
* it waits until every ticket before it was served, watching the table's
  entries (each look reads the versions it expects next by key: one GetItem,
  or one BatchGetItem far back in the queue): a claim made from the queue records its ticket
  (``queue_ticket``) and time (``claimed_at``) in the claimed entry, which
  *serves* it — no request of its own — and the newest such ticket is the
  queue's ``served``. The claim also hands its staged manifest (packed, when
  small) to the next in line in the same entry (``lancetx_manifest``): the look
  that shows the claim gives the bytes to build on, so the next claim follows
  after one HEAD (is the version's final copy there yet?), a stage and a claim;
* a writer whose turn ends without a claim (refused, gave up) serves its
  ticket here instead: one ``UpdateItem`` setting ``served`` to the ticket if
  that is higher. Waiters read this item only while the queue stands still.

Invariants:

* Advisory only. A version is claimed by the conditional ``PutItem`` alone;
  the queue decides who *tries* when, never who wins. pylance writers and
  lancetx writers that saw no contention do not queue and may win rounds in
  between; a queued writer then learns the winner and tries again.
* Nobody waits for a dead writer forever: a waiter whose queue stands still
  for a stall limit (several turns, at least a second) goes anyway, and
  ``served`` only moves up (the newest ticket claimed, or ``max`` here), so a
  ticket nobody will serve is skipped as soon as any later one is served.
* Uncontended commits never touch the queue.
* A pylance reader that finalizes a staged version rewrites its item with
  Lance's attributes only (``queue_ticket`` and ``claimed_at`` gone). The
  finalizer that finds it so puts them back (see
  :func:`~lancetx.externalstore.protocol.finalize_steps`); waiters count a
  version that shows no ticket, after the last claim that showed one, as
  serving the next ticket.

Item: ``base_uri`` = the table's ``base_uri`` + :data:`QUEUE_SUFFIX`,
``version`` = 0, attributes ``issued`` (N), ``served`` (N) and
``served_version`` (N: the version the holder of ticket ``served`` claimed, if
any), ``served_at`` (N, epoch milliseconds: when it was served) — tickets served
here, by turns that ended without a claim. Lance and
pylance only query their table's own ``base_uri``, so they never see it.
Needs ``dynamodb:UpdateItem`` (and ``GetItem``); without it the handler stops
queueing and falls back to random backoff (see
:class:`~lancetx.externalstore.commit_handler.ExternalStoreCommitHandler`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

from lancetx.commit.handlers.queue import Turns
from lancetx.externalstore.dynamodb.plans import (
    ApiCall,
    RequestContext,
    Requests,
    _ConditionFailed,
    call_plan,
    key_of,
)

#: Appended to a table's ``base_uri`` to key its queue item.
QUEUE_SUFFIX = "#lancetx-commit-queue"
ISSUED = "issued"
SERVED = "served"
SERVED_VERSION = "served_version"
SERVED_AT = "served_at"

__all__ = [
    "ISSUED",
    "QUEUE_SUFFIX",
    "SERVED",
    "SERVED_AT",
    "SERVED_VERSION",
    "end_turn_plan",
    "is_queue_key",
    "read_turns_plan",
    "take_ticket_plan",
]


def is_queue_key(base_uri: str) -> bool:
    """Whether a ``base_uri`` is a commit queue's, not a table's."""
    return base_uri.endswith(QUEUE_SUFFIX)


def _key(base_uri: str) -> dict[str, Any]:
    return key_of(base_uri + QUEUE_SUFFIX, 0)


def _turns(item: Mapping[str, Any] | None) -> Turns:
    def number(name: str) -> int:
        value = (item or {}).get(name)
        if isinstance(value, Mapping) and str(value.get("N", "")).isdigit():
            return int(value["N"])
        return 0

    return Turns(
        issued=number(ISSUED),
        served=number(SERVED),
        served_version=number(SERVED_VERSION),
        served_at=number(SERVED_AT) / 1000.0,
    )


def take_ticket_plan(ctx: RequestContext, base_uri: str) -> Requests[Turns]:
    """One UpdateItem: the next ticket (``issued``) and the current ``served``."""
    params = {
        "TableName": ctx.table,
        "Key": _key(base_uri),
        "UpdateExpression": "ADD #issued :one",
        "ExpressionAttributeNames": {"#issued": ISSUED},
        "ExpressionAttributeValues": {":one": {"N": "1"}},
        "ReturnValues": "ALL_NEW",
    }
    # A retried ADD whose first answer was lost hands out a ticket nobody holds:
    # harmless, the waiters behind it skip it after the stall limit.
    response = yield from call_plan(ctx, ApiCall("UpdateItem", params), write=True)
    return _turns(response.get("Attributes"))


def read_turns_plan(ctx: RequestContext, base_uri: str) -> Requests[Turns]:
    """One consistent GetItem of the queue item (an absent item is an empty queue)."""
    params = {"TableName": ctx.table, "Key": _key(base_uri), "ConsistentRead": True}
    response = yield from call_plan(ctx, ApiCall("GetItem", params))
    return _turns(response.get("Item"))


def end_turn_plan(
    ctx: RequestContext, base_uri: str, ticket: int, version: int | None = None
) -> Requests[None]:
    """One UpdateItem raising ``served`` to ``ticket`` (never lowering it), with the
    version its holder claimed, if it did (the next holder watches for a newer one)."""
    names = {"#served": SERVED, "#served_at": SERVED_AT}
    values: dict[str, Any] = {
        ":ticket": {"N": str(int(ticket))},
        # Milliseconds: waiters on other machines time the next turn from it
        # (clocks a few ms apart only shift one sleep by as much).
        ":now": {"N": str(int(time.time() * 1000))},
    }
    update = "SET #served = :ticket, #served_at = :now"
    if version is not None:
        names["#served_version"] = SERVED_VERSION
        values[":version"] = {"N": str(int(version))}
        update += ", #served_version = :version"
    params = {
        "TableName": ctx.table,
        "Key": _key(base_uri),
        "UpdateExpression": update,
        "ConditionExpression": "attribute_not_exists(#served) OR #served < :ticket",
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    # A condition failure means a later ticket was served already: nothing to do.
    with contextlib.suppress(_ConditionFailed):
        yield from call_plan(ctx, ApiCall("UpdateItem", params), write=True)
    return None
