"""``gc`` beside writers: a threshold below the commit budget plus a margin is refused,
and even when forced, nothing a commit in flight wrote or names is deleted."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import lance
import pytest
from cli_helpers import age_objects, make_table, read_versions, run_cli
from protocol_helpers import batch, lancetx_append

from lancetx.commit.engine.committer import Committed
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.errors import UnsafeThresholdError
from lancetx.externalstore.connect import connect
from lancetx.ops.gc import (
    COMMIT_BUDGET,
    MINIMUM_OLDER_THAN,
    collect_garbage,
    format_age,
    store_clock,
)
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


def test_a_threshold_below_the_minimum_is_refused_naming_the_minimum_and_the_override(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    objects = table.objects()
    done = run_cli(aws, "gc", table.uri, "--older-than", "0s", "--delete")
    assert done.code == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert format_age(MINIMUM_OLDER_THAN) == "10m"
    assert "minimum of 10m" in message and "--force-unsafe-threshold" in message
    assert table.objects() == objects
    with pytest.raises(UnsafeThresholdError, match="minimum of 10m"):
        collect_garbage(open_table(table.uri, table.options), older_than=timedelta(minutes=9))


def _hold_the_claim(aws: EmbeddedAws) -> tuple[threading.Event, threading.Event]:
    """An interceptor holding the first version claim (a conditional PutItem) until
    ``release`` is set; ``arrived`` is set when it arrives."""
    arrived, release = threading.Event(), threading.Event()

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.target not in ("PutItem", "TransactWriteItems"):
            return None
        if b"attribute_not_exists" not in request.body or arrived.is_set():
            return None
        arrived.set()
        release.wait(timeout=300)
        return None  # then the claim goes through

    aws.set_interceptor(interceptor)
    return arrived, release


def test_forced_to_zero_gc_keeps_every_file_of_a_commit_in_flight(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name)
    # A failed task's files, old: gc's to delete.
    failed = lance.fragment.write_fragments(
        batch("failed", 0, 3), f"s3://{bucket}/{table.path}", storage_options=table.options
    )
    orphans = [f"{table.path}/data/{f.path}" for fragment in failed for f in fragment.files]
    age_objects(bucket, orphans, timedelta(hours=2))
    before = set(table.objects())

    options = {**table.options, "dynamodb_read_timeout": "600"}  # the claim is held
    conn = connect(table.uri, options)
    arrived, release = _hold_the_claim(legacy_aws)
    outcome: list[Any] = []

    def writer() -> None:
        try:
            outcome.append(
                lancetx_append(conn.handler, conn.base, conn.data_uri, options, batch("slow", 0, 4))
            )
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert arrived.wait(timeout=120), "the writer never claimed"
        in_flight = set(table.objects()) - before
        data = {k for k in in_flight if "/data/" in k}
        assert data and {k.split("/")[1] for k in in_flight} >= {"data", "_transactions"}
        # Its data files as old as can be: only its young transaction file keeps them.
        age_objects(bucket, sorted(data), timedelta(hours=2))

        forced = run_cli(
            legacy_aws, "gc", table.uri, "--older-than", "0s", "--force-unsafe-threshold",
            "--delete", "--json",
        )  # fmt: skip
        assert forced.code == 0, forced.stdout + forced.stderr
        assert set(orphans) <= {c["key"] for c in forced.json["candidates"]}
        assert in_flight <= set(table.objects())
        assert not set(orphans) & set(table.objects())
    finally:
        release.set()
        thread.join(timeout=300)
        legacy_aws.set_interceptor(None)
    (committed,) = outcome
    assert isinstance(committed, Committed) and committed.version == 3
    assert sorted(read_versions(table.uri, table.options)) == [1, 2, 3]
    report = verify_table(open_table(table.uri, table.options), deep=True, all_versions=True)
    assert report.ok, report.findings


def test_forced_gc_never_deletes_what_is_younger_than_the_commit_budget(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A failed task's files no transaction names: kept while younger than the budget,
    deleted by a forced gc once older, by the default gc only past the minimum."""
    table = make_table(aws, bucket, ddb_table_name)
    failed = lance.fragment.write_fragments(
        batch("failed", 0, 3), f"s3://{bucket}/{table.path}", storage_options=table.options
    )
    orphans = {f"{table.path}/data/{f.path}" for fragment in failed for f in fragment.files}
    ops = open_table(table.uri, table.options)

    def candidates(**kwargs: Any) -> set[str]:
        return {c.key for c in collect_garbage(ops, **kwargs).candidates}

    assert not orphans & candidates(older_than=timedelta(0), force_unsafe_threshold=True)
    age_objects(bucket, sorted(orphans), COMMIT_BUDGET + timedelta(minutes=1))
    assert orphans <= candidates(older_than=timedelta(0), force_unsafe_threshold=True)
    assert not orphans & candidates(older_than=MINIMUM_OLDER_THAN)
    age_objects(bucket, sorted(orphans), MINIMUM_OLDER_THAN)
    assert orphans <= candidates(older_than=MINIMUM_OLDER_THAN)


def test_ages_are_measured_by_the_stores_clock_when_ours_runs_ahead(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local clock an hour ahead of the store's would make every object look an
    hour older; the store's Date header is the reference then."""
    table = make_table(aws, bucket, ddb_table_name)
    ops = open_table(table.uri, table.options)
    real = datetime.now(UTC)

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return real + timedelta(hours=1)

    import lancetx.ops.gc as gc_module

    monkeypatch.setattr(gc_module, "datetime", Ahead)
    when, clock, skew = store_clock(ops)
    assert clock == "store" and skew is not None and skew > 3000
    assert abs((when - real).total_seconds()) < 120
    failed = lance.fragment.write_fragments(
        batch("failed", 0, 3), f"s3://{bucket}/{table.path}", storage_options=table.options
    )
    young = {f"{table.path}/data/{f.path}" for fragment in failed for f in fragment.files}
    report = collect_garbage(ops, older_than=timedelta(minutes=30), force_unsafe_threshold=True)
    assert report.clock == "store"
    assert not young & {c.key for c in report.candidates}
