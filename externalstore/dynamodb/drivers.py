"""The drivers of the DynamoDB plans: the only code that performs their I/O.

A plan (:mod:`.plans`) yields :class:`~.plans.ApiCall` and :class:`~.plans.Sleep`
steps; :func:`run_plan` performs them with a boto3 client and
:func:`run_plan_async` with an aiobotocore one, sending each response back in or
throwing the botocore exception into the plan, which decides.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from lancetx.commit.sansio import drive, drive_async
from lancetx.externalstore.dynamodb.plans import METHODS, Requests, Sleep, Step

__all__ = ["run_plan", "run_plan_async"]

T = TypeVar("T")

#: What a plan is given back: botocore's errors, which the plan translates; anything
#: else (a bug, an interrupt, even in a sleep) leaves the plan where it stands.
_BOTOCORE = (ClientError, BotoCoreError)


def run_plan(client: Any, plan: Requests[T], sleep: Callable[[float], None] = time.sleep) -> T:
    """Drive ``plan`` with a boto3 client: the only blocking I/O of the sync store."""

    def perform(step: Step) -> Any:
        if isinstance(step, Sleep):
            return sleep(step.seconds)
        return getattr(client, METHODS[step.operation])(**step.params)

    return drive(plan, perform, passes=_BOTOCORE)


async def run_plan_async(
    client: Any, plan: Requests[T], sleep: Callable[[float], Awaitable[None]] | None = None
) -> T:
    """Drive ``plan`` with an aiobotocore client: the only I/O of the async store
    (``sleep``: ``asyncio.sleep`` unless given)."""
    if sleep is None:
        import asyncio  # here: the sync store, which opening a table uses, never loads it

        sleep = asyncio.sleep

    async def perform(step: Step) -> Any:
        if isinstance(step, Sleep):
            return await sleep(step.seconds)
        return await getattr(client, METHODS[step.operation])(**step.params)

    return await drive_async(plan, perform, passes=_BOTOCORE)
