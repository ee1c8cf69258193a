"""Concurrent writers on a legacy S3 (If-None-Match silently ignored), made
safe by claiming versions in DynamoDB (``s3+ddb://``).

* 16 writer threads, and 16 writers spread over spawned processes (each builds
  its own ``connect(uri, options)``), append concurrently: pylance then lists
  versions 1..N without a gap and every acknowledged row is there exactly once.
* Not one request of our S3 clients carries a conditional header
  (``If-None-Match``, ``If-Match``, ``x-amz-copy-source-if-*``): a botocore
  ``before-send`` hook registered ahead of the store's own guard sees them all.
* Throttling and 503 SlowDown injected during concurrent appends (and 500s
  after the claim landed) cost retries, never a commit.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from protocol_helpers import (
    RequestLog,
    Tally,
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    process_writer,
    pylance_append_landing,
    pylance_create,
    run_threads,
    verify_history,
)

from lancetx.commit.engine.committer import Committed
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.connect import TableConnection, connect

WRITERS = 16
APPENDS = 3
ROWS = 10


@dataclass
class Shared:
    aws: EmbeddedAws
    uri: str
    options: dict[str, str]
    bucket: str
    ddb_table: str


@pytest.fixture
def shared(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Shared]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "events.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    try:
        yield Shared(legacy_aws, uri, options, bucket, ddb_table_name)
    finally:
        legacy_aws.set_interceptor(None)


def watched_connection(shared: Shared, log: RequestLog) -> TableConnection:
    conn = connect(shared.uri, shared.options)
    log.attach(conn.handler.store.client, "s3")  # type: ignore[attr-defined]
    log.attach(conn.handler.entries.client, "dynamodb")  # type: ignore[attr-defined]
    return conn


def test_the_bucket_really_ignores_if_none_match(shared: Shared) -> None:
    """The premise: on this server a conditional create does not protect anything."""
    s3 = boto3.client("s3", **shared.aws.client_kwargs())
    s3.put_object(Bucket=shared.bucket, Key="probe", Body=b"1", IfNoneMatch="*")
    s3.put_object(Bucket=shared.bucket, Key="probe", Body=b"2", IfNoneMatch="*")  # no 412
    assert s3.get_object(Bucket=shared.bucket, Key="probe")["Body"].read() == b"2"


def test_sixteen_writer_threads_append_without_loss(shared: Shared) -> None:
    log = RequestLog()
    tally = Tally()
    tally.add("setup", 0, ROWS)
    connections = [watched_connection(shared, log) for _ in range(WRITERS)]

    def writer(index: int) -> None:
        conn = connections[index]
        parent: Committed | None = None
        for seq in range(APPENDS):
            name = f"thread-{index}"
            parent = lancetx_append(
                conn.handler,
                conn.base,
                conn.data_uri,
                shared.options,
                batch(name, seq, ROWS),
                parent,
            )
            tally.add(name, seq, ROWS)

    errors = run_threads([lambda i=i: writer(i) for i in range(WRITERS)])  # type: ignore[misc]
    assert errors == [], errors
    assert tally.commits == 1 + WRITERS * APPENDS
    verify_history(
        shared.uri,
        shared.options,
        connections[0].handler,
        connections[0].base,
        tally.rows,
        versions=tally.commits,
    )

    s3_ops = log.operations("s3")
    assert s3_ops.count("CopyObject") >= WRITERS * APPENDS  # the hook saw our requests
    assert s3_ops.count("PutObject") >= 2 * WRITERS * APPENDS
    assert log.with_conditional_headers() == []


@pytest.mark.long_only  # minutes of CPU: CI's long pass (LANCETX_TEST_PROFILE=long)
def test_sixteen_writers_in_spawned_processes_append_without_loss(shared: Shared) -> None:
    processes, threads = 8, 2
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        futures = [
            pool.submit(
                process_writer, shared.uri, shared.options, f"proc-{p}", APPENDS, ROWS, threads
            )
            for p in range(processes)
        ]
        reports = [f.result(timeout=600) for f in futures]  # a hang guard, not a speed check
    tally = Tally()
    tally.add("setup", 0, ROWS)
    for report in reports:
        assert report["errors"] == [], report["errors"]
        assert report["conditional"] == [], report["conditional"]
        assert {"PutObject", "CopyObject", "DeleteObject"} <= set(report["s3_operations"])
        for writer, seq, rows in report["acknowledged"]:
            tally.add(writer, seq, rows)
    assert tally.commits == 1 + processes * threads * APPENDS
    conn = connect(shared.uri, shared.options)
    verify_history(
        shared.uri, shared.options, conn.handler, conn.base, tally.rows, versions=tally.commits
    )


# ------------------------------------------------------------------ transient faults


class FirstAttemptFaults:
    """Fails the first attempt of some of our requests, deterministically.

    A request is picked by a hash of what identifies it (a DynamoDB body, an S3
    method + path + copy source), so a retry of the same request is never
    picked twice and every commit can eventually land. Only requests sent by
    botocore are touched (pylance's have another user agent)."""

    def __init__(self, ddb_table: str, bucket: str, one_in: int = 3) -> None:
        self.ddb_table = ddb_table.encode()
        self.bucket = bucket
        self.one_in = one_in
        self.seen: set[str] = set()
        self.fired: dict[str, int] = {"throttled": 0, "slowdown": 0, "landed-500": 0}
        self.lock = threading.Lock()

    def _pick(self, identity: str) -> bool:
        digest = int(hashlib.sha256(identity.encode()).hexdigest(), 16)
        with self.lock:
            if identity in self.seen:
                return False
            self.seen.add(identity)
        return digest % self.one_in == 0

    def __call__(self, r: InterceptedRequest) -> InterceptedResponse | None:
        if "botocore" not in r.headers.get("user-agent", "").lower():
            return None
        if r.service == "dynamodb" and r.target == "PutItem" and self.ddb_table in r.body:
            identity = hashlib.sha256(r.body).hexdigest()
            claim = b"attribute_not_exists" in r.body
            with self.lock:
                # The first claim always lands-then-fails, so the ambiguous path is
                # exercised on every run, not only when the hashes happen to pick it.
                first_claim = claim and self.fired["landed-500"] == 0 and identity not in self.seen
            if not first_claim and not self._pick(identity):
                return None
            if first_claim:
                with self.lock:
                    self.seen.add(identity)
            if claim and (first_claim or int(identity, 16) % 4 == 0):
                self._count("landed-500")  # lands, but the client sees a 500
                return _ddb_error("InternalServerError", 500, after_forwarding=True)
            self._count("throttled")
            return _ddb_error("ProvisionedThroughputExceededException", 400)
        if r.service == "s3" and r.method == "PUT" and r.path.startswith(f"/{self.bucket}/"):
            key = r.path + "|" + r.headers.get("x-amz-copy-source", "")
            if ("/_versions/" in key or "/_transactions/" in key) and self._pick(key):
                self._count("slowdown")
                return InterceptedResponse(
                    503,
                    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                    b"<Message>Please reduce your request rate.</Message></Error>",
                    [("Content-Type", "application/xml")],
                )
        return None

    def _count(self, kind: str) -> None:
        with self.lock:
            self.fired[kind] += 1


def _ddb_error(code: str, status: int, *, after_forwarding: bool = False) -> InterceptedResponse:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code})
    return InterceptedResponse(
        status,
        body.encode(),
        [("Content-Type", "application/x-amz-json-1.0")],
        after_forwarding=after_forwarding,
    )


