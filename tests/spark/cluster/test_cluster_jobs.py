"""The data source on a Spark cluster: executors in JVMs of their own, each with its own
Python workers, on two hosts (127.0.0.1 and 127.0.0.2); speculative, killed and
retried task attempts; an executor JVM killed mid-job.

One cluster serves every test here (``conftest.py``); the tests run in file order and
the one that kills an executor comes last (the worker starts a new executor, which
costs a start-up). Verdicts are outcomes read back by pylance: exact rows, one version
per job, each partition's rows from exactly one task attempt (every row carries its
``part`` and ``attempt``), and no data file left that no version references once
``gc`` (its threshold forced) has run: files of attempts that died or lost to another
attempt can only be collected there, since no process that knew them survived.

Sizes: ``LANCETX_SPECULATION_ROUNDS`` speculative jobs (``make test``: 1; the long
profile: the acceptance's 10).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import lance
import pytest
from spark_helpers import data_files, referenced_files
from suite_profile import sized

from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from pyspark_lancetx import table_history

ROUNDS = sized("LANCETX_SPECULATION_ROUNDS", quick=1, long=10)
ROWS = 2_000

# A cluster of its own (two daemons, two executor JVMs, a driver process): started once
# per run, in CI's long pass only, so `make test` stays within its budget.
pytestmark = [pytest.mark.slow, pytest.mark.long_only, pytest.mark.timeout(3600)]


def _read(uri: str, storage: dict[str, str]) -> Any:
    return lance.dataset(uri, storage_options=storage).to_table()


def _attempts_per_partition(uri: str, storage: dict[str, str], ids: range) -> dict[int, set[int]]:
    """The task attempts whose rows the table holds, per partition of the job that
    wrote ``ids``."""
    table = _read(uri, storage)
    out: dict[int, set[int]] = {}
    for i, part, attempt in zip(
        table.column("id").to_pylist(),
        table.column("part").to_pylist(),
        table.column("attempt").to_pylist(),
        strict=True,
    ):
        if i in ids:
            out.setdefault(part, set()).add(attempt)
    return out


def _collect_orphans(uri: str, storage: dict[str, str]) -> set[str]:
    """``gc`` with its threshold forced past every file's age; the names of the data
    files it deleted.

    Asserts what must hold however late a killed attempt's Python worker finishes its
    upload (Spark counts a killed task as ended before its worker has stopped, so a
    losing attempt's file may appear after the job, even after ``gc``): every file no
    version referenced before ``gc`` ran is deleted, nothing a version references is,
    and a file left unreferenced after it was not there when it started."""
    listed = data_files(uri, storage)
    unreferenced = listed - referenced_files(uri, storage)
    report = collect_garbage(
        open_table(uri, storage),
        older_than=timedelta(0),
        force_unsafe_threshold=True,
        dry_run=False,
        now=datetime.now(UTC) + timedelta(days=1),
    )
    assert report.ok, report.errors
    deleted = {c.key.rsplit("/", 1)[-1] for c in report.candidates if c.kind == "data_file"}
    assert unreferenced <= deleted, unreferenced - deleted
    referenced = referenced_files(uri, storage)
    assert not deleted & referenced, deleted & referenced
    after = data_files(uri, storage)
    assert referenced <= after, referenced - after
    assert not (after - referenced) & listed
    return deleted


def _write(cluster: Any, **args: Any) -> None:
    answer = cluster.run("write", **args)
    assert answer["ok"], answer["error"]


def test_executors_are_processes_of_their_own_on_two_hosts(cluster: Any) -> None:
    answer = cluster.run("processes")
    tasks = answer["tasks"]
    assert len(tasks) == 2
    jvms = {t["jvm_pid"] for t in tasks}
    pythons = {t["python_pid"] for t in tasks}
    assert len(jvms) == 2 and len({t["executor_id"] for t in tasks}) == 2, tasks
    assert len(pythons) == 2 and not pythons & jvms, tasks
    assert {t["host"] for t in tasks} == {"127.0.0.1", "127.0.0.2"}, tasks
    driver = answer["driver_pid"]
    assert driver == cluster.driver_pid and driver not in jvms | pythons
    assert jvms <= set(cluster.cluster.executor_pids())  # started by the workers, not the driver


def test_append_overwrite_job_id_and_read_on_the_cluster(
    cluster: Any, ddb_uri: str, storage: dict[str, str]
) -> None:
    _write(cluster, uri=ddb_uri, storage=storage, first=0, rows=ROWS, job_id="create")
    _write(cluster, uri=ddb_uri, storage=storage, first=ROWS, rows=ROWS, job_id="append")
    # The same job id again (a re-run after a lost answer): committed once.
    _write(cluster, uri=ddb_uri, storage=storage, first=ROWS, rows=ROWS, job_id="append")
    assert [h.job_id for h in table_history(ddb_uri, storage)] == ["create", "append"]
    assert sorted(_read(ddb_uri, storage).column("id").to_pylist()) == list(range(2 * ROWS))
    read = cluster.run("read", uri=ddb_uri, storage=storage)
    assert read["ids"] == list(range(2 * ROWS))

    _write(cluster, uri=ddb_uri, storage=storage, first=10**6, rows=ROWS, mode="overwrite")
    assert sorted(_read(ddb_uri, storage).column("id").to_pylist()) == list(
        range(10**6, 10**6 + ROWS)
    )
    assert len(table_history(ddb_uri, storage)) == 3
    # Speculation is on for every job here: a task that merely ran slow may have been
    # copied, and the losing copy's files are collected.
    _collect_orphans(ddb_uri, storage)


@pytest.mark.long
def test_a_speculative_copy_commits_exactly_one_attempt_per_partition(
    cluster: Any, ddb_uri: str, storage: dict[str, str], tmp_path: Path
) -> None:
    """Partition 0's first attempt waits until Spark has copied it (speculation) and the
    copy has produced all its rows; then both write files and race to report. Each
    round: one new version, exact rows, one attempt per partition."""
    expected: list[int] = []
    for round_ in range(ROUNDS):
        markers = tmp_path / f"round-{round_}"
        markers.mkdir()
        first = round_ * 10 * ROWS
        job = f"speculative-{round_}-{uuid.uuid4().hex[:6]}"
        _write(
            cluster,
            uri=ddb_uri,
            storage=storage,
            first=first,
            rows=ROWS,
            job_id=job,
            slow=True,
            marker_dir=str(markers),
        )
        started = {p.name for p in markers.iterdir() if p.name.startswith("started-")}
        assert {"started-p0-a0", "started-p0-a1"} <= started, (round_, started)
        expected += range(first, first + ROWS)
        table = _read(ddb_uri, storage)
        assert table.num_rows == len(expected), round_
        assert sorted(table.column("id").to_pylist()) == expected, round_
        history = table_history(ddb_uri, storage)
        assert [h.version for h in history] == list(range(1, round_ + 2))
        assert history[-1].job_id == job
        attempts = _attempts_per_partition(ddb_uri, storage, range(first, first + ROWS))
        assert all(len(a) == 1 for a in attempts.values()), (round_, attempts)

    # The first round's job again, speculating again: found committed, nothing added.
    markers = tmp_path / "again"
    markers.mkdir()
    _write(
        cluster,
        uri=ddb_uri,
        storage=storage,
        first=0,
        rows=ROWS,
        job_id=table_history(ddb_uri, storage)[0].job_id,
        slow=True,
        marker_dir=str(markers),
    )
    assert len(table_history(ddb_uri, storage)) == ROUNDS
    assert lance.dataset(ddb_uri, storage_options=storage).count_rows() == len(expected)

    # The losing attempts' files: no version references them; gc collects them.
    _collect_orphans(ddb_uri, storage)
    assert lance.dataset(ddb_uri, storage_options=storage).count_rows() == len(expected)


def test_a_python_worker_killed_after_writing_leaves_files_only_gc_collects(
    cluster: Any, ddb_uri: str, storage: dict[str, str], tmp_path: Path
) -> None:
    _write(cluster, uri=ddb_uri, storage=storage, first=0, rows=ROWS, job_id="base")
    # Speculation is on for every job here: under load the base job's slow task may have
    # been copied, and the losing copy's files are orphans already. Only the files the
    # base version references must stay referenced.
    before = referenced_files(ddb_uri, storage)
    _write(
        cluster,
        uri=ddb_uri,
        storage=storage,
        first=ROWS,
        rows=ROWS,
        job_id="exit",
        fault="exit",
        hold=True,
        marker_dir=str(tmp_path),
    )
    assert (tmp_path / "retried-p0-a1").exists()  # the fault fired; Spark ran the task again
    history = table_history(ddb_uri, storage)
    assert [h.job_id for h in history] == ["base", "exit"]  # the retry committed, once
    assert sorted(_read(ddb_uri, storage).column("id").to_pylist()) == list(range(2 * ROWS))
    attempts = _attempts_per_partition(ddb_uri, storage, range(ROWS, 2 * ROWS))
    assert all(len(a) == 1 for a in attempts.values()), attempts
    assert attempts[0] != {0}, attempts  # partition 0's first attempt died unreported
    orphans = data_files(ddb_uri, storage) - referenced_files(ddb_uri, storage)
    assert orphans, "the killed attempt wrote files before it died"
    assert not orphans & before  # the base version's files are still referenced
    assert before <= referenced_files(ddb_uri, storage)
    assert orphans <= _collect_orphans(ddb_uri, storage)
    assert lance.dataset(ddb_uri, storage_options=storage).count_rows() == 2 * ROWS


def test_an_executor_killed_mid_job_the_retry_commits_once(
    cluster: Any, ddb_uri: str, storage: dict[str, str], tmp_path: Path
) -> None:
    """Partition 0's first attempt SIGKILLs its executor JVM once its files are written
    (the job is mid-flight: the other partition waits for partition 0's retry, so that
    speculation cannot finish partition 0 first); Spark runs the task again on a new
    executor, and the job commits once."""
    _write(cluster, uri=ddb_uri, storage=storage, first=0, rows=ROWS, job_id="base")
    executors = set(cluster.cluster.executor_pids())
    _write(
        cluster,
        uri=ddb_uri,
        storage=storage,
        first=ROWS,
        rows=ROWS,
        job_id="lost-executor",
        fault="kill-executor",
        hold=True,
        marker_dir=str(tmp_path),
    )
    assert (tmp_path / "retried-p0-a1").exists()  # the fault fired; Spark ran the task again
    history = table_history(ddb_uri, storage)
    assert [h.job_id for h in history] == ["base", "lost-executor"]
    assert sorted(_read(ddb_uri, storage).column("id").to_pylist()) == list(range(2 * ROWS))
    attempts = _attempts_per_partition(ddb_uri, storage, range(ROWS, 2 * ROWS))
    assert attempts[0] != {0}, attempts  # partition 0 came from a later attempt
    assert all(len(a) == 1 for a in attempts.values()), attempts
    assert executors - set(cluster.cluster.executor_pids()), "an executor JVM was killed"
    _collect_orphans(ddb_uri, storage)
    assert lance.dataset(ddb_uri, storage_options=storage).count_rows() == 2 * ROWS
