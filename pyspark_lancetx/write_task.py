"""What one Spark write task does on an executor: Arrow batches in, Lance data files out.

The batches Spark hands over are streamed into pylance's fragment writer (no
copy of the partition is held in memory), conformed on the way to the write's
schema (:func:`~pyspark_lancetx.schema.conform_write_batch`). Files get fresh
field ids; the commit maps them onto the table's.

A task that fails removes the files it finished before failing: Spark sends no
commit message for a failed attempt, so nothing else would ever know them.
pylance reports each finished file through its progress hook, which is how the
task knows what to remove.

What no task can remove: the files of an attempt whose process died (the Python
worker or its executor killed: no ``except`` runs), and those of an attempt that
finished writing but lost to another attempt of its partition (speculation):
Spark's output commit coordinator lets exactly one attempt per partition report
(the others are denied after their Python code returned, and Python is never
told). Only the reported attempt's fragments reach the commit; the others' files
are referenced by no version, and ``lancetx-sync gc`` collects them once they are
older than its threshold. Each report carries its partition and attempt, so the
commit keeps exactly one per partition whatever arrives.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lancetx
from pyspark_lancetx.schema import conform_write_batch

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WritePlan:
    """Everything a write task needs, as plain picklable data.

    ``data_uri`` is where pylance writes (``s3://…`` for an ``s3+ddb://``
    table); ``schema_ipc`` is the write's Arrow schema, IPC-serialized.
    """

    uri: str
    data_uri: str
    #: Not in the repr: it holds credentials.
    storage_options: dict[str, str] = field(repr=False)
    schema_ipc: bytes
    max_rows_per_file: int | None = None
    max_rows_per_group: int | None = None
    max_bytes_per_file: int | None = None
    data_storage_version: str | None = None

    def schema(self) -> pa.Schema:
        """The write's Arrow schema."""
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(self.schema_ipc))


def schema_to_ipc(schema: pa.Schema) -> bytes:
    """``schema`` as IPC bytes (what :class:`WritePlan` carries)."""
    return bytes(schema.serialize().to_pybytes())


@dataclass
class TaskOutput:
    """What a finished task reports: its fragments (pylance JSON), rows, nulls per
    column, and which Spark partition and task attempt wrote them (None outside a
    Spark task)."""

    fragments: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    null_counts: dict[str, int] = field(default_factory=dict)
    partition: int | None = None
    attempt: int | None = None


#: Fault injection for tests: with this Spark local property set on the thread that
#: starts a job, the first attempt of the job's partition 0 dies once its data files
#: are written, before it reports: ``"exit"`` ends its Python worker (``os._exit``),
#: ``"kill-executor"`` SIGKILLs the executor JVM running it. Nothing can clean up
#: after either (what ``lancetx-sync gc`` is for); Spark retries the task.
AFTER_WRITE_FAULT_PROPERTY = "lancetx.test.afterWriteFault"


def _task_identity() -> tuple[int | None, int | None]:
    """The running Spark task's partition and attempt number (None, None outside one)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None, None
    return context.partitionId(), context.attemptNumber()


def _executor_jvm() -> int | None:
    """The process id of the executor JVM this Python worker serves (an ancestor)."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None
        if b"CoarseGrainedExecutorBackend" in command:
            return pid
        pid = parent
    return None


def _injected_fault() -> Callable[[], None] | None:
    """The fault :data:`AFTER_WRITE_FAULT_PROPERTY` asks of this task, if any."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    fault = context.getLocalProperty(AFTER_WRITE_FAULT_PROPERTY)
    if not fault or context.partitionId() != 0 or context.attemptNumber() != 0:
        return None

    def die() -> None:
        log.warning("injected fault %r after writing: this task attempt dies now", fault)
        if fault == "kill-executor":
            jvm = _executor_jvm()
            if jvm is not None:
                os.kill(jvm, signal.SIGKILL)
        os._exit(17)

    return die


def written_files(
    plan: WritePlan, paths: Sequence[str], idempotency_key: str | None = None
) -> lancetx.WrittenFiles:
    """Data files of this write (by fragment path), for lancetx's deletion rule."""
    return lancetx.WrittenFiles(
        table_uri=plan.uri,
        data_uri=plan.data_uri,
        paths=tuple(paths),
        idempotency_key=idempotency_key,
        storage_options=plan.storage_options,
    )


def remove_data_files(plan: WritePlan, paths: list[str]) -> list[str]:
    """Delete data files no commit was sent for (by fragment path); returns those that
    could not be deleted."""
    return written_files(plan, paths).delete()


def fragment_file_paths(fragments: list[dict[str, Any]]) -> list[str]:
    """The data-file paths of fragments in pylance's JSON form."""
    return [f["path"] for frag in fragments for f in frag.get("files", [])]


def write_task(
    batches: Iterator[pa.RecordBatch],
    plan: WritePlan,
    after_write: Callable[[], None] | None = None,
) -> TaskOutput:
    """Write the task's batches as Lance fragments; remove them all if anything fails.

    ``after_write`` runs once pylance has returned, before the task reports (a
    failure there is the task's to clean up: pylance has finished its files).
    """
    import lance
    import pyarrow as pa
    from lance.progress import FragmentWriteProgress

    target = plan.schema()
    finished: list[str] = []
    partition, attempt = _task_identity()
    output = TaskOutput(
        null_counts={f.name: 0 for f in target}, partition=partition, attempt=attempt
    )
    fault = _injected_fault()
    failure: list[BaseException] = []

    class Finished(FragmentWriteProgress):  # type: ignore[misc]
        def begin(self, fragment: Any, **kwargs: Any) -> None:
            pass

        def complete(self, fragment: Any, **kwargs: Any) -> None:
            finished.extend(f.path for f in fragment.files)

    def conformed() -> Iterator[pa.RecordBatch]:
        try:
            for batch in batches:
                batch = conform_write_batch(batch, target, plan.uri)
                output.rows += batch.num_rows
                for i, f in enumerate(target):
                    output.null_counts[f.name] += batch.column(i).null_count
                yield batch
        except BaseException as exc:  # pylance wraps it; keep the original to re-raise
            failure.append(exc)
            raise

    kwargs: dict[str, Any] = {}
    if plan.max_rows_per_file is not None:
        kwargs["max_rows_per_file"] = plan.max_rows_per_file
    if plan.max_rows_per_group is not None:
        kwargs["max_rows_per_group"] = plan.max_rows_per_group
    if plan.max_bytes_per_file is not None:
        kwargs["max_bytes_per_file"] = plan.max_bytes_per_file
    try:
        fragments = lance.fragment.write_fragments(
            pa.RecordBatchReader.from_batches(target, conformed()),
            plan.data_uri,
            schema=target,
            mode="overwrite",  # fresh field ids; the commit maps them onto the table's
            progress=Finished(),
            data_storage_version=plan.data_storage_version,
            storage_options=plan.storage_options or None,
            **kwargs,
        )
        # From here on every file is known, whether or not the progress hook saw it.
        finished.extend(p for f in fragments for p in (d.path for d in f.files))
        output.fragments = [f.to_json() for f in fragments]
        if fault is not None:
            fault()
        if after_write is not None:
            after_write()
    except BaseException as exc:
        paths = sorted(set(finished))
        left = remove_data_files(plan, paths)
        log.warning(
            "write task for %s failed; removed %d data file(s) it wrote%s",
            plan.uri,
            len(paths) - len(left),
            f", could not remove {left}" if left else "",
        )
        if failure and failure[0] is not exc:
            raise failure[0] from None
        raise
    return output
