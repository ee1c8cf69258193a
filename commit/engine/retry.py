"""One retry policy: a time budget, capped exponential windows, jitter.

Used by the commit loop (lost races) and by the DynamoDB store (throttling,
5xx); each has its own defaults (:data:`lancetx.externalstore.dynamodb.retry.DYNAMODB_RETRY`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# 2**62 seconds is already far past any max_delay; larger exponents only risk overflow.
_MAX_EXPONENT = 62


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``max_attempts`` attempts and (for the commit loop) at most
    ``max_elapsed`` seconds from the first attempt to the start of the last one
    (None: no time limit); before retry ``k`` (1 = the first retry)
    a wait drawn from a window of ``max(base_delay, slot) * 2**(k-1)`` seconds,
    capped at ``max_delay``. ``slot`` is a measured duration the caller may
    supply (the commit loop passes how long its lost attempt took), else 0.
    ``jitter`` is the randomized fraction of the window (1.0 = full jitter).

    The defaults are the commit loop's: a lost race names its winner, so
    windows are short, and the budget is time — five minutes, with a count cap
    far above what that allows, as a safety net. A writer therefore keeps
    trying under sustained contention as long as a person would wait for it.
    """

    max_attempts: int = 1000
    base_delay: float = 0.002
    max_delay: float = 5.0
    jitter: float = 1.0
    max_elapsed: float | None = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_elapsed is not None and self.max_elapsed < 0:
            raise ValueError(f"RetryPolicy.max_elapsed must be >= 0, got {self.max_elapsed}")
        if self.base_delay < 0 or self.max_delay < 0 or not 0 <= self.jitter <= 1:
            raise ValueError("RetryPolicy delays must be >= 0 and jitter in [0, 1]")

    def window(self, retry: int, slot: float = 0.0) -> float:
        """The longest wait before retry number ``retry``."""
        growth = 2.0 ** min(max(retry - 1, 0), _MAX_EXPONENT)
        return float(min(self.max_delay, max(self.base_delay, slot) * growth))

    def cap(self, attempt: int) -> float:
        """The window after failed attempt ``attempt`` (0-based): ``window(attempt + 1)``."""
        return self.window(attempt + 1)

    def delay(self, retry: int, slot: float = 0.0, rng: random.Random | None = None) -> float:
        """A wait before retry number ``retry``: uniform over the jittered part of the window."""
        window = self.window(retry, slot)
        spread: float = (rng or random).uniform(0, window * self.jitter)
        return window * (1 - self.jitter) + spread
