"""Two Spark jobs with the same ``job_id`` at the same moment: the job lands exactly once.

The data source commits with the job id as the idempotency key. Two jobs of one
driver (threads of the shared session), released together by a barrier, write
different rows under one ``job_id``; every round exactly one job's rows land, in one
version, and both jobs finish without an error (the other one is told its job is
already committed). Then ``cleanup`` removes the older versions and their DynamoDB
items, and jobs rerun with the ids of removed versions land nothing again, while
fresh ids race as before.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import lance
import pytest
from spark_helpers import spark_options
from suite_profile import sized

from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table
from pyspark_lancetx.commit import JOB_ID_KEY

#: Rounds of the race: the acceptance's 20 in the long profile, 4 in ``make test``
#: (``LANCETX_KEY_RACE_ROUNDS`` sets it).
ROUNDS = sized("LANCETX_KEY_RACE_ROUNDS", quick=4, long=20)
#: Versions cleanup keeps; the older ones and their items are removed.
KEPT = ROUNDS // 2
#: Removed jobs rerun (by both threads) after the cleanup.
RERUNS = min(3, ROUNDS - KEPT - 1)
#: Fresh job ids raced after the cleanup.
FRESH_AFTER = 5


def _ids(round_: int, side: int) -> range:
    first = 100_000 * (round_ + 1) + 50 * side
    return range(first, first + 5)


def _race(spark: Any, uri: str, opts: dict[str, str], jobs: list[tuple[str, int]]) -> None:
    """Per ``(job_id, round)``: two jobs (threads), released together, commit it."""
    barrier = threading.Barrier(2, timeout=300)
    errors: list[BaseException] = []

    def side(n: int) -> None:
        try:
            jvm = spark._jvm  # the data source is found through the thread's active session
            jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
            for job_id, round_ in jobs:
                ids = _ids(round_, n)
                df = spark.range(ids.start, ids.stop, 1, 1)
                barrier.wait()
                df.write.format("lancetx").mode("append").options(**opts).option(
                    "job_id", job_id
                ).save(uri)
        except BaseException as exc:  # report both sides' failures
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=side, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def _jobs_in_history(uri: str, storage: dict[str, str]) -> Counter[str]:
    ds = lance.dataset(uri, storage_options=storage)
    found: Counter[str] = Counter()
    for v in ds.versions():
        txn = ds.read_transaction(int(v["version"]))
        job = dict(txn.transaction_properties or {}).get(JOB_ID_KEY) if txn else None
        if job is not None:
            found[job] += 1
    return found


def _landed_sides(uri: str, storage: dict[str, str], rounds: list[int]) -> dict[int, list[int]]:
    """Per round, which sides' rows are in the table."""
    ds = lance.dataset(uri, storage_options=storage)
    ids = set(ds.to_table(columns=["id"])["id"].to_pylist())
    return {r: [n for n in (0, 1) if set(_ids(r, n)) <= ids] for r in rounds}


@pytest.mark.slow  # ~2.5 x ROUNDS Spark jobs
@pytest.mark.long
def test_two_spark_jobs_with_one_job_id_land_once_before_and_after_cleanup(
    spark: Any, legacy_aws: EmbeddedAws, ddb_uri: str, storage: dict[str, str]
) -> None:
    uri = ddb_uri
    opts = spark_options(storage)
    spark.range(0, 5, 1, 1).write.format("lancetx").mode("append").options(**opts).save(uri)

    jobs = [(f"race-{r}", r) for r in range(ROUNDS)]
    _race(spark, uri, opts, jobs)
    sides = _landed_sides(uri, storage, list(range(ROUNDS)))
    assert {r: len(s) for r, s in sides.items()} == dict.fromkeys(range(ROUNDS), 1), sides
    history = _jobs_in_history(uri, storage)
    assert {job: history[job] for job, _ in jobs} == dict.fromkeys((j for j, _ in jobs), 1)
    assert lance.dataset(uri, storage_options=storage).version == 1 + ROUNDS

    report = cleanup_versions(
        open_table(uri, storage),
        keep_versions=KEPT,
        older_than=timedelta(0),
        items_older_than=timedelta(0),
    )
    removed = list(range(1, 2 + ROUNDS - KEPT))
    assert report.ok and report.removed_versions == removed and report.items_deleted == removed

    # Jobs of removed versions rerun (both sides at once): nothing lands again.
    # Fresh job ids race as before.
    reruns = [(f"race-{r}", ROUNDS + r) for r in range(RERUNS)]
    fresh = [(f"later-{r}", 2 * ROUNDS + r) for r in range(FRESH_AFTER)]
    _race(
        spark,
        uri,
        opts,
        [job for pair in zip(fresh, reruns, strict=False) for job in pair] + fresh[RERUNS:],
    )
    again = _landed_sides(uri, storage, [r for _, r in reruns])
    assert again == {r: [] for _, r in reruns}
    later = _landed_sides(uri, storage, [r for _, r in fresh])
    assert {r: len(s) for r, s in later.items()} == {r: 1 for _, r in fresh}, later
    assert lance.dataset(uri, storage_options=storage).version == 1 + ROUNDS + FRESH_AFTER
    history = _jobs_in_history(uri, storage)
    assert all(count == 1 for count in history.values()), history
    assert {job for job, _ in fresh} <= set(history)
