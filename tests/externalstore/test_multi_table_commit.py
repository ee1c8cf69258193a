"""``lancetx.commit_many``: several tables published atomically through DynamoDB.

Real parts throughout: the embedded moto server over HTTP (legacy S3, so only
DynamoDB can claim a version), tables created and read by pylance through
``s3+ddb://``, data files written by pylance, and faults injected with the
server's interceptor.

* both tables land; pylance reads both new versions;
* a fault between the claim and the finalize of the second table (its copy to
  the final name fails): the call still returns, and a fresh pylance reader
  sees both new versions (it finalizes the second itself);
* the claim refused by DynamoDB (IAM): neither version, nothing left behind;
* the claim lands but its answer is lost: settled by our commit tokens, both land;
* racing publishers with expected versions: exactly one wins, the other gets
  ExpectedVersionMismatchError naming the table, expected and actual version;
* without expected versions, a commit to one table between prepare and claim
  makes the round lose; the next round rebuilds on it and both land;
* tables whose versions live in different DynamoDB tables (or none): refused
  before anything is written.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from protocol_helpers import ddb_uri, ensure_ddb_table

import lancetx
import lancetx.aio
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import ExpectedVersionMismatchError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.connect import connect
from lancetx.externalstore.errors import AccessDeniedError, TablesNotColocatedError


@dataclass
class Lake:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    options: dict[str, str]

    def uri(self, name: str, ddb_table: str | None = None) -> str:
        return ddb_uri(self.bucket, f"{name}.lance", ddb_table or self.ddb_table)

    def create(self, name: str, rows: int = 3, ddb_table: str | None = None) -> str:
        uri = self.uri(name, ddb_table)
        lance.write_dataset(_rows(name, 0, rows), uri, storage_options=self.options)
        return uri

    def version(self, uri: str) -> int:
        """The latest version a fresh pylance reader opens."""
        return int(lance.dataset(uri, storage_options=self.options).version)

    def rows(self, uri: str) -> list[tuple[str, int]]:
        table = lance.dataset(uri, storage_options=self.options).to_table()
        return sorted(zip(table["src"].to_pylist(), table["seq"].to_pylist(), strict=True))

    def objects(self, prefix: str = "") -> list[str]:
        s3 = boto3.client("s3", **self.aws.client_kwargs())
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def items(self, name: str) -> dict[int, str]:
        client = boto3.client("dynamodb", **self.aws.client_kwargs("dynamodb"))
        found = client.query(
            TableName=self.ddb_table,
            KeyConditionExpression="base_uri = :b",
            ExpressionAttributeValues={":b": {"S": f"{name}.lance"}},
            ConsistentRead=True,
        )["Items"]
        return {int(i["version"]["N"]): i["path"]["S"] for i in found}

    def append(self, uri: str, src: str, seq: int, rows: int = 2) -> Transaction:
        """Our Append of ``rows`` rows, planned at the table's latest version."""
        conn = connect(uri, self.options)
        read = self.version(uri)
        fragments = lance.fragment.write_fragments(
            _rows(src, seq, rows), conn.data_uri, storage_options=self.options
        )
        return Transaction(
            read_version=read,
            operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        )


def _rows(src: str, seq: int, n: int) -> pa.Table:
    return pa.table({"src": pa.array([src] * n), "seq": pa.array([seq] * n, pa.int64())})


@pytest.fixture
def lake(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Lake]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    yield Lake(legacy_aws, bucket, ddb_table_name, options)
    legacy_aws.set_interceptor(None)


def _ddb_error(code: str, status: int, *, after_forwarding: bool = False) -> InterceptedResponse:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code})
    return InterceptedResponse(
        status,
        body.encode(),
        [("Content-Type", "application/x-amz-json-1.0")],
        after_forwarding=after_forwarding,
    )


def _s3_error(status: int = 500) -> InterceptedResponse:
    body = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code></Error>"
    return InterceptedResponse(status, body, [("Content-Type", "application/xml")])


def _is_claim(request: InterceptedRequest) -> bool:
    return request.service == "dynamodb" and request.target == "TransactWriteItems"


