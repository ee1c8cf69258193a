"""The ``lancetx`` Spark data source: batch writes, streaming writes, reads, streaming reads.

Spark runs the pieces in different Python processes, none of them the
driver's: ``writer()``/``reader()`` in a planning worker, ``write()``/``read()``
in executor workers, ``commit()``/``abort()`` in yet another worker. So the
objects below hold only picklable plain data (options, IPC-serialized schemas,
version numbers), and pylance is imported inside the methods that need it.

Write path: ``writer()`` checks the DataFrame's schema and the table's state
(failing before any data is written), each task streams its Arrow batches into
data files (:mod:`pyspark_lancetx.write_task`), and ``commit()`` commits them as
one transaction (:mod:`pyspark_lancetx.commit`). ``abort()`` only removes files
when the job failed before committing; after a failed commit it leaves them to
the commit, which alone knows whether a version may reference them.

Read path: the version is resolved once, when Spark asks for the schema, and
the DataFrame stays on it. Partitions are sized by the bytes and rows of the
columns read: small fragments packed together, large ones split by row ranges
(:mod:`pyspark_lancetx.scan`).

Streaming reads (the rows each new version appends, micro-batch by micro-batch):
:mod:`pyspark_lancetx.stream_source`.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from lancetx.errors import ColumnMismatchError
from pyspark_lancetx.commit import (
    JobCommit,
    commit_job,
    keep_after_failed_commit,
    stream_batch_key,
)
from pyspark_lancetx.errors import SparkOptionError, SparkSchemaError, UnknownSparkOptionError
from pyspark_lancetx.filters import translate
from pyspark_lancetx.options import ReadOptions, StreamReadOptions, WriteOptions
from pyspark_lancetx.scan import LanceTxPartition as LanceTxPartition
from pyspark_lancetx.scan import ScanPlan
from pyspark_lancetx.schema import (
    check_read_schema,
    conform_read_batch,
    read_spark_schema,
    spark_arrow_schema,
    write_schema,
)
from pyspark_lancetx.write_task import (
    TaskOutput,
    WritePlan,
    fragment_file_paths,
    remove_data_files,
    schema_to_ipc,
    write_task,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: Spark's local property naming the running streaming query (stable across restarts).
QUERY_ID_PROPERTY = "sql.streaming.queryId"

#: Fault injection for tests: with this Spark local property set to ``"true"`` on the
#: thread that starts a job, the first attempt of each of its write tasks fails after
#: its data files are written (the task must remove them; Spark retries it).
FAIL_FIRST_ATTEMPT_PROPERTY = "lancetx.test.failFirstAttemptAfterWrite"


def _injected_failure() -> Callable[[], None] | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None or context.getLocalProperty(FAIL_FIRST_ATTEMPT_PROPERTY) != "true":
        return None
    if context.attemptNumber() != 0:
        return None

    def fail() -> None:
        raise RuntimeError(
            f"injected failure ({FAIL_FIRST_ATTEMPT_PROPERTY}) of task "
            f"{context.partitionId()} attempt 0, after its data files were written"
        )

    return fail


# --------------------------------------------------------------------------- writing


@dataclass
class LanceTxCommitMessage(WriterCommitMessage):  # type: ignore[misc]
    """One task's fragments; ``stream_id`` is the streaming query id, if any."""

    output: TaskOutput
    stream_id: str | None = None


@dataclass(frozen=True)
class _TableState:
    version: int
    storage_version: str | None


def _table_state(
    options: WriteOptions, schema: pa.Schema, overwrite: bool
) -> tuple[str, _TableState]:
    """The data URI and the table's latest version; checks an append's columns early."""
    import lancetx

    table = lancetx.open(options.uri, options.storage_options, missing_ok=True)
    if not table.exists:
        return table.data_uri, _TableState(0, options.data_storage_version)
    if not overwrite:
        # Types only: null counts are known once the tasks ran (the commit checks them).
        try:
            table.check_fragment_schema(schema, merge_schema=options.merge_schema)
        except ColumnMismatchError as exc:
            raise SparkSchemaError(options.uri, exc.column, exc.problem) from None
    storage = table.data_storage_version
    if overwrite and options.data_storage_version is not None:
        storage = options.data_storage_version
    return table.data_uri, _TableState(table.version, storage)


