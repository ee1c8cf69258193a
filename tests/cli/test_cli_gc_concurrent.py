"""gc and cleanup racing four writers: no file a committed version references is deleted.

Four writers commit for the whole test — two through lancetx, two through
pylance's ``s3+ddb://`` (one of them deleting its previous append, so old
versions hold files newer ones do not) — while ``lancetx-sync gc --delete`` and
``lancetx-sync cleanup`` run as subprocesses, twice each. Afterwards pylance
opens and reads every version that still exists, and every acknowledged row
is in the latest one. gc's threshold is an hour, as it must exceed any
writer's commit duration; the garbage planted for it is aged two hours on the
embedded server.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import lance
import pytest
from cli_helpers import age_objects, make_table, read_versions, run_cli
from protocol_helpers import batch, lancetx_append, pylance_append

from lancetx.commit.engine.committer import Committed
from lancetx.commit.errors import LancetxError
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table

#: gc's threshold, far above any commit's duration; the planted garbage is aged past it.
GC_AGE = timedelta(hours=1)


@pytest.mark.slow
def test_gc_and_cleanup_racing_four_writers_delete_nothing_a_version_references(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name, versions=1)
    options = table.options
    lance.fragment.write_fragments(  # a failed task's files: gc's to delete
        batch("failed", 0, 4), f"s3://{bucket}/{table.path}", storage_options=options
    )
    planted = set(table.objects("data/")) - {
        f"{table.path}/data/{f.path}"
        for fragment in lance.dataset(table.uri, storage_options=options).get_fragments()
        for f in fragment.metadata.files
    }
    age_objects(bucket, sorted(planted), 2 * GC_AGE)
    stop = threading.Event()
    acked: set[tuple[str, int]] = set()
    deleted: set[tuple[str, int]] = set()
    lock = threading.Lock()
    failures: list[str] = []

    def lancetx_writer(name: str) -> None:
        conn = connect(table.uri, options)
        parent: Committed | None = None
        seq = 0
        while not stop.is_set():
            try:
                parent = lancetx_append(
                    conn.handler, conn.base, conn.data_uri, options, batch(name, seq, 3), parent
                )
            except LancetxError as exc:  # e.g. a version it read was cleaned up: retry fresh
                parent = None
                failures.append(f"{name}: {exc}")
                continue
            with lock:
                acked.add((name, seq))
            seq += 1

    def pylance_writer(name: str, delete_previous: bool) -> None:
        seq = 0
        while not stop.is_set():
            try:
                pylance_append(table.uri, options, batch(name, seq, 3))
                with lock:
                    acked.add((name, seq))
                if delete_previous and seq > 0:
                    ds = lance.dataset(table.uri, storage_options=options)
                    ds.delete(f"writer = '{name}' AND seq = {seq - 1}")
                    with lock:
                        deleted.add((name, seq - 1))
            except OSError as exc:
                failures.append(f"{name}: {exc}")
            seq += 1

    threads = [
        threading.Thread(target=lancetx_writer, args=("lancetx-a",)),
        threading.Thread(target=lancetx_writer, args=("lancetx-b",)),
        threading.Thread(target=pylance_writer, args=("pylance-c", False)),
        threading.Thread(target=pylance_writer, args=("pylance-d", True)),
    ]
    for thread in threads:
        thread.start()
    runs = []
    deadline = time.monotonic() + 60
    try:
        while len(acked) < 4 and time.monotonic() < deadline:  # writers under way
            time.sleep(0.1)
        for _ in range(2):
            runs.append(
                run_cli(legacy_aws, "gc", table.uri, "--older-than", "1h", "--delete", "--json")
            )
            runs.append(run_cli(legacy_aws, "cleanup", table.uri, "--keep-versions", "4", "--json"))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    for run in runs:
        assert run.code == 0, run.stdout + run.stderr

    gcs, cleanups = [r.json for r in runs[0::2]], [r.json for r in runs[1::2]]
    assert planted <= {c["key"] for g in gcs for c in g["candidates"]}  # gc had work to do...
    assert not planted & set(table.objects("data/"))
    assert any(c["removed_versions"] for c in cleanups)  # ...and so had cleanup
    assert any(c["files_deleted"] for c in cleanups)
    assert len(acked) >= 8, failures

    versions = read_versions(table.uri, options)  # opens and reads every remaining version
    latest = versions[max(versions)]
    present = {(writer, seq) for writer, seq, _ in latest}
    assert (acked - deleted) <= present
    report = verify_table(open_table(table.uri, options), deep=True, all_versions=True)
    assert report.ok, report.findings
    # What remains unreferenced now is only what the writers' failed attempts left.
    leftover = collect_garbage(
        open_table(table.uri, options),
        older_than=GC_AGE,
        now=datetime.now(UTC) + 2 * GC_AGE,
    )
    assert not planted & {c.key for c in leftover.candidates}
