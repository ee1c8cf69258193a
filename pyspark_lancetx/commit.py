"""The driver side of a Spark write: ONE transaction per job (or per micro-batch).

A job's tasks report fragments written as a new dataset (fresh field ids).
:func:`commit_job` hands them to the front door, :func:`lancetx.commit_fragments`,
which commits them as one Append (or Overwrite, or — with ``merge_schema`` and new
columns — one Merge adding the columns and the fragments together): field ids
mapped onto the table's by column path, a table that does not exist yet created
strictly (of racing creators one wins, the others append), lost races retried by
the commit loop, and the job's idempotency key (the Spark job id, or stream id +
batch id) looked for so a job is never committed twice.

What this module adds is the job's view of the outcome:

* an unknown outcome (the claim may have landed, the answer was lost) is settled
  by committing again with the same key until the job's time budget runs out —
  the front door then finds the version that holds the key instead of committing
  twice; after such an attempt no data file is deleted (a version may reference
  it), and an unsettled outcome is a typed :class:`JobCommitUnknownError`;
* a definite failure (schema mismatch, budget exhausted: the claim provably did
  not land) removes the job's files; any other exception (``KeyboardInterrupt``,
  the worker killed) leaves them, since the claim may have landed;
* a job found already committed (a re-run with the same ``job_id``, a replayed
  micro-batch) removes the files no version references.

Whether the job's files may be deleted is decided by the one rule of
:mod:`lancetx.commit.engine.unreferenced`, here and in the data source's ``abort()``.

Streams: a micro-batch is keyed by stream id (the query id, stable across restarts
from one checkpoint) and batch id. Before committing, the stream's newest commit
is looked up (history newest-first, stopping there): a batch id at or beyond ours
means ours is in (Delta's ``txnAppId``/``txnVersion`` idea, in one transaction per
batch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lancetx.commit.engine.committer import IDEMPOTENCY_KEY, load_parent
from lancetx.commit.engine.unreferenced import Claim, keep, keep_unsettled, may_delete
from lancetx.commit.errors import (
    CommitStateUnknownError,
    LancetxError,
    RetriesExhaustedError,
    TransientObjectStoreError,
)
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.errors import ColumnMismatchError
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.errors import (
    EndpointUnreachableError,
    ServiceUnavailableError,
    ThrottledError,
)
from lancetx.history import map_versions
from pyspark_lancetx.errors import JobCommitTimeoutError, JobCommitUnknownError, SparkSchemaError
from pyspark_lancetx.write_task import (
    TaskOutput,
    WritePlan,
    fragment_file_paths,
    remove_data_files,
)

log = logging.getLogger(__name__)

#: Transaction property keys this data source writes (the idempotency key is the
#: commit loop's own, ``lancetx.idempotency_key``).
JOB_ID_KEY = "lancetx.spark.job_id"
ROWS_KEY = "lancetx.spark.rows"
STREAM_ID_KEY = "lancetx.spark.stream_id"
BATCH_ID_KEY = "lancetx.spark.batch_id"

#: Versions whose transactions are loaded at once while scanning history.
SCAN_PARALLELISM = 8

#: Errors after which the commit is simply tried again (within the job's budget).
_TRANSIENT = (
    TransientObjectStoreError,
    ThrottledError,
    ServiceUnavailableError,
    EndpointUnreachableError,
)


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


def _transactions_newest_first(
    conn: TableConnection, since: int, until: int
) -> Iterator[tuple[int, Mapping[str, str]]]:
    """``(version, transaction properties)`` for versions in ``(since, until]``, newest
    first; versions a cleanup removed (their items outlive their manifests) are skipped."""
    locations = [
        loc for loc in conn.handler.list_versions(conn.base, since) if loc.version <= until
    ]
    locations.reverse()

    def properties(location: ManifestLocation, manifest: ManifestFile) -> Mapping[str, str]:
        txn = read_transaction_of(conn.handler.store, conn.base, manifest)
        return dict(txn.transaction_properties) if txn is not None else {}

    for start in range(0, len(locations), SCAN_PARALLELISM):
        batch = locations[start : start + SCAN_PARALLELISM]
        for location, props in map_versions(
            conn.handler.store, conn.base, batch, properties, parallelism=SCAN_PARALLELISM
        ):
            yield location.version, props


def find_committed(conn: TableConnection, job: JobCommit, since: int, until: int) -> int | None:
    """The version in ``(since, until]`` that already holds this job (or micro-batch)."""
    key = job.idempotency_key
    for version, props in _transactions_newest_first(conn, since, until):
        if props.get(IDEMPOTENCY_KEY) == key:
            return version
        if job.stream_id is not None and props.get(STREAM_ID_KEY) == job.stream_id:
            # The stream's newest commit: batches are committed in order, so a
            # later-or-equal batch id there means ours is in (possibly under an
            # older key format); an earlier one means ours is not.
            try:
                committed_batch = int(props.get(BATCH_ID_KEY, "-1"))
            except ValueError:
                committed_batch = -1
            return version if job.batch_id is not None and committed_batch >= job.batch_id else None
    return None


def last_commit(
    uri: str,
    job_id: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> int | None:
    """The version a Spark job committed to ``uri`` (by its ``job_id`` option), or
    the newest version written by this data source when ``job_id`` is None.

    Scans the history newest-first; None when no such version exists.
    """
    conn = connect(uri, dict(storage_options or {}))
    latest = conn.handler.resolve_latest(conn.base)
    if latest is None:
        return None
    for version, props in _transactions_newest_first(conn, 0, latest.version):
        if job_id is None and JOB_ID_KEY in props:
            return version
        if job_id is not None and props.get(JOB_ID_KEY) == job_id:
            return version
    return None


@dataclass(frozen=True)
class VersionRecord:
    """One version of a table as the history shows it."""

    version: int
    operation: str
    properties: dict[str, str]
    rows: int

    @property
    def job_id(self) -> str | None:
        """The Spark job (or stream) that committed it, if this data source did."""
        return self.properties.get(JOB_ID_KEY)


def table_history(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> list[VersionRecord]:
    """Every version of ``uri``, oldest first: operation, transaction properties, live rows."""
    from lancetx.commit.format.snapshot import load_snapshot

    conn = connect(uri, dict(storage_options or {}))
    locations = conn.handler.list_versions(conn.base, 0)

    def record(location: ManifestLocation, manifest: ManifestFile) -> VersionRecord:
        snapshot = load_snapshot(conn.handler.store, conn.base, location, loaded=manifest)
        txn = snapshot.transaction()
        return VersionRecord(
            version=snapshot.version,
            operation=(txn.WhichOneof("operation") or "?") if txn is not None else "?",
            properties=dict(txn.transaction_properties) if txn is not None else {},
            rows=snapshot.num_rows,
        )

    return [found for _, found in map_versions(conn.handler.store, conn.base, locations, record)]


# --------------------------------------------------------------------------- commit


def commit_job(job: JobCommit, outputs: Sequence[TaskOutput]) -> JobCommitted:
    """Commit the tasks' fragments as one transaction (see the module docstring).

    Raises SparkSchemaError (files removed), JobCommitTimeoutError (files
    removed), JobCommitUnknownError (files kept: the commit may have landed),
    or another LancetxError of the table's store.
    """
    import lancetx

    uri = job.plan.uri
    frag_json = [f for out in outputs for f in out.fragments]
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
    while True:
        attempts += 1
        try:
            if job.stream_id is not None and uncertain is None:
                found, since = _stream_batch_committed(job, since)
                if found is not None:
                    _discard_unreferenced(job, frag_json, found)
                    return JobCommitted(found, True, attempts - 1)
            result = lancetx.commit_fragments(
                uri,
                frag_json,
                schema=job.plan.schema(),
                mode=job.mode,
                storage_options=job.plan.storage_options,
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
                _discard(job, frag_json, exc)
            raise SparkSchemaError(uri, exc.column, exc.problem) from None
        except (CommitStateUnknownError, *_TRANSIENT) as exc:
            # The claim may have landed (a transient error may have hidden its answer
            # too): the next call looks for our key first, and no file is deleted.
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
        except RetriesExhaustedError as exc:
            if uncertain is not None:
                raise JobCommitUnknownError(
                    uri, job.job_id, _version_of(uncertain), f"last error: {exc}"
                ) from exc
            _discard(job, frag_json, exc)
            raise JobCommitTimeoutError(uri, job.job_id, job.timeout, exc.attempts) from exc
        except LancetxError as exc:
            if uncertain is None:
                _discard(job, frag_json, exc)  # refused or never sent: deleted
            else:  # an earlier attempt of this job may have landed
                keep_unsettled(
                    [_describe(job)(p) for p in fragment_file_paths(frag_json)],
                    job_claim(job),
                    f"an earlier attempt's outcome is unknown ({uncertain})",
                )
            raise
        if result.deduplicated:
            log.info("job %s is already in version %d of %s", job.job_id, result.version, uri)
            _discard_unreferenced(job, frag_json, result.version)
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


def _stream_batch_committed(job: JobCommit, since: int) -> tuple[int | None, int]:
    """The version holding this micro-batch (or None), and the latest version looked at."""
    conn = connect(job.plan.uri, job.plan.storage_options)
    latest = conn.handler.resolve_latest(conn.base)
    if latest is None or latest.version <= since:
        return None, since
    return find_committed(conn, job, since, latest.version), latest.version


def job_claim(job: JobCommit) -> Claim:
    """What settles whether the job's commit landed: its key (the job id or batch)."""
    return Claim(table_uri=job.plan.uri, idempotency_key=job.idempotency_key)


