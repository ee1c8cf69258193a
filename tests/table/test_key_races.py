"""One idempotency key, two processes at the same moment: the key lands exactly once.

Two spawned processes commit through the same door with the same key per round,
released together by a barrier, against the embedded legacy S3 + DynamoDB. Every
round one of them commits and the other is told ``deduplicated`` with the winner's
version; the table holds exactly one of the two batches. Then ``cleanup`` removes
the older half of the versions and (item age 0) their DynamoDB items, and the race
goes on with fresh keys and with keys of removed versions, which must still be found
(by both processes, with the version they were committed as).

The two processes start once for the module; each round costs about two commits.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from typing import Any

import lance
import pytest
from key_race_worker import race_rounds
from protocol_helpers import batch, ddb_uri, ensure_ddb_table, pylance_create
from suite_profile import sized

from lancetx.commit.engine.committer import IDEMPOTENCY_KEY
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table

#: Rounds of the race: the acceptance's 20 in the long profile, 4 in ``make test``
#: (``LANCETX_KEY_RACE_ROUNDS`` sets it).
ROUNDS = sized("LANCETX_KEY_RACE_ROUNDS", quick=4, long=20)
#: Versions cleanup keeps (the others and their DynamoDB items are removed).
KEPT = ROUNDS // 2
#: Keys of removed versions committed again after the cleanup (by both processes).
OLD_KEYS_AGAIN = min(5, ROUNDS - KEPT - 1)


@pytest.fixture(scope="module")
def pool() -> Iterator[tuple[ProcessPoolExecutor, Any]]:
    """Two spawned processes (started once for the module) and a barrier for them."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(2)
        with ProcessPoolExecutor(max_workers=2, mp_context=context) as executor:
            yield executor, barrier


def _race(
    pool: tuple[ProcessPoolExecutor, Any],
    uri: str,
    options: dict[str, str],
    door: str,
    keys: list[str],
    first_seq: int = 0,
) -> list[list[tuple[int, bool]]]:
    executor, barrier = pool
    data_uri = connect(uri, options).data_uri
    futures = [
        executor.submit(race_rounds, uri, options, data_uri, door, keys, name, barrier, first_seq)
        for name in ("a", "b")
    ]
    return [f.result(timeout=600) for f in futures]


def _landed(uri: str, options: dict[str, str]) -> Counter[tuple[str, int]]:
    """Rows per (writer, seq) in the table's latest version (pylance reads it)."""
    rows = lance.dataset(uri, storage_options=options).to_table(columns=["writer", "seq"])
    return Counter(zip(rows["writer"].to_pylist(), rows["seq"].to_pylist(), strict=True))


def _keys_in_history(uri: str, options: dict[str, str]) -> Counter[str]:
    """How many versions (of those still there) carry each idempotency key, read by pylance."""
    ds = lance.dataset(uri, storage_options=options)
    found: Counter[str] = Counter()
    for v in ds.versions():
        txn = ds.read_transaction(int(v["version"]))
        key = dict(txn.transaction_properties or {}).get(IDEMPOTENCY_KEY) if txn else None
        if key is not None:
            found[key] += 1
    return found


def _check_rounds(
    results: list[list[tuple[int, bool]]],
    landed: Counter[tuple[str, int]],
    keys: list[str],
    seqs: list[int],
) -> dict[str, int]:
    """Each round: one process committed, the other was deduplicated with its version;
    the table holds the winner's batch only. Returns each key's version."""
    versions: dict[str, int] = {}
    problems = []
    for i, (key, seq) in enumerate(zip(keys, seqs, strict=True)):
        (va, da), (vb, db) = results[0][i], results[1][i]
        winner = "b" if da else "a"
        rows = {name: landed[(name, seq)] for name in ("a", "b")}
        if va != vb or da == db or rows != {winner: 3, ("a" if da else "b"): 0}:
            problems.append(f"{key}: a=({va}, dedup={da}) b=({vb}, dedup={db}) rows={rows}")
        versions[key] = va
    assert not problems, "\n".join(problems)
    return versions


@pytest.mark.slow  # two spawned processes, ~2.3 x ROUNDS rounds of two commits each
@pytest.mark.long
@pytest.mark.parametrize("door", ["commit_fragments", "append"])
def test_two_processes_commit_one_key_once_before_and_after_cleanup(
    pool: tuple[ProcessPoolExecutor, Any],
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    door: str,
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "race.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", -1, 3))

    first = [f"{door}-job-{i}" for i in range(ROUNDS)]
    results = _race(pool, uri, options, door, first)
    versions = _check_rounds(results, _landed(uri, options), first, list(range(ROUNDS)))
    assert sorted(versions.values()) == list(range(2, 2 + ROUNDS))
    assert _keys_in_history(uri, options) == Counter(first)

    report = cleanup_versions(
        open_table(uri, options),
        keep_versions=KEPT,
        older_than=timedelta(0),
        items_older_than=timedelta(0),
    )
    removed = list(range(1, 2 + ROUNDS - KEPT))
    assert report.ok and report.removed_versions == removed
    assert report.items_deleted == removed

    # Fresh keys race as before; the keys of removed versions are found again by
    # both processes, with the version they were committed as.
    fresh = [f"{door}-later-{i}" for i in range(ROUNDS)]
    gone = [key for key in first if versions[key] in removed][:OLD_KEYS_AGAIN]
    keys = list(fresh)
    for i, key in enumerate(gone):
        keys.insert(1 + 5 * i, key)
    base = 1000
    results = _race(pool, uri, options, door, keys, base)
    landed = _landed(uri, options)
    problems = []
    for i, key in enumerate(keys):
        if key in versions:
            got = [results[0][i], results[1][i]]
            want = [(versions[key], True)] * 2
            again = {name: landed[(name, base + i)] for name in ("a", "b")}
            if got != want or any(again.values()):
                problems.append(f"{key}: got {got}, want {want}; rows committed again: {again}")
    assert not problems, "\n".join(problems)
    fresh_at = [i for i, key in enumerate(keys) if key not in versions]
    later = _check_rounds(
        [[r[i] for i in fresh_at] for r in results], landed, fresh, [base + i for i in fresh_at]
    )
    assert sorted(later.values()) == list(range(2 + ROUNDS, 2 + 2 * ROUNDS))
    # The removed versions are gone; the kept ones and every later one hold one key each.
    kept = [key for key in first if versions[key] not in removed]
    assert _keys_in_history(uri, options) == Counter([*kept, *fresh])
