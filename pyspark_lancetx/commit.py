"""The driver side of a Spark write: ONE transaction per job (or per micro-batch).

This is the only module of the data source that commits. A job's tasks report
fragments written with fresh field ids; :func:`commit_job` turns them into one
Append (or Overwrite, or — with ``merge_schema`` and new columns — one Merge
that adds the columns and the fragments together) and claims the next version
through the table's commit handler (DynamoDB for ``s3+ddb://``).

Every attempt is *strict*: it claims exactly ``latest + 1`` for the version it
planned against. A lost race comes back here, so each round

1. reads the latest version;
2. looks for the job's idempotency key in every version committed since the
   last look (``lancetx.idempotency_key`` in the transaction properties): found
   means the job already committed — an earlier attempt whose answer was lost,
   a replayed streaming batch, or a re-run with the same ``job_id``;
3. plans the transaction against that version (field ids mapped onto the
   table's by column path; a table that does not exist yet is created by an
   Overwrite at version 1 — of racing creators one wins and the others append,
   provided their columns match);
4. commits it, strictly.

An attempt whose outcome cannot be told (``CommitStateUnknownError``) is
settled by step 2 on the next round; until the job's time budget runs out the
commit keeps going, and it never deletes a data file after such an attempt
(the version may reference them). A definite failure (schema mismatch,
budget exhausted without any uncertain attempt) removes the job's files.

Streams: a micro-batch is keyed by stream id (the query id, stable across
restarts from one checkpoint) and batch id, and a stream's newest committed
batch is found by scanning history newest-first until the stream's last commit
(Delta's ``txnAppId``/``txnVersion`` idea, in one transaction per batch).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lancetx.commit.engine.committer import (
    CommitOptions,
    Parent,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import Append, Merge, Overwrite, Transaction
from lancetx.commit.errors import (
    ExpectedVersionMismatchError,
    LancetxError,
    TransientObjectStoreError,
)
from lancetx.commit.format.fragments import fragment_from_json
from lancetx.commit.format.manifest import read_manifest_at
from lancetx.commit.format.transaction_file import read_transaction_of
from lancetx.commit.handlers.interface import CommitStateUnknownError
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.errors import (
    EndpointUnreachableError,
    ServiceUnavailableError,
    ThrottledError,
)
from lancetx.protos import table_pb2
from pyspark_lancetx.errors import JobCommitTimeoutError, JobCommitUnknownError
from pyspark_lancetx.schema import field_id_map, lance_fields, match_table, merged_fields
from pyspark_lancetx.write_task import (
    TaskOutput,
    WritePlan,
    fragment_file_paths,
    remove_data_files,
)

log = logging.getLogger(__name__)

#: Transaction property keys this data source writes.
IDEMPOTENCY_KEY = "lancetx.idempotency_key"
JOB_ID_KEY = "lancetx.spark.job_id"
ROWS_KEY = "lancetx.spark.rows"
STREAM_ID_KEY = "lancetx.spark.stream_id"
BATCH_ID_KEY = "lancetx.spark.batch_id"

#: Versions whose transactions are loaded at once while scanning history.
SCAN_PARALLELISM = 8

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
    version when the job was planned; 0 when the key may be older). With
    ``scan_history`` the key is looked for before the first attempt (a
    user-given ``job_id``, a micro-batch); otherwise only after an attempt
    whose outcome is unknown. ``stream_id``/``batch_id`` mark a micro-batch.
    """

    plan: WritePlan
    job_id: str
    mode: str  # "append" | "overwrite"
    scan_from: int = 0
    scan_history: bool = False
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
            return f"spark-stream:{self.stream_id}:{self.batch_id}"
        return f"spark-job:{self.job_id}"


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
    """``(version, transaction properties)`` for versions in ``(since, until]``, newest first."""
    locations = [
        loc for loc in conn.handler.list_versions(conn.base, since) if loc.version <= until
    ]
    locations.reverse()

    def properties(location: Any) -> tuple[int, Mapping[str, str]]:
        manifest = read_manifest_at(conn.handler.store, location)
        txn = read_transaction_of(conn.handler.store, conn.base, manifest)
        return location.version, dict(txn.transaction_properties) if txn is not None else {}

    with ThreadPoolExecutor(max_workers=SCAN_PARALLELISM) as pool:
        for start in range(0, len(locations), SCAN_PARALLELISM):
            yield from pool.map(properties, locations[start : start + SCAN_PARALLELISM])


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
    out = []
    for location in conn.handler.list_versions(conn.base, 0):
        snapshot = load_snapshot(conn.handler.store, conn.base, location)
        txn = snapshot.transaction()
        out.append(
            VersionRecord(
                version=snapshot.version,
                operation=(txn.WhichOneof("operation") or "?") if txn is not None else "?",
                properties=dict(txn.transaction_properties) if txn is not None else {},
                rows=snapshot.num_rows,
            )
        )
    return out


# --------------------------------------------------------------------------- planning


def _remapped(
    fragments: Sequence[table_pb2.DataFragment], ids: Mapping[int, int], first_id: int | None
) -> list[table_pb2.DataFragment]:
    """Copies with data-file field ids mapped; fragment ids from ``first_id`` when given."""
    out = []
    for i, fragment in enumerate(fragments):
        copy = table_pb2.DataFragment()
        copy.CopyFrom(fragment)
        for data_file in copy.files:
            data_file.fields[:] = [ids[f] if f >= 0 else f for f in data_file.fields]
        if first_id is not None:
            copy.id = first_id + i
        out.append(copy)
    return out


