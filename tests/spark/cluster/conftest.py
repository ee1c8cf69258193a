"""One standalone Spark cluster for every cluster test, and a driver process on it.

``cluster`` starts a master and two workers (``lancetx.demo.cluster.StandaloneCluster``:
workers on 127.0.0.1 and 127.0.0.2, so speculation has another host to copy a task
to) and a Spark driver of its own (``tests/support/cluster_driver.py``: one
SparkContext per process, and pytest's holds the shared local session), once per
run. Tests send the driver scenarios and get JSON answers; executors inherit the
fake AWS credentials and reach the embedded server on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lancetx.demo.cluster import StandaloneCluster, descendants
from lancetx.demo.embedded import fake_credentials_environ

DRIVER = Path(__file__).resolve().parents[2] / "support" / "cluster_driver.py"
#: Generous: the start of three JVMs, then a driver and two executors, on a loaded machine.
START_BUDGET = 900.0
#: One scenario (a job, its retries and the wind-down of killed attempts).
SCENARIO_BUDGET = 900.0


class ClusterDriver:
    """The cluster and the driver process serving scenarios on it."""

    def __init__(self, cluster: StandaloneCluster, log: Path) -> None:
        self.cluster = cluster
        self.log = log
        read, write = os.pipe()
        env = {
            **os.environ,
            **fake_credentials_environ(),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER), cluster.master_url, str(write)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(write,),
                start_new_session=True,
            )
        os.close(write)
        self.replies = os.fdopen(read, "r")
        self.lock = threading.Lock()
        ready = self._answer(START_BUDGET)
        self.driver_pid = int(ready["driver_pid"])

    def _answer(self, budget: float) -> dict[str, Any]:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.replies.readline()))
        reader.daemon = True
        reader.start()
        reader.join(budget)
        if not result or not result[0]:
            tail = self.log.read_text(errors="replace")[-4000:]
            pytest.fail(f"the cluster driver gave no answer within {budget:.0f}s; log:\n{tail}")
        answer: dict[str, Any] = json.loads(result[0])
        return answer

    def run(self, scenario: str, **args: Any) -> dict[str, Any]:
        """Run ``scenario`` in the driver; its JSON answer."""
        with self.lock:
            assert self.process.stdin is not None
            self.process.stdin.write((json.dumps({"scenario": scenario, **args}) + "\n").encode())
            self.process.stdin.flush()
            return self._answer(SCENARIO_BUDGET)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.write(b'{"scenario": "quit"}\n')
            self.process.stdin.close()
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            for pid in descendants(self.process.pid) | {self.process.pid}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            self.process.wait()
        self.replies.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterDriver]:
    """The session's standalone cluster and its driver (started on first use)."""
    logs = Path(tempfile.mkdtemp(prefix="lancetx-cluster-tests-"))
    with StandaloneCluster(2, env=fake_credentials_environ(), log_dir=logs) as spark_cluster:
        driver = ClusterDriver(spark_cluster, logs / "driver.log")
        try:
            yield driver
        finally:
            driver.close()
