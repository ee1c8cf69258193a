"""A job's commit whose PutItem landed but whose answer was lost."""

from __future__ import annotations

import json
import threading
from typing import Any

import lance
import pytest
from spark_helpers import data_files, lance_ids, referenced_files, spark_options

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from pyspark_lancetx import last_commit, table_history


def _ddb_500(*, after_forwarding: bool) -> InterceptedResponse:
    body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"})
    return InterceptedResponse(
        500,
        body.encode(),
        [("Content-Type", "application/x-amz-json-1.0")],
        after_forwarding=after_forwarding,
    )


class LoseClaimAnswers:
    """The first version claim lands but its caller sees a 500; with ``outage``,
    DynamoDB answers nothing but 500s afterwards (until ``stop()``)."""

    def __init__(self, outage: bool) -> None:
        self.outage = outage
        self.fired = 0
        self.stopped = False
        self.lock = threading.Lock()

    def stop(self) -> None:
        self.stopped = True

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if self.stopped or request.service != "dynamodb":
            return None
        with self.lock:
            if self.fired:
                return _ddb_500(after_forwarding=False) if self.outage else None
            # The job's claim: its job id is an idempotency key, so the version and the
            # key are claimed in one TransactWriteItems.
            claim = request.target in ("PutItem", "TransactWriteItems")
            if claim and b"attribute_not_exists" in request.body:
                self.fired += 1
                return _ddb_500(after_forwarding=True)
        return None


def _seed(spark: Any, uri: str, opts: dict[str, str]) -> None:
    spark.range(0, 10, 1, 1).write.format("lancetx").mode("append").options(**opts).save(uri)


def test_a_lost_answer_is_settled_and_the_job_succeeds_once(
    spark: Any, legacy_aws: EmbeddedAws, ddb_uri: str, storage: dict[str, str]
) -> None:
    opts = spark_options(storage)
    _seed(spark, ddb_uri, opts)
    fault = LoseClaimAnswers(outage=False)
    legacy_aws.set_interceptor(fault)
    spark.range(10, 30, 1, 2).write.format("lancetx").mode("append").options(**opts).option(
        "job_id", "lost-answer"
    ).save(ddb_uri)
    legacy_aws.set_interceptor(None)
    assert fault.fired == 1
    assert lance_ids(ddb_uri, storage) == list(range(30))
    assert last_commit(ddb_uri, "lost-answer", storage) == 2
    assert [h.version for h in table_history(ddb_uri, storage)] == [1, 2]


def test_an_unsettled_commit_is_a_typed_error_and_abort_keeps_the_version(
    spark: Any, legacy_aws: EmbeddedAws, ddb_uri: str, storage: dict[str, str]
) -> None:
    opts = spark_options(storage)
    _seed(spark, ddb_uri, opts)
    fault = LoseClaimAnswers(outage=True)
    legacy_aws.set_interceptor(fault)
    try:
        with pytest.raises(Exception, match="JobCommitUnknownError") as failed:
            spark.range(10, 30, 1, 2).write.format("lancetx").mode("append").options(**opts).option(
                "job_id", "unsettled"
            ).option("commit_timeout", "3").save(ddb_uri)
    finally:
        fault.stop()
        legacy_aws.set_interceptor(None)
    assert "last_commit" in str(failed.value)  # the message says how to settle it
    # Spark called abort(); the version the claim created is intact and readable.
    assert last_commit(ddb_uri, "unsettled", storage) == 2
    assert lance_ids(ddb_uri, storage) == list(range(30))
    ds = lance.dataset(ddb_uri, storage_options=storage)
    assert ds.version == 2 and ds.to_table().num_rows == 30
    assert data_files(ddb_uri, storage) == referenced_files(ddb_uri, storage)
