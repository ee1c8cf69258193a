"""DynamoDB store specifics on the embedded moto server: table validation,
typed errors for bad setups, retries under throttling, ambiguous writes,
create_table races, configuration, and interoperation with pylance."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest

from lancetx.commit.engine.committer import load_parent
from lancetx.commit.format.naming import NamingScheme, manifest_key
from lancetx.commit.storage.aws_clients import session_region
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb.config import DEFAULT_REGION, DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.retry import RetryPolicy
from lancetx.externalstore.dynamodb.store import (
    DynamoDBManifestStore,
    clear_validation_cache,
    create_table,
)
from lancetx.externalstore.dynamodb.store_async import (
    AsyncDynamoDBManifestStore,
    create_table_async,
    open_client,
)
from lancetx.externalstore.dynamodb.store_schema import STAMP_BASE_URI, clear_stamp_cache
from lancetx.externalstore.dynamodb.uri import canonical_base_uri
from lancetx.externalstore.errors import (
    AccessDeniedError,
    AmbiguousWriteError,
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
    EndpointUnreachableError,
    EntryExistsError,
    EntryMismatchError,
    ExternalStoreError,
    InvalidConfigError,
    ServiceUnavailableError,
    ThrottledError,
)

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

BASE = "db/t.lance"
FAST = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.01)


def staged(version: int, token: str) -> ManifestEntry:
    return ManifestEntry(
        BASE, version, f"{BASE}/_versions/{version}.manifest-{token}", 10, commit_token=token
    )


def ddb_error(
    code: str, status: int = 400, *, after_forwarding: bool = False
) -> InterceptedResponse:
    body = json.dumps(
        {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": f"injected {code}"}
    )
    return InterceptedResponse(
        status,
        body.encode(),
        [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-ErrorType", code)],
        after_forwarding=after_forwarding,
    )


class Faults:
    """An interceptor acting only on DynamoDB requests naming our table.

    ``plan(op, responses)``: the next len(responses) ``op`` requests get those
    answers (None lets a request through); ``always(op, response)`` answers
    every one. ``seen`` counts requests per operation.
    """

    def __init__(self, aws: EmbeddedAws, table: str) -> None:
        self.table = table.encode()
        self.seen: Counter[str] = Counter()
        self._queued: dict[str, list[InterceptedResponse | None]] = {}
        self._always: dict[str, InterceptedResponse] = {}
        self._before: dict[str, Callable[[InterceptedRequest], None]] = {}
        self._lock = threading.Lock()
        aws.set_interceptor(self)

    def plan(self, op: str, responses: list[InterceptedResponse | None]) -> None:
        with self._lock:
            self._queued[op] = list(responses)

    def always(self, op: str, response: InterceptedResponse) -> None:
        with self._lock:
            self._always[op] = response

    def before(self, op: str, action: Callable[[InterceptedRequest], None]) -> None:
        self._before[op] = action

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service != "dynamodb" or self.table not in request.body:
            return None
        with self._lock:
            self.seen[request.target] += 1
            queued = self._queued.get(request.target)
            response = queued.pop(0) if queued else self._always.get(request.target)
        action = self._before.get(request.target)
        if action is not None:
            action(request)
        return response


@pytest.fixture(autouse=True)
def _no_interceptor_left(aws: EmbeddedAws) -> Iterator[None]:
    yield
    aws.set_interceptor(None)


@pytest.fixture
def config(aws: EmbeddedAws) -> DynamoDBConfig:
    return replace(DynamoDBConfig.from_options(aws.pylance_storage_options()), retry=FAST)


@pytest.fixture
def table(config: DynamoDBConfig, ddb_table_name: str) -> str:
    create_table(make_client(config), ddb_table_name)
    return ddb_table_name


@pytest.fixture
def store(config: DynamoDBConfig, table: str) -> DynamoDBManifestStore:
    return DynamoDBManifestStore.from_config(table, config)


def scan(config: DynamoDBConfig, table: str) -> list[dict[str, Any]]:
    """Every item of ``table`` but the layout stamp ``create_table`` writes, read with a
    plain boto3 client (lancetx's has no Scan)."""
    client = boto3.client("dynamodb", **config.client_kwargs(session_region()))
    items = client.scan(TableName=table, ConsistentRead=True)["Items"]
    return [i for i in items if i["base_uri"]["S"] != STAMP_BASE_URI]


def make_table(client: Any, name: str, keys: list[tuple[str, str, str]]) -> None:
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": n, "KeyType": k} for n, k, _ in keys],
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": t} for n, _, t in keys],
        BillingMode="PAY_PER_REQUEST",
    )


