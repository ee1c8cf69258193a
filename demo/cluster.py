"""``make demo-cluster``: the Spark demo on a standalone cluster of its own.

:class:`StandaloneCluster` starts a Spark standalone master and workers from the
installed pyspark (``spark-class`` in its ``bin/`` folder), each a JVM of its own
whose executors are JVMs again, with their own Python workers: the setting the
data source meets on a real cluster (tasks in other processes, retried and
speculative attempts, executors lost mid-job), on one machine. Each worker
listens on a loopback address of its own (``127.0.0.1``, ``127.0.0.2``, …):
Spark never runs a speculative copy of a task on a host that already runs an
attempt of it, so two workers on one address could never speculate.

Every port is picked by the daemons themselves (``--port 0``) and read back from
their logs; everything is stopped by the process ids this module started (and
the processes those started), also when the run fails or is interrupted
(Ctrl-C, SIGTERM): no JVM outlives the context.

``python -m lancetx.demo.cluster`` runs the demo's jobs (:mod:`lancetx.demo.spark`)
against such a cluster; ``--help`` lists the knobs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

#: How long a daemon may take to come up on a loaded machine before the start fails.
START_BUDGET = 300.0
#: How long a daemon gets to stop after SIGTERM before it is killed.
STOP_GRACE = 15.0

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"


class ClusterStartError(RuntimeError):
    """A daemon of the cluster exited or did not come up in time (its log is named)."""


def spark_bin() -> Path:
    """The ``bin/`` folder of the installed pyspark (``spark-class`` lives there)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin"


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            out.setdefault(parent, []).append(int(entry))
    return out


