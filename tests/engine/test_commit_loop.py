"""The commit loop itself: strict mode, commit metadata, bad input, the retry
policy, and the S3 requests a commit costs.

* Strict mode (``CommitOptions(expected_version=N)``) commits only on top of N:
  a table that moved gives ExpectedVersionMismatchError(expected, actual), no
  manifest and no rebase; at the right version it lands.
* ``properties`` and ``commit_message`` round-trip: through our snapshot and
  through pylance (``read_transaction`` / ``get_transactions``).
* Bad input gets a typed error and leaves the table as it was (same version
  list, same files under ``_versions/``).
* Losing every race ends in RetriesExhaustedError after ``max_attempts``; the
  backoff stays within its bounds; the documented defaults hold.
* A writer holding its parent commits on S3 (conditional PUT) with two PUTs: no
  LIST, no HEAD.
"""

from __future__ import annotations

import random
from pathlib import Path

import lance
import pytest
from engine_helpers import (
    EngineTable,
    LosingHandler,
    append_transaction,
    delete_transaction,
    lancetx_append,
    make_table,
    rows,
    s3_requests,
    snapshot_of,
)

from lancetx.commit.engine.builder import InvalidTransactionError
from lancetx.commit.engine.committer import (
    CommitOptions,
    Committed,
    RetryPolicy,
    commit_transaction,
)
from lancetx.commit.engine.operations import (
    COMMIT_MESSAGE_KEY,
    Delete,
    Restore,
    Transaction,
    UpdateConfig,
    update_map,
)
from lancetx.commit.errors import (
    CommitError,
    ExpectedVersionMismatchError,
    InvalidCommitError,
    RetriesExhaustedError,
    UnsupportedFeatureError,
    UnsupportedOperationError,
    VersionNotFoundError,
)
from lancetx.commit.format.manifest import decode_manifest, encode_manifest
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.format.transaction_file import read_transaction_file
from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.handlers.probe import probe_conditional_put
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.protos import table_pb2


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    """Fragment 0 holds a = 0..9, fragment 1 holds a = 10..19 (version 2)."""
    return make_table(str(tmp_path / "t.lance"), sizes=(10, 10))


@pytest.fixture
def s3_table(aws: EmbeddedAws, bucket: str) -> EngineTable:
    table = make_table(f"s3://{bucket}/t.lance", (10, 10), aws.pylance_storage_options())
    # The bucket's conditional-PUT probe (once per process) is paid here, so the
    # request counts below see commits alone.
    probe_conditional_put(table.handler.store, table.base)
    return table


def unchanged(table: EngineTable) -> tuple[list[int], list[tuple[str, int]]]:
    """What "the table is unchanged" compares: pylance's versions and our _versions/ files."""
    return table.versions(), table.listing("_versions")


# ============================================================ strict mode


def test_strict_commit_against_a_moved_table_is_refused_before_writing(
    table: EngineTable,
) -> None:
    read = table.latest()
    ours = append_transaction(table, rows(100, 5), read)
    lance.write_dataset(rows(200, 5), table.uri, mode="append")  # the table moves to v3
    before = unchanged(table)
    transactions = table.listing("_transactions")

    with pytest.raises(ExpectedVersionMismatchError) as info:
        table.commit(ours, options=CommitOptions(expected_version=2))

    assert (info.value.expected, info.value.actual) == (2, 3)
    assert unchanged(table) == before
    assert table.listing("_transactions") == transactions  # refused before any write