# =========================================================================== bad setups


def test_missing_table_is_named_with_region_endpoint_and_remedy(
    aws: EmbeddedAws, config: DynamoDBConfig, ddb_table_name: str
) -> None:
    with pytest.raises(DynamoDBTableNotFoundError) as info:
        DynamoDBManifestStore.from_config(ddb_table_name, config)
    message = str(info.value)
    for needle in (
        "dynamodb:DescribeTable",
        f"table/{ddb_table_name}",
        "us-east-1",
        aws.dynamodb_endpoint,
        "create_table",
        f"create-table --table-name {ddb_table_name} ",
        f"--region us-east-1 --endpoint-url {aws.dynamodb_endpoint}",
    ):
        assert needle in message, needle

    async def main() -> None:
        async with AsyncDynamoDBManifestStore.open(ddb_table_name, config):
            pass

    with pytest.raises(DynamoDBTableNotFoundError):
        asyncio.run(main())


@pytest.mark.parametrize(
    ("keys", "found", "problem"),
    [
        ([("id", "HASH", "S"), ("version", "RANGE", "N")], "HASH id (S)", "wrong key schema"),
        ([("base_uri", "HASH", "S"), ("v", "RANGE", "N")], "RANGE v (N)", "wrong key schema"),
        ([("base_uri", "HASH", "S")], "HASH base_uri (S)", "wrong key schema"),
        (
            [("base_uri", "HASH", "S"), ("version", "RANGE", "S")],
            "RANGE version (S)",
            "wrong key attribute types",
        ),
        (
            [("base_uri", "HASH", "B"), ("version", "RANGE", "N")],
            "HASH base_uri (B)",
            "wrong key attribute types",
        ),
    ],
)
def test_wrong_table_layout_is_refused(
    config: DynamoDBConfig,
    ddb_table_name: str,
    keys: list[tuple[str, str, str]],
    found: str,
    problem: str,
) -> None:
    client = make_client(config)
    make_table(client, ddb_table_name, keys)
    with pytest.raises(DynamoDBTableSchemaError) as info:
        DynamoDBManifestStore(client, ddb_table_name)
    message = str(info.value)
    assert found in message and problem in message
    assert "HASH key base_uri (type S) and RANGE key version (type N)" in message
    assert "dynamodb:DescribeTable" in message and f"table/{ddb_table_name}" in message
    # create_table on an existing, wrongly shaped table refuses it too.
    with pytest.raises(DynamoDBTableSchemaError):
        create_table(client, ddb_table_name)


