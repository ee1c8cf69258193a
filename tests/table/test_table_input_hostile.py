"""The kinds of data pylance coerces (tests/table/test_table_input_kinds.py), given by a
hostile user, an impatient operator, a source that vanishes: a typed error, nothing
committed, none of the files the failed write wrote left in the bucket — or, where the
data is taken, every value of it."""

from __future__ import annotations

import _thread
import signal
from collections.abc import Iterator
from typing import Any

import boto3
import lance
import pyarrow as pa
import pyarrow.dataset as pa_dataset
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table
from table_helpers import Api, api_fixture, data_files

import lancetx
from lancetx.commit.errors import VersionNotFoundError
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table

SCHEMA = batch("w", 0, 1).schema


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


class Tables:
    """A table ``t.lance`` (version 1: one row) and, on demand, a source ``src.lance``."""

    def __init__(self, api: Api, aws: EmbeddedAws, bucket: str, ddb_table: str) -> None:
        self.api, self.bucket, self.ddb_table = api, bucket, ddb_table
        self.options = aws.pylance_storage_options()
        ensure_ddb_table(self.options, ddb_table)
        self.uri = ddb_uri(bucket, "t.lance", ddb_table)
        self.table = api.write_table(self.uri, batch("first", 0, 1), storage_options=self.options)
        self.s3 = boto3.client("s3", **aws.client_kwargs())
        self.files = self.data_files()

    def data_files(self, name: str = "t.lance") -> set[str]:
        return data_files(self.s3, self.bucket, f"{name}/data/")

    def source(self, appends: int = 0) -> lancetx.Table:
        """``src.lance``: version 1 of 3 rows, then ``appends`` appends of 3 (a file each)."""
        uri = ddb_uri(self.bucket, "src.lance", self.ddb_table)
        source = lancetx.write_table(uri, batch("src", 0, 3), storage_options=self.options)
        for n in range(1, appends + 1):
            source.append(batch("src", n, 3))
        return source

    def rows(self) -> list[dict[str, Any]]:
        read = lance.dataset(self.uri, storage_options=self.options).to_table().to_pylist()
        return sorted(read, key=lambda r: (r["writer"] or "", r["seq"] or 0, r["i"] or 0))

    def assert_unchanged(self) -> None:
        """Nothing committed, and every data file a failed write wrote deleted."""
        assert lance.dataset(self.uri, storage_options=self.options).version == 1
        assert self.rows() == batch("first", 0, 1).to_pylist()
        assert self.data_files() == self.files


