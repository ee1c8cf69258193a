"""Upserts keep the key unique: racing merge_inserts of one new key land one row.

Two writers plan ``merge_insert(on=key)`` from the same version, both find the key
absent and both insert it. Lance's rule (and ours) makes the second commit a
retryable conflict when both record the keys they inserted (the ``inserted_rows``
filter of the Update); the verb then plans again on the new version, where the key
exists, and updates instead. The filter is computed by lancetx (pylance's
uncommitted merge does not hand it over) for a key annotated
``lance-schema:unenforced-primary-key`` and for any key with
``.conflict_on_inserted_keys()``. Judged with pylance on the embedded legacy S3 +
DynamoDB.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from table_helpers import Api, api_fixture, ddb_uri

import lancetx
import lancetx.aio
from lancetx.commit.engine.operations import DataFragment, Update
from lancetx.commit.format.key_existence import inserted_keys_filter, key_hashes
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.protos import transaction_pb2
from lancetx.verbs.merging import MergeSpec, UniqueKey, inserted_key_hashes

PK = {"lance-schema:unenforced-primary-key": "true"}


def keyed_schema(
    key_type: pa.DataType | None = None, *, annotated: bool = True, nullable: bool = False
) -> pa.Schema:
    return pa.schema(
        [
            pa.field(
                "id",
                key_type or pa.int64(),
                nullable=nullable,
                metadata=PK if annotated else None,
            ),
            pa.field("name", pa.string()),
        ]
    )


def rows(keys: list[Any], name: str, schema: pa.Schema) -> pa.Table:
    return pa.table({"id": keys, "name": [name] * len(keys)}, schema=schema)


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


@pytest.fixture
def options(legacy_aws: EmbeddedAws) -> dict[str, str]:
    return legacy_aws.pylance_storage_options()


@pytest.fixture
def uri(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **legacy_aws.client_kwargs()), ddb_table_name)
    return ddb_uri(bucket, ddb_table_name)


def pylance_keys(uri: str, options: dict[str, str], column: str = "id") -> list[Any]:
    return sorted(lance.dataset(uri, storage_options=options).to_table()[column].to_pylist())


def race(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run ``jobs`` in threads released together; re-raise the first error."""
    barrier = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = jobs[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def upsert(table: Any, data: pa.Table, on: str | list[str] = "id") -> Any:
    return (
        table.merge_insert(on).when_matched_update_all().when_not_matched_insert_all().execute(data)
    )


def test_racing_upserts_of_one_new_key_land_one_row(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    """The Why bullet: two upserts of one new key planned from the same version."""
    schema = keyed_schema()
    api.write_table(uri, rows([1, 2, 3], "old", schema), storage_options=options)
    # Both Tables know version 1 only: each plans against it, as racing writers do.
    first, second = api.open(uri, options), api.open(uri, options)
    if api.is_async:

        async def both() -> list[int]:
            return list(
                await asyncio.gather(
                    upsert(first, rows([10], "first", schema)),
                    upsert(second, rows([10], "second", schema)),
                )
            )

        versions = api.run(both())
    else:
        versions = race(
            [
                lambda: upsert(first, rows([10], "first", schema)),
                lambda: upsert(second, rows([10], "second", schema)),
            ]
        )
    assert sorted(versions) == [2, 3]
    assert pylance_keys(uri, options) == [1, 2, 3, 10]
    # The loser planned again and updated the winner's row.
    loser = first if first.last_commit.plans == 2 else second
    assert {first.last_commit.plans, second.last_commit.plans} == {1, 2}
    name = "first" if loser is first else "second"
    ds = lance.dataset(uri, storage_options=options)
    assert ds.to_table(filter="id = 10")["name"].to_pylist() == [name]


ROUNDS = 20


def test_twenty_rounds_of_racing_upserts_land_one_row_per_key(
    uri: str, options: dict[str, str]
) -> None:
    """Acceptance: two threads upsert one new key per round, released by a barrier
    after both Tables know the same latest version; pylance reads one row per key."""
    schema = keyed_schema()
    lancetx.write_table(uri, rows([-1], "seed", schema), storage_options=options)
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)
    replanned = []
    for r in range(ROUNDS):
        first.refresh()
        second.refresh()
        assert first.version == second.version == 1 + 2 * r
        race(
            [
                lambda r=r: upsert(first, rows([r], f"first-{r}", schema)),
                lambda r=r: upsert(second, rows([r], f"second-{r}", schema)),
            ]
        )
        plans = sorted([first.last_commit.plans, second.last_commit.plans])
        assert plans == [1, 2], f"round {r}: plans {plans}"
        replanned.append("first" if first.last_commit.plans == 2 else "second")
    table = lance.dataset(uri, storage_options=options).to_table().sort_by("id")
    assert table["id"].to_pylist() == [-1, *range(ROUNDS)]
    # Every round's loser updated the winner's row: the loser's value is the one kept.
    assert table["name"].to_pylist()[1:] == [f"{who}-{r}" for r, who in enumerate(replanned)]
    assert lance.dataset(uri, storage_options=options).version == 1 + 2 * ROUNDS


def test_four_writers_with_overlapping_new_keys(uri: str, options: dict[str, str]) -> None:
    """Four upserts planned from one version, each inserting keys the next one
    inserts too: every key lands once, and each row holds some writer's value."""
    schema = keyed_schema()
    lancetx.write_table(uri, rows([-1], "seed", schema), storage_options=options)
    tables = [lancetx.open(uri, options) for _ in range(4)]
    jobs = [
        lambda i=i: upsert(tables[i], rows(list(range(3 * i, 3 * i + 5)), f"w{i}", schema))
        for i in range(4)
    ]
    race(jobs)
    table = lance.dataset(uri, storage_options=options).to_table()
    assert sorted(table["id"].to_pylist()) == [-1, *range(14)]
    assert sorted(t.last_commit.plans for t in tables)[0] == 1
    assert lance.dataset(uri, storage_options=options).version == 5


@pytest.mark.parametrize(
    ("key_type", "new"),
    [(pa.string(), ["k-10", "k-11"]), (pa.large_binary(), [b"\x00a", b"\x00b"])],
    ids=["string", "binary"],
)
def test_string_and_binary_keys(
    uri: str, options: dict[str, str], key_type: pa.DataType, new: list[Any]
) -> None:
    schema = keyed_schema(key_type)
    seed = ["seed"] if pa.types.is_string(key_type) else [b"seed"]
    lancetx.write_table(uri, rows(seed, "seed", schema), storage_options=options)
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)
    upsert(first, rows(new, "first", schema))
    upsert(second, rows(new[::-1], "second", schema))  # planned on version 1 too
    assert second.last_commit.plans == 2
    assert pylance_keys(uri, options) == sorted([*seed, *new])