def test_throttling_and_slowdowns_during_concurrent_appends_lose_nothing(shared: Shared) -> None:
    faults = FirstAttemptFaults(shared.ddb_table, shared.bucket)
    shared.aws.set_interceptor(faults)
    log = RequestLog()
    tally = Tally()
    tally.add("setup", 0, ROWS)
    writers = 6

    def lancetx_writer(index: int) -> None:
        conn = watched_connection(shared, log)
        parent: Committed | None = None
        for seq in range(APPENDS):
            parent = lancetx_append(
                conn.handler,
                conn.base,
                conn.data_uri,
                shared.options,
                batch(f"lancetx-{index}", seq, ROWS),
                parent,
            )
            tally.add(f"lancetx-{index}", seq, ROWS)

    def pylance_writer() -> None:
        for seq in range(APPENDS):
            pylance_append_landing(shared.uri, shared.options, batch("pylance", seq, ROWS))
            tally.add("pylance", seq, ROWS)

    targets: list[Any] = [lambda i=i: lancetx_writer(i) for i in range(writers)]
    errors = run_threads([*targets, pylance_writer])
    shared.aws.set_interceptor(None)
    assert errors == [], errors
    assert faults.fired["throttled"] > 0 and faults.fired["slowdown"] > 0, faults.fired
    assert faults.fired["landed-500"] > 0, faults.fired
    assert tally.commits == 1 + (writers + 1) * APPENDS
    conn = connect(shared.uri, shared.options)
    verify_history(
        shared.uri, shared.options, conn.handler, conn.base, tally.rows, versions=tally.commits
    )
    assert log.with_conditional_headers() == []
