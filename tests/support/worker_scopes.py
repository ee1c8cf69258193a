"""How ``make test``'s pytest-xdist workers share the suite: every test under
``tests/spark/`` on one worker (the run's one local Spark session lives there: a second
would double the memory and CPU a small machine has for the run), every other test a
unit of its own, handed to whichever worker is free.

pytest-xdist's ``loadgroup`` would say the same with markers, but it renames node ids
to carry the group, which pytest 9 no longer lets a plugin do (the markers are then
silently ignored); a scheduler of our own only reads the ids.
"""

from __future__ import annotations

from typing import Any

#: The unit of work that holds every Spark test.
SPARK_SCOPE = "tests/spark"


def scope_of(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to."""
    return SPARK_SCOPE if nodeid.startswith(SPARK_SCOPE + "/") else nodeid


def make_scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's scope scheduler with :func:`scope_of` as its scopes. Scopes are
    handed out largest first, so the Spark unit starts at once and the small ones fill
    the other worker meanwhile."""
    from xdist.scheduler import LoadScopeScheduling

    class SparkOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return SparkOnOneWorker(config, log)