def test_a_connection_to_a_missing_table_fails_at_its_first_read(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    """connect() sends nothing; the missing table is reported at the first read, still
    naming the table, region, endpoint and the remedy."""
    clear_validation_cache()
    conn = connect(
        f"s3+ddb://some-bucket/t.lance?ddbTableName={ddb_table_name}",
        aws.pylance_storage_options(),
    )
    with pytest.raises(DynamoDBTableNotFoundError) as info:
        load_parent(conn.handler, conn.base)
    message = str(info.value)
    for needle in (
        f"table/{ddb_table_name}",
        "us-east-1",
        aws.dynamodb_endpoint,
        f"create-table --table-name {ddb_table_name} ",
    ):
        assert needle in message, needle


@pytest.mark.parametrize(
    ("keys", "found"),
    [
        ([("id", "HASH", "S"), ("version", "RANGE", "N")], "HASH id (S)"),
        ([("base_uri", "HASH", "S"), ("v", "RANGE", "N")], "RANGE v (N)"),
        ([("base_uri", "HASH", "S")], "HASH base_uri (S)"),
        ([("base_uri", "HASH", "S"), ("version", "RANGE", "S")], "RANGE version (S)"),
    ],
)
def test_a_connection_to_a_table_of_another_layout_fails_at_its_first_use(
    aws: EmbeddedAws,
    config: DynamoDBConfig,
    ddb_table_name: str,
    keys: list[tuple[str, str, str]],
    found: str,
) -> None:
    """The layout is checked beside the first request and reported instead of its
    result (or of the error DynamoDB gave for our keys)."""
    make_table(make_client(config), ddb_table_name, keys)
    clear_validation_cache()
    clear_stamp_cache()
    uri = f"s3+ddb://some-bucket/t.lance?ddbTableName={ddb_table_name}"
    conn = connect(uri, aws.pylance_storage_options())
    with pytest.raises(DynamoDBTableSchemaError) as info:
        load_parent(conn.handler, conn.base)
    message = str(info.value)
    assert found in message and f"table/{ddb_table_name}" in message
    assert "HASH key base_uri (type S) and RANGE key version (type N)" in message
    with pytest.raises(DynamoDBTableSchemaError):  # and again: a failed check is not forgotten
        load_parent(conn.handler, conn.base)


def test_a_batch_read_answered_resource_not_found_on_a_table_of_another_layout_is_a_schema_error(
    aws: EmbeddedAws, config: DynamoDBConfig, ddb_table_name: str
) -> None:
    """dynalite answers a BatchGetItem whose keys do not fit the table with "resource
    not found" (DynamoDB says ValidationException): the table is asked, and a table
    that exists with another layout is reported as such, not as missing."""
    make_table(make_client(config), ddb_table_name, [("id", "HASH", "S")])
    clear_validation_cache()
    clear_stamp_cache()

    def like_dynalite(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service != "dynamodb" or request.target != "BatchGetItem":
            return None
        body = {
            "__type": "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException",
            "message": "Requested resource not found",
        }
        return InterceptedResponse(
            400, json.dumps(body).encode(), [("Content-Type", "application/x-amz-json-1.0")]
        )

    aws.set_interceptor(like_dynalite)
    try:
        conn = connect(
            f"s3+ddb://some-bucket/t.lance?ddbTableName={ddb_table_name}",
            aws.pylance_storage_options(),
        )
        with pytest.raises(DynamoDBTableSchemaError, match="HASH id"):
            load_parent(conn.handler, conn.base)
    finally:
        aws.set_interceptor(None)


def test_unreachable_endpoint(ddb_table_name: str) -> None:
    config = DynamoDBConfig(
        endpoint_url="http://127.0.0.1:1",
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        connect_timeout=0.5,
        retry=RetryPolicy(max_attempts=1),
    )
    started = time.monotonic()
    with pytest.raises(EndpointUnreachableError) as info:
        DynamoDBManifestStore.from_config(ddb_table_name, config)
    assert time.monotonic() - started < 10
    message = str(info.value)
    for needle in (
        "dynamodb:DescribeTable",
        "http://127.0.0.1:1",
        "dynamodb_endpoint",
        "1 attempt",
    ):
        assert needle in message, needle

    async def main() -> None:
        async with AsyncDynamoDBManifestStore.open(ddb_table_name, config):
            pass

    with pytest.raises(EndpointUnreachableError):
        asyncio.run(main())


def test_access_denied_names_the_action_to_grant(
    aws: EmbeddedAws, store: DynamoDBManifestStore, table: str
) -> None:
    faults = Faults(aws, table)
    faults.always("PutItem", ddb_error("AccessDeniedException"))
    with pytest.raises(AccessDeniedError) as info:
        store.put_if_not_exists(staged(1, "t"))
    assert faults.seen["PutItem"] == 1  # not retried
    message = str(info.value)
    assert (
        f"grant IAM action dynamodb:PutItem on arn:aws:dynamodb:us-east-1:123456789012:table/{table}"
        in message
    )

    faults.always("Query", ddb_error("UnrecognizedClientException"))
    with pytest.raises(AccessDeniedError) as info:
        store.latest(BASE)
    assert "dynamodb:Query" in str(info.value) and "credentials" in str(info.value)


def test_access_denied_on_describe(aws: EmbeddedAws, config: DynamoDBConfig, table: str) -> None:
    clear_validation_cache()
    Faults(aws, table).always("DescribeTable", ddb_error("AccessDeniedException"))
    with pytest.raises(AccessDeniedError) as info:
        DynamoDBManifestStore.from_config(table, config)
    assert (
        f"grant IAM action dynamodb:DescribeTable on arn:aws:dynamodb:us-east-1:*:table/{table}"
        in str(info.value)
    )
    # Callers without DescribeTable permission can skip the check.
    DynamoDBManifestStore.from_config(table, config, validate=False).put_if_not_exists(
        staged(1, "t")
    )


def test_malformed_item_is_reported(
    config: DynamoDBConfig, table: str, store: DynamoDBManifestStore
) -> None:
    make_client(config).put_item(
        TableName=table, Item={"base_uri": {"S": BASE}, "version": {"N": "1"}}
    )
    with pytest.raises(ExternalStoreError, match="malformed manifest item"):
        store.get(BASE, 1)


# =========================================================================== throttling


@pytest.mark.parametrize(
    "code",
    ["ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"],
)
def test_throttled_twice_then_succeeds(
    aws: EmbeddedAws, config: DynamoDBConfig, table: str, store: DynamoDBManifestStore, code: str
) -> None:
    faults = Faults(aws, table)
    faults.plan("PutItem", [ddb_error(code), ddb_error(code)])
    store.put_if_not_exists(staged(1, "tok"))
    assert faults.seen["PutItem"] == 3
    items = scan(config, table)
    assert len(items) == 1 and items[0]["commit_token"] == {"S": "tok"}
    faults.plan("Query", [ddb_error(code), ddb_error(code)])
    latest = store.latest(BASE)
    assert latest is not None and latest.commit_token == "tok"
    assert faults.seen["Query"] == 3


def test_persistent_throttling_raises_throttled(
    aws: EmbeddedAws, config: DynamoDBConfig, table: str, store: DynamoDBManifestStore
) -> None:
    faults = Faults(aws, table)
    faults.always("PutItem", ddb_error("ProvisionedThroughputExceededException"))
    with pytest.raises(ThrottledError) as info:
        store.put_if_not_exists(staged(1, "tok"))
    assert info.value.attempts == FAST.max_attempts == faults.seen["PutItem"]
    assert "dynamodb:PutItem" in str(info.value) and f"table/{table}" in str(info.value)
    assert scan(config, table) == []

    async def main() -> None:
        async with AsyncDynamoDBManifestStore.open(table, config) as s:
            await s.put_if_not_exists(staged(1, "tok"))

    with pytest.raises(ThrottledError):
        asyncio.run(main())


def test_transient_5xx_on_reads_is_retried(
    aws: EmbeddedAws, store: DynamoDBManifestStore, table: str
) -> None:
    store.put_if_not_exists(staged(1, "tok"))
    faults = Faults(aws, table)
    faults.plan(
        "GetItem", [ddb_error("InternalServerError", 500), ddb_error("InternalServerError", 500)]
    )
    assert store.get(BASE, 1).commit_token == "tok"
    faults.always("GetItem", ddb_error("InternalServerError", 500))
    with pytest.raises(ServiceUnavailableError) as info:
        store.get(BASE, 1)
    assert "dynamodb:GetItem" in str(info.value)


# =========================================================================== ambiguity


def test_landed_write_reported_as_5xx_resolves_as_ours(
    aws: EmbeddedAws, config: DynamoDBConfig, table: str
) -> None:
    before_retry: list[int] = []
    store = DynamoDBManifestStore(
        make_client(config),
        table,
        retry=FAST,
        sleep=lambda _: before_retry.append(len(scan(config, table))),
    )
    faults = Faults(aws, table)
    faults.plan("PutItem", [ddb_error("InternalServerError", 500, after_forwarding=True)])
    store.put_if_not_exists(staged(1, "mine"))  # retry hits ConditionalCheckFailed on our own item
    assert faults.seen["PutItem"] == 2
    assert before_retry == [1]  # the first attempt did land: the retry met our own item
    items = scan(config, table)
    assert len(items) == 1 and items[0]["commit_token"] == {"S": "mine"}


def test_ambiguous_attempt_then_someone_elses_item_is_a_conflict(
    aws: EmbeddedAws, store: DynamoDBManifestStore, table: str
) -> None:
    store.put_if_not_exists(staged(1, "theirs"))
    faults = Faults(aws, table)
    faults.plan("PutItem", [ddb_error("InternalServerError", 500, after_forwarding=True)])
    with pytest.raises(EntryExistsError) as info:
        store.put_if_not_exists(staged(1, "mine"))
    assert faults.seen["PutItem"] == 2
    assert info.value.existing is not None and info.value.existing.commit_token == "theirs"


def test_ambiguous_attempt_then_tokenless_final_item_stays_ambiguous(
    config: DynamoDBConfig, aws: EmbeddedAws, table: str
) -> None:
    raw = make_client(config)
    mine = staged(1, "mine")

    def pylance_finalizes_meanwhile(_: float) -> None:
        # Between our attempts a token-unaware finalizer flips the entry (as pylance does).
        raw.put_item(
            TableName=table,
            Item={
                "base_uri": {"S": BASE},
                "version": {"N": "1"},
                "path": {"S": f"{BASE}/_versions/1.manifest"},
                "size": {"N": "10"},
                "committer": {"S": "lancedb"},
            },
        )

    store = DynamoDBManifestStore(
        make_client(config), table, retry=FAST, sleep=pylance_finalizes_meanwhile
    )
    Faults(aws, table).plan(
        "PutItem", [ddb_error("InternalServerError", 500, after_forwarding=True)]
    )
    with pytest.raises(AmbiguousWriteError) as info:
        store.put_if_not_exists(mine)
    assert info.value.entry == mine
    assert (
        info.value.existing is not None
        and info.value.existing.path == f"{BASE}/_versions/1.manifest"
    )
    assert "Do not delete the staged manifest" in str(info.value)


def test_tokenless_final_item_without_ambiguity_is_a_conflict(store: DynamoDBManifestStore) -> None:
    store.put_if_not_exists(
        ManifestEntry(BASE, 1, f"{BASE}/_versions/1.manifest", committer="lancedb")
    )
    with pytest.raises(EntryExistsError):
        store.put_if_not_exists(staged(1, "mine"))


def test_persistent_5xx_on_a_write_is_ambiguous(
    aws: EmbeddedAws, config: DynamoDBConfig, table: str, store: DynamoDBManifestStore
) -> None:
    faults = Faults(aws, table)
    faults.always("PutItem", ddb_error("InternalServerError", 500))
    with pytest.raises(AmbiguousWriteError) as info:
        store.put_if_not_exists(staged(1, "mine"))
    assert faults.seen["PutItem"] == FAST.max_attempts
    assert "dynamodb:PutItem" in str(info.value)


def test_read_timeout_on_a_write(aws: EmbeddedAws, config: DynamoDBConfig, table: str) -> None:
    slow = replace(config, read_timeout=0.3, retry=RetryPolicy(max_attempts=1))
    store = DynamoDBManifestStore.from_config(table, slow)
    faults = Faults(aws, table)
    delayed: list[bool] = []

    def delay_first(_: InterceptedRequest) -> None:
        if len(delayed) < 1:  # the request lands after the client gave up
            delayed.append(True)
            time.sleep(0.8)

    faults.before("PutItem", delay_first)
    with pytest.raises(AmbiguousWriteError):
        store.put_if_not_exists(staged(1, "late"))
    deadline = time.monotonic() + 10
    while store.latest(BASE) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    latest = store.latest(BASE)
    assert latest is not None and latest.commit_token == "late"  # it did land: ambiguity was real

    # With retries the same situation resolves: the retry finds (or makes) our item.
    delayed.clear()
    retrying = DynamoDBManifestStore.from_config(table, replace(slow, retry=FAST))
    retrying.put_if_not_exists(staged(2, "late2"))
    entry = retrying.get(BASE, 2)
    assert entry.commit_token == "late2"


def test_flip_retried_after_landing_is_a_noop(
    aws: EmbeddedAws, store: DynamoDBManifestStore, table: str
) -> None:
    claim = staged(1, "tok")
    store.put_if_not_exists(claim)
    done = replace(claim, path=f"{BASE}/_versions/1.manifest")
    faults = Faults(aws, table)
    faults.plan("PutItem", [ddb_error("InternalServerError", 500, after_forwarding=True)])
    store.put_if_exists(done, expected_path=claim.path)
    assert faults.seen["PutItem"] == 2
    assert store.get(BASE, 1).path == done.path


def test_condition_failure_without_all_old_falls_back_to_a_read(
    aws: EmbeddedAws, store: DynamoDBManifestStore, table: str
) -> None:
    store.put_if_not_exists(staged(1, "theirs"))
    faults = Faults(aws, table)
    # A service that ignores ReturnValuesOnConditionCheckFailure (older DynamoDB Local).
    faults.plan(
        "PutItem",
        [
            ddb_error("ConditionalCheckFailedException"),
            ddb_error("ConditionalCheckFailedException"),
        ],
    )
    with pytest.raises(EntryExistsError) as info:
        store.put_if_not_exists(staged(1, "mine"))
    assert info.value.existing is not None and info.value.existing.commit_token == "theirs"
    assert faults.seen["GetItem"] == 1
    with pytest.raises(EntryMismatchError):
        store.put_if_exists(staged(1, "x"), expected_path="elsewhere")


def test_async_store_resolves_ambiguity_too(
    aws: EmbeddedAws, config: DynamoDBConfig, table: str
) -> None:
    faults = Faults(aws, table)
    faults.plan("PutItem", [ddb_error("InternalServerError", 500, after_forwarding=True)])
    before_retry: list[int] = []

    async def record(_: float) -> None:
        before_retry.append(len(scan(config, table)))

    async def main() -> ManifestEntry:
        async with AsyncDynamoDBManifestStore.open(table, config, sleep=record) as s:
            await s.put_if_not_exists(staged(1, "mine"))
            return await s.get(BASE, 1)

    assert asyncio.run(main()).commit_token == "mine"
    assert faults.seen["PutItem"] == 2
    assert before_retry == [1]  # the first attempt landed


@pytest.fixture
def resetting_endpoint() -> Iterator[str]:
    """An endpoint that reads each whole request, then resets the connection:
    the request was sent (and could have been applied), its answer is lost."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    server.close()


def _remote_config(endpoint: str) -> DynamoDBConfig:
    return DynamoDBConfig(
        endpoint_url=endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        connect_timeout=0.5,
        read_timeout=2.0,
        retry=RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.001),
    )


def _claim_and_read_sync_and_async(config: DynamoDBConfig) -> list[tuple[str, type, type]]:
    """(driver, error of put_if_not_exists, error of get) for the sync and async stores."""
    results: list[tuple[str, type, type]] = []
    store = DynamoDBManifestStore.from_config("t", config, validate=False)
    with pytest.raises(ExternalStoreError) as put:
        store.put_if_not_exists(staged(1, "mine"))
    with pytest.raises(ExternalStoreError) as get:
        store.get(BASE, 1)
    results.append(("sync", type(put.value), type(get.value)))

    async def main() -> None:
        async with AsyncDynamoDBManifestStore.open("t", config, validate=False) as s:
            with pytest.raises(ExternalStoreError) as put:
                await s.put_if_not_exists(staged(1, "mine"))
            with pytest.raises(ExternalStoreError) as get:
                await s.get(BASE, 1)
            results.append(("async", type(put.value), type(get.value)))

    asyncio.run(main())
    return results


def test_connection_reset_after_sending_is_not_unreachable(resetting_endpoint: str) -> None:
    # aiobotocore reports a reset while reading the answer as EndpointConnectionError;
    # the claim may have landed, so it must not read as "nothing was sent".
    results = _claim_and_read_sync_and_async(_remote_config(resetting_endpoint))
    assert results == [
        ("sync", AmbiguousWriteError, ServiceUnavailableError),
        ("async", AmbiguousWriteError, ServiceUnavailableError),
    ]


def test_connection_refused_stays_unreachable() -> None:
    results = _claim_and_read_sync_and_async(_remote_config("http://127.0.0.1:1"))
    assert results == [
        ("sync", EndpointUnreachableError, EndpointUnreachableError),
        ("async", EndpointUnreachableError, EndpointUnreachableError),
    ]


def test_botocore_retries_are_off_for_both_clients(
    aws: EmbeddedAws, config: DynamoDBConfig, table: str
) -> None:
    # Each store attempt is exactly one HTTP request, for boto3 and aiobotocore alike.
    faults = Faults(aws, table)
    faults.always("PutItem", ddb_error("InternalServerError", 500))
    with pytest.raises(AmbiguousWriteError):
        DynamoDBManifestStore.from_config(table, config).put_if_not_exists(staged(1, "a"))
    assert faults.seen["PutItem"] == FAST.max_attempts

    async def main() -> None:
        async with AsyncDynamoDBManifestStore.open(table, config) as s:
            await s.put_if_not_exists(staged(1, "a"))

    with pytest.raises(AmbiguousWriteError):
        asyncio.run(main())
    assert faults.seen["PutItem"] == 2 * FAST.max_attempts


# =========================================================================== create / validate


def test_create_table_race(config: DynamoDBConfig, ddb_table_name: str, aws: EmbeddedAws) -> None:
    faults = Faults(aws, ddb_table_name)
    results: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        client = make_client(config)
        barrier.wait()
        try:
            results[i] = create_table(client, ddb_table_name, timeout=30)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert faults.seen["CreateTable"] == 2
    assert all(r.status == "ACTIVE" for r in results), results
    assert results[0].arn == results[1].arn and results[0].arn.endswith(f":table/{ddb_table_name}")
    description = make_client(config).describe_table(TableName=ddb_table_name)["Table"]
    assert description["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    create_table(make_client(config), ddb_table_name)  # idempotent

    async def again() -> str:
        async with open_client(config) as client:
            return str((await create_table_async(client, ddb_table_name)).status)

    assert asyncio.run(again()) == "ACTIVE"


def test_validation_is_cached_per_table(
    config: DynamoDBConfig, table: str, ddb_table_name: str
) -> None:
    clear_validation_cache()
    calls: Counter[str] = Counter()

    def counting_client() -> Any:
        # A client of its own (make_client's is shared by the process).
        client = boto3.session.Session().client("dynamodb", **config.client_kwargs())
        client.meta.events.register(
            "before-parameter-build.dynamodb.DescribeTable",
            lambda params, **_: calls.update([params["TableName"]]),
        )
        return client

    client = counting_client()
    first = DynamoDBManifestStore(client, table)
    DynamoDBManifestStore(client, table)
    DynamoDBManifestStore(counting_client(), table)  # the cache is per process, not per client
    assert calls[table] == 1
    assert first.target.arn is not None and first.target.arn.endswith(f":table/{table}")

    async def main() -> None:
        async with AsyncDynamoDBManifestStore.open(table, config) as s:
            assert s.target.arn == first.target.arn

    asyncio.run(main())
    assert calls[table] == 1
    other = f"{table}_2"
    create_table(make_client(config), other)
    clear_validation_cache()
    DynamoDBManifestStore(client, other)
    DynamoDBManifestStore(client, table)
    assert calls[other] == 1 and calls[table] == 2


# =========================================================================== config


def test_config_precedence_and_separation_from_s3() -> None:
    env = {
        "DYNAMODB_ENDPOINT": "http://env-lance:1",
        "AWS_ENDPOINT_URL_DYNAMODB": "http://env-boto:1",
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_REGION": "eu-central-1",
    }
    assert DynamoDBConfig.from_options({}, env).endpoint_url == "http://env-lance:1"
    assert (
        DynamoDBConfig.from_options({}, {"AWS_ENDPOINT_URL_DYNAMODB": "http://b:1"}).endpoint_url
        == "http://b:1"
    )
    assert (
        DynamoDBConfig.from_options({"dynamodb_endpoint": "http://opt:1"}, env).endpoint_url
        == "http://opt:1"
    )
    # delta-rs style upper-case keys in storage options.
    assert (
        DynamoDBConfig.from_options({"AWS_ENDPOINT_URL_DYNAMODB": "http://d:1"}, {}).endpoint_url
        == "http://d:1"
    )
    # S3's endpoint is never DynamoDB's.
    assert (
        DynamoDBConfig.from_options(
            {"aws_endpoint": "http://minio:9000"}, {"AWS_ENDPOINT_URL": "x"}
        ).endpoint_url
        is None
    )

    assert DynamoDBConfig.from_options({}, env).region == "eu-central-1"
    assert DynamoDBConfig.from_options({"aws_region": "us-east-2"}, env).region == "us-east-2"
    assert (
        DynamoDBConfig.from_options(
            {"aws_region": "us-east-2", "dynamodb_region": "ap-south-1"}, env
        ).region
        == "ap-south-1"
    )
    assert (
        DynamoDBConfig.from_options(
            {"region": "us-east-2"}, {"AWS_REGION_DYNAMODB": "sa-east-1"}
        ).region
        == "sa-east-1"
    )
    assert DynamoDBConfig.from_options({}, {}).region is None


def test_config_credentials() -> None:
    s3_only = DynamoDBConfig.from_options(
        {"aws_access_key_id": "S3KEY", "aws_secret_access_key": "S3SECRET"}, {}
    )
    assert (s3_only.access_key_id, s3_only.secret_access_key) == ("S3KEY", "S3SECRET")
    separate = DynamoDBConfig.from_options(
        {
            "aws_access_key_id": "S3KEY",
            "aws_secret_access_key": "S3SECRET",
            "aws_session_token": "S3TOKEN",
        },
        {"AWS_ACCESS_KEY_ID_DYNAMODB": "DKEY", "AWS_SECRET_ACCESS_KEY_DYNAMODB": "DSECRET"},
    )
    # The _dynamodb set is used as a whole: S3's session token must not leak in.
    assert (separate.access_key_id, separate.secret_access_key, separate.session_token) == (
        "DKEY",
        "DSECRET",
        None,
    )
    assert "DSECRET" not in repr(separate)
    with pytest.raises(InvalidConfigError):
        DynamoDBConfig.from_options({"aws_access_key_id_dynamodb": "only-the-id"}, {})
    with pytest.raises(InvalidConfigError, match="dynamodb_max_attempts"):
        DynamoDBConfig.from_options({"dynamodb_max_attempts": "many"}, {})
    with pytest.raises(InvalidConfigError):
        DynamoDBConfig.from_options({"dynamodb_read_timeout": "-1"}, {})
    tuned = DynamoDBConfig.from_options(
        {
            "dynamodb_max_attempts": "2",
            "dynamodb_connect_timeout": "0.5",
            "dynamodb_read_timeout": "3",
        },
        {},
    )
    assert (tuned.retry.max_attempts, tuned.connect_timeout, tuned.read_timeout) == (2, 0.5, 3.0)


def test_client_ignores_generic_endpoint_and_falls_back_like_lance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.invalid:9000")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    client = make_client(DynamoDBConfig())
    assert client.meta.endpoint_url == f"https://dynamodb.{DEFAULT_REGION}.amazonaws.com"
    assert client.meta.region_name == DEFAULT_REGION == "us-west-2"
    assert client.meta.config.retries["total_max_attempts"] == 1  # our loop owns retries


def test_from_uri(aws: EmbeddedAws, table: str) -> None:
    store = DynamoDBManifestStore.from_uri(
        f"s3+ddb://bucket/{BASE}?ddbTableName={table}", aws.pylance_storage_options()
    )
    assert store.table_name == table and store.target.endpoint == aws.dynamodb_endpoint
    store.put_if_not_exists(staged(1, "t"))


# =========================================================================== pylance


def test_pylance_reads_entries_we_wrote(
    aws: EmbeddedAws, bucket: str, s3_client: Any, config: DynamoDBConfig, table: str
) -> None:
    options = aws.pylance_storage_options()
    uri = f"s3+ddb://{bucket}/nested/ds.lance?ddbTableName={table}"
    lance.write_dataset(pa.table({"x": [1, 2, 3]}), uri, storage_options=options)
    lance.write_dataset(pa.table({"x": [4, 5, 6]}), uri, mode="append", storage_options=options)

    store = DynamoDBManifestStore.from_uri(uri, options)
    base = canonical_base_uri(uri)
    assert base == "nested/ds.lance"
    latest = store.latest(base)
    assert latest is not None
    final_key = manifest_key(base, 2, NamingScheme.V2)  # pylance 14 names manifests V2
    assert (latest.version, latest.path, latest.committer, latest.commit_token) == (
        2,
        final_key,
        "lancedb",
        None,
    )
    assert latest.size == s3_client.head_object(Bucket=bucket, Key=final_key)["ContentLength"]

    # Our flip adds commit_token; pylance still opens the table.
    tagged = replace(latest, commit_token=str(uuid.uuid4()), committer="lancetx")
    store.put_if_exists(tagged, expected_path=latest.path)
    item = make_client(config).get_item(
        TableName=table, Key={"base_uri": {"S": base}, "version": {"N": "2"}}, ConsistentRead=True
    )["Item"]
    assert item["commit_token"] == {"S": tagged.commit_token}
    dataset = lance.dataset(uri, storage_options=options)
    assert (dataset.version, dataset.count_rows()) == (2, 6)

    # A writer that died after claiming (step 2): the entry points at a staged
    # manifest carrying our token and the final object is missing. pylance
    # finalizes it on open, and its flip drops the attribute it does not know.
    token = str(uuid.uuid4())
    staged_key = f"{final_key}-{token}"
    s3_client.copy_object(
        Bucket=bucket, Key=staged_key, CopySource={"Bucket": bucket, "Key": final_key}
    )
    s3_client.delete_object(Bucket=bucket, Key=final_key)
    store.put_if_exists(
        replace(tagged, path=staged_key, commit_token=token), expected_path=final_key
    )
    assert store.get(base, 2).is_staged
    dataset = lance.dataset(uri, storage_options=options)
    assert (dataset.version, dataset.count_rows()) == (2, 6)
    after = store.get(base, 2)
    assert (after.path, after.commit_token, after.committer) == (final_key, None, "lancedb")
    s3_client.head_object(Bucket=bucket, Key=final_key)

    # pylance keeps committing on top, through the same condition.
    lance.write_dataset(pa.table({"x": [7]}), uri, mode="append", storage_options=options)
    newest = store.latest(base)
    assert newest is not None and newest.version == 3
    assert [e.version for e in store.list_entries(base)] == [1, 2, 3]
