"""Stable row ids through the Table API, on moto over HTTP via DynamoDB.

``write_table(..., enable_stable_row_ids=True)`` creates the table as Lance does
(reader/writer flag 2, ``next_row_id``, a row-id sequence per fragment), and every
verb after it — append, delete, update, merge_insert, compact, a commit rebased
after losing a race, a pylance writer beside — keeps each row's id, which real
pylance reads back as ``_rowid``. Where the parameter cannot be honoured (an
existing table without them), it is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from lance.fragment import write_fragments
from table_helpers import Api, api_fixture, data_files, ddb_uri, ids

import lancetx
from lancetx.commit.format.manifest import FLAG_STABLE_ROW_IDS
from lancetx.commit.format.rowids import decode_row_ids
from lancetx.demo.embedded import EmbeddedAws
from lancetx.errors import InvalidWriteParamError
from lancetx.externalstore.dynamodb.store import create_table


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


@pytest.fixture
def options(aws: EmbeddedAws) -> dict[str, str]:
    return aws.pylance_storage_options()


@pytest.fixture
def uri(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    return ddb_uri(bucket, ddb_table_name)


def _row_ids(uri: str, options: dict[str, str], version: int | None = None) -> dict[int, int]:
    """``id`` → ``_rowid`` as real pylance reads them (at ``version``, default latest)."""
    ds = lance.dataset(uri, version=version, storage_options=options)
    assert ds.has_stable_row_ids, f"version {ds.version} has no stable row ids"
    table = ds.to_table(columns=["id"], with_row_id=True)
    pairs = dict(zip(table["id"].to_pylist(), table["_rowid"].to_pylist(), strict=True))
    assert len(set(pairs.values())) == len(pairs), f"row ids repeat: {pairs}"
    return pairs


def _manifest(table: lancetx.Table) -> Any:
    return table._state.parent_at(table.version).manifest.manifest


def test_write_table_creates_stable_row_ids(api: Api, uri: str, options: dict[str, str]) -> None:
    table = api.write_table(
        uri, ids(10), storage_options=options, enable_stable_row_ids=True, max_rows_per_file=4
    )
    manifest = _manifest(table)
    assert manifest.reader_feature_flags & FLAG_STABLE_ROW_IDS
    assert manifest.writer_feature_flags & FLAG_STABLE_ROW_IDS
    assert manifest.next_row_id == 10
    # One sequence per fragment, in row order, continuing from one fragment to the next.
    sequences = [decode_row_ids(f.inline_row_ids) for f in manifest.fragments]
    assert [len(s) for s in sequences] == [4, 4, 2]
    assert [i for s in sequences for i in s] == list(range(10))
    assert _row_ids(uri, options) == {i: i for i in range(10)}
    # The next verb continues the sequence.
    version = api.run(table.append(ids(3, start=10)))
    assert _row_ids(uri, options, version) == {i: i for i in range(13)}


def test_every_verb_keeps_each_rows_id(uri: str, options: dict[str, str]) -> None:
    table = lancetx.write_table(
        uri, ids(10), storage_options=options, enable_stable_row_ids=True, max_rows_per_file=5
    )
    expected = {i: i for i in range(10)}
    assert _row_ids(uri, options) == expected

    version = table.append(ids(5, start=10))  # new rows get the next ids
    expected.update({i: i for i in range(10, 15)})
    assert _row_ids(uri, options, version) == expected

    version = table.delete("id = 3 OR id = 12")
    del expected[3], expected[12]
    assert _row_ids(uri, options, version) == expected

    version = table.update({"name": "'changed'"}, where="id >= 7")  # rows move, ids stay
    assert _row_ids(uri, options, version) == expected
    assert lance.dataset(uri, storage_options=options).count_rows("name = 'changed'") == 7

    upsert = pa.table({"id": pa.array([1, 100], pa.int64()), "name": ["one", "hundred"]})
    version = (
        table.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    expected[100] = 15  # the only new row takes the next id; the updated one keeps its own
    assert _row_ids(uri, options, version) == expected

    version = table.compact({"target_rows_per_fragment": 1000})
    ds = lance.dataset(uri, storage_options=options)
    assert len(ds.get_fragments()) == 1, "compaction rewrote every fragment into one"
    assert _row_ids(uri, options, version) == expected
    assert _manifest(table).next_row_id == 16

    version = table.append(ids(2, start=200))  # after all that, still the next ids
    expected.update({200: 16, 201: 17})
    assert _row_ids(uri, options, version) == expected


def test_a_rebased_append_takes_ids_after_the_winners(uri: str, options: dict[str, str]) -> None:
    lancetx.write_table(uri, ids(4), storage_options=options, enable_stable_row_ids=True)
    late = lancetx.open(uri, options)  # holds version 1
    winner = lancetx.open(uri, options)
    assert winner.append(ids(3, start=10)) == 2
    # pylance's own writer beside lancetx: its commit assigns the next ids itself.
    lance.write_dataset(ids(2, start=20), uri, mode="append", storage_options=options)
    # ``late`` planned on version 1: its claim of version 2 loses, it rebases onto 3,
    # and its rows must not reuse the ids the winners took.
    version = late.append(ids(2, start=30))
    assert version == 4
    assert late.last_commit.attempts >= 2
    assert _row_ids(uri, options, version) == {
        **{i: i for i in range(4)},
        10: 4,
        11: 5,
        12: 6,
        20: 7,
        21: 8,
        30: 9,
        31: 10,
    }
    assert _manifest(late).next_row_id == 11

    # An upsert planned on version 4 loses to an append too: the row it updates
    # keeps its id, the row it inserts takes one after the winner's.
    upsert = lancetx.open(uri, options)
    assert upsert.version == 4  # it plans on this one
    winner.append(ids(1, start=40))
    upsert_data = pa.table({"id": pa.array([1, 50], pa.int64()), "name": ["one", "fifty"]})
    version = (
        upsert.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert_data)
    )
    assert version == 6
    found = _row_ids(uri, options, version)
    assert (found[1], found[40], found[50]) == (1, 11, 12)


def test_refused_where_it_cannot_be_honoured(
    uri: str, options: dict[str, str], aws: EmbeddedAws, bucket: str
) -> None:
    s3 = boto3.client("s3", **aws.client_kwargs())
    plain = lancetx.write_table(uri, ids(3), storage_options=options)
    before = data_files(s3, bucket, "t.lance/data/")
    with pytest.raises(InvalidWriteParamError, match="cannot be turned on later"):
        plain.append(ids(1, start=3), enable_stable_row_ids=True)
    with pytest.raises(InvalidWriteParamError, match="cannot be turned on later"):
        lancetx.write_table(
            uri, ids(1, start=3), mode="append", storage_options=options, enable_stable_row_ids=True
        )
    with pytest.raises(InvalidWriteParamError, match="cannot be turned on later"):
        plain.overwrite(ids(1), enable_stable_row_ids=True)
    with pytest.raises(InvalidWriteParamError, match="cannot be turned on later"):
        plain.writer(enable_stable_row_ids=True)
    with pytest.raises(InvalidWriteParamError, match="True or False"):
        plain.append(ids(1, start=3), enable_stable_row_ids="yes")
    assert data_files(s3, bucket, "t.lance/data/") == before, "nothing was written"
    assert plain.append(ids(1, start=3), enable_stable_row_ids=False) == 2
    assert not lance.dataset(uri, storage_options=options).has_stable_row_ids

    other = ddb_uri(bucket, uri.split("ddbTableName=")[1], "stable.lance")
    stable = lancetx.write_table(other, ids(3), storage_options=options, enable_stable_row_ids=True)
    with pytest.raises(InvalidWriteParamError, match="cannot be turned off"):
        stable.append(ids(1, start=3), enable_stable_row_ids=False)
    assert stable.append(ids(1, start=3), enable_stable_row_ids=True) == 2
    assert _row_ids(other, options) == {i: i for i in range(4)}


def test_a_creation_race_lost_to_a_table_without_them_is_refused(
    uri: str, options: dict[str, str]
) -> None:
    """``write_table(mode="append", enable_stable_row_ids=True)`` plans a creation; a
    pylance writer creates the table first (without stable row ids) while lancetx's
    data is being written. The creation becomes an append, which cannot have them."""

    def batches() -> Iterator[pa.RecordBatch]:
        lance.write_dataset(ids(2, start=50), uri, storage_options=options)
        yield from ids(3).to_batches()

    reader = pa.RecordBatchReader.from_batches(ids(1).schema, batches())
    with pytest.raises(InvalidWriteParamError, match="cannot be turned on later"):
        lancetx.write_table(
            uri, reader, mode="append", storage_options=options, enable_stable_row_ids=True
        )
    ds = lance.dataset(uri, storage_options=options)
    assert (ds.version, ds.count_rows(), ds.has_stable_row_ids) == (1, 2, False)


def test_commit_fragments_creates_them_for_writers_elsewhere(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    """Fragments written as a new dataset (as Spark executors write them) create the
    table with stable row ids; a later commit asking otherwise is refused."""
    table = api.open(uri, options, missing_ok=True)
    written = write_fragments(ids(6), table.data_uri, mode="overwrite", storage_options=options)
    result = api.commit_fragments(
        uri,
        written,
        schema=ids(1).schema,
        storage_options=options,
        fresh_field_ids=True,
        enable_stable_row_ids=True,
    )
    assert result.version == 1
    assert _row_ids(uri, options) == {i: i for i in range(6)}
    more = write_fragments(
        ids(2, start=6), table.data_uri, mode="overwrite", storage_options=options
    )
    with pytest.raises(InvalidWriteParamError, match="cannot be turned off"):
        api.commit_fragments(
            uri,
            more,
            schema=ids(1).schema,
            storage_options=options,
            fresh_field_ids=True,
            enable_stable_row_ids=False,
        )
    result = api.commit_fragments(
        uri, more, schema=ids(1).schema, storage_options=options, fresh_field_ids=True
    )
    assert _row_ids(uri, options, result.version) == {i: i for i in range(8)}
