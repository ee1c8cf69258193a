"""The conditional-PUT probe: a store that silently ignores If-None-Match is refused
before the first ``s3://`` commit writes any manifest; the probe costs at most 3
requests, once per process per bucket (counted on the wire)."""

from __future__ import annotations

import boto3
import pytest
from protocol_helpers import (
    RequestLog,
    batch,
    create_transaction,
    lancetx_append,
    pylance_create,
)

from lancetx.commit.engine.committer import commit_transaction
from lancetx.commit.handlers.conditional_put import ConditionalPutCommitHandler
from lancetx.commit.handlers.probe import PROBE_DIR, ConditionalPutIgnoredError
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import TableConnection, connect


def _objects(aws: EmbeddedAws, bucket: str) -> dict[str, str]:
    s3 = boto3.client("s3", **aws.client_kwargs())
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


def _connect(uri: str, options: dict[str, str]) -> tuple[TableConnection, RequestLog]:
    conn = connect(uri, options)
    assert isinstance(conn.handler, ConditionalPutCommitHandler)
    log = RequestLog().attach(conn.handler.store.client, "s3")  # type: ignore[attr-defined]
    return conn, log


def _probe_requests(log: RequestLog) -> list[str]:
    return [r.operation for r in log.requests if f"/{PROBE_DIR}/" in r.url]


def _create(conn: TableConnection, options: dict[str, str]) -> None:
    """Version 1, written by lancetx on a store that honours If-None-Match."""
    txn = create_transaction(conn.data_uri, options, batch("create", 0, 4))
    commit_transaction(conn.handler, conn.base, txn)


def test_a_store_ignoring_if_none_match_is_refused_before_any_manifest(
    legacy_aws: EmbeddedAws, bucket: str
) -> None:
    """The embedded server's legacy switch: S3 silently drops If-None-Match."""
    options = legacy_aws.pylance_storage_options()
    uri = f"s3://{bucket}/probe.lance"
    pylance_create(uri, options, batch("create", 0, 4))
    before = _objects(legacy_aws, bucket)
    conn, log = _connect(uri, options)
    with pytest.raises(ConditionalPutIgnoredError) as refused:
        lancetx_append(conn.handler, conn.base, conn.data_uri, options, batch("w", 0, 3))
    assert "s3+ddb://" in str(refused.value) and "probe.lance" in str(refused.value)
    assert _probe_requests(log) == ["PutObject", "PutObject", "DeleteObject"]
    after = _objects(legacy_aws, bucket)
    new = set(after) - set(before)
    assert all("/data/" in key for key in new), new  # no manifest, no transaction file
    assert {k: after[k] for k in before} == before

    # Once per process per bucket: the next writer is refused without a request.
    log.clear()
    again, again_log = _connect(uri, options)
    with pytest.raises(ConditionalPutIgnoredError):
        lancetx_append(again.handler, again.base, again.data_uri, options, batch("w", 1, 3))
    assert _probe_requests(log) == _probe_requests(again_log) == []

    # A user who knows the store can turn the probe off (and takes the risk).
    off, off_log = _connect(uri, {**options, "lancetx_probe_conditional_put": "false"})
    done = lancetx_append(off.handler, off.base, off.data_uri, options, batch("w", 2, 3))
    assert done.version == 2 and _probe_requests(off_log) == []


def test_a_store_honouring_if_none_match_is_probed_once(aws: EmbeddedAws, bucket: str) -> None:
    options = aws.pylance_storage_options()
    uri = f"s3://{bucket}/honest.lance"
    conn, log = _connect(uri, options)
    _create(conn, options)
    assert _probe_requests(log) == ["PutObject", "PutObject", "DeleteObject"]
    assert not [k for k in _objects(aws, bucket) if PROBE_DIR in k]  # cleaned up
    other, other_log = _connect(uri, options)
    committed = lancetx_append(other.handler, other.base, other.data_uri, options, batch("w", 0, 2))
    assert committed.version == 2
    assert _probe_requests(log) == ["PutObject", "PutObject", "DeleteObject"]
    assert _probe_requests(other_log) == []
