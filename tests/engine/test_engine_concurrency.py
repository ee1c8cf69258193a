"""Concurrent writers appending to one table, on local disk and on S3 with
conditional PUT (the embedded moto server).

8 threads sharing one connection, and 4 ``spawn`` processes each opening its
own (``connect(uri, options)``), append 5 x 10 rows each with lancetx's commit
loop (default retry policy). Then pylance must see:

* a linear history: ``ds.versions()`` is exactly 1..N, N = 1 + all appends;
* every acknowledged append: each writer's ``(writer, seq)`` batch has its 10
  rows, the row count is the sum, and the version each writer was told it
  committed holds that writer's transaction (same uuid), one per version.

Writers that commit back to back are the worst case for optimistic commits:
a loser must list and load before its next try while each winner goes again
at once, so a commit can lose many races (measured on moto S3 with 8 threads:
up to ~18 attempts of the default 20). A writer whose commit exhausts its
retries plans it again, as an application would; such a transaction must have
written no version.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import EngineTable, append_worker, make_table

from lancetx.demo.embedded import EmbeddedAws

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

APPENDS = 5
ROWS = 10
THREADS = 8
PROCESSES = 4
SETUP_ROWS = 10


@pytest.fixture(params=["local", "s3"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> EngineTable:
    if request.param == "local":
        return make_table(str(tmp_path / "t.lance"), sizes=(SETUP_ROWS,))
    aws: EmbeddedAws = request.getfixturevalue("aws")
    bucket: str = request.getfixturevalue("bucket")
    return make_table(f"s3://{bucket}/t.lance", (SETUP_ROWS,), aws.pylance_storage_options())


def _check(table: EngineTable, results: list[dict[str, Any]]) -> None:
    writers = [r["writer"] for r in results]
    total = len(writers) * APPENDS
    # Linear history, as pylance lists it.
    assert table.versions() == list(range(1, total + 2))
    # Every acknowledged append is present, once, with all its rows.
    data = table.dataset().to_table(columns=["writer", "seq"]).to_pylist()
    batches = Counter((row["writer"], row["seq"]) for row in data)
    expected = {(w, s): ROWS for w in writers for s in range(APPENDS)}
    expected[("setup", 0)] = SETUP_ROWS
    assert dict(batches) == expected
    assert table.dataset().count_rows() == SETUP_ROWS + total * ROWS
    # Each acknowledged version holds the acknowledging writer's transaction.
    acked = {version: uuid for r in results for _, version, uuid, _ in r["acks"]}
    assert sorted(acked) == list(range(2, total + 2))
    transactions = table.dataset().get_transactions(total + 1)
    by_version = {total + 1 - i: t.uuid for i, t in enumerate(transactions) if t is not None}
    assert {v: by_version[v] for v in acked} == acked
    # A transaction that exhausted its retries wrote no version.
    exhausted = {uuid for r in results for uuid in r["exhausted"]}
    assert not exhausted & set(by_version.values())
    # Writers did race (a loser retried): otherwise this test proves nothing.
    attempts = [a for r in results for *_, a in r["acks"]]
    assert max(attempts) > 1, attempts
    print(
        f"attempts: max {max(attempts)}, total {sum(attempts)} for {total}; exhausted {len(exhausted)}"
    )


def _run_threads(target: Callable[[int], dict[str, Any]], n: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(n)
    lock = threading.Lock()

    def run(i: int) -> None:
        try:
            start.wait()
            result = target(i)
        except BaseException as exc:  # every writer's failure is reported
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(result)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def test_threads_append_concurrently(table: EngineTable) -> None:
    def writer(i: int) -> dict[str, Any]:
        return append_worker(
            table.uri, table.storage_options, f"thread-{i}", APPENDS, ROWS, conn=table.conn
        )

    results = _run_threads(writer, THREADS)
    _check(table, results)


def test_processes_append_concurrently(table: EngineTable) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(PROCESSES) as pool:
        start = manager.Barrier(PROCESSES)
        arguments = [
            (table.uri, table.storage_options, f"process-{i}", APPENDS, ROWS, None, start)
            for i in range(PROCESSES)
        ]
        results = pool.starmap(append_worker, arguments)
    assert len({r["pid"] for r in results}) == PROCESSES
    _check(table, results)
