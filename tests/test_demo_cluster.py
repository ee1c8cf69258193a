"""``make demo-cluster`` leaves no JVM behind: interrupted (Ctrl-C) while its Spark
application starts, it stops the master and workers it started, and what they started.

The demo itself runs in CI (``.ci/run``: ``make demo-cluster``); its cluster class is
what the cluster tests (``tests/spark/cluster/``) run on.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from lancetx.demo.cluster import descendants, process_command

#: Generous: three JVMs start on a loaded machine before the line appears.
BUDGET = 900.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.long_only  # starts a Spark cluster of its own: CI's long pass
@pytest.mark.slow
@pytest.mark.timeout(2 * BUDGET)
def test_ctrl_c_stops_every_daemon_it_started() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-u", "-m", "lancetx.demo.cluster"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert demo.stdout is not None
    daemons: list[int] = []
    deadline = time.monotonic() + BUDGET
    seen: list[str] = []
    for line in demo.stdout:
        seen.append(line)
        found = re.search(r"daemon pids: ([\d ]+)", line)
        if found:
            daemons = [int(p) for p in found.group(1).split()]
            break
        assert time.monotonic() < deadline, "".join(seen[-50:])
    assert len(daemons) == 3, "".join(seen[-50:])  # a master and two workers
    # Interrupted once its executors run (the application is up, its jobs start).
    tree = set(daemons)
    while sum("CoarseGrainedExecutorBackend" in process_command(p) for p in tree) < 2:
        assert time.monotonic() < deadline, "no executors started"
        time.sleep(0.2)
        for pid in daemons:
            tree |= descendants(pid)
    os.kill(demo.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the demo's process
    rest, _ = demo.communicate(timeout=BUDGET)
    assert demo.returncode != 0, rest[-3000:]
    stray = {pid for pid in tree if _alive(pid)}
    assert not stray, (stray, rest[-3000:])
