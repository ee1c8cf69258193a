"""Every Table verb, through the sync and the async API, on moto over HTTP via DynamoDB.

Each test runs the verb, then real pylance reads the exact rows/schema at the
committed version, and history() shows the commit message and properties.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import lance
import numpy as np
import pyarrow as pa
import pytest
from table_helpers import Api, api_fixture, ddb_uri, ids, pylance_rows

import lancetx
from lancetx.demo.embedded import EmbeddedAws
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


def _created(api: Api, uri: str, options: dict[str, str], n: int = 10, **kw: Any) -> Any:
    return api.write_table(uri, ids(n), storage_options=options, **kw)


def _last(api: Api, table: Any) -> lancetx.VersionInfo:
    return api.history(table)[-1]


def _checked(api: Api, table: Any, version: int, operation: str, message: str) -> None:
    info = _last(api, table)
    assert (info.version, info.operation, info.commit_message) == (version, operation, message)
    assert info.properties == {"verb": operation}
    assert info.committer == "lancetx"


def test_write_table_creates_and_open_reads(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, commit_message="create", properties={"verb": "Overwrite"})
    assert table.version == 1
    assert pylance_rows(uri, options, 1) == ids(10).to_pydict()
    assert lance.dataset(uri, storage_options=options).schema == ids(1).schema
    _checked(api, table, 1, "Overwrite", "create")
    again = api.open(uri, options)
    assert again.version == 1
    assert api.run(again.to_table()).sort_by("id") == ids(10)


def test_write_table_create_refuses_an_existing_table(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    _created(api, uri, options)
    with pytest.raises(lancetx.TableExistsError, match="latest version 1"):
        _created(api, uri, options)


def test_append(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=3)
    v = api.run(table.append(ids(2, start=3), commit_message="more", properties={"verb": "Append"}))
    assert v == 2 == table.version
    assert pylance_rows(uri, options, 2) == ids(5).to_pydict()
    _checked(api, table, 2, "Append", "more")


def test_append_accepts_batches_readers_and_iterables(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    table = _created(api, uri, options, n=1)
    batch = ids(1, start=1).to_batches()[0]
    api.run(table.append(batch))
    api.run(
        table.append(pa.RecordBatchReader.from_batches(batch.schema, ids(1, start=2).to_batches()))
    )
    api.run(table.append(iter([ids(1, start=3), ids(1, start=4).to_batches()[0]])))
    assert pylance_rows(uri, options, 4) == ids(5).to_pydict()


def test_overwrite_replaces_rows_and_schema(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options)
    new = pa.table({"id": [7], "score": [0.5]})
    v = api.run(table.overwrite(new, commit_message="replace", properties={"verb": "Overwrite"}))
    assert pylance_rows(uri, options, v) == new.to_pydict()
    assert lance.dataset(uri, version=v, storage_options=options).schema == new.schema
    _checked(api, table, v, "Overwrite", "replace")
    assert pylance_rows(uri, options, 1) == ids(10).to_pydict()  # time travel


def test_delete(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options)
    v = api.run(
        table.delete("id < 3 OR id = 7", commit_message="gone", properties={"verb": "Delete"})
    )
    assert pylance_rows(uri, options, v)["id"] == [3, 4, 5, 6, 8, 9]
    _checked(api, table, v, "Delete", "gone")
    # a second delete on the same fragment keeps the first one's rows deleted
    v2 = api.run(table.delete("id = 9"))
    assert pylance_rows(uri, options, v2)["id"] == [3, 4, 5, 6, 8]
    assert pylance_rows(uri, options, 1)["id"] == list(range(10))


def test_delete_of_every_row_of_a_fragment_removes_it(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    table = _created(api, uri, options, max_rows_per_file=5)
    v = api.run(table.delete("id < 5"))
    ds = lance.dataset(uri, version=v, storage_options=options)
    assert len(ds.get_fragments()) == 1
    assert sorted(ds.to_table()["id"].to_pylist()) == [5, 6, 7, 8, 9]


def test_update(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options)
    v = api.run(
        table.update(
            {"name": "concat(name, '!')", "id": "id + 100"},
            where="id >= 8",
            commit_message="bump",
            properties={"verb": "Update"},
        )
    )
    rows = pylance_rows(uri, options, v)
    assert rows["id"] == [*range(8), 108, 109]
    assert rows["name"] == [f"n{i}" for i in range(8)] + ["n8!", "n9!"]
    _checked(api, table, v, "Update", "bump")
    v2 = api.run(table.update({"id": -1}, where="id = 0"))  # a literal, not SQL
    assert pylance_rows(uri, options, v2)["id"][0] == -1


def test_merge_insert_upsert(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=3)
    source = pa.table({"id": pa.array([1, 5], pa.int64()), "name": ["one", "five"]})
    v = api.run(
        table.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(source, commit_message="upsert", properties={"verb": "Update"})
    )
    assert pylance_rows(uri, options, v) == {
        "id": [0, 1, 2, 5],
        "name": ["n0", "one", "n2", "five"],
    }
    _checked(api, table, v, "Update", "upsert")


def test_merge_insert_insert_if_not_exists(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=3)
    source = pa.table({"id": pa.array([1, 5], pa.int64()), "name": ["one", "five"]})
    v = api.run(table.merge_insert("id").when_not_matched_insert_all().execute(source))
    assert pylance_rows(uri, options, v) == {"id": [0, 1, 2, 5], "name": ["n0", "n1", "n2", "five"]}


def test_merge_insert_delete_not_matched_by_source(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    table = _created(api, uri, options, n=4)
    source = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]})
    v = api.run(
        table.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_by_source_delete()
        .execute(source)
    )
    assert pylance_rows(uri, options, v) == {"id": [1, 2], "name": ["a", "b"]}


def test_add_columns_from_sql_and_as_nulls(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=4, max_rows_per_file=2)
    v = api.run(
        table.add_columns({"double": "id * 2"}, commit_message="cols", properties={"verb": "Merge"})
    )
    assert pylance_rows(uri, options, v)["double"] == [0, 2, 4, 6]
    _checked(api, table, v, "Merge", "cols")
    v2 = api.run(table.add_columns(pa.field("note", pa.string())))
    rows = pylance_rows(uri, options, v2)
    assert rows["note"] == [None] * 4 and rows["double"] == [0, 2, 4, 6]
    schema = lance.dataset(uri, version=v2, storage_options=options).schema
    assert schema.names == ["id", "name", "double", "note"]


def test_drop_and_alter_columns(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=2)
    v = api.run(table.drop_columns(["name"], commit_message="drop", properties={"verb": "Project"}))
    assert lance.dataset(uri, version=v, storage_options=options).schema.names == ["id"]
    _checked(api, table, v, "Project", "drop")
    v2 = api.run(
        table.alter_columns(
            {"path": "id", "name": "key"}, commit_message="rename", properties={"verb": "Project"}
        )
    )
    assert pylance_rows(uri, options, v2, sort="key") == {"key": [0, 1]}
    _checked(api, table, v2, "Project", "rename")
    # a dropped column's field id is never reused: the new column reads as null
    v3 = api.run(table.add_columns(pa.field("name", pa.string())))
    assert pylance_rows(uri, options, v3, sort="key")["name"] == [None, None]


def test_compact(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=20, max_rows_per_file=4)
    api.run(table.delete("id % 5 = 0"))
    v = api.run(table.compact(commit_message="tidy", properties={"verb": "Rewrite"}))
    ds = lance.dataset(uri, version=v, storage_options=options)
    assert len(ds.get_fragments()) == 1
    assert sorted(ds.to_table()["id"].to_pylist()) == [i for i in range(20) if i % 5]
    _checked(api, table, v, "Rewrite", "tidy")
    assert api.run(table.compact()) == v  # nothing left to compact: no new version


def test_compact_keeps_indices_covering_every_row(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    table = _created(api, uri, options, n=20, max_rows_per_file=4)
    api.run(table.create_index("id", "BTREE"))
    api.run(table.create_index("name", "BITMAP"))
    v = api.run(table.compact(commit_message="tidy"))
    ds = lance.dataset(uri, version=v, storage_options=options)
    assert len(ds.get_fragments()) == 1
    # the rewritten rows are indexed again (a new segment each), not left unindexed
    assert {i.name: i.num_rows_indexed for i in ds.describe_indices()} == {
        "id_idx": 20,
        "name_idx": 20,
    }
    assert "ScalarIndexQuery" in ds.scanner(filter="id = 13").explain_plan()
    assert ds.to_table(filter="id = 13")["name"].to_pylist() == ["n13"]
    assert ds.count_rows(filter="name = 'n7'") == 1
    ops = [(h.operation, h.commit_message) for h in api.history(table)[-2:]]
    assert ops == [("Rewrite", "tidy"), ("CreateIndex", "tidy")]


def test_create_scalar_index(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=50)
    v = api.run(
        table.create_index("id", "BTREE", commit_message="idx", properties={"verb": "CreateIndex"})
    )
    ds = lance.dataset(uri, version=v, storage_options=options)
    assert [i["name"] for i in ds.list_indices()] == ["id_idx"]
    assert "ScalarIndexQuery" in ds.scanner(filter="id = 7").explain_plan()
    assert ds.to_table(filter="id = 7")["name"].to_pylist() == ["n7"]
    _checked(api, table, v, "CreateIndex", "idx")
    v2 = api.run(table.drop_index("id_idx"))
    assert lance.dataset(uri, version=v2, storage_options=options).describe_indices() == []
    with pytest.raises(lancetx.SchemaMismatchError, match="no index named 'id_idx'"):
        api.run(table.drop_index("id_idx"))


def test_create_vector_index(api: Api, uri: str, options: dict[str, str]) -> None:
    rng = np.random.default_rng(0)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(256 * 8, dtype=np.float32)), 8)
    data = pa.table({"id": pa.array(range(256), pa.int64()), "vec": vectors})
    table = api.write_table(uri, data, storage_options=options)
    v = api.run(table.create_index("vec", "IVF_FLAT", num_partitions=2))
    ds = lance.dataset(uri, version=v, storage_options=options)
    assert [i["name"] for i in ds.list_indices()] == ["vec_idx"]
    hit = ds.to_table(nearest={"column": "vec", "q": vectors[17].values, "k": 1})
    assert hit["id"].to_pylist() == [17]


def test_restore_and_time_travel(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=3)
    api.run(table.delete("id = 0"))
    v = api.run(table.restore(1, commit_message="undo", properties={"verb": "Restore"}))
    assert v == 3
    assert pylance_rows(uri, options, 3) == ids(3).to_pydict()
    _checked(api, table, 3, "Restore", "undo")
    old = api.run(table.checkout(2))
    assert api.run(old.to_table()).sort_by("id")["id"].to_pylist() == [1, 2]
    with pytest.raises(lancetx.ReadOnlyTableError, match="version 2"):
        api.run(old.append(ids(1)))


def test_update_config_and_metadata(api: Api, uri: str, options: dict[str, str]) -> None:
    table = _created(api, uri, options, n=1)
    v = api.run(
        table.update_config({"k": "v"}, commit_message="cfg", properties={"verb": "UpdateConfig"})
    )
    _checked(api, table, v, "UpdateConfig", "cfg")
    v2 = api.run(table.update_metadata({"owner": "data-team"}))
    v3 = api.run(table.update_schema_metadata({"source": "tests"}))
    ds = lance.dataset(uri, version=v3, storage_options=options)
    assert ds.config()["k"] == "v"
    assert ds.schema.metadata[b"source"] == b"tests"
    assert dict(lance.dataset(uri, version=v2, storage_options=options).metadata) == {
        "owner": "data-team"
    }
    v4 = api.run(table.update_config({"k": None}))
    assert "k" not in lance.dataset(uri, version=v4, storage_options=options).config()


def test_idempotency_key_twice_gives_one_version(
    api: Api, uri: str, options: dict[str, str]
) -> None:
    table = _created(api, uri, options, n=1)
    v = api.run(table.append(ids(1, start=1), idempotency_key="job-42"))
    again = api.run(table.append(ids(1, start=1), idempotency_key="job-42"))
    assert again == v == 2
    assert table.last_commit is not None and table.last_commit.deduplicated
    latest = api.run(table.latest_version()) if api.is_async else table.latest_version
    assert latest == 2
    assert pylance_rows(uri, options, 2)["id"] == [0, 1]
    assert api.run(table.find_idempotency_key("job-42")) == 2


def test_versions_are_all_committed_by_lancetx(api: Api, uri: str, options: dict[str, str]) -> None:
    """No verb lets pylance commit: every version in the sequence is one of ours."""
    table = _created(api, uri, options, n=20, max_rows_per_file=5)
    run = api.run
    run(table.append(ids(5, start=20)))
    run(table.delete("id = 1"))
    run(table.update({"name": "'u'"}, where="id = 2"))
    run(
        table.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(ids(2, start=24))
    )
    run(table.add_columns({"x": "id + 1"}))
    run(table.alter_columns({"path": "x", "name": "y"}))
    run(table.drop_columns(["y"]))
    run(table.create_index("id", "BTREE"))
    run(table.compact())
    run(table.update_config({"a": "b"}))
    run(table.restore(2))
    history = api.history(table)
    assert [h.version for h in history] == list(range(1, 14))
    assert {h.committer for h in history} == {"lancetx"}
    pylance_versions = [
        v["version"] for v in lance.dataset(uri, storage_options=options).versions()
    ]
    assert pylance_versions == list(range(1, 14))


def test_a_failing_follow_up_does_not_hide_the_compaction(
    uri: str,
    options: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from lancetx.verbs import maintenance

    def broken(*_: Any) -> Any:
        def plan(ctx: Any) -> Any:
            raise OSError("index segment upload failed")

        return plan

    monkeypatch.setattr(maintenance, "plan_cover_fragments", broken)
    table = lancetx.write_table(uri, ids(20), storage_options=options, max_rows_per_file=4)
    table.create_index("id", "BTREE")
    v = table.compact()
    assert v == 3 and table.history()[-1].operation == "Rewrite"
    assert "index segment upload failed" in caplog.text
    assert sorted(lance.dataset(uri, storage_options=options).to_table()["id"].to_pylist()) == list(
        range(20)
    )
