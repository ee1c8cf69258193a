"""How big the long tests run.

``make test`` (the quick profile, the default) runs every test, each long one at a size
that still proves its point in seconds; CI's long pass (``LANCETX_TEST_PROFILE=long``,
run by ``.ci/run`` after ``make test``) runs the tests marked ``long`` again at the sizes
the acceptance criteria name (20 rounds of a race, 1,000 randomized histories, a
5-minute soak). A test's own variable (e.g. ``LANCETX_KEY_RACE_ROUNDS``) overrides both.
"""

from __future__ import annotations

import os

#: The variable that picks the profile: ``quick`` (default) or ``long``.
PROFILE_VARIABLE = "LANCETX_TEST_PROFILE"


def profile() -> str:
    value = os.environ.get(PROFILE_VARIABLE, "quick").strip().lower() or "quick"
    if value not in ("quick", "long"):
        raise ValueError(f"{PROFILE_VARIABLE}={value!r}: use 'quick' (the default) or 'long'")
    return value


def is_long() -> bool:
    return profile() == "long"


#: Set by ``.ci/run`` for its ``make test``: the long pass that follows runs every test
#: marked ``long`` again at full size, so the quick run leaves them to it.
LONG_PASS_FOLLOWS_VARIABLE = "LANCETX_LONG_PASS_FOLLOWS"


def long_pass_follows() -> bool:
    """True in a quick run whose long tests a long pass will run at full size."""
    return not is_long() and os.environ.get(LONG_PASS_FOLLOWS_VARIABLE, "") not in ("", "0")


def sized(variable: str, *, quick: int, long: int) -> int:
    """``$variable`` if set, else ``long`` in the long profile and ``quick`` otherwise."""
    given = os.environ.get(variable)
    if given:
        return int(given)
    return long if is_long() else quick


def seconds(variable: str, *, quick: float, long: float) -> float:
    """As :func:`sized`, for a duration in seconds."""
    given = os.environ.get(variable)
    if given:
        return float(given)
    return long if is_long() else quick