def test_strict_commit_holding_a_stale_parent_does_not_rebase(table: EngineTable) -> None:
    """The writer holds v2 and only learns the table moved when it loses v3.
    A non-strict commit would rebase the deletion vectors and land; strict mode
    raises, writing no manifest and no merged deletion file."""
    read = table.latest()
    ours = delete_transaction(table, read, {0: [5]}, "a = 5")
    table.commit(delete_transaction(table, read, {0: [0]}, "a = 0"), parent=read)  # v3
    before = unchanged(table)
    deletions = table.listing("_deletions")

    with pytest.raises(ExpectedVersionMismatchError) as info:
        table.commit(ours, parent=read, options=CommitOptions(expected_version=2))

    assert (info.value.expected, info.value.actual) == (2, 3)
    assert unchanged(table) == before
    assert table.listing("_deletions") == deletions  # no rebase was attempted
    # The same transaction, not strict, rebases and lands: strictness made the difference.
    assert table.commit(ours, parent=read).version == 4


def test_strict_mismatch_reports_the_latest_version_not_the_one_tried(
    table: EngineTable,
) -> None:
    """Holding v2 while the table moved to v4, a strict commit loses v3; the error
    says where the table actually is, so the caller re-reads the right version."""
    read = table.latest()
    ours = append_transaction(table, rows(300, 5), read)
    lancetx_append(table, rows(100, 5))  # v3
    lancetx_append(table, rows(200, 5))  # v4
    with pytest.raises(ExpectedVersionMismatchError) as info:
        table.commit(ours, parent=read, options=CommitOptions(expected_version=2))
    assert (info.value.expected, info.value.actual) == (2, 4)
    assert table.versions() == [1, 2, 3, 4]


def test_strict_commit_at_the_right_version_lands(table: EngineTable) -> None:
    read = table.latest()
    committed = table.commit(
        append_transaction(table, rows(100, 5), read),
        parent=read,
        options=CommitOptions(expected_version=2),
    )
    assert committed.version == 3
    following = table.commit(
        append_transaction(table, rows(200, 5), committed),
        options=CommitOptions(expected_version=3),
    )
    assert following.version == 4
    assert table.versions() == [1, 2, 3, 4]
    assert table.values() == [*range(20), *range(100, 105), *range(200, 205)]


# ============================================================ commit metadata


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "file-only"])
def test_properties_and_commit_message_round_trip(table: EngineTable, inline: bool) -> None:
    read = table.latest()
    txn = append_transaction(table, rows(100, 5), read)
    txn = Transaction(
        read_version=txn.read_version,
        operation=txn.operation,
        properties={"source": "test", "job_id": "overridden"},
    )
    options = CommitOptions(
        properties={"job_id": "job-42"},
        commit_message="nightly load",
        inline_transaction=inline,
    )
    committed = table.commit(txn, parent=read, options=options)

    expected = {"source": "test", "job_id": "job-42", COMMIT_MESSAGE_KEY: "nightly load"}
    assert dict(committed.transaction.properties) == expected
    assert committed.transaction.commit_message == "nightly load"
    # Ours, read back from the version (inline copy, or the transaction file).
    snap = snapshot_of(table, table.latest())
    stored = snap.transaction()
    assert stored is not None
    assert dict(stored.transaction_properties) == expected
    assert (snap.manifest_file.transaction is not None) == inline
    from_file = read_transaction_file(
        table.handler.store, table.base, snap.manifest.transaction_file
    )
    assert dict(from_file.transaction_properties) == expected
    # pylance sees them too.
    ds = table.dataset()
    assert dict(ds.read_transaction(3).transaction_properties) == expected
    assert dict(ds.get_transactions(1)[0].transaction_properties) == expected
    assert ds.get_transactions(1)[0].uuid == txn.uuid


# ============================================================== bad input


def test_delete_of_an_unknown_fragment_is_refused(table: EngineTable) -> None:
    read = table.latest()
    planned = delete_transaction(table, read, {0: [1]}, "a = 1")
    ghost = table_pb2.DataFragment()
    ghost.CopyFrom(planned.operation.updated_fragments[0])  # type: ignore[attr-defined]
    ghost.id = 999
    txn = Transaction(read_version=2, operation=Delete(updated_fragments=(ghost,), predicate="x"))
    before = unchanged(table)

    with pytest.raises(InvalidTransactionError) as info:
        table.commit(txn)

    assert isinstance(info.value, CommitError)
    assert info.value.fragment_ids == (999,)
    assert unchanged(table) == before
    assert table.values() == list(range(20))