def test_two_tables_land_together(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    claims: list[str] = []
    lake.aws.set_interceptor(lambda r: claims.append(r.target) if _is_claim(r) else None)

    versions = lancetx.commit_many(
        {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)},
        storage_options=lake.options,
        commit_message="batch 1",
    )

    assert versions == {orders: 2, lines: 2}
    assert claims == ["TransactWriteItems"]  # one claim for both tables
    assert (lake.version(orders), lake.version(lines)) == (2, 2)
    assert lake.rows(orders) == sorted([("orders", 0)] * 3 + [("o", 1)] * 2)
    assert lake.rows(lines) == sorted([("lines", 0)] * 3 + [("l", 1)] * 2)
    # Finalized: the items point at the final manifests, nothing staged is left.
    for name in ("orders", "lines"):
        assert lake.items(name)[2].endswith(".manifest")
    assert not [k for k in lake.objects() if ".manifest-" in k]
    message = lance.dataset(orders, storage_options=lake.options).versions()[-1]
    assert message["version"] == 2


def test_the_async_commit_many_lands_async_tables_together_off_the_event_loop(
    lake: Lake,
) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    planned = {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)}
    claims: list[str] = []
    lake.aws.set_interceptor(lambda r: claims.append(r.target) if _is_claim(r) else None)

    async def main() -> tuple[dict[str, int], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        first = await lancetx.aio.open(orders, lake.options)
        second = await lancetx.aio.open(lines, lake.options)
        ticker = asyncio.create_task(tick())
        async with first, second:  # keys are the tables; their storage options are used
            versions = await lancetx.aio.commit_many(
                {first: planned[orders], second: planned[lines]}, commit_message="batch 1"
            )
        ticker.cancel()
        return {table.uri: v for table, v in versions.items()}, ticks

    versions, ticks = asyncio.run(main())
    assert versions == {orders: 2, lines: 2}
    assert claims == ["TransactWriteItems"]  # one claim for both tables
    assert ticks > 5  # the event loop ran while the tables committed
    assert lake.rows(orders) == sorted([("orders", 0)] * 3 + [("o", 1)] * 2)
    assert lake.rows(lines) == sorted([("lines", 0)] * 3 + [("l", 1)] * 2)


def test_a_fault_between_the_claim_and_the_second_finalize_publishes_both(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    failed_copies: list[str] = []

    def copy_of_lines_fails(request: InterceptedRequest) -> InterceptedResponse | None:
        if (
            request.service == "s3"
            and request.method == "PUT"
            and "x-amz-copy-source" in request.headers
            and "/lines.lance/" in request.path
        ):
            failed_copies.append(request.path)
            return _s3_error(500)
        return None

    lake.aws.set_interceptor(copy_of_lines_fails)
    versions = lancetx.commit_many(
        {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)},
        storage_options=lake.options,
    )
    lake.aws.set_interceptor(None)

    assert versions == {orders: 2, lines: 2}
    assert failed_copies  # the fault did fire, after the claim
    # The second table is claimed but not finalized: its item points at the staged manifest.
    assert lake.items("orders")[2].endswith(".manifest")
    assert ".manifest-" in lake.items("lines")[2]
    # A fresh reader sees both new versions (pylance finalizes the second itself).
    assert (lake.version(lines), lake.version(orders)) == (2, 2)
    assert lake.rows(lines) == sorted([("lines", 0)] * 3 + [("l", 1)] * 2)
    assert lake.items("lines")[2].endswith(".manifest")


def test_a_refused_claim_publishes_neither_and_leaves_nothing(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    before = lake.objects()
    txns = {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)}
    data_files = set(lake.objects()) - set(before)
    lake.aws.set_interceptor(
        lambda r: _ddb_error("AccessDeniedException", 400) if _is_claim(r) else None
    )

    with pytest.raises(AccessDeniedError) as info:
        lancetx.commit_many(txns, storage_options=lake.options)
    lake.aws.set_interceptor(None)

    # TransactWriteItems is no IAM action: each of its Puts is authorized as PutItem.
    assert "dynamodb:TransactWriteItems" not in str(info.value)
    assert info.value.action == "dynamodb:PutItem"
    assert "grant IAM action dynamodb:PutItem" in str(info.value)
    assert "item by item" in str(info.value)
    assert (lake.version(orders), lake.version(lines)) == (1, 1)
    assert set(lake.items("orders")) == set(lake.items("lines")) == {1}
    # No staged manifest, transaction file or version: only the caller's data files.
    assert set(lake.objects()) - set(before) == data_files


def test_a_claim_that_landed_with_its_answer_lost_is_settled_as_ours(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    fired: list[int] = []

    def lose_first_answer(request: InterceptedRequest) -> InterceptedResponse | None:
        if _is_claim(request) and not fired:
            fired.append(1)
            return _ddb_error("InternalServerError", 500, after_forwarding=True)
        return None

    lake.aws.set_interceptor(lose_first_answer)
    versions = lancetx.commit_many(
        {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)},
        storage_options=lake.options,
    )
    lake.aws.set_interceptor(None)

    assert fired and versions == {orders: 2, lines: 2}
    assert (lake.version(orders), lake.version(lines)) == (2, 2)
    assert sorted(lake.items("orders")) == sorted(lake.items("lines")) == [1, 2]


def test_racing_publishers_with_expected_versions_exactly_one_wins(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    first = {orders: lake.append(orders, "first", 1), lines: lake.append(lines, "first", 1)}
    second = {orders: lake.append(orders, "second", 1), lines: lake.append(lines, "second", 1)}
    expected = {orders: 1, lines: 1}
    outcome: dict[str, Any] = {}
    raced = threading.Event()

    def second_claims_first(request: InterceptedRequest) -> InterceptedResponse | None:
        # The first publisher has prepared and sends its claim: the second
        # publishes completely before that claim reaches DynamoDB.
        if _is_claim(request) and not raced.is_set():
            raced.set()
            outcome["second"] = lancetx.commit_many(
                second, expected_versions=expected, storage_options=lake.options
            )
        return None

    lake.aws.set_interceptor(second_claims_first)
    with pytest.raises(ExpectedVersionMismatchError) as info:
        lancetx.commit_many(first, expected_versions=expected, storage_options=lake.options)
    lake.aws.set_interceptor(None)

    assert outcome["second"] == {orders: 2, lines: 2}
    assert info.value.uri in (orders, lines)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert f"{info.value.uri!r}" in str(info.value)
    assert (lake.version(orders), lake.version(lines)) == (2, 2)
    for uri in (orders, lines):
        assert {src for src, seq in lake.rows(uri) if seq == 1} == {"second"}
    assert not [k for k in lake.objects() if ".manifest-" in k]


def test_racing_publishers_in_threads_exactly_one_wins(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    writers = ["a", "b", "c"]
    txns = {
        w: {orders: lake.append(orders, w, 1), lines: lake.append(lines, w, 1)} for w in writers
    }
    barrier = threading.Barrier(len(writers))
    won: list[str] = []
    lost: list[ExpectedVersionMismatchError] = []
    other: list[BaseException] = []

    def publish(writer: str) -> None:
        barrier.wait()
        try:
            lancetx.commit_many(
                txns[writer], expected_versions={orders: 1, lines: 1}, storage_options=lake.options
            )
            won.append(writer)
        except ExpectedVersionMismatchError as exc:
            lost.append(exc)
        except BaseException as exc:
            other.append(exc)

    threads = [threading.Thread(target=publish, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)

    assert not other, other
    assert len(won) == 1 and len(lost) == len(writers) - 1
    assert all((e.expected, e.actual) == (1, 2) for e in lost)
    for uri in (orders, lines):
        assert lake.version(uri) == 2
        assert {src for src, seq in lake.rows(uri) if seq == 1} == set(won)


def test_a_commit_between_prepare_and_claim_is_rebuilt_on(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    txns = {orders: lake.append(orders, "many", 1), lines: lake.append(lines, "many", 1)}
    single = lake.append(orders, "single", 1)
    claims: list[int] = []

    def append_first(request: InterceptedRequest) -> InterceptedResponse | None:
        if _is_claim(request):
            claims.append(1)
            if len(claims) == 1:
                lancetx.commit_many({orders: single}, storage_options=lake.options)
        return None

    lake.aws.set_interceptor(append_first)
    versions = lancetx.commit_many(txns, storage_options=lake.options)
    lake.aws.set_interceptor(None)

    assert versions == {orders: 3, lines: 2}
    assert len(claims) == 3  # ours lost, the single one won, ours again
    assert {src for src, seq in lake.rows(orders) if seq == 1} == {"single", "many"}
    assert lake.rows(lines) == sorted([("lines", 0)] * 3 + [("many", 1)] * 2)
    assert not [k for k in lake.objects() if ".manifest-" in k]


def test_a_mismatch_found_before_the_claim_writes_nothing(lake: Lake) -> None:
    orders, lines = lake.create("orders"), lake.create("lines")
    txns = {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)}
    before = lake.objects()

    with pytest.raises(ExpectedVersionMismatchError) as info:
        lancetx.commit_many(txns, expected_versions={lines: 5}, storage_options=lake.options)

    assert (info.value.uri, info.value.expected, info.value.actual) == (lines, 5, 1)
    assert lake.objects() == before
    assert (lake.version(orders), lake.version(lines)) == (1, 1)


def test_tables_in_different_dynamodb_tables_are_refused(lake: Lake, tmp_path: Any) -> None:
    other_table = f"{lake.ddb_table}_b"
    ensure_ddb_table(lake.options, other_table)
    orders = lake.create("orders")
    lines = lake.create("lines", ddb_table=other_table)
    local = str(tmp_path / "local.lance")
    lance.write_dataset(_rows("x", 0, 1), local)
    txns = {orders: lake.append(orders, "o", 1), lines: lake.append(lines, "l", 1)}
    before = lake.objects()

    with pytest.raises(TablesNotColocatedError) as info:
        lancetx.commit_many(txns, storage_options=lake.options)
    assert lake.ddb_table in str(info.value) and other_table in str(info.value)
    assert "same ddbTableName" in str(info.value)
    assert lake.objects() == before

    with pytest.raises(TablesNotColocatedError) as info:
        lancetx.commit_many(
            {orders: txns[orders], local: Transaction(1, Append())},
            storage_options=lake.options,
        )
    assert local in str(info.value)
    assert lake.objects() == before


def test_a_reader_racing_the_publisher_never_sees_one_table_ahead(lake: Lake) -> None:
    """Both tables advance together, so a reader that resolves ``orders`` and
    then ``lines`` must never find ``lines`` behind ``orders``: that would be a
    partial publish (one table's version visible without the other's)."""
    orders, lines = lake.create("orders"), lake.create("lines")
    readers = {uri: connect(uri, lake.options) for uri in (orders, lines)}
    rounds = 3
    txns = [
        {orders: lake.append(orders, "o", i), lines: lake.append(lines, "l", i)}
        for i in range(rounds)
    ]
    done = threading.Event()
    seen: list[tuple[int, int]] = []

    def read() -> None:
        while not done.is_set():
            a = readers[orders].handler.resolve_latest(readers[orders].base)
            b = readers[lines].handler.resolve_latest(readers[lines].base)
            assert a is not None and b is not None
            seen.append((a.version, b.version))

    def slow_writes(request: InterceptedRequest) -> InterceptedResponse | None:
        # Hold back every claim that names the second table: a publish made of
        # several claims would show the first table ahead meanwhile.
        body = request.body
        if (
            request.service == "dynamodb"
            and b"attribute_not_exists" in body
            and b"lines.lance/_versions" in body
        ):
            time.sleep(0.2)
        return None

    lake.aws.set_interceptor(slow_writes)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for txn in txns:
            lancetx.commit_many(txn, storage_options=lake.options)
    finally:
        done.set()
        reader.join(60)
        lake.aws.set_interceptor(None)

    assert all(b >= a for a, b in seen), [p for p in seen if p[1] < p[0]][:5]
    assert len({a for a, _ in seen}) > 1  # the reader did overlap the publishes
    assert (lake.version(orders), lake.version(lines)) == (1 + rounds, 1 + rounds)