def descendants(pid: int) -> set[int]:
    """``pid``'s child processes, theirs, and so on (Linux ``/proc``; empty elsewhere)."""
    if not os.path.isdir("/proc"):
        return set()
    children = _children()
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def process_command(pid: int) -> str:
    """The command line of ``pid`` ('' when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on this machine.

    Use as a context manager (or :meth:`start` / :meth:`stop`); :attr:`master_url`
    is what ``SparkSession.builder.master(...)`` takes. Worker ``i`` listens on
    ``127.0.0.{i + 1}`` with ``cores`` cores and ``memory`` for its executors.
    ``env`` is added to the daemons' environment, which their executors and the
    executors' Python workers inherit. Logs go to ``log_dir`` (a temporary
    folder by default, kept when a start fails).
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        env: dict[str, str] | None = None,
        log_dir: str | Path | None = None,
    ) -> None:
        if not 1 <= workers <= 250:
            raise ValueError(f"workers={workers}: between 1 and 250")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.env = dict(env or {})
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="lancetx-spark-cluster-"))
        self.master_url = ""
        self.processes: list[subprocess.Popen[bytes]] = []
        self.worker_hosts = [f"127.0.0.{i + 1}" for i in range(workers)]

    # ------------------------------------------------------------------ start

    def _environ(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Each daemon writes its own work folders here, not into pyspark's install.
        env["SPARK_WORKER_DIR"] = str(self.log_dir / "work")
        env.setdefault("SPARK_DAEMON_MEMORY", "256m")
        # The master's REST submission server listens on a fixed port (6066) by default:
        # two clusters on one machine would collide, and nothing here submits through it.
        env["SPARK_MASTER_OPTS"] = (
            env.get("SPARK_MASTER_OPTS", "") + " -Dspark.master.rest.enabled=false"
        ).strip()
        # An installed pyspark is its own Spark home; an unrelated SPARK_HOME would win.
        env["SPARK_HOME"] = str(spark_bin().parent)
        return env

    def _spawn(self, name: str, args: list[str], host: str) -> tuple[Path, int]:
        log = self.log_dir / f"{name}.log"
        env = self._environ()
        env["SPARK_LOCAL_IP"] = host
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [str(spark_bin() / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                # A group of its own: Ctrl-C in the terminal reaches this process only,
                # which then stops the daemons in order (executors before their worker).
                start_new_session=True,
            )
        self.processes.append(process)
        return log, len(self.processes) - 1

    def _await(self, log: Path, index: int, pattern: re.Pattern[str] | str, what: str) -> str:
        deadline = time.monotonic() + START_BUDGET
        process = self.processes[index]
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            if isinstance(pattern, str):
                if pattern in text:
                    return pattern
            else:
                match = pattern.search(text)
                if match:
                    return match.group(1)
            if process.poll() is not None:
                raise ClusterStartError(
                    f"the Spark {what} exited with status {process.returncode} before it was "
                    f"up; its log: {log}"
                )
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"the Spark {what} was not up after {START_BUDGET:.0f}s; its log: {log}"
                )
            time.sleep(0.2)

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker registered."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            log, index = self._spawn(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                ],
                "127.0.0.1",
            )
            self.master_url = self._await(log, index, _MASTER_URL, "master")
            started = []
            for i, host in enumerate(self.worker_hosts):
                started.append(
                    self._spawn(
                        f"worker-{i + 1}",
                        [
                            "org.apache.spark.deploy.worker.Worker",
                            "--host",
                            host,
                            "--port",
                            "0",
                            "--webui-port",
                            "0",
                            "--cores",
                            str(self.cores),
                            "--memory",
                            self.memory,
                            "--work-dir",
                            str(self.log_dir / f"work-{i + 1}"),
                            self.master_url,
                        ],
                        host,
                    )
                )
            for i, (log, index) in enumerate(started):
                self._await(log, index, _REGISTERED, f"worker {i + 1}")
        except BaseException:
            self.stop()
            raise
        return self

    # ------------------------------------------------------------------ stop

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers run now (one per application and worker)."""
        found = []
        for process in self.processes[1:]:
            for pid in descendants(process.pid):
                if "CoarseGrainedExecutorBackend" in process_command(pid):
                    found.append(pid)
        return sorted(found)

    def stop(self) -> None:
        """Stop every daemon this object started, workers first, and whatever they
        started: SIGTERM, then SIGKILL after :data:`STOP_GRACE` seconds. Idempotent."""
        for process in reversed(self.processes):
            tree = descendants(process.pid)
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    process.wait()
            # Executors (and their Python workers) a worker started and left behind.
            for pid in tree | descendants(process.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM (``kill``, a CI timeout) raises SystemExit, so ``finally`` blocks stop
    the cluster as they do on Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cluster_session(master_url: str, app_name: str, **conf: str) -> Any:
    """A SparkSession on ``master_url`` (one executor per worker, 1 core each)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master_url)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(argv: Sequence[str] | None = None) -> int:
    """Start a cluster, run the Spark demo's jobs on it, stop it; 0 when every check holds."""
    from lancetx.demo import spark as demo
    from lancetx.demo.embedded import fake_credentials_environ

    parser = argparse.ArgumentParser(
        prog="python -m lancetx.demo.cluster",
        description="The Spark demo (make demo) on a standalone master and workers of its "
        "own, started from the installed pyspark and stopped by PID (make demo-cluster).",
    )
    parser.add_argument("--workers", type=int, default=2, help="Spark workers (default 2)")
    parser.add_argument("--append-jobs", type=int, default=2, help="concurrent Spark appends")
    parser.add_argument("--rows", type=int, default=5_000, help="rows per Spark job")
    parser.add_argument("--pylance-appends", type=int, default=2, help="appends by pylance")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    env = fake_credentials_environ()
    os.environ.update(env)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import pyspark_lancetx  # noqa: F401  (prepares the Python workers' import path)

    ok = False
    with sigterm_as_exit(), StandaloneCluster(args.workers, env=env) as cluster:
        print(
            f"Spark standalone master {cluster.master_url}, workers on "
            f"{', '.join(cluster.worker_hosts)} (logs: {cluster.log_dir}); daemon pids: "
            f"{' '.join(str(p.pid) for p in cluster.processes)}",
            flush=True,
        )
        spark = cluster_session(cluster.master_url, "lancetx-demo-cluster")
        try:
            spark.sparkContext.setLogLevel("ERROR")
            ok = demo.run(spark, args.append_jobs, args.rows, args.pylance_appends)
            executors = cluster.executor_pids()
            print(f"executor JVMs: {len(executors)} (pids {', '.join(map(str, executors))})")
        finally:
            spark.stop()
    print(f"{'OK' if ok else 'FAILED'} in {time.perf_counter() - started:.0f}s; cluster stopped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