def test_restore_of_a_missing_version_is_refused(table: EngineTable) -> None:
    before = unchanged(table)
    with pytest.raises(VersionNotFoundError) as info:
        table.commit(Transaction(read_version=2, operation=Restore(version=42)))
    assert info.value.version == 42
    assert unchanged(table) == before


def test_restore_of_an_existing_version_lands(table: EngineTable) -> None:
    """The valid counterpart of the test above: the same call with version 1."""
    committed = table.commit(Transaction(read_version=2, operation=Restore(version=1)))
    assert committed.version == 3
    assert table.values() == list(range(10))


def test_read_version_newer_than_the_latest_is_refused(table: EngineTable) -> None:
    txn = append_transaction(table, rows(100, 5), table.latest())
    future = Transaction(read_version=7, operation=txn.operation)
    before = unchanged(table)
    transactions = table.listing("_transactions")

    with pytest.raises(InvalidCommitError) as info:
        table.commit(future)

    assert "read version 7" in str(info.value)
    assert "latest version is 2" in str(info.value)
    assert unchanged(table) == before
    assert table.listing("_transactions") == transactions


UNKNOWN_WRITER_FLAG = 1 << 40


def _commit_flagged_version(table: EngineTable) -> int:
    """Write version N+1 ourselves: the latest manifest with an unknown writer
    flag, claimed through ``handler.commit``."""
    latest = table.latest()
    manifest = table_pb2.Manifest()
    manifest.CopyFrom(latest.manifest.manifest)
    manifest.version = latest.version + 1
    manifest.writer_feature_flags |= UNKNOWN_WRITER_FLAG
    manifest.transaction_file = ""
    txn = Transaction(
        read_version=latest.version,
        operation=UpdateConfig(config_updates=update_map({"lancetx.test": "flagged"})),
    )
    data = encode_manifest(manifest, indices=latest.manifest.indices, transaction=txn.to_proto())
    table.handler.commit(table.base, manifest.version, data, latest.location.scheme)
    return manifest.version


@pytest.mark.parametrize("how", ["resolved", "holding-the-flagged-version", "stale-held"])
def test_unknown_writer_feature_flag_is_refused(table: EngineTable, how: str) -> None:
    read = table.latest()
    ours = append_transaction(table, rows(100, 5), read)
    flagged = _commit_flagged_version(table)
    assert table.versions() == [1, 2, 3]  # pylance reads it (a writer flag only)
    before = unchanged(table)

    with pytest.raises(UnsupportedFeatureError) as info:
        if how == "resolved":
            table.commit(ours)
        elif how == "holding-the-flagged-version":
            held = table.latest()
            table.commit(Transaction(read_version=flagged, operation=ours.operation), parent=held)
        else:
            table.commit(ours, parent=read)  # learns of v3 by losing the race

    assert info.value.role == "writer"
    assert info.value.flags == UNKNOWN_WRITER_FLAG
    assert unchanged(table) == before


def test_legacy_store_is_refused_by_the_conditional_put_handler(
    aws: EmbeddedAws, bucket: str
) -> None:
    options = aws.pylance_storage_options()
    store = S3ObjectStore(bucket, config=S3Config.from_options(options), legacy=True)
    with pytest.raises(UnsupportedOperationError) as info:
        ConditionalPutCommitHandler(store)
    assert info.value.operation == "put_if_not_exists"
    assert "DynamoDB" in str(info.value)
    with pytest.raises(UnsupportedOperationError):
        connect(f"s3://{bucket}/t.lance", {**options, "lancetx_legacy_s3": "true"})
    # The same bucket, not declared legacy, is accepted.
    assert isinstance(
        connect(f"s3://{bucket}/t.lance", options).handler, ConditionalPutCommitHandler
    )


