"""Checks an ``s3+ddb://`` connection owes before its results may be used, run beside
its first request instead of before it.

Opening a table used to send, before anything useful, a DescribeTable (the table's
key layout), a GetItem of the store's layout stamp and a GetItem of the table's
moved record: three round trips before the first read. None of them can change what
the first request returns; they only decide whether it may be trusted. So :class:`Preflight` starts them on a thread when
the connection is first used, lets the request run meanwhile, and reports their
verdict before the request's result is handed back (each check on its own thread, so
the first use waits for one round trip more at most, not three): a failed check (the table was
migrated, the store is newer than this lancetx) is raised instead of the result, and
also instead of the request's own error, which it usually explains. A check that
passed is not repeated for the connection; one that failed (or could not be made, e.g.
throttled) is made again at the next use.

A *write* (a claim, finishing it) is not run beside the checks but after them:
a claim that landed on a table a check refuses (migrated off DynamoDB, stamped by a
newer lancetx) would be finalized into that table by its next ``s3+ddb://`` reader.
So the write waits one round trip more, on the rare connection whose first use is a
write (its parent came from elsewhere). Only the ``write_verdicts`` (the errors that
mean "do not write here") stop it, before anything is sent; any other error of a
check (throttled, unreachable) is logged, the write goes ahead, and the check is made
again at the next use.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class Preflight:
    """``checks`` run once, each on its own thread, beside the first action (see the
    module docstring); what they return is ignored, what they raise is the verdict. They are independent round trips, so the first use waits for
    the slowest one, not their sum; if several fail, the first in ``checks`` order is
    raised (put the most basic first)."""

    def __init__(
        self,
        checks: Sequence[Callable[[], object]],
        *,
        verdicts: tuple[type[BaseException], ...] = (BaseException,),
        write_verdicts: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        self._checks = tuple(checks)
        self._verdicts = verdicts
        self._write_verdicts = verdicts if write_verdicts is None else write_verdicts
        self._lock = threading.Lock()
        self._passed = False
        self._pending: list[Future[None]] | None = None

    @property
    def passed(self) -> bool:
        """Whether the checks have passed (nothing left to run)."""
        return self._passed

    def beside(self, action: Callable[[], T], *, write: bool = False) -> T:
        """``action()``, with the checks running beside it until they have passed once.

        Raises a check's error, if one fails, in place of the action's result or error.
        A ``write`` is not run beside the checks but after them: a ``write_verdicts``
        error is raised before anything is written; any other failure of a check (it
        could not be made) is logged, and the write goes ahead.
        """
        if self._passed:
            return action()
        with self._lock:
            pending = self._pending
            if pending is None and not self._passed:
                pending = self._pending = [_start(check) for check in self._checks]
        if pending is None:
            return action()
        if write:
            # A write waits for the checks: a claim that landed on a table a check
            # refuses (moved, a newer store) would be finalized into it by the next
            # reader. A check that could not be made is logged and made again later.
            self._settle(pending, self._write_verdicts)
            return action()
        try:
            result = action()
        except BaseException:
            self._settle(pending, self._verdicts)
            raise
        self._settle(pending, self._verdicts)
        return result

    def _settle(
        self, pending: list[Future[None]], verdicts: tuple[type[BaseException], ...]
    ) -> None:
        errors = [f.exception() for f in pending]  # waits for every check
        failed = next((e for e in errors if e is not None), None)
        with self._lock:
            if failed is None:
                self._passed = True
                self._pending = None
            elif self._pending is pending:
                self._pending = None  # not passed: check again at the next use
        verdict = next((e for e in errors if isinstance(e, verdicts)), None)
        if verdict is not None:
            raise verdict
        if failed is not None:
            log.warning("could not check beside the request, will check again: %s", failed)


def _start(check: Callable[[], object]) -> Future[None]:
    future: Future[None] = Future()

    def work() -> None:
        try:
            check()
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)
        else:
            future.set_result(None)

    threading.Thread(target=work, name="lancetx-preflight", daemon=True).start()
    return future


__all__ = ["Preflight"]
