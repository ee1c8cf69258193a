"""Inputs a user passes by mistake: a typed error naming the thing, the table unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from lance import LanceOperation
from lance.fragment import write_fragments
from table_helpers import Api, api_fixture, data_files, ddb_uri, ids, pylance_rows

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
def ddb_table(aws: EmbeddedAws, ddb_table_name: str) -> str:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    return ddb_table_name


@pytest.fixture
def uri(bucket: str, ddb_table: str) -> str:
    return ddb_uri(bucket, ddb_table)


@pytest.fixture
def table(api: Api, uri: str, options: dict[str, str]) -> Any:
    return api.write_table(uri, ids(5), storage_options=options)


def _unchanged(
    uri: str, options: dict[str, str], s3_client: Any, bucket: str, files: set[str]
) -> None:
    assert lance.dataset(uri, storage_options=options).version == 1
    assert pylance_rows(uri, options, 1) == ids(5).to_pydict()
    assert data_files(s3_client, bucket, "t.lance/") == files


def test_fragments_of_another_table_are_refused(
    api: Api,
    table: Any,
    uri: str,
    options: dict[str, str],
    s3_client: Any,
    bucket: str,
    ddb_table: str,
) -> None:
    before = data_files(s3_client, bucket, "t.lance/")
    other = f"s3://{bucket}/other.lance"
    fragments = write_fragments(ids(2, start=50), other, storage_options=options)
    with pytest.raises(lancetx.ForeignFragmentError, match=r"t\.lance/data/") as caught:
        api.commit_fragments(uri, fragments, schema=ids(1).schema, storage_options=options)
    assert caught.value.files == [f.path for frag in fragments for f in frag.files]
    with pytest.raises(lancetx.ForeignFragmentError):
        api.run(table.commit(LanceOperation.Append(fragments)))
    _unchanged(uri, options, s3_client, bucket, before)


def test_path_escaping_the_data_dir_is_refused(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = data_files(s3_client, bucket, "t.lance/")
    fragment = write_fragments(ids(1), table.data_uri, storage_options=options)[0].to_json()
    fragment["files"][0]["path"] = "../../other.lance/data/" + fragment["files"][0]["path"]
    with pytest.raises(lancetx.ForeignFragmentError, match=r"\.\./\.\./other"):
        api.commit_fragments(uri, [fragment], schema=ids(1).schema, storage_options=options)
    assert lance.dataset(uri, storage_options=options).version == 1
    assert before <= data_files(s3_client, bucket, "t.lance/")


def test_pylance_fragments_and_operations_are_converted(
    api: Api, table: Any, uri: str, options: dict[str, str]
) -> None:
    fragments = write_fragments(ids(2, start=5), table.data_uri, storage_options=options)
    result = api.commit_fragments(uri, fragments, schema=ids(1).schema, storage_options=options)
    assert result.version == 2 and not result.deduplicated
    more = write_fragments(ids(1, start=7), table.data_uri, storage_options=options)
    api.run(table.refresh())
    v = api.run(
        table.commit(lance.Transaction(read_version=2, operation=LanceOperation.Append(more)))
    )
    assert v == 3
    assert pylance_rows(uri, options, 3) == ids(8).to_pydict()


def test_pylance_objects_of_the_wrong_kind_are_refused(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = data_files(s3_client, bucket, "t.lance/")
    clone = LanceOperation.Clone(
        is_shallow=True, ref_name=None, ref_version=1, ref_path="x", branch_name=None
    )
    with pytest.raises(lancetx.UnsupportedInputError, match=r"LanceOperation\.Clone"):
        api.run(table.commit(clone))
    with pytest.raises(lancetx.UnsupportedInputError, match=r"pyarrow\.lib\.Table"):
        api.commit_fragments(uri, [ids(1)], schema=ids(1).schema, storage_options=options)
    with pytest.raises(lancetx.UnsupportedInputError, match=r"lance\.dataset\.LanceDataset"):
        api.run(table.commit(lance.dataset(uri, storage_options=options)))
    _unchanged(uri, options, s3_client, bucket, before)


def test_unparsable_predicate(
    api: Api,
    table: Any,
    uri: str,
    options: dict[str, str],
    s3_client: Any,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused naming the predicate, with no request spent asking whether a cleanup
    removed the version planned on (only a plan failing on "not found" is looked into;
    each of these cost a GetItem and a GET of the manifest)."""
    from lancetx.state import TableState

    probes: list[int] = []
    monkeypatch.setattr(TableState, "version_gone", lambda self, v: probes.append(v) or False)
    before = data_files(s3_client, bucket, "t.lance/")
    with pytest.raises(lancetx.InvalidPredicateError, match=r"id >>> 3"):
        api.run(table.delete("id >>> 3"))
    with pytest.raises(lancetx.InvalidPredicateError, match=r"no_such_column"):
        api.run(table.delete("no_such_column = 1"))
    with pytest.raises(lancetx.InvalidPredicateError, match=r"no_such_column"):
        api.run(table.update({"id": "id + 1"}, where="no_such_column = 1"))
    _unchanged(uri, options, s3_client, bucket, before)
    assert probes == []


def test_schema_incompatible_append(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = data_files(s3_client, bucket, "t.lance/")
    with pytest.raises(lancetx.SchemaMismatchError, match=r"column 'id' is string"):
        api.run(table.append(pa.table({"id": ["a"], "name": ["b"]})))
    with pytest.raises(lancetx.SchemaMismatchError, match=r"column 'extra' is not in the table"):
        api.run(table.append(ids(1).append_column("extra", pa.array([1]))))
    _unchanged(uri, options, s3_client, bucket, before)


def test_unknown_column_in_update(
    api: Api, table: Any, uri: str, options: dict[str, str], s3_client: Any, bucket: str
) -> None:
    before = data_files(s3_client, bucket, "t.lance/")
    with pytest.raises(lancetx.UnknownColumnError, match=r"'nope'"):
        api.run(table.update({"nope": "1"}, where="id = 1"))
    with pytest.raises(lancetx.UnknownColumnError, match=r"'gone'"):
        api.run(table.drop_columns(["gone"]))
    _unchanged(uri, options, s3_client, bucket, before)


def test_verbs_pylance_can_only_commit_itself_are_refused(
    api: Api, table: Any, uri: str, options: dict[str, str]
) -> None:
    with pytest.raises(lancetx.PylanceCommitsItselfError, match=r"delete\('true'\)"):
        table.truncate_table()
    with pytest.raises(lancetx.PylanceCommitsItselfError, match=r"CAST"):
        api.run(table.alter_columns({"path": "id", "data_type": pa.int32()}))
    assert lance.dataset(uri, storage_options=options).version == 1


def test_open_of_a_missing_table(
    api: Api, bucket: str, ddb_table: str, options: dict[str, str]
) -> None:
    with pytest.raises(lancetx.DatasetNotFoundError):
        api.open(ddb_uri(bucket, ddb_table, "missing.lance"), options)
