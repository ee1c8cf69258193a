"""gc every 3 s, forced to a zero threshold, beside every kind of writer and a reader:
every version stays readable and every acknowledged row stays in the table.

Actors, for ``LANCETX_GC_SOAK_SECONDS`` (``make test``: 20 s; the long profile: 300 s):

* two lancetx appenders and a pylance ``s3+ddb://`` appender;
* a streaming writer (``table.writer()``), two batches per commit;
* a slow job: its claim is held at the server until gc has run once more, after its
  data files were aged two hours — only the rule that a young transaction file
  keeps what it names protects them;
* a failed task every ~2 s: data files never committed, aged two hours (gc's work);
* a pylance reader reading the latest version in a loop;
* gc with ``older_than=0`` and ``force_unsafe_threshold`` every 3 s.

Afterwards pylance opens every version and reads every file it references, every
acknowledged (writer, seq) is in the latest version with its rows,
``verify --deep --all-versions`` is clean, and gc did delete the failed tasks' files.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import lance
import pytest
from cli_helpers import age_objects, read_every_version_once
from protocol_helpers import batch, ddb_uri, ensure_ddb_table
from suite_profile import seconds

import lancetx
from lancetx.commit.engine.committer import commit_transaction, load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import LancetxError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.externalstore.connect import connect
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table

SOAK_SECONDS = seconds("LANCETX_GC_SOAK_SECONDS", quick=20, long=300)
GC_EVERY = 3.0
OLD = timedelta(hours=2)


class Soak:
    """Shared state of the actors."""

    def __init__(self, aws: EmbeddedAws, bucket: str, uri: str, path: str) -> None:
        self.aws, self.bucket, self.uri, self.path = aws, bucket, uri, path
        self.options = aws.pylance_storage_options()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: Counter[tuple[str, int]] = Counter()
        self.failures: list[str] = []
        self.reader_errors: list[str] = []
        self.reads = 0
        self.gc_runs = 0
        self.gc_deleted: set[str] = set()
        self.gc_errors: list[str] = []
        self.planted: list[tuple[float, set[str]]] = []
        self.held = 0  # slow-job claims held across a gc run
        self.slow_uuid: str | None = None
        self.slow_held: set[str] = set()  # only a transaction's first claim is held
        self.slow_files: set[str] = set()
        self.gc_ran = threading.Condition(self.lock)

    def ack(self, writer: str, seq: int, rows: int) -> None:
        with self.lock:
            self.acked[(writer, seq)] += rows

    def note(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.failures.append(f"{where}: {type(exc).__name__}: {exc}")


def _lancetx_appender(soak: Soak, name: str) -> None:
    table = lancetx.open(soak.uri, soak.options)
    seq = 0
    while not soak.stop.is_set():
        try:
            table.append(batch(name, seq, 3))
            soak.ack(name, seq, 3)
        except LancetxError as exc:
            soak.note(name, exc)
        seq += 1


def _pylance_appender(soak: Soak, name: str) -> None:
    seq = 0
    while not soak.stop.is_set():
        try:
            lance.write_dataset(batch(name, seq, 3), soak.uri, mode="append",
                                storage_options=soak.options)  # fmt: skip
            soak.ack(name, seq, 3)
        except OSError as exc:  # pylance's own budget under load: not acknowledged
            soak.note(name, exc)
        seq += 1


def _streaming_writer(soak: Soak, name: str) -> None:
    table = lancetx.open(soak.uri, soak.options)
    seq = 0
    while not soak.stop.is_set():
        try:
            with table.writer() as writer:
                writer.write(batch(name, seq, 2))
                writer.write(batch(name, seq, 2))
                writer.commit()
            soak.ack(name, seq, 4)
        except LancetxError as exc:
            soak.note(name, exc)
        seq += 1


def _slow_job(soak: Soak, name: str) -> None:
    options = {**soak.options, "dynamodb_read_timeout": "600"}  # its claim is held
    conn = connect(soak.uri, options)
    seq = 0
    while not soak.stop.is_set():
        try:
            parent = load_parent(conn.handler, conn.base)
            assert parent is not None
            fragments = lance.fragment.write_fragments(
                batch(name, seq, 5), conn.data_uri, storage_options=options
            )
            txn = Transaction(
                read_version=parent.version,
                operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
                uuid=str(uuid.uuid4()),
            )
            with soak.lock:
                soak.slow_uuid = txn.uuid
                soak.slow_files = {
                    f"{soak.path}/data/{f.path}" for fragment in fragments for f in fragment.files
                }
            commit_transaction(conn.handler, conn.base, txn, parent=parent)
            soak.ack(name, seq, 5)
        except LancetxError as exc:
            soak.note(name, exc)
        seq += 1


def _hold_slow_claims(soak: Soak) -> Any:
    """The slow job's claim waits, its data files aged, until gc has run once more."""

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.target not in ("PutItem", "TransactWriteItems"):
            return None
        with soak.lock:
            marker, files = soak.slow_uuid, set(soak.slow_files)
            if marker is None or marker in soak.slow_held or marker.encode() not in request.body:
                return None
            if b"attribute_not_exists" not in request.body:
                return None
            soak.slow_held.add(marker)
        age_objects(soak.bucket, sorted(files), OLD)
        with soak.gc_ran:
            runs = soak.gc_runs
            soak.gc_ran.wait_for(lambda: soak.gc_runs > runs or soak.stop.is_set(), timeout=300)
            if soak.gc_runs > runs:
                soak.held += 1
        return None

    return interceptor