# ============================================================ retry policy


def test_documented_defaults() -> None:
    policy = RetryPolicy()
    # The budget is time (issue 9); the count is only a safety net.
    assert (
        policy.max_attempts,
        policy.base_delay,
        policy.max_delay,
        policy.jitter,
        policy.max_elapsed,
    ) == (1000, 0.002, 5.0, 1.0, 300.0)
    options = CommitOptions()
    assert options.retry == RetryPolicy()
    assert options.expected_version is None
    assert dict(options.properties) == {}
    assert options.commit_message is None
    assert options.naming is NamingScheme.V2
    assert options.inline_transaction is True
    assert options.idempotency_key is None and options.observer is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": -1.0},
        {"max_delay": -0.1},
        {"jitter": 1.5},
        {"jitter": -0.1},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def _take(policy: RetryPolicy, n: int, slot: float = 0.0, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [policy.delay(k, slot, rng) for k in range(1, n + 1)]


def test_windows_double_from_one_slot_up_to_the_cap() -> None:
    policy = RetryPolicy(base_delay=0.01, max_delay=0.05, jitter=0.0)
    # No measured slot: the window starts at base_delay.
    assert _take(policy, 5) == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])
    # A measured attempt of 15 ms sizes the first window.
    assert _take(policy, 3, slot=0.015) == pytest.approx([0.015, 0.03, 0.05])


@pytest.mark.parametrize("jitter", [1.0, 0.5, 0.25])
def test_jittered_delays_stay_within_bounds(jitter: float) -> None:
    policy = RetryPolicy(base_delay=0.01, max_delay=0.05, jitter=jitter)
    for seed in range(50):
        for k, delay in enumerate(_take(policy, 10, slot=0.012, seed=seed), start=1):
            cap = min(0.012 * 2 ** (k - 1), 0.05)
            assert cap * (1 - jitter) - 1e-12 <= delay <= cap + 1e-12
    # Jitter really randomizes (full jitter differs between seeds).
    assert len({tuple(_take(RetryPolicy(), 5, seed=seed)) for seed in range(5)}) == 5


def test_a_writer_that_always_loses_exhausts_its_attempts(
    table: EngineTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("lancetx.commit.engine.committer.time.sleep", slept.append)
    losing = LosingHandler(table.handler, losses=10**6)
    txn = append_transaction(table, rows(100, 5), table.latest())
    policy = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.02)
    before = unchanged(table)

    with pytest.raises(RetriesExhaustedError) as info:
        commit_transaction(losing, table.base, txn, options=CommitOptions(retry=policy))

    assert info.value.attempts == 4
    assert info.value.last_version == 3
    assert info.value.transaction_uuid == txn.uuid
    assert losing.attempts == [3, 3, 3, 3]
    # The winner never became visible: each retry backed off within the policy.
    assert len(slept) == 4
    assert all(0 < d <= 0.02 for d in slept)
    assert unchanged(table) == before