def _plan_write(
    raw: dict[str, str], spark_schema: StructType, overwrite: bool
) -> tuple[WriteOptions, WritePlan, _TableState]:
    options = WriteOptions.parse(raw)
    schema = write_schema(
        spark_schema,
        options.uri,
        vector_columns=options.vector_columns,
        keep_spark_nullability=options.keep_spark_nullability,
    )
    data_uri, state = _table_state(options, schema, overwrite)
    plan = WritePlan(
        uri=options.uri,
        data_uri=data_uri,
        storage_options=options.storage_options,
        schema_ipc=schema_to_ipc(schema),
        max_rows_per_file=options.max_rows_per_file,
        max_rows_per_group=options.max_rows_per_group,
        max_bytes_per_file=options.max_bytes_per_file,
        data_storage_version=state.storage_version,
    )
    return options, plan, state


def _outputs(messages: Sequence[Any]) -> list[TaskOutput]:
    return [m.output for m in messages if isinstance(m, LanceTxCommitMessage)]


def _abort(plan: WritePlan, messages: Sequence[Any], what: str, key: str | None) -> None:
    """Remove the files of a job that never reached its commit; keep those of one
    whose commit failed (the rule of :mod:`lancetx.commit.engine.unreferenced`).

    Spark sends None for each task that failed, and calls ``commit()`` only when all
    succeeded: so with every message present the job failed *in* ``commit()`` — in
    another worker, possibly after its claim landed (an unknown outcome, Ctrl-C, the
    worker killed). ``commit()`` removed the files itself when its claim provably
    did not land; here nothing can be known, so they stay (``lancetx-sync gc``
    collects them if no version references them).
    """
    paths = [p for out in _outputs(messages) for p in fragment_file_paths(out.fragments)]
    if messages and all(isinstance(m, LanceTxCommitMessage) for m in messages):
        keep_after_failed_commit(plan, key or "", paths, what)
        return
    left = remove_data_files(plan, paths)  # no claim was ever sent
    log.warning(
        "%s aborted before committing: removed %d data file(s)", what, len(paths) - len(left)
    )


class LanceTxWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """A batch write: tasks write fragments, ``commit()`` makes one version."""

    def __init__(self, options: WriteOptions, plan: WritePlan, job: JobCommit) -> None:
        self.options = options
        self.plan = plan
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LanceTxCommitMessage:
        return LanceTxCommitMessage(write_task(iterator, self.plan, _injected_failure()))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_job(self.job, _outputs(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(
            self.plan,
            messages,
            f"Spark job {self.job.job_id!r} writing {self.plan.uri!r}",
            self.job.idempotency_key,
        )


class LanceTxStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    """A streaming sink: one version per micro-batch, exactly once across restarts.

    A micro-batch is identified by the query id (kept in the checkpoint, so a
    restarted query has the same one; the ``stream_id`` option overrides it)
    and its batch id; a replayed batch finds itself in the table's history and
    is not committed again.
    """

    def __init__(self, options: WriteOptions, plan: WritePlan, overwrite: bool) -> None:
        self.options = options
        self.plan = plan
        self.overwrite = overwrite

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LanceTxCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        return LanceTxCommitMessage(write_task(iterator, self.plan), query_id)

    def _stream_id(self, messages: Sequence[Any]) -> str | None:
        if self.options.stream_id is not None:
            return self.options.stream_id
        ids = {m.stream_id for m in messages if isinstance(m, LanceTxCommitMessage) and m.stream_id}
        return ids.pop() if len(ids) == 1 else None

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        outputs = _outputs(messages)
        if not any(out.fragments for out in outputs):
            return  # an empty micro-batch: nothing to commit, nothing to replay
        stream_id = self._stream_id(messages)
        if stream_id is None:
            remove_data_files(
                self.plan, [p for o in outputs for p in fragment_file_paths(o.fragments)]
            )
            raise SparkOptionError(
                "stream_id",
                "",
                "a stable stream identity: the query id was not visible to the tasks; set "
                "option stream_id to a name unique to this query",
            )
        job = JobCommit(
            plan=self.plan,
            job_id=stream_id,
            mode="overwrite" if self.overwrite else "append",
            scan_from=0,
            merge_schema=self.options.merge_schema,
            commit_message=self.options.commit_message,
            properties=self.options.properties,
            timeout=self.options.commit_timeout,
            stream_id=stream_id,
            batch_id=batchId,
        )
        commit_job(job, outputs)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        stream_id = self._stream_id(messages)
        key = stream_batch_key(stream_id, batchId) if stream_id is not None else None
        _abort(self.plan, messages, f"micro-batch {batchId} writing {self.plan.uri!r}", key)


# --------------------------------------------------------------------------- reading


class LanceTxReader(DataSourceReader):  # type: ignore[misc]
    """Reads a pinned version; partitions and pieces: :mod:`pyspark_lancetx.scan`."""

    def __init__(self, plan: ScanPlan, schema: StructType) -> None:
        self.plan = plan
        self.schema_json = schema.json()

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan.partitions()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        pieces = getattr(partition, "pieces", ())
        if not pieces:
            return
        target = spark_arrow_schema(StructType.fromJson(_loads(self.schema_json)))
        for batch in self.plan.batches(pieces):
            if batch.num_rows:
                yield conform_read_batch(batch, target)


class LanceTxFilteringReader(LanceTxReader):
    """:class:`LanceTxReader` that also takes Spark's pushed-down filters.

    Spark refuses a reader defining ``pushFilters`` when filter pushdown is off,
    so this class is only handed out to Spark's filter-pushdown step.
    """

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        pushed = list(self.plan.filters)
        for f in filters:
            expression = translate(f)
            if expression is None:
                yield f
            else:
                pushed.append(expression)
        self.plan = _replace_filters(self.plan, tuple(pushed))


def _replace_filters(plan: ScanPlan, filters: tuple[str, ...]) -> ScanPlan:
    from dataclasses import replace

    return replace(plan, filters=filters)


def _loads(text: str) -> dict[str, Any]:
    import json

    value: dict[str, Any] = json.loads(text)
    return value


def _called_for_pushdown() -> bool:
    """Whether Spark's filter-pushdown worker is asking for the reader.

    Spark does not tell ``reader()`` whether pushdown is on, but it only runs
    its pushdown step when it is; that step's module is on the call stack.
    """
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").endswith(
            "data_source_pushdown_filters"
        ) or frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _resolve_version(options: ReadOptions) -> tuple[str, int, pa.Schema, dict[str, str]]:
    """The data URI, version, Arrow schema and pylance's storage options to read,
    resolved through lancetx: a missing table, version, DynamoDB table or credentials
    are the same typed errors (naming the table, the version and its nearest ones, the
    configuration) as on the write side, not pylance's text."""
    import lancetx
    from lancetx.errors import VersionNotFoundError

    table = lancetx.open(options.uri, options.storage_options)
    if options.version is not None:
        table = table.checkout(options.version)
    elif options.timestamp is not None:
        when = _parse_timestamp(options.timestamp)
        history = table.history()
        before = [v for v in history if v.timestamp is not None and v.timestamp <= when]
        if not before:
            first = history[0] if history else None
            raise VersionNotFoundError(
                options.uri,
                0,
                f"no version was committed at or before {when.isoformat()}"
                + (
                    f"; the oldest is version {first.version}, committed "
                    f"{first.timestamp.isoformat()}"
                    if first is not None and first.timestamp is not None
                    else ""
                ),
            )
        table = table.checkout(before[-1].version)
    return table.data_uri, table.version, table.schema, table.pylance_storage_options


def _schema_options(raw: Mapping[str, str | None]) -> ReadOptions:
    """The options that decide the schema: Spark asks a batch read and a streaming
    read alike, so a streaming read's options are taken too (at the latest version).
    Each kind of read then parses its own options strictly."""
    try:
        return ReadOptions.parse(raw)
    except UnknownSparkOptionError as exc:
        try:
            stream = StreamReadOptions.parse(raw)
        except UnknownSparkOptionError as stream_exc:
            # Neither kind knows it: the kind that has a name close to it tells.
            guessed = "did you mean" in str(stream_exc) and "did you mean" not in str(exc)
            raise (stream_exc if guessed else exc) from None
        return ReadOptions(
            uri=stream.uri, storage_options=stream.storage_options, columns=stream.columns
        )


def _parse_timestamp(text: str) -> datetime.datetime:
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise SparkOptionError(
            "timestamp", text, "an ISO-8601 time such as 2026-01-31T12:00:00Z"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)


# --------------------------------------------------------------------------- the source


@dataclass
class _Pinned:
    version: int
    schema_json: str
    names: tuple[str, ...] = field(default_factory=tuple)
    data_uri: str | None = None
    #: The storage options pylance reads with. Not in the repr: it holds credentials.
    pylance_options: dict[str, str] = field(default_factory=dict, repr=False)


class LanceTxDataSource(DataSource):  # type: ignore[misc]
    """``format("lancetx")``: Lance tables committed through lancetx (see the package docs)."""

    @classmethod
    def name(cls) -> str:
        return "lancetx"

    # ---- reading

    def _pin(self) -> _Pinned:
        pinned: _Pinned | None = getattr(self, "_pinned", None)
        if pinned is not None:
            return pinned
        options = _schema_options(self.options)
        data_uri, version, arrow_schema, pylance_options = _resolve_version(options)
        spark_schema = read_spark_schema(arrow_schema, options.uri)
        if options.columns is not None:
            by_name = {f.name: f for f in spark_schema.fields}
            for name in options.columns:
                if name not in by_name:
                    raise SparkSchemaError(
                        options.uri,
                        name,
                        f"not a column of the table {sorted(by_name)}",
                        reading=True,
                    )
            spark_schema = StructType([by_name[n] for n in options.columns])
        pinned = _Pinned(
            version, spark_schema.json(), tuple(spark_schema.names), data_uri, pylance_options
        )
        self._pinned = pinned
        return pinned

    def schema(self) -> StructType:
        return StructType.fromJson(_loads(self._pin().schema_json))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = ReadOptions.parse(self.options)
        pinned = self._pin()
        check_read_schema(options.uri, StructType.fromJson(_loads(pinned.schema_json)), schema)
        plan = ScanPlan(
            uri=options.uri,
            storage_options=pinned.pylance_options,
            version=pinned.version,
            columns=tuple(schema.names),
            filters=(options.filter,) if options.filter else (),
            batch_size=options.batch_size,
            rows_per_partition=options.rows_per_partition,
            data_uri=pinned.data_uri,
            max_partition_bytes=options.max_partition_bytes,
            min_partitions=options.min_partitions,
        )
        reader_class = LanceTxFilteringReader if _called_for_pushdown() else LanceTxReader
        return reader_class(plan, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pyspark_lancetx.stream_source import LanceTxStreamReader, StreamPlan

        options = StreamReadOptions.parse(self.options)
        pinned = self._pin()
        check_read_schema(options.uri, StructType.fromJson(_loads(pinned.schema_json)), schema)
        plan = StreamPlan(
            options=options,
            schema_json=schema.json(),
            schema_version=pinned.version,
            data_uri=pinned.data_uri or options.uri,
            pylance_options=pinned.pylance_options,
        )
        return LanceTxStreamReader(plan)

    # ---- writing

    def writer(self, schema: StructType, overwrite: bool) -> LanceTxWriter:
        options, plan, state = _plan_write(dict(self.options), schema, overwrite)
        job = JobCommit(
            plan=plan,
            job_id=options.job_id,
            mode="overwrite" if overwrite else "append",
            scan_from=0 if options.job_id_given else state.version,
            merge_schema=options.merge_schema,
            commit_message=options.commit_message,
            properties=options.properties,
            timeout=options.commit_timeout,
        )
        return LanceTxWriter(options, plan, job)

    def streamWriter(self, schema: StructType, overwrite: bool) -> LanceTxStreamWriter:
        options, plan, _ = _plan_write(dict(self.options), schema, overwrite)
        return LanceTxStreamWriter(options, plan, overwrite)


DefaultSource = LanceTxDataSource
