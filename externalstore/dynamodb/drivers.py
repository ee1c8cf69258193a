"""The drivers of the DynamoDB plans: the only code that performs their I/O.

A plan (:mod:`.plans`) yields :class:`~.plans.ApiCall` and :class:`~.plans.Sleep`
steps; :func:`run_plan` performs them with a boto3 client and
:func:`run_plan_async` with an aiobotocore one, sending each response back in or
throwing the botocore exception into the plan, which decides.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from botocore.exceptions import BotoCoreError, ClientError

from lancetx.externalstore.dynamodb.plans import METHODS, Plan, Sleep

__all__ = ["run_plan", "run_plan_async"]

T = TypeVar("T")


def run_plan(client: Any, plan: Plan[T], sleep: Callable[[float], None] = time.sleep) -> T:
    """Drive ``plan`` with a boto3 client: the only blocking I/O of the sync store."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = plan.throw(error) if error is not None else plan.send(value)
        except StopIteration as stop:
            return cast(T, stop.value)
        value, error = None, None
        if isinstance(step, Sleep):
            sleep(step.seconds)
            continue
        try:
            value = getattr(client, METHODS[step.operation])(**step.params)
        except (ClientError, BotoCoreError) as exc:
            error = exc


async def run_plan_async(
    client: Any, plan: Plan[T], sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
) -> T:
    """Drive ``plan`` with an aiobotocore client: the only I/O of the async store."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = plan.throw(error) if error is not None else plan.send(value)
        except StopIteration as stop:
            return cast(T, stop.value)
        value, error = None, None
        if isinstance(step, Sleep):
            await sleep(step.seconds)
            continue
        try:
            value = await getattr(client, METHODS[step.operation])(**step.params)
        except (ClientError, BotoCoreError) as exc:
            error = exc