def test_a_key_of_two_columns_in_any_order(uri: str, options: dict[str, str]) -> None:
    """``on`` names the primary key's columns in another order: the filter follows
    the key's order (as a pylance writer's does), so the two merges compare."""
    schema = pa.schema(
        [
            pa.field("tenant", pa.string(), nullable=False, metadata=PK),
            pa.field("id", pa.int32(), nullable=False, metadata=PK),
            pa.field("name", pa.string()),
        ]
    )

    def data(name: str) -> pa.Table:
        return pa.table({"tenant": ["a", "b"], "id": [1, 1], "name": [name] * 2}, schema=schema)

    seed = pa.table({"tenant": ["a"], "id": [0], "name": ["seed"]}, schema=schema)
    lancetx.write_table(uri, seed, storage_options=options)
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)
    upsert(first, data("first"), on=["tenant", "id"])
    upsert(second, data("second"), on=["id", "tenant"])
    assert second.last_commit.plans == 2
    got = (
        lance.dataset(uri, storage_options=options)
        .to_table()
        .sort_by([("tenant", "ascending"), ("id", "ascending")])
    )
    assert got.to_pydict() == {
        "tenant": ["a", "a", "b"],
        "id": [0, 1, 1],
        "name": ["seed", "second", "second"],
    }


def test_an_append_of_the_key_first_makes_the_upsert_update(
    uri: str, options: dict[str, str]
) -> None:
    """An append carries no key filter: a merge recording its keys cannot rule the
    appended rows out, so it plans again (and finds the key)."""
    schema = keyed_schema()
    lancetx.write_table(uri, rows([0], "seed", schema), storage_options=options)
    stale, appender = lancetx.open(uri, options), lancetx.open(uri, options)
    appender.append(rows([3], "appended", schema))
    upsert(stale, rows([3], "upserted", schema))
    assert stale.last_commit.plans == 2
    got = lance.dataset(uri, storage_options=options).to_table().sort_by("id").to_pydict()
    assert got == {"id": [0, 3], "name": ["seed", "upserted"]}


def test_disjoint_new_keys_do_not_replan(uri: str, options: dict[str, str]) -> None:
    schema = keyed_schema()
    lancetx.write_table(uri, rows([0], "seed", schema), storage_options=options)
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)
    upsert(first, rows(list(range(1, 301)), "first", schema))
    upsert(second, rows(list(range(1001, 1301)), "second", schema))
    assert second.last_commit.plans == 1
    assert pylance_keys(uri, options) == [0, *range(1, 301), *range(1001, 1301)]