def plan_transaction(
    job: JobCommit,
    parent: Parent | None,
    fragments: Sequence[table_pb2.DataFragment],
    null_counts: Mapping[str, int],
) -> Transaction:
    """The one transaction that commits ``fragments`` on top of ``parent``."""
    ours = lance_fields(job.plan.schema())
    if parent is None or job.mode == "overwrite":
        return Transaction(
            read_version=parent.version if parent is not None else 0,
            operation=Overwrite(fragments=tuple(fragments), schema=tuple(ours)),
        )
    manifest = parent.manifest.manifest
    table = list(manifest.fields)
    new = match_table(
        job.plan.uri, ours, table, merge_schema=job.merge_schema, null_counts=null_counts
    )
    if not new:
        ids = field_id_map(ours, table)
        return Transaction(
            read_version=parent.version,
            operation=Append(fragments=tuple(_remapped(fragments, ids, None))),
        )
    # Ids of dropped columns may still sit in data files: never reuse them.
    in_files = max((i for f in manifest.fragments for d in f.files for i in d.fields), default=-1)
    target = merged_fields(ours, table, new, in_files)
    ids = field_id_map(ours, target)
    high = manifest.max_fragment_id if manifest.HasField("max_fragment_id") else -1
    high = max([high, *(f.id for f in manifest.fragments)])
    added = _remapped(fragments, ids, high + 1)
    return Transaction(
        read_version=parent.version,
        operation=Merge(fragments=(*manifest.fragments, *added), schema=tuple(target)),
    )


# --------------------------------------------------------------------------- commit


def commit_job(job: JobCommit, outputs: Sequence[TaskOutput]) -> JobCommitted:
    """Commit the tasks' fragments as one transaction (see the module docstring).

    Raises SparkSchemaError (files removed), JobCommitTimeoutError (files
    removed), JobCommitUnknownError (files kept: the commit may have landed),
    or another LancetxError of the table's store.
    """
    uri = job.plan.uri
    frag_json = [f for out in outputs for f in out.fragments]
    fragments = [fragment_from_json(f) for f in frag_json]
    rows = sum(out.rows for out in outputs)
    nulls: dict[str, int] = {}
    for out in outputs:
        for name, count in out.null_counts.items():
            nulls[name] = nulls.get(name, 0) + count
    properties = dict(job.properties)
    properties.update(
        {IDEMPOTENCY_KEY: job.idempotency_key, JOB_ID_KEY: job.job_id, ROWS_KEY: str(rows)}
    )
    if job.stream_id is not None:
        properties.update({STREAM_ID_KEY: job.stream_id, BATCH_ID_KEY: str(job.batch_id)})
    conn = connect(uri, job.plan.storage_options)
    deadline = time.monotonic() + job.timeout
    seen = job.scan_from
    must_scan = job.scan_history or job.stream_id is not None
    uncertain = False
    attempts = 0
    last_error: BaseException | None = None
    try:
        while True:
            try:
                parent = load_parent(conn.handler, conn.base)
                latest = parent.version if parent is not None else 0
                if (must_scan or uncertain) and latest > seen:
                    found = find_committed(conn, job, seen, latest)
                    if found is not None:
                        log.info("job %s is already in version %d of %s", job.job_id, found, uri)
                        if not uncertain:
                            _discard(job, frag_json)  # an earlier run's commit holds the key
                        return JobCommitted(found, True, attempts)
                seen = max(seen, latest)
            except _TRANSIENT as exc:
                last_error = exc
                if time.monotonic() > deadline:
                    if uncertain:
                        raise JobCommitUnknownError(
                            uri, job.job_id, seen + 1, f"the store did not answer: {exc}"
                        ) from exc
                    raise
                time.sleep(0.2)
                continue
            if time.monotonic() > deadline:
                if uncertain:
                    raise JobCommitUnknownError(
                        uri, job.job_id, latest + 1, f"last error: {last_error}"
                    ) from last_error
                raise JobCommitTimeoutError(uri, job.job_id, job.timeout, attempts)
            txn = plan_transaction(job, parent, fragments, nulls)
            attempts += 1
            try:
                done = commit_transaction(
                    conn.handler,
                    conn.base,
                    txn,
                    parent=parent,
                    options=CommitOptions(
                        expected_version=latest,
                        properties=properties,
                        commit_message=job.commit_message,
                    ),
                )
            except ExpectedVersionMismatchError as exc:
                last_error = exc
                time.sleep(random.uniform(0, min(0.5, 0.01 * 2 ** min(attempts, 6))))
                continue
            except (CommitStateUnknownError, *_TRANSIENT) as exc:
                # The claim may have landed: settle it by looking for our key next round.
                uncertain = True
                last_error = exc
                log.warning(
                    "commit of job %s to %s: outcome unknown (%s); settling", job.job_id, uri, exc
                )
                time.sleep(0.2)
                continue
            log.info(
                "job %s committed version %d of %s (%d attempts)",
                job.job_id,
                done.version,
                uri,
                attempts,
            )
            return JobCommitted(done.version, False, attempts)
    except JobCommitUnknownError:
        raise
    except CommitStateUnknownError:
        raise
    except LancetxError:
        if not uncertain:
            _discard(job, frag_json)
        raise


def _discard(job: JobCommit, fragments: list[dict[str, Any]]) -> None:
    """Remove the job's data files: no committed version references them."""
    left = remove_data_files(job.plan, fragment_file_paths(fragments))
    if left:
        log.warning("job %s: could not remove %d unreferenced data file(s)", job.job_id, len(left))
