"""A stream copying a table while a writer appends to it, killed (SIGKILL) twice and
restarted from its checkpoint: the copy holds every appended row exactly once.

The copy runs as a Spark application of its own (``stream_copy_child.py``: driver,
JVM and Python workers), reading the source with ``readStream.format("lancetx")``
and writing the copy with the ``lancetx`` sink. It is killed at two points chosen
by the embedded server, not by a clock (it tells the child's requests by their
access key id):

1. the moment the sink's claim of its second micro-batch has *landed* in DynamoDB,
   before any answer: the batch is committed, but Spark never learned it (its
   commit log has no entry), so the next run replays the batch;
2. the moment the restarted child reads the first data file of the source: the
   replayed batch is being read (its offsets come from the checkpoint), nothing is
   written yet.

The third run (``Trigger.AvailableNow``, after the writer is done; in the tests'
own Spark session) replays the batch again (the sink finds it committed and
commits nothing) and copies the rest. Sizes: ``LANCETX_STREAM_SOURCE_VERSIONS`` appended versions (the
acceptance's 50 in the long profile, 12 in ``make test``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from claim_faults import VICTIM_KEY, access_key, check_every_version_opens, is_claim
from spark_helpers import run_stream, spark_options
from suite_profile import sized

import lancetx
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from pyspark_lancetx import table_history

VERSIONS = sized("LANCETX_STREAM_SOURCE_VERSIONS", quick=12, long=50)
ROWS = 5
#: A child that has not reached its kill point (or finished) by then has hung.
CHILD_BUDGET = 900.0
CHILD = Path(__file__).resolve().parents[1] / "support" / "stream_copy_child.py"


def rows(version: int) -> pa.Table:
    ids = range(1000 * version, 1000 * version + ROWS)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"r{i}" for i in ids]})


# ------------------------------------------------------------------- killing a tree


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                out[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
    return out


def _tree(root: int) -> set[int]:
    parents = _parents()
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return tree


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every process under it (Spark's Python daemon starts a
    process group of its own): all are stopped first, so none can fork or go on
    writing while the rest die."""
    stopped: set[int] = set()
    while True:
        new = _tree(root) - stopped
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------- the kill points


class KillPoint:
    """The server's interceptor: kills the child at the ``nth`` request of its that
    ``matches`` (after letting it reach the store if ``lands``)."""

    def __init__(self, matches: Any, nth: int, lands: bool) -> None:
        self.matches = matches
        self.nth = nth
        self.lands = lands
        self.seen = 0
        self.child: subprocess.Popen[bytes] | None = None
        self.fired = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if access_key(request) != VICTIM_KEY or not self.matches(request):
            return None
        with self._lock:
            self.seen += 1
            if self.seen != self.nth or self.child is None:
                return None
        child = self.child

        def kill() -> None:
            kill_tree(child.pid)
            self.fired.set()

        return InterceptedResponse(500, after_forwarding=self.lands, then=kill)


def sink_claim(request: InterceptedRequest) -> bool:
    return is_claim(request)  # the child only commits to the copy


def source_data_read(request: InterceptedRequest) -> bool:
    return request.service == "s3" and request.method == "GET" and "/t.lance/data/" in request.path


# ------------------------------------------------------------------- the test


def run_child(
    aws: EmbeddedAws,
    args: dict[str, Any],
    kill: KillPoint | None,
    log: Path,
) -> int:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    with open(log, "ab") as out:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(args)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        if kill is not None:
            kill.child = child
            aws.set_interceptor(kill)
        try:
            return child.wait(CHILD_BUDGET)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the stream child did not finish in {CHILD_BUDGET:.0f}s; see {log}")
    finally:
        aws.set_interceptor(None)
        kill_tree(child.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


@pytest.mark.long_only  # its own Spark applications, killed twice: CI's long pass
@pytest.mark.slow
@pytest.mark.timeout(3 * CHILD_BUDGET)
def test_a_stream_killed_twice_copies_every_appended_row_exactly_once(
    spark: Any, aws: EmbeddedAws, ddb_uri: str, storage: dict[str, str], tmp_path: Path
) -> None:
    source, target = ddb_uri, ddb_uri.replace("/t.lance?", "/copy.lance?")
    table = lancetx.write_table(source, rows(1), storage_options=storage)  # version 1
    args = {
        "source": source,
        "target": target,
        "checkpoint": str(tmp_path / "checkpoint"),
        "storage": {**storage, "aws_access_key_id": VICTIM_KEY},
        "source_options": {"startingVersion": "1", "maxVersionsPerTrigger": "2"},
        "available_now": False,
    }
    log = tmp_path / "child.log"

    failures: list[BaseException] = []

    def write() -> None:
        try:
            for version in range(2, VERSIONS + 2):
                table.append(rows(version))
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        at_claim = KillPoint(sink_claim, nth=2, lands=True)
        assert run_child(aws, args, at_claim, log) == -signal.SIGKILL, log.read_text()[-3000:]
        assert at_claim.fired.is_set()
        history = table_history(target, storage)
        batches = [h.properties["lancetx.spark.batch_id"] for h in history]
        assert batches == ["0", "1"]  # the second one landed, unknown to Spark

        at_read = KillPoint(source_data_read, nth=1, lands=False)
        assert run_child(aws, args, at_read, log) == -signal.SIGKILL, log.read_text()[-3000:]
        assert at_read.fired.is_set()
    finally:
        writer.join()
    assert not failures, failures

    # The last run in this process's session (one Spark start less): the same checkpoint.
    opts = spark_options(storage)
    run_stream(
        lambda: (
            spark.readStream.format("lancetx")
            .options(**opts)
            .options(**args["source_options"])
            .load(source)
            .writeStream.format("lancetx")
            .options(**opts)
            .option("checkpointLocation", args["checkpoint"])
            .trigger(availableNow=True)
            .start(target)
        )
    )

    written = Counter(i for v in range(1, VERSIONS + 2) for i in rows(v).column("id").to_pylist())
    copied = Counter(
        lancetx.open(target, storage).to_table(columns=["id"]).column("id").to_pylist()
    )
    assert copied == written  # every row, each exactly once
    history = table_history(target, storage)
    batches = [h.properties["lancetx.spark.batch_id"] for h in history]
    assert len(batches) == len(set(batches)), batches  # no micro-batch committed twice
    assert len({h.properties["lancetx.spark.stream_id"] for h in history}) == 1
    check_every_version_opens(target, storage)