def _failed_tasks(soak: Soak) -> None:
    seq = 0
    while not soak.stop.wait(2.0):
        written = lance.fragment.write_fragments(
            batch("failed", seq, 2), f"s3://{soak.bucket}/{soak.path}",
            storage_options=soak.options,
        )  # fmt: skip
        keys = {f"{soak.path}/data/{f.path}" for fragment in written for f in fragment.files}
        age_objects(soak.bucket, sorted(keys), OLD)
        with soak.lock:
            soak.planted.append((time.monotonic(), keys))
        seq += 1


def _reader(soak: Soak) -> None:
    while not soak.stop.wait(0.2):
        try:
            lance.dataset(soak.uri, storage_options=soak.options).to_table()
            with soak.lock:
                soak.reads += 1
        except OSError as exc:
            with soak.lock:
                soak.reader_errors.append(str(exc))


def _gc(soak: Soak) -> None:
    ops = open_table(soak.uri, soak.options)
    while not soak.stop.wait(GC_EVERY):
        try:
            report = collect_garbage(
                ops, older_than=timedelta(0), force_unsafe_threshold=True, dry_run=False
            )
        except LancetxError as exc:
            with soak.lock:
                soak.gc_errors.append(f"{type(exc).__name__}: {exc}")
            continue
        with soak.gc_ran:
            soak.gc_runs += 1
            soak.gc_deleted |= {c.key for c in report.candidates}
            soak.gc_errors.extend(report.errors)
            soak.gc_ran.notify_all()


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(int(SOAK_SECONDS) + 600)  # a hang guard beyond the soak itself
def test_gc_every_three_seconds_beside_writers_a_slow_job_and_a_reader_loses_nothing(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    lancetx.write_table(uri, batch("first", 0, 3), storage_options=options)
    soak = Soak(legacy_aws, bucket, uri, "t.lance")
    soak.ack("first", 0, 3)
    legacy_aws.set_interceptor(_hold_slow_claims(soak))
    actors = [
        threading.Thread(target=_lancetx_appender, args=(soak, "lancetx-a")),
        threading.Thread(target=_lancetx_appender, args=(soak, "lancetx-b")),
        threading.Thread(target=_pylance_appender, args=(soak, "pylance")),
        threading.Thread(target=_streaming_writer, args=(soak, "stream")),
        threading.Thread(target=_slow_job, args=(soak, "slow")),
        threading.Thread(target=_failed_tasks, args=(soak,)),
        threading.Thread(target=_reader, args=(soak,)),
        threading.Thread(target=_gc, args=(soak,)),
    ]
    try:
        for actor in actors:
            actor.start()
        soak.stop.wait(SOAK_SECONDS)
    finally:
        soak.stop.set()
        with soak.gc_ran:
            soak.gc_ran.notify_all()
        for actor in actors:
            actor.join(timeout=600)
        legacy_aws.set_interceptor(None)
    assert not any(actor.is_alive() for actor in actors)
    print(
        f"soak {SOAK_SECONDS:.0f}s: acked {dict(Counter(w for w, _ in soak.acked))}, "
        f"gc runs {soak.gc_runs} (deleted {len(soak.gc_deleted)}), slow claims held {soak.held}, "
        f"reads {soak.reads}, failures {len(soak.failures)}"
    )

    assert soak.gc_errors == []
    assert soak.gc_runs >= 3 and soak.held >= 1, (soak.gc_runs, soak.held)
    assert not [e for e in soak.reader_errors if "not found" in e.lower()]
    assert soak.reads >= 1, soak.reader_errors
    # gc did its work: the failed tasks' files planted before its last run are gone.
    planted = set().union(*(keys for _, keys in soak.planted[:-2]))
    assert planted and planted <= soak.gc_deleted

    # pylance opens every version and reads every file they reference (each once:
    # reading ~500 versions whole took longer than the test's timeout on CI).
    _, latest = read_every_version_once(uri, options)
    rows = Counter((writer, seq) for writer, seq, _ in latest)
    assert {key: n for key, n in soak.acked.items()} == {key: rows[key] for key in soak.acked}, (
        soak.failures
    )
    writers = {writer for writer, _ in soak.acked}
    assert {"lancetx-a", "lancetx-b", "stream", "slow"} <= writers, soak.failures
    report = verify_table(open_table(uri, options), deep=True, all_versions=True)
    assert report.ok, report.findings
