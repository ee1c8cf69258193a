"""The driver-side job commit goes through the front door: it retries on ``exc.retryable``
(not on a hand-made list of classes), and one job's commit opens one connection."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from spark_helpers import data_files, referenced_files

import lancetx.committing
import lancetx.state
import pyspark_lancetx.commit
from lancetx.commit.errors import LancetxError
from pyspark_lancetx.commit import JobCommit, commit_job
from pyspark_lancetx.write_task import TaskOutput, WritePlan, schema_to_ipc, write_task

SCHEMA = pa.schema([pa.field("id", pa.int64())])


class Flaky(LancetxError):
    """An error no list in the Spark code names, marked safe to retry."""

    retryable = True


class Broken(LancetxError):
    """A definite failure: nothing was committed, retrying will not help."""


def _job(uri: str, name: str, **kw: Any) -> JobCommit:
    plan = WritePlan(uri=uri, data_uri=uri, storage_options={}, schema_ipc=schema_to_ipc(SCHEMA))
    return JobCommit(plan=plan, job_id=name, mode="append", timeout=30, **kw)


def _task(job: JobCommit, ids: range) -> TaskOutput:
    return write_task(iter(pa.table({"id": list(ids)}, schema=SCHEMA).to_batches()), job.plan)


def _fail_first(monkeypatch: pytest.MonkeyPatch, error: LancetxError) -> list[int]:
    """The first commit of the job raises ``error`` before anything is sent."""
    calls: list[int] = []
    real: Callable[..., Any] = lancetx.committing.run_verb

    def run_verb(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(*args, **kwargs)

    # the front door imports it from lancetx.committing when a verb runs
    monkeypatch.setattr(lancetx.committing, "run_verb", run_verb)
    return calls


def test_a_retryable_error_is_retried_whatever_its_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t.lance")
    job = _job(uri, "flaky")
    output = _task(job, range(10))
    calls = _fail_first(monkeypatch, Flaky("the store stuttered"))
    done = commit_job(job, [output])
    assert len(calls) == 2 and done.version == 1 and not done.deduplicated
    assert sorted(lance.dataset(uri).to_table().column("id").to_pylist()) == list(range(10))


def test_a_definite_error_is_raised_at_once_and_removes_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t.lance")
    job = _job(uri, "broken")
    output = _task(job, range(10))
    assert data_files(uri)
    calls = _fail_first(monkeypatch, Broken("refused"))
    with pytest.raises(Broken):
        commit_job(job, [output])
    assert len(calls) == 1 and not data_files(uri)


def _count_connections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every connection opened (the front door's, and any the Spark code opens itself)."""
    opened: list[str] = []
    for module in (lancetx.state, pyspark_lancetx.commit):
        real = getattr(module, "connect", None)
        if real is None:
            continue

        def counting(uri: str, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            opened.append(uri)
            return _real(uri, *args, **kwargs)

        monkeypatch.setattr(module, "connect", counting)
    return opened


@pytest.mark.parametrize("replayed", [False, True], ids=["new-batch", "replayed-batch"])
def test_one_connection_per_micro_batch_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replayed: bool
) -> None:
    uri = str(tmp_path / "t.lance")
    first = _job(uri, "s", stream_id="s", batch_id=0)
    commit_job(first, [_task(first, range(5))])
    batch = _job(uri, "s", stream_id="s", batch_id=0 if replayed else 1)
    output = _task(batch, range(5, 10))
    opened = _count_connections(monkeypatch)
    done = commit_job(batch, [output])
    assert done.deduplicated is replayed and done.version == (1 if replayed else 2)
    assert opened == [uri], f"{len(opened)} connections for one commit"
    expected = range(5) if replayed else range(10)
    assert sorted(lance.dataset(uri).to_table().column("id").to_pylist()) == list(expected)
    # The replay's files are referenced by nothing: removed; every other file stays.
    assert data_files(uri) == referenced_files(uri)