def test_without_the_annotation_the_key_is_not_checked(uri: str, options: dict[str, str]) -> None:
    """What pylance does too: on a key that is not the primary key, racing inserts
    of one key both land, unless the merge asks for the check."""
    schema = keyed_schema(annotated=False)
    lancetx.write_table(uri, rows([0], "seed", schema), storage_options=options)
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)
    upsert(first, rows([5], "first", schema))
    upsert(second, rows([5], "second", schema))
    assert pylance_keys(uri, options) == [0, 5, 5]


def test_conflict_on_inserted_keys_checks_any_key(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    schema = keyed_schema(annotated=False)
    api.write_table(uri, rows([0], "seed", schema), storage_options=options)
    first, second = api.open(uri, options), api.open(uri, options)

    def checked(table: Any, data: pa.Table) -> Any:
        return (
            table.merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .conflict_on_inserted_keys()
            .execute(data)
        )

    api.run(checked(first, rows([5, 6], "first", schema)))
    api.run(checked(second, rows([6, 7], "second", schema)))
    assert second.last_commit.plans == 2
    assert pylance_keys(uri, options) == [0, 5, 6, 7]


def test_null_keys_are_inserted_by_every_merge(uri: str, options: dict[str, str]) -> None:
    """A null never matches, so each merge inserts its null-key rows (as one writer
    running the merge twice does); the non-null keys stay unique."""
    schema = keyed_schema(annotated=False, nullable=True)
    lancetx.write_table(uri, rows([0], "seed", schema), storage_options=options)
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)

    def checked(table: Any, name: str) -> Any:
        data = rows([None, 9], name, schema)
        builder = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
        return builder.conflict_on_inserted_keys().execute(data)

    checked(first, "first")
    checked(second, "second")
    assert second.last_commit.plans == 2
    keys = lance.dataset(uri, storage_options=options).to_table()["id"].to_pylist()
    assert sorted(k for k in keys if k is not None) == [0, 9]
    assert keys.count(None) == 2


def test_merges_inserting_other_keys_do_not_replan(uri: str, options: dict[str, str]) -> None:
    schema = keyed_schema()
    lancetx.write_table(uri, rows([1, 2], "seed", schema), storage_options=options)
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)
    upsert(first, rows([1, 50], "first", schema))  # updates 1, inserts 50
    upsert(second, rows([2, 60], "second", schema))  # updates 2, inserts 60
    assert second.last_commit.plans == 1
    assert pylance_keys(uri, options) == [1, 2, 50, 60]


def committed_filter(
    s3_client: Any, bucket: str, table: lancetx.Table, version: int
) -> transaction_pb2.Transaction.KeyExistenceFilter | None:
    """The inserted_rows filter in the transaction file of ``version``."""
    uuid = next(v.transaction_uuid for v in table.history() if v.version == version)
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="t.lance/_transactions/")
    (name,) = [o["Key"] for o in listed["Contents"] if str(uuid) in o["Key"]]
    txn = transaction_pb2.Transaction()
    txn.ParseFromString(s3_client.get_object(Bucket=bucket, Key=name)["Body"].read())
    return txn.update.inserted_rows if txn.update.HasField("inserted_rows") else None


