"""The Spark driver of the cluster tests, a process of its own (one SparkContext per
process: the tests' shared local session lives in pytest's):
``python cluster_driver.py <master-url> <reply-fd>``.

It connects to a standalone cluster (``lancetx.demo.cluster.StandaloneCluster``,
started by the ``cluster`` fixture), then serves requests, one JSON object per line
on stdin, each answered by one JSON line on ``<reply-fd>`` (Spark's own output goes
to stdout/stderr): ``{"scenario": name, ...arguments}`` → ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``. Scenarios: ``processes`` (where two tasks ran),
``write`` (a batch job, see :func:`write`), ``read``, ``quit``.

Every written row carries the Spark partition (``part``) and task attempt
(``attempt``) that produced it, added by a Python step pipelined into the write task:
the tests read them back with pylance to tell which attempt's files were committed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

#: How long the first attempt of partition 0 waits for its speculative copy.
SPECULATION_BUDGET = 600.0
#: How long the cluster may take to become idle (killed attempts wound down).
IDLE_BUDGET = 300.0


def session(master: str) -> Any:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from lancetx.demo.cluster import cluster_session

    return cluster_session(
        master,
        "lancetx-cluster-tests",
        **{
            # Speculation on, eager: a task slower than 1.5x the median of the finished
            # half is copied within ~100 ms (the tests' slow task waits for its copy).
            "spark.speculation": "true",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.interval": "100ms",
            "spark.speculation.minTaskRuntime": "200ms",
            "spark.speculation.efficiency.enabled": "false",
            "spark.task.maxFailures": "4",
        },
    )


def executor_of(pid: int) -> dict[str, Any]:
    """The executor JVM serving Python worker ``pid``: its pid, id and host."""
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
        if any("CoarseGrainedExecutorBackend" in a for a in args):
            return {
                "jvm_pid": pid,
                "executor_id": args[args.index("--executor-id") + 1],
                "host": args[args.index("--hostname") + 1],
            }
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no executor JVM among this process's ancestors")


def wait_for_executors(spark: Any, count: int = 2) -> None:
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + IDLE_BUDGET
    while len(tracker.getExecutorInfos()) < count + 1:  # the driver is listed too
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} executors after {IDLE_BUDGET:.0f}s")
        time.sleep(0.2)


def wait_idle(spark: Any) -> None:
    """Until no task runs on any executor (killed speculative attempts have ended)."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + IDLE_BUDGET
    while any(info.numRunningTasks() for info in tracker.getExecutorInfos()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"tasks still running after {IDLE_BUDGET:.0f}s")
        time.sleep(0.2)