@pytest.fixture
def tables(api: Api, legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Tables:
    return Tables(api, legacy_aws, bucket, ddb_table_name)


# ------------------------------------------------------------------ lists of row dicts


def test_a_list_of_row_dicts_keeps_every_key_of_every_row(
    api: Api, tables: Tables, bucket: str, ddb_table_name: str
) -> None:
    """pyarrow names the columns after the first row's keys: a later row's other keys
    were dropped, their values lost without a word (here seq 5 and i 7 became null)."""
    api.run(tables.table.append([{"writer": "a"}, {"writer": "b", "seq": 5, "i": 7}]))
    assert {"writer": "b", "seq": 5, "i": 7} in tables.rows()
    assert {"writer": "a", "seq": None, "i": None} in tables.rows()
    made = api.write_table(
        ddb_uri(bucket, "rows.lance", ddb_table_name),
        [{"a": 1}, {"b": "x", "a": 2}, {"c": [1.5]}],
        storage_options=tables.options,
    )
    assert api.run(made.to_table()).to_pylist() == [
        {"a": 1, "b": None, "c": None},
        {"a": 2, "b": "x", "c": None},
        {"a": None, "b": None, "c": [1.5]},
    ]


@pytest.mark.parametrize(
    "item",
    [batch("x", 0, 1).to_batches()[0], [("writer", "x")], 3, None],
    ids=["record batch", "list of pairs", "int", "None"],
)
def test_a_list_of_row_dicts_holding_something_else_is_refused_and_writes_nothing(
    api: Api, tables: Tables, item: Any
) -> None:
    """pyarrow took any item for a row (of nulls: a batch or a list of pairs was
    committed as a row of nulls), or failed with a bare TypeError."""
    rows = [{"writer": "a", "seq": 1, "i": 1}, item]
    for schema in (None, SCHEMA):
        with pytest.raises(lancetx.UnsupportedInputError, match=r"item 1 of a list of row dicts"):
            api.run(tables.table.append(rows, schema=schema))
    tables.assert_unchanged()


# ------------------------------------------------------------------ coercion failures


def test_what_pyarrow_cannot_convert_is_an_unsupported_input_error(
    api: Api, tables: Tables
) -> None:
    """A column schema= names missing from a dict of columns (KeyError) and an int too
    large for int64 (OverflowError) escaped untyped."""
    with pytest.raises(lancetx.UnsupportedInputError, match=r"doesn't contain .* field.*: i"):
        api.run(tables.table.append({"writer": ["a"], "seq": [1]}, schema=SCHEMA))
    with pytest.raises(lancetx.UnsupportedInputError, match=r"too large"):
        api.run(tables.table.append([{"writer": "a", "seq": 2**70, "i": 1}]))
    merge = tables.table.merge_insert("i").when_matched_update_all()
    with pytest.raises(lancetx.UnsupportedInputError, match=r"doesn't contain"):
        api.run(merge.execute({"i": [0]}, schema=SCHEMA))
    tables.assert_unchanged()


# ------------------------------------------------------------------ schema=


def test_schema_given_with_a_dataset_or_scanner_must_be_the_datas(
    api: Api, tables: Tables, bucket: str, ddb_table_name: str
) -> None:
    """pylance ignores schema= for a dataset or a scanner: the data was written with its
    own schema, whatever schema= said."""
    source = tables.source()
    other = pa.schema([("writer", pa.string()), ("seq", pa.int32()), ("i", pa.int64())])
    kinds = {
        "lance dataset": lambda: source.dataset,
        "lance scanner": lambda: source.dataset.scanner(),
        "lancetx scanner": lambda: source.scanner(),
        "arrow dataset": lambda: pa_dataset.dataset(batch("arrow", 0, 2)),
    }
    for name, data in kinds.items():
        with pytest.raises(lancetx.SchemaMismatchError, match=r"seq: int32") as caught:
            api.run(tables.table.append(data(), schema=other))
        assert "schema= is" in str(caught.value), name
        with pytest.raises(lancetx.SchemaMismatchError, match=r"schema= is"):
            api.write_table(
                ddb_uri(bucket, "new.lance", ddb_table_name),
                data(),
                schema=other,
                storage_options=tables.options,
            )
    tables.assert_unchanged()
    assert not tables.data_files("new.lance")
    for data in kinds.values():  # the data's own schema, given or not, is taken
        api.run(tables.table.append(data(), schema=SCHEMA))
        api.run(tables.table.append(data()))
    assert len(tables.rows()) == 1 + 2 * (3 + 3 + 3 + 2)


# ------------------------------------------------------------------ merge sources


@pytest.mark.parametrize(
    "source",
    [
        {"i": [0], "writer": ["x"], "extra": [1]},
        {"i": [0], "seq": pa.array([1], pa.int32())},
        {"i": [0], "writer": [None]},  # all None: a column of type null
        [{"i": 0, "seq": "one"}],
    ],
    ids=["unknown column", "int32", "null type", "string for int"],
)
def test_a_merge_source_whose_columns_do_not_fit_is_a_schema_mismatch(
    api: Api, tables: Tables, source: Any
) -> None:
    """pylance refuses it with an OSError "Append with different schema"."""
    merge = tables.table.merge_insert("i").when_matched_update_all().when_not_matched_insert_all()
    with pytest.raises(lancetx.SchemaMismatchError, match=r"Append with different schema"):
        api.run(merge.execute(source))
    tables.assert_unchanged()


# ------------------------------------------------------------------ a source that fails


def _failing(after: int, error: BaseException) -> Iterator[pa.RecordBatch]:
    for n in range(after):
        yield batch("stream", n, 1).to_batches()[0]
    raise error


@pytest.mark.parametrize("error", [KeyboardInterrupt("ctrl-c"), SystemExit(3)], ids=repr)
@pytest.mark.parametrize("wrapped", ["generator", "arrow scanner"])
def test_an_interrupt_raised_by_the_source_is_raised_and_its_files_deleted(
    api: Api,
    tables: Tables,
    legacy_aws: EmbeddedAws,
    bucket: str,
    ddb_table_name: str,
    error: BaseException,
    wrapped: str,
) -> None:
    """Raised into pylance, it came back as pylance's OSError ("C Data interface
    error"): a Ctrl-C (or sys.exit) in the source's code was lost."""

    def data() -> Any:
        source = _failing(10, error)
        if wrapped == "arrow scanner":  # coerced by pylance
            return pa_dataset.Scanner.from_batches(source, schema=SCHEMA)
        return source

    written: list[str] = []

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service == "s3" and request.method == "PUT" and "/data/" in request.path:
            written.append(request.path)
        return None

    legacy_aws.set_interceptor(interceptor)
    table = tables.table
    calls = {
        "append": lambda: table.append(data(), schema=SCHEMA, max_rows_per_file=1),
        "overwrite": lambda: table.overwrite(data(), schema=SCHEMA, max_rows_per_file=1),
        "merge_insert": lambda: table.merge_insert("i").when_matched_update_all().execute(data()),
    }
    for name, call in calls.items():
        with pytest.raises(type(error)) as caught:
            api.run(call())
        assert caught.value is error, name
    with pytest.raises(type(error)):
        api.write_table(
            ddb_uri(bucket, "new.lance", ddb_table_name),
            data(),
            schema=SCHEMA,
            max_rows_per_file=1,
            storage_options=tables.options,
        )
    legacy_aws.set_interceptor(None)
    if wrapped == "generator":
        assert written  # files were written, and then deleted
    tables.assert_unchanged()
    assert not tables.data_files("new.lance")


def test_ctrl_c_while_pylance_writes_stops_the_write_and_deletes_its_files(
    tables: Tables, api: Api
) -> None:
    """Ctrl-C while pylance writes: pylance pulls the stream from a thread of its own,
    the caller's waits in Rust where no signal handler runs; the KeyboardInterrupt came
    once the whole stream was written, as pylance returned, before lancetx learned of
    the files — every one of them stayed in the bucket."""
    if api.is_async:
        pytest.skip("signals reach the main thread; the async verbs write in a worker")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def source() -> Iterator[pa.RecordBatch]:
        for n in range(40):
            if n == 10:
                _thread.interrupt_main()  # as Ctrl-C: the main thread's handler raises
            yield batch("stream", n, 1).to_batches()[0]

    try:
        with pytest.raises(KeyboardInterrupt):
            tables.table.append(source(), schema=SCHEMA, max_rows_per_file=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    tables.assert_unchanged()


# ------------------------------------------------------------------ what held already


def test_a_table_appended_to_itself_from_its_dataset_or_scanner_gets_its_rows_once(
    api: Api, tables: Tables
) -> None:
    """The source is the destination: the dataset or scanner reads the version it was
    made at, so the read ends, and the rows are there twice, not more."""
    table = tables.table
    api.run(table.append(batch("second", 0, 2)))
    expected = tables.rows()

    def dataset() -> lance.LanceDataset:
        return api.run(table.dataset()) if api.is_async else table.dataset

    kinds = (dataset, lambda: api.run(table.scanner()), lambda: dataset().scanner())
    for read in kinds:
        api.run(table.append(read()))
        expected = sorted(2 * expected, key=lambda r: (r["writer"], r["seq"], r["i"]))
        assert tables.rows() == expected
    api.run(table.overwrite(api.run(table.scanner(filter="writer = 'second'"))))
    assert tables.rows() == sorted(8 * batch("second", 0, 2).to_pylist(), key=lambda r: r["i"])


def _clean_up_the_source_at_its_first_data_read(
    aws: EmbeddedAws, uri: str, options: dict[str, str]
) -> list[str]:
    """An interceptor: the first GET of a source data file waits until pylance overwrote
    the source and a cleanup removed every other version with its files: it finds its
    file gone (and so may others)."""
    gets: list[str] = []

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service != "s3" or request.method != "GET":
            return None
        if "src.lance/data/" not in request.path:
            return None
        gets.append(request.path)
        if len(gets) == 1:
            lance.write_dataset(
                batch("later", 0, 1), uri, mode="overwrite", storage_options=options
            )
            cleanup_versions(open_table(uri, options), keep_versions=1)
        return None

    aws.set_interceptor(interceptor)
    return gets


@pytest.mark.parametrize("kind", ["lance dataset", "lance scanner", "lancetx scanner"])
def test_a_source_whose_files_a_cleanup_removes_midway_commits_nothing_and_leaves_nothing(
    api: Api, tables: Tables, legacy_aws: EmbeddedAws, kind: str
) -> None:
    """A lancetx scanner says VersionNotFoundError naming the source's removed version;
    pylance's dataset or scanner, pylance's "Not found"."""
    source = tables.source(appends=7)
    data = {
        "lance dataset": lambda: source.dataset,
        "lance scanner": lambda: source.dataset.scanner(batch_size=1),
        "lancetx scanner": lambda: source.scanner(batch_size=1),
    }[kind]()
    gets = _clean_up_the_source_at_its_first_data_read(legacy_aws, source.uri, tables.options)
    expected: Any = VersionNotFoundError if kind == "lancetx scanner" else (OSError, ValueError)
    try:
        with pytest.raises(expected, match=r"cleanup removed it|Not found") as caught:
            api.run(tables.table.append(data, max_rows_per_file=1))
    finally:
        legacy_aws.set_interceptor(None)
    assert gets
    if kind == "lancetx scanner":
        assert caught.value.version == 8 and "src.lance" in str(caught.value)
    tables.assert_unchanged()