def test_what_each_merge_records(
    uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    """Inserts record their keys; a merge that inserts nothing (update-only, or an
    upsert whose keys all exist) records an empty filter; a merge on a key that is
    neither the primary key nor asked for records none."""
    schema = keyed_schema()
    table = lancetx.write_table(uri, rows([1, 2], "seed", schema), storage_options=options)
    v_insert = upsert(table, rows([3, 4], "new", schema))
    v_existing = upsert(table, rows([1, 2], "again", schema))
    v_update = table.merge_insert("id").when_matched_update_all().execute(rows([5], "x", schema))
    v_other = (
        table.merge_insert("name").when_matched_update_all().execute(rows([1], "again", schema))
    )
    inserted = committed_filter(s3_client, bucket, table, v_insert)
    assert inserted is not None and list(inserted.field_ids) == [0]
    expected = inserted_keys_filter([0], key_hashes(pa.table({"id": [3, 4]}), ["id"]))
    assert inserted == expected
    for version in (v_existing, v_update):
        empty = committed_filter(s3_client, bucket, table, version)
        assert empty is not None and list(empty.field_ids) == [0]
        assert not any(empty.bloom.bitmap), version
    assert committed_filter(s3_client, bucket, table, v_other) is None


# ------------------------------------------------------------ a pylance writer beside


def test_a_pylance_insert_then_a_stale_lancetx_upsert(uri: str, options: dict[str, str]) -> None:
    """pylance's merge commits the key first (its bloom filter); lancetx, planned
    on the version before, must see the common key and update instead."""
    schema = keyed_schema()
    lancetx.write_table(uri, rows([0], "seed", schema), storage_options=options)
    stale = lancetx.open(uri, options)
    ds = lance.dataset(uri, storage_options=options)
    upsert(ds, rows([7], "pylance", schema))
    upsert(stale, rows([7], "lancetx", schema))
    assert stale.last_commit.plans == 2
    got = lance.dataset(uri, storage_options=options).to_table().sort_by("id").to_pydict()
    assert got == {"id": [0, 7], "name": ["seed", "lancetx"]}


def test_a_stale_pylance_upsert_reads_lancetx_inserted_keys(
    uri: str, options: dict[str, str]
) -> None:
    """pylance, planned on the version before lancetx's insert and allowed no retry,
    compares its filter with the one lancetx recorded: the same key is a conflict;
    another key commits (a missing filter would have been a conflict too)."""
    schema = keyed_schema()
    table = lancetx.write_table(uri, rows([0], "seed", schema), storage_options=options)
    same = lance.dataset(uri, storage_options=options)
    other = lance.dataset(uri, storage_options=options)
    upsert(table, rows([7], "lancetx", schema))  # version 2

    def no_retry(ds: Any, data: pa.Table) -> Any:
        builder = ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
        return builder.conflict_retries(0).execute(data)

    with pytest.raises(Exception, match=r"(?i)too many concurrent writers"):
        no_retry(same, rows([7], "pylance", schema))
    # Keys 7 and 8 set no common bit (pylance compares bits), checked here:
    seven = inserted_keys_filter([0], key_hashes(pa.table({"id": [7]}), ["id"])).bloom.bitmap
    eight = inserted_keys_filter([0], key_hashes(pa.table({"id": [8]}), ["id"])).bloom.bitmap
    assert not any(a & b for a, b in zip(seven, eight, strict=True))
    no_retry(other, rows([8], "pylance", schema))
    got = lance.dataset(uri, storage_options=options).to_table().sort_by("id").to_pydict()
    assert got == {"id": [0, 7, 8], "name": ["seed", "lancetx", "pylance"]}


# ------------------------------------------------------------ the plan's key set


class _Ctx:
    """The two things inserted_key_hashes reads of a PlanContext."""

    uri = "s3+ddb://b/t.lance?ddbTableName=t"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema


def test_the_plan_records_every_source_key_or_none() -> None:
    spec = MergeSpec(on=["id"], matched_update=True, not_matched_insert=True)
    source = pa.table({"id": pa.array([3, None, 5], pa.int32()), "name": ["a", "b", "c"]})
    ctx: Any = _Ctx(keyed_schema())  # int64 in the table: hashed as int64, like pylance
    key = UniqueKey(("id",), (0,))
    some = inserted_key_hashes(spec, ctx, source, key, {"num_inserted_rows": 2})
    assert some is not None
    assert sorted(some.tolist()) == sorted(
        key_hashes(pa.table({"id": pa.array([3, 5], pa.int64())}), ["id"]).tolist()
    )
    counts = {"num_inserted_rows": 0, "num_updated_rows": 1}
    one_row = Update(new_fragments=(DataFragment(id=0, physical_rows=1),))
    none = inserted_key_hashes(spec, ctx, source, key, counts, one_row)
    assert none is not None and len(none) == 0
    update_only = MergeSpec(on=["id"], matched_update=True)
    left = inserted_key_hashes(update_only, ctx, source, key, {"num_inserted_rows": 5})
    assert left is not None and len(left) == 0
    # No count from pylance, or more rows written than it says it updated: every key.
    unknown = inserted_key_hashes(spec, ctx, source, key, {})
    assert unknown is not None and len(unknown) == 2
    two_rows = Update(new_fragments=(DataFragment(id=0, physical_rows=2),))
    miscounted = inserted_key_hashes(spec, ctx, source, key, counts, two_rows)
    assert miscounted is not None and len(miscounted) == 2


def test_a_key_that_cannot_be_hashed_claims_every_key(caplog: pytest.LogCaptureFixture) -> None:
    spec = MergeSpec(on=["id"], not_matched_insert=True)
    schema = pa.schema([pa.field("id", pa.list_(pa.int64()))])
    source = pa.table({"id": [[1], [2]]}, schema=schema)
    key = UniqueKey(("id",), (0,))
    with caplog.at_level("INFO", logger="lancetx.verbs.merging"):
        hashes = inserted_key_hashes(spec, _Ctx(schema), source, key, {"num_inserted_rows": 2})
    assert hashes is None
    assert "cannot hash key ['id']" in caplog.text
    full = inserted_keys_filter([0], hashes)
    assert set(full.bloom.bitmap) == {0xFF}