def _discard(job: JobCommit, fragments: list[dict[str, Any]], error: BaseException) -> None:
    """Remove the job's data files if ``error`` proves its claim did not land."""
    _discard_paths(job, fragment_file_paths(fragments), error)


def _discard_unreferenced(job: JobCommit, fragments: list[dict[str, Any]], version: int) -> None:
    """Remove the job's files that ``version`` (the one holding the job) does not reference:
    the files of a re-run; none when the version is this very job's own lost-answer commit."""
    conn = connect(job.plan.uri, job.plan.storage_options)
    try:
        parent = load_parent(conn.handler, conn.base, version)
    except LancetxError as exc:
        # The version holding the job cannot be read (cleanup removed it since): which
        # files it referred to cannot be told, so none is deleted (gc removes orphans).
        log.warning(
            "job %s is committed as version %d of %s, which cannot be read (%s); its data "
            "files from this run are kept",
            job.job_id,
            version,
            job.plan.uri,
            exc,
        )
        return
    kept = (
        {f.path for frag in parent.manifest.manifest.fragments for f in frag.files}
        if parent is not None
        else set()
    )
    _discard_paths(job, [p for p in fragment_file_paths(fragments) if p not in kept])


def _discard_paths(job: JobCommit, paths: list[str], error: BaseException | None = None) -> None:
    """Apply the rule to the job's data files (``error`` None: provably unreferenced)."""
    if error is not None and not may_delete(error):
        keep(error, [_describe(job)(p) for p in paths], claim=job_claim(job))
        return
    left = remove_data_files(job.plan, paths)
    if left:
        log.warning("job %s: could not remove %d unreferenced data file(s)", job.job_id, len(left))


def _describe(job: JobCommit) -> Any:
    def describe(path: str) -> str:
        return f"{job.plan.data_uri.rstrip('/')}/data/{path}"

    return describe


def keep_after_failed_commit(job_plan: WritePlan, key: str, paths: list[str], what: str) -> None:
    """``abort()`` after ``commit()`` raised: it runs in another worker and cannot know
    whether the claim landed, so the job's files stay (``commit()`` itself deleted them
    when its claim provably did not land); say which, and how to settle it."""
    keep_unsettled(
        [f"{job_plan.data_uri.rstrip('/')}/data/{p}" for p in paths],
        Claim(table_uri=job_plan.uri, idempotency_key=key),
        f"{what} was aborted after its commit failed, which cannot tell whether the claim "
        "landed; the commit removed the files itself if it provably did not",
    )