def processes(spark: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Two tasks launched together (barrier mode: both at once, one per executor
    core): the Python worker and executor each ran in."""

    def where(_: Iterator[int]) -> Iterator[dict[str, Any]]:
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        context.barrier()  # both tasks are running now
        yield {
            "partition": context.partitionId(),
            "python_pid": os.getpid(),
            **executor_of(os.getpid()),
        }

    rows = spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(where).collect()
    return {"tasks": rows, "driver_pid": os.getpid()}


def _wait_for(marker_dir: str, prefix: str) -> None:
    deadline = time.monotonic() + SPECULATION_BUDGET
    while not any(n.startswith(prefix) for n in os.listdir(marker_dir)):
        if time.monotonic() > deadline:
            return  # the test then finds the attempt missing and says so
        time.sleep(0.05)


def tag_attempts(
    marker_dir: str | None, slow: bool, hold: bool
) -> Callable[[Iterator[int]], Iterator[Any]]:
    """The step before the write (a Python RDD step, pipelined into the write's task):
    adds ``part``/``attempt`` to each id. With ``slow``, the first attempt of partition
    0 waits (before its first row) until a later attempt of partition 0 has produced all
    its rows, so speculation copies it for sure and both attempts write files. With
    ``hold``, the other partitions wait until a second attempt of partition 0 started:
    no task finishes before partition 0's first attempt has met its fault, so
    speculation cannot copy it away first."""

    def step(ids: Iterator[int]) -> Iterator[tuple[int, int, int]]:
        from pyspark import TaskContext

        context = TaskContext.get()
        part, attempt = context.partitionId(), context.attemptNumber()
        if marker_dir is not None:
            open(os.path.join(marker_dir, f"started-p{part}-a{attempt}"), "w").close()
            if part == 0 and attempt > 0:
                open(os.path.join(marker_dir, f"retried-p0-a{attempt}"), "w").close()
        if marker_dir is not None and slow and part == 0 and attempt == 0:
            _wait_for(marker_dir, "produced-p0-")
        if marker_dir is not None and hold and part != 0:
            _wait_for(marker_dir, "retried-p0-")
        for i in ids:
            yield (i, part, attempt)
        if marker_dir is not None and slow and part == 0 and attempt > 0:
            open(os.path.join(marker_dir, f"produced-p0-a{attempt}"), "w").close()

    return step


def write(spark: Any, request: dict[str, Any]) -> dict[str, Any]:
    """A batch job: ``rows`` ids from ``first`` in ``partitions`` partitions, ``mode``
    append/overwrite, optional ``job_id``; ``slow`` makes partition 0's first attempt
    wait for a speculative copy, ``hold`` the other partitions for partition 0's retry
    (markers in ``marker_dir``, see :func:`tag_attempts`); ``fault`` is the after-write
    fault of partition 0's first attempt
    (``pyspark_lancetx.write_task.AFTER_WRITE_FAULT_PROPERTY``)."""
    from pyspark_lancetx.write_task import AFTER_WRITE_FAULT_PROPERTY

    wait_for_executors(spark)
    context = spark.sparkContext
    first, rows = request["first"], request["rows"]
    ids = context.range(first, first + rows, 1, request.get("partitions", 2))
    step = tag_attempts(
        request.get("marker_dir"), request.get("slow", False), request.get("hold", False)
    )
    frame = spark.createDataFrame(ids.mapPartitions(step), "id long, part int, attempt int")
    writer = (
        frame.write.format("lancetx")
        .mode(request.get("mode", "append"))
        .options(**{f"storage.{k}": v for k, v in request["storage"].items()})
    )
    if request.get("job_id"):
        writer = writer.option("job_id", request["job_id"])
    context.setLocalProperty(AFTER_WRITE_FAULT_PROPERTY, request.get("fault"))
    error = None
    try:
        writer.save(request["uri"])
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:4000]
    finally:
        context.setLocalProperty(AFTER_WRITE_FAULT_PROPERTY, None)
    wait_idle(spark)
    return {"ok": error is None, "error": error}


def read(spark: Any, request: dict[str, Any]) -> dict[str, Any]:
    wait_for_executors(spark)
    frame = (
        spark.read.format("lancetx")
        .options(**{f"storage.{k}": v for k, v in request["storage"].items()})
        .load(request["uri"])
    )
    ids = sorted(r.id for r in frame.select("id").collect())
    return {"ok": True, "ids": ids}


SCENARIOS = {"processes": processes, "write": write, "read": read}


def main(argv: list[str]) -> int:
    master, reply_fd = argv[1], int(argv[2])
    replies = os.fdopen(reply_fd, "w", buffering=1)
    spark = session(master)
    spark.sparkContext.setLogLevel("WARN")
    wait_for_executors(spark)
    replies.write(json.dumps({"ok": True, "ready": True, "driver_pid": os.getpid()}) + "\n")
    try:
        for line in sys.stdin:
            request = json.loads(line)
            if request["scenario"] == "quit":
                break
            try:
                answer = SCENARIOS[request["scenario"]](spark, request)
            except Exception:
                answer = {"ok": False, "error": traceback.format_exc()[-4000:]}
            replies.write(json.dumps(answer) + "\n")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
