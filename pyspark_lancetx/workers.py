"""Making ``format("lancetx")`` findable by Spark's Python workers.

Spark looks data sources up, plans and runs them in Python worker processes it
starts with ``PYSPARK_PYTHON`` (else ``python3`` from ``PATH``), never in the
driver's interpreter. A job started with a virtualenv's Python that is not
activated therefore has workers that cannot import this package, and Spark
answers ``[DATA_SOURCE_NOT_FOUND] Failed to find the data source: lancetx``.

Importing :mod:`pyspark_lancetx` on the driver settles it (:func:`prepare_workers`):

* before the session starts, with ``PYSPARK_PYTHON`` unset and a default
  ``python3`` that cannot import the package, it sets ``PYSPARK_PYTHON`` to the
  driver's interpreter, which can;
* after a local session started with such workers, it registers the data source
  with that session explicitly (``spark.dataSource.register``), its workers
  running the driver's interpreter, and says so in a warning.

Clusters (a non-local master) are left as deployed: their workers run on other
machines, whose interpreters this process cannot judge. :func:`register` does the
explicit registration on demand.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import Any

from pyspark_lancetx.errors import SparkSetupError

log = logging.getLogger("pyspark_lancetx")

#: Whether an interpreter has the package and what it runs on (found, not imported: fast).
_IMPORT_CHECK = (
    "import importlib.util, sys; "
    "sys.exit(0 if all(importlib.util.find_spec(m) for m in "
    "('pyspark_lancetx', 'lancetx', 'lance', 'pyarrow')) else 1)"
)


def _in_a_worker() -> bool:
    """Whether this process is one of Spark's Python workers (they import the package
    too: nothing to prepare there)."""
    if "PYTHON_WORKER_FACTORY_SECRET" in os.environ:
        return True
    return any(
        name in ("pyspark.daemon", "pyspark.worker") or name.startswith("pyspark.sql.worker")
        for name in list(sys.modules)
    )


def _same_interpreter(python: str) -> bool:
    mine = os.path.abspath(sys.executable)
    theirs = os.path.abspath(python)
    if theirs == mine:
        return True
    # python and python3 of one virtualenv (the same file, in the same bin directory);
    # the base interpreter a venv's python links to is *not* the same: it lacks the venv.
    try:
        return os.path.dirname(theirs) == os.path.dirname(mine) and os.path.samefile(theirs, mine)
    except OSError:
        return False


def can_import_package(python: str) -> bool:
    """Whether interpreter ``python`` (a path or a name on ``PATH``) imports this package."""
    resolved = python if os.sep in python else shutil.which(python)
    if resolved is None:
        return False
    if _same_interpreter(resolved):
        return True
    try:
        done = subprocess.run(
            [resolved, "-c", _IMPORT_CHECK],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _make_discoverable() -> None:
    """Spark's lookup lists top-level modules with ``pkgutil.iter_modules()``, which does
    not see a package an editable install serves through an import hook (outside the
    checkout it is importable, yet not listed). Then the folder holding it goes on the
    workers' ``PYTHONPATH``."""
    import importlib.util
    import pkgutil

    if any(info.name == "pyspark_lancetx" for info in pkgutil.iter_modules()):
        return
    spec = importlib.util.find_spec("pyspark_lancetx")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        return
    folder = os.path.dirname(os.path.abspath(locations[0]))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, folder])
        log.info(
            "pyspark_lancetx is an editable install Spark's data-source lookup cannot list: "
            "added %s to PYTHONPATH for the Python workers",
            folder,
        )


def _active_session() -> Any:
    """The driver's SparkSession, if pyspark is loaded and one exists (never imports pyspark)."""
    module = sys.modules.get("pyspark.sql.session")
    if module is None:
        return None
    session_class = getattr(module, "SparkSession", None)
    session = getattr(session_class, "_instantiatedSession", None)
    if session is None and session_class is not None:
        session = session_class.getActiveSession()
    return session


def register(spark: Any = None) -> None:
    """Register ``format("lancetx")`` with ``spark`` (default: the active session)
    explicitly, its Python workers running this interpreter, which can import the
    package whatever ``PYSPARK_PYTHON`` says. Raises SparkSetupError when the
    session has no local SparkContext (Spark Connect): there, install ``lancetx[spark]``
    into the interpreter the server's workers run."""
    session = spark if spark is not None else _active_session()
    if session is None:
        raise SparkSetupError(
            "no active SparkSession to register the lancetx data source with: start the "
            "session first, or set PYSPARK_PYTHON to an interpreter that has lancetx[spark] "
            f"installed (this one: {sys.executable}) before it starts"
        )
    try:
        context = session.sparkContext
    except Exception as exc:  # Spark Connect sessions have no local SparkContext
        raise SparkSetupError(
            f"cannot register the lancetx data source from here ({type(exc).__name__}: the "
            "session has no local SparkContext, as with Spark Connect): install lancetx[spark] "
            "into the Python that the server's workers run (its PYSPARK_PYTHON), or call "
            "spark.dataSource.register(pyspark_lancetx.DefaultSource) where the session runs"
        ) from None
    from pyspark_lancetx.datasource import LanceTxDataSource

    # The registered source carries its own worker interpreter, taken from the context.
    previous = context.pythonExec
    context.pythonExec = sys.executable
    try:
        session.dataSource.register(LanceTxDataSource)
    finally:
        context.pythonExec = previous


def prepare_workers() -> None:
    """See the module docstring; called when the package is imported. Never raises."""
    try:
        _prepare()
    except Exception:  # an import must not fail over a convenience
        log.debug("could not prepare Spark's Python workers for lancetx", exc_info=True)


def _prepare() -> None:
    if _in_a_worker():
        return
    session = _active_session()
    if session is None:
        worker = os.environ.get("PYSPARK_PYTHON")
        if not worker:
            if can_import_package("python3"):
                worker = "python3"
            else:
                worker = os.environ["PYSPARK_PYTHON"] = sys.executable
                log.info(
                    "PYSPARK_PYTHON was not set and python3 on PATH cannot import "
                    "pyspark_lancetx: Spark sessions started from now on run their Python "
                    "workers with %s",
                    sys.executable,
                )
        resolved = worker if os.sep in worker else shutil.which(worker)
        if resolved is not None and _same_interpreter(resolved):
            _make_discoverable()
        return
    context = session.sparkContext
    if not str(context.master).startswith("local") or can_import_package(context.pythonExec):
        return
    register(session)
    source = (
        f"PYSPARK_PYTHON={os.environ['PYSPARK_PYTHON']}"
        if os.environ.get("PYSPARK_PYTHON")
        else "python3 on PATH; PYSPARK_PYTHON is not set"
    )
    log.warning(
        "this Spark session's Python workers (%s) cannot import pyspark_lancetx, so Spark "
        "could not find format('lancetx') on its own: registered it with the session "
        "explicitly (spark.dataSource.register), its workers running %s. To avoid this, "
        "set PYSPARK_PYTHON=%s before the session starts, or import pyspark_lancetx first",
        source,
        sys.executable,
        sys.executable,
    )


__all__ = ["can_import_package", "prepare_workers", "register"]
