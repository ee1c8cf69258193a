"""The suite's profiles: which tests a quick run, CI's quick run and the long pass hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONG_TEST = "tests/table/test_key_races.py"


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest in a child process at the repository's root, without this run's
    ``LANCETX_*`` settings (``env`` adds some)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LANCETX_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _outcomes(**env: str) -> str:
    """``pytest --setup-plan -rs`` on a file of ``long`` tests: nothing runs, skips and
    their reasons are reported."""
    done = _pytest(LONG_TEST, "--setup-plan", "-rs", "-q", **env)
    return done.stdout + done.stderr


def test_ci_quick_run_leaves_long_tests_to_the_long_pass() -> None:
    assert "run at full size by the long pass" not in _outcomes()
    assert "run at full size by the long pass" in _outcomes(LANCETX_LONG_PASS_FOLLOWS="1")
    # The long pass itself runs them whatever the variable says.
    long = _outcomes(LANCETX_LONG_PASS_FOLLOWS="1", LANCETX_TEST_PROFILE="long")
    assert "run at full size by the long pass" not in long


def test_every_spark_test_runs_on_one_xdist_worker() -> None:
    # make test runs two workers: the tests under tests/spark/ must all go to one, or a
    # second worker starts a second Spark session. These Spark-side tests need no
    # session (nothing starts); the others are quick ones from elsewhere.
    done = _pytest(
        "tests/spark/test_read_planning.py",
        "tests/spark/test_write_conversion.py",
        "tests/test_protos.py",
        "-n",
        "2",
        "--dist",
        "load",  # test by test, where nothing else keeps a module together
        "-v",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [line.split() for line in done.stdout.splitlines() if line.startswith("[gw")]
    workers = {words[0] for words in ran if "PASSED" in words}
    spark = {words[0] for words in ran if any(w.startswith("tests/spark/") for w in words)}
    assert workers == {"[gw0]", "[gw1]"}, done.stdout[-3000:]  # both worked
    assert len(spark) == 1, done.stdout[-3000:]