def test_a_writer_that_loses_a_few_times_lands(
    table: EngineTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lancetx.commit.engine.committer.time.sleep", lambda _: None)
    losing = LosingHandler(table.handler, losses=2)
    txn = append_transaction(table, rows(100, 5), table.latest())
    committed = commit_transaction(
        losing, table.base, txn, options=CommitOptions(retry=RetryPolicy(max_attempts=3))
    )
    assert committed.attempts == 3
    assert committed.version == 3
    assert table.versions() == [1, 2, 3]


def test_a_writer_that_loses_to_real_winners_retries_at_once(
    table: EngineTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lost races whose winners are visible: the retry waits at most one slot
    (a random part of how long the lost attempt took), never a long backoff."""
    slept: list[float] = []
    monkeypatch.setattr("lancetx.commit.engine.committer.time.sleep", slept.append)
    read = table.latest()
    txn = append_transaction(table, rows(100, 5), read)

    def other_writer_wins(version: int) -> None:
        lancetx_append(table, rows(200, 5))

    racing = LosingHandler(table.handler, before_commit=other_writer_wins)
    committed = commit_transaction(racing, table.base, txn, parent=read)

    assert racing.attempts == [3, 4]
    assert committed.version == 4
    assert len(slept) == 1
    assert 0.0 <= slept[0] <= RetryPolicy().max_delay
    assert table.values() == [*range(20), *range(100, 105), *range(200, 205)]


# ============================================================ manifest bytes


def test_no_index_section_without_indices_as_lance_writes(table: EngineTable) -> None:
    committed = lancetx_append(table, rows(100, 5))
    raw = table.handler.store.get(committed.location.key)
    decoded = decode_manifest(raw, path=committed.location.key)
    pylance_written = table.handler.store.get(table.handler.resolve_version(table.base, 2).key)
    assert decode_manifest(pylance_written, path="v2").indices is None
    assert decoded.indices is None
    assert not decoded.manifest.HasField("index_section")
    assert committed.manifest.indices is None


def test_index_section_is_kept_when_the_table_has_indices(table: EngineTable) -> None:
    table.dataset().create_scalar_index("a", "BTREE")  # v3
    committed = lancetx_append(table, rows(100, 5))
    decoded = decode_manifest(
        table.handler.store.get(committed.location.key), path=committed.location.key
    )
    assert [i.name for i in decoded.indices or []] == ["a_idx"]
    assert table.dataset().to_table(filter="a = 102")["a"].to_pylist() == [102]


# ============================================================ request budget


def _store_client(table: EngineTable) -> object:
    store = table.handler.store
    assert isinstance(store, S3ObjectStore)
    return store.client


def test_commit_holding_its_parent_makes_no_list_and_no_head(s3_table: EngineTable) -> None:
    first: Committed = lancetx_append(s3_table, rows(100, 5))
    append = append_transaction(s3_table, rows(200, 5), first)

    with s3_requests(_store_client(s3_table)) as log:
        second = s3_table.commit(append, parent=first)

    # One PUT for the transaction file, one conditional PUT for the manifest.
    assert log.operations == ["PutObject", "PutObject"]
    delete = delete_transaction(s3_table, second, {0: [3]}, "a = 3")
    with s3_requests(_store_client(s3_table)) as log:
        third = s3_table.commit(delete, parent=second)
    assert log.operations == ["PutObject", "PutObject"]
    assert third.version == 5
    assert s3_table.versions() == [1, 2, 3, 4, 5]
    assert s3_table.dataset().count_rows() == 29


def test_commit_without_a_parent_resolves_the_latest_by_listing(s3_table: EngineTable) -> None:
    """The counterpart: the hook sees the LIST a parent-less commit needs."""
    append = append_transaction(s3_table, rows(100, 5), s3_table.latest())
    with s3_requests(_store_client(s3_table)) as log:
        s3_table.commit(append)
    assert log.count("ListObjectsV2") == 1
    assert log.count("HeadObject") == 0
    assert log.count("PutObject") == 2


def test_commit_that_loses_a_race_lists_once_and_never_heads(s3_table: EngineTable) -> None:
    read = s3_table.latest()
    ours = append_transaction(s3_table, rows(100, 5), read)
    lancetx_append(s3_table, rows(200, 5))  # another writer takes v3

    with s3_requests(_store_client(s3_table)) as log:
        committed = s3_table.commit(ours, parent=read)

    assert committed.version == 4
    assert log.count("ListObjectsV2") == 1
    assert log.count("HeadObject") == 0
    assert log.count("GetObject") == 1  # the winner's manifest (transaction inline)
    # Two manifests, one transaction file: an append that lost to a compatible
    # commit keeps its read version, so its transaction file is reused as is.
    assert log.count("PutObject") == 3
