"""The driver side of a Spark write: ONE transaction per job (or per micro-batch).

A job's tasks report fragments written as a new dataset (fresh field ids).
:func:`commit_job` hands them to the front door, one :class:`lancetx.Table` per
job (:meth:`~lancetx.Table.commit_fragments`), which commits them as one Append (or Overwrite, or — with ``merge_schema`` and new
columns — one Merge adding the columns and the fragments together): field ids
mapped onto the table's by column path, a table that does not exist yet created
strictly (of racing creators one wins, the others append), lost races retried by
the commit loop, and the job's idempotency key (the Spark job id, or stream id +
batch id) looked for so a job is never committed twice.

What this module adds is the job's view of the outcome:

* an error marked ``retryable`` (:attr:`lancetx.LancetxError.retryable`: a
  throttled or unreachable store, an unknown outcome — the claim may have landed,
  the answer was lost) is settled by committing again with the same key until the job's time budget runs out —
  the front door then finds the version that holds the key instead of committing
  twice; after such an attempt no data file is deleted (a version may reference
  it), and an unsettled outcome is a typed :class:`JobCommitUnknownError`;
* a definite failure (schema mismatch, budget exhausted: the claim provably did
  not land) removes the job's files; any other exception (``KeyboardInterrupt``,
  the worker killed) leaves them, since the claim may have landed;
* a job found already committed (a re-run with the same ``job_id``, a replayed
  micro-batch) removes the files no version references;
* exactly one task report per partition is committed (:func:`one_per_partition`):
  Spark's commit coordinator already lets only one attempt of a partition report,
  and should two reports of one partition ever arrive, the second attempt's files
  are removed (no claim can reference them) instead of committing its rows twice.

Whether the job's files may be deleted is decided by lancetx's one rule, which
:class:`lancetx.WrittenFiles` applies, here and in the data source's ``abort()``.

Streams: a micro-batch is keyed by stream id (the query id, stable across restarts
from one checkpoint) and batch id. Before committing, the stream's newest commit
is looked up (:meth:`lancetx.Table.walk_history`, newest first, stopping there): a batch id at or beyond ours
means ours is in (Delta's ``txnAppId``/``txnVersion`` idea, in one transaction per
batch).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import lancetx
from lancetx.commit.errors import (
    CommitStateUnknownError,
    DatasetNotFoundError,
    LancetxError,
    RetriesExhaustedError,
)
from lancetx.errors import (
    ColumnMismatchError,
    JobCommitTimeoutError,
    JobCommitUnknownError,
    SparkSchemaError,
)
from pyspark_lancetx.write_task import (
    TaskOutput,
    WritePlan,
    fragment_file_paths,
    remove_data_files,
    written_files,
)

log = logging.getLogger(__name__)

#: Transaction property keys this data source writes (the idempotency key is the
#: commit loop's own, ``lancetx.idempotency_key``).
JOB_ID_KEY = "lancetx.spark.job_id"
ROWS_KEY = "lancetx.spark.rows"
STREAM_ID_KEY = "lancetx.spark.stream_id"
BATCH_ID_KEY = "lancetx.spark.batch_id"
#: Lance's reserved transaction property holding the commit message
#: (:attr:`lancetx.VersionInfo.commit_message`; :class:`VersionRecord` shows it among
#: the properties, as the transaction stores it).
COMMIT_MESSAGE_KEY = "__lance_commit_message"


@dataclass(frozen=True)
class JobCommit:
    """What a commit needs besides the tasks' outputs (plain, picklable data).

    ``scan_from``: versions up to this one cannot hold the job's key (the table's
    version when a job with a generated id was planned; 0 when the key may be
    older: a user-given ``job_id``, a micro-batch). ``timeout`` is the job's commit
    budget in seconds. ``stream_id``/``batch_id`` mark a micro-batch.
    """

    plan: WritePlan
    job_id: str
    mode: str  # "append" | "overwrite"
    scan_from: int = 0
    merge_schema: bool = False
    commit_message: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    timeout: float = 300.0
    stream_id: str | None = None
    batch_id: int | None = None

    @property
    def idempotency_key(self) -> str:
        """The key stored with the commit and looked for before every attempt."""
        if self.stream_id is not None:
            return stream_batch_key(self.stream_id, self.batch_id)
        return f"spark-job:{self.job_id}"


def stream_batch_key(stream_id: str, batch_id: int | None) -> str:
    """The idempotency key of one micro-batch of a stream."""
    return f"spark-stream:{stream_id}:{batch_id}"


@dataclass(frozen=True)
class JobCommitted:
    """The outcome: the version holding the job's rows; ``deduplicated`` when an
    earlier commit of the same key was found instead of committing again."""

    version: int
    deduplicated: bool
    attempts: int


# --------------------------------------------------------------------------- history


def find_committed(table: lancetx.Table, job: JobCommit, since: int) -> int | None:
    """The version after ``since`` (up to the Table's version) that already holds this
    job (or micro-batch): the front door's history, newest first, read only as far as
    the answer."""
    key = job.idempotency_key
    for info in table.walk_history(since=since):
        props = info.properties
        if info.idempotency_key == key:
            return info.version
        if job.stream_id is not None and props.get(STREAM_ID_KEY) == job.stream_id:
            # The stream's newest commit: batches are committed in order, so a
            # later-or-equal batch id there means ours is in (possibly under an
            # older key format); an earlier one means ours is not.
            try:
                committed_batch = int(props.get(BATCH_ID_KEY, "-1"))
            except ValueError:
                committed_batch = -1
            if job.batch_id is not None and committed_batch >= job.batch_id:
                return info.version
            return None
    return None


def last_commit(
    uri: str,
    job_id: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> int | None:
    """The version a Spark job committed to ``uri`` (by its ``job_id`` option), or
    the newest version written by this data source when ``job_id`` is None.

    Reads the history newest-first, as far as the answer; None when no such version
    exists (or no table).
    """
    try:
        table = lancetx.open(uri, storage_options)
    except DatasetNotFoundError:
        return None
    for info in table.walk_history():
        if job_id is None and JOB_ID_KEY in info.properties:
            return info.version
        if job_id is not None and info.properties.get(JOB_ID_KEY) == job_id:
            return info.version
    return None


@dataclass(frozen=True)
class VersionRecord:
    """One version of a table as the history shows it: ``operation`` in the
    transaction's own spelling (``"append"``, ``"create_index"``; ``"?"`` without one)."""

    version: int
    operation: str
    properties: dict[str, str]
    rows: int
    commit_message: str | None = None

    @property
    def job_id(self) -> str | None:
        """The Spark job (or stream) that committed it, if this data source did."""
        return self.properties.get(JOB_ID_KEY)


def _with_message(info: lancetx.VersionInfo) -> dict[str, str]:
    properties = dict(info.properties)
    if info.commit_message is not None:
        properties[COMMIT_MESSAGE_KEY] = info.commit_message
    return properties


def _snake(name: str | None) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() if name else "?"


def table_history(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> list[VersionRecord]:
    """Every version of ``uri``, oldest first: operation, transaction properties, live rows
    (from :meth:`lancetx.Table.history`); empty when there is no table."""
    table = lancetx.open(uri, storage_options, missing_ok=True)
    return [
        VersionRecord(
            version=info.version,
            operation=_snake(info.operation),
            properties=_with_message(info),
            rows=info.rows if info.rows is not None else table.checkout(info.version).count_rows(),
            commit_message=info.commit_message,
        )
        for info in table.history()
    ]


# --------------------------------------------------------------------------- commit


def one_per_partition(job: JobCommit, outputs: Sequence[TaskOutput]) -> list[TaskOutput]:
    """The task reports to commit: the first of each Spark partition (reports without a
    partition, written outside a task, all count).

    A report of a partition already reported by another attempt is left out and its
    files are deleted: they belong to no claim, now or later (the rule of
    :mod:`lancetx.commit.engine.unreferenced` allows it). A report repeated by the
    same attempt names the same files and is simply dropped.
    """
    kept: list[TaskOutput] = []
    first: dict[int, TaskOutput] = {}
    extra: list[TaskOutput] = []
    for out in outputs:
        if out.partition is None:
            kept.append(out)
        elif out.partition not in first:
            first[out.partition] = out
            kept.append(out)
        elif out.attempt != first[out.partition].attempt:
            extra.append(out)
    if extra:
        keep = {p for out in kept for p in fragment_file_paths(out.fragments)}
        paths = [p for out in extra for p in fragment_file_paths(out.fragments) if p not in keep]
        left = remove_data_files(job.plan, paths)
        log.warning(
            "job %s on %s: %d more report(s) of partition(s) %s from other task attempts "
            "(%s) left out of the commit; removed their %d data file(s)%s",
            job.job_id,
            job.plan.uri,
            len(extra),
            sorted({out.partition for out in extra if out.partition is not None}),
            ", ".join(f"partition {out.partition} attempt {out.attempt}" for out in extra),
            len(paths) - len(left),
            f", could not remove {left} (lancetx-sync gc collects them)" if left else "",
        )
    return kept


def commit_job(job: JobCommit, outputs: Sequence[TaskOutput]) -> JobCommitted:
    """Commit the tasks' fragments as one transaction (see the module docstring).

    One :class:`lancetx.Table` (one connection, one table state) serves the whole
    commit: the micro-batch look-up, every attempt and the clean-up after a found
    commit. Raises SparkSchemaError (files removed), JobCommitTimeoutError (files
    removed), JobCommitUnknownError (files kept: the commit may have landed), or
    another LancetxError of the table's store.
    """
    uri = job.plan.uri
    outputs = one_per_partition(job, outputs)
    frag_json = [f for out in outputs for f in out.fragments]
    files = job_files(job, fragment_file_paths(frag_json))
    rows = sum(out.rows for out in outputs)
    nulls: dict[str, int] = {}
    for out in outputs:
        for name, count in out.null_counts.items():
            nulls[name] = nulls.get(name, 0) + count
    properties = dict(job.properties)
    properties.update({JOB_ID_KEY: job.job_id, ROWS_KEY: str(rows)})
    if job.stream_id is not None:
        properties.update({STREAM_ID_KEY: job.stream_id, BATCH_ID_KEY: str(job.batch_id)})
    deadline = time.monotonic() + job.timeout
    since = job.scan_from
    uncertain: Exception | None = None
    attempts = 0
    table: lancetx.Table | None = None
    while True:
        attempts += 1
        try:
            if table is None:
                table = lancetx.open(uri, job.plan.storage_options, missing_ok=True)
            if job.stream_id is not None and uncertain is None:
                found, since = _stream_batch_committed(table, job, since)
                if found is not None:
                    files.drop_unreferenced(table, found)
                    return JobCommitted(found, True, attempts - 1)
            result = table.commit_fragments(
                frag_json,
                schema=job.plan.schema(),
                mode=job.mode,
                commit_message=job.commit_message,
                properties=properties,
                idempotency_key=job.idempotency_key,
                idempotency_since=since,
                fresh_field_ids=True,
                merge_schema=job.merge_schema,
                null_counts=nulls,
                commit_timeout=max(0.0, deadline - time.monotonic()),
            )
        except ColumnMismatchError as exc:
            if uncertain is None:
                files.release(exc)
            raise SparkSchemaError(uri, exc.column, exc.problem) from None
        except RetriesExhaustedError as exc:
            if uncertain is not None:
                raise JobCommitUnknownError(
                    uri, job.job_id, _version_of(uncertain), f"last error: {exc}"
                ) from exc
            files.release(exc)
            raise JobCommitTimeoutError(uri, job.job_id, job.timeout, exc.attempts) from exc
        except LancetxError as exc:
            if exc.retryable:
                # Transient, or the claim may have landed (a transient error may have
                # hidden its answer too): the next call looks for our key first, and
                # no file is deleted from here on.
                uncertain = exc
                log.warning(
                    "commit of job %s to %s: outcome unknown (%s); settling", job.job_id, uri, exc
                )
                if time.monotonic() > deadline:
                    raise JobCommitUnknownError(
                        uri, job.job_id, _version_of(exc), f"last error: {exc}"
                    ) from exc
                time.sleep(0.2)
                continue
            if uncertain is None:
                files.release(exc)  # refused or never sent: deleted
            else:  # an earlier attempt of this job may have landed
                files.keep_unsettled(f"an earlier attempt's outcome is unknown ({uncertain})")
            raise
        if result.deduplicated:
            log.info("job %s is already in version %d of %s", job.job_id, result.version, uri)
            files.drop_unreferenced(table, result.version)
        else:
            log.info(
                "job %s committed version %d of %s (%d attempts)",
                job.job_id,
                result.version,
                uri,
                result.attempts,
            )
        return JobCommitted(result.version, result.deduplicated, attempts)


def _version_of(error: BaseException) -> int:
    """The version an unknown outcome is about (0 when the error does not say)."""
    return error.version if isinstance(error, CommitStateUnknownError) else 0


def _stream_batch_committed(
    table: lancetx.Table, job: JobCommit, since: int
) -> tuple[int | None, int]:
    """The version holding this micro-batch (or None), and the latest version looked at."""
    table.refresh()
    if not table.exists or table.version <= since:
        return None, since
    return find_committed(table, job, since), table.version


def job_files(job: JobCommit, paths: Sequence[str]) -> lancetx.WrittenFiles:
    """The job's data files, with what settles whether its commit landed: its key."""
    return written_files(job.plan, paths, job.idempotency_key)


def keep_after_failed_commit(job_plan: WritePlan, key: str, paths: list[str], what: str) -> None:
    """``abort()`` after ``commit()`` raised: it runs in another worker and cannot know
    whether the claim landed, so the job's files stay (``commit()`` itself deleted them
    when its claim provably did not land); say which, and how to settle it."""
    written_files(job_plan, paths, key).keep_unsettled(
        f"{what} was aborted after its commit failed, which cannot tell whether the claim "
        "landed; the commit removed the files itself if it provably did not"
    )
