"""The sans-IO kit: steps that yield effects, and the one way to drive them.

Every piece of lancetx that talks to a store is written as *steps*: a generator
that yields an effect (read this object, claim this entry, call DynamoDB, sleep…),
receives the effect's result, or has the effect's error thrown in, and returns its
value. The steps perform no I/O, so one implementation is driven by a blocking
driver and an asyncio one, and tests can stop them at any effect.

A *driver* is then only its table of effects: a ``perform`` function from an effect
to its result, handed to :func:`drive` (blocking) or :func:`drive_async` (awaited).
A *relay* (:func:`relay`, or :func:`advance` for one with its own logic) sits between
steps and their driver: it sees, or rewrites, each effect and its result.

Which errors of ``perform`` are thrown back into the steps is each driver's choice,
made explicit by its ``passes`` argument (see :func:`drive`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

E = TypeVar("E")
T = TypeVar("T")

#: Steps yielding effects of type ``E`` and returning ``T``.
Steps = Generator[E, Any, T]


class Outcome:
    """What an effect gave: a result or an error, to carry either into the steps
    (and across a thread or task boundary)."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error


def advance(steps: Generator[E, Any, Any], last: Outcome) -> tuple[bool, Any]:
    """Hand ``last`` to ``steps``: (True, their next effect) or (False, their return value).

    The only place in lancetx where steps are resumed; an error in ``last`` is
    raised inside the steps, at the ``yield`` of the effect that failed."""
    try:
        if last.error is not None:
            return True, steps.throw(last.error)
        return True, steps.send(last.value)
    except StopIteration as stop:
        return False, stop.value


# ``passes``: the errors of ``perform`` thrown back into the steps; any other error
# leaves the driver (and the steps are closed where they stand). The drivers differ
# on purpose: the commit loop's and the verbs' pass every BaseException, because
# their steps must record what an interrupt (Ctrl-C, a cancellation) may have left in
# flight — a claim that may have landed keeps its files (commit/engine/unreferenced.py);
# the protocol's and its relays pass LancetxError, which their steps handle and
# nothing else; the DynamoDB request plans pass botocore's errors, which they
# translate.
Passes = type[BaseException] | tuple[type[BaseException], ...]


def drive(steps: Steps[E, T], perform: Callable[[E], Any], *, passes: Passes) -> T:
    """Run ``steps`` to their end, performing each effect with ``perform`` (blocking).

    ``perform`` may return an :class:`Outcome` to hand back an error it did not
    raise (the first failure of effects run side by side)."""
    last = Outcome()
    while True:
        running, effect = advance(steps, last)
        if not running:
            return cast(T, effect)
        try:
            result = perform(effect)
        except passes as exc:
            last = Outcome(error=exc)
            continue
        last = result if isinstance(result, Outcome) else Outcome(result)


async def drive_async(
    steps: Steps[E, T], perform: Callable[[E], Awaitable[Any]], *, passes: Passes
) -> T:
    """:func:`drive`, awaiting ``perform``."""
    last = Outcome()
    while True:
        running, effect = advance(steps, last)
        if not running:
            return cast(T, effect)
        try:
            result = await perform(effect)
        except passes as exc:
            last = Outcome(error=exc)
            continue
        last = result if isinstance(result, Outcome) else Outcome(result)


def relay(
    steps: Steps[E, T], on_effect: Callable[[E], E], *, passes: Passes
) -> Generator[E, Any, T]:
    """``steps``, each effect handed to ``on_effect`` (which may replace it) before it
    is yielded on; results and the ``passes`` errors go back in unchanged. Closing
    the relay closes ``steps``."""
    last = Outcome()
    while True:
        running, effect = advance(steps, last)
        if not running:
            return cast(T, effect)
        effect = on_effect(effect)
        try:
            last = Outcome((yield effect))
        except GeneratorExit:
            steps.close()
            raise
        except passes as exc:
            last = Outcome(error=exc)


__all__ = ["Outcome", "Passes", "Steps", "advance", "drive", "drive_async", "relay"]
