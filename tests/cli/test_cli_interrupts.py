"""An impatient operator: Ctrl-C and kill -9 in the middle of ``gc --delete`` and ``cleanup``.

The CLI runs as a subprocess against the embedded server; the server's interceptor
counts the command's deletions and interrupts it (SIGINT or SIGKILL, found from the
connection's client port) at a chosen one, letting that request through. Afterwards
the table must open in pylance at every version that still exists, the command must
have stopped (Ctrl-C means stop, not "finish every deletion queued"), and the next
run must finish the job.

Found this way: Ctrl-C, in ``gc``/``cleanup`` as in every command, exited 130 without a
word (typer's handling): the operator could not tell a finished run from one cut
short. It now says it stopped part-way and how to finish.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from datetime import timedelta

import boto3
import lance
import pytest
from claim_faults import check_every_version_opens, pid_of_client
from cli_helpers import DdbTable, age_objects, make_table, read_versions, run_cli
from protocol_helpers import batch

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse
from lancetx.ops.inventory import PARALLELISM

#: The CLI's deletions before the interrupt arrives.
INTERRUPT_AT = 3


class InterruptAtDelete:
    """The server's interceptor: the ``nth`` S3 DELETE under ``bucket/prefix`` goes
    through, then its sender gets ``signum``; every later one is refused (AccessDenied),
    so what was deleted does not depend on how soon the command sees the signal. Every
    DELETE under ``bucket/prefix`` is counted, and those let through are recorded."""

    def __init__(self, bucket: str, prefix: str, nth: int, signum: int) -> None:
        self.path = f"/{bucket}/{prefix}"
        self.nth = nth
        self.signum = signum
        self.deletes: list[str] = []
        self.through: list[str] = []
        self.after: list[str] = []
        self.fired = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service != "s3" or request.method != "DELETE":
            return None
        if not request.path.startswith(self.path):
            return None
        with self._lock:
            self.deletes.append(request.path)
            if self.fired.is_set():
                self.after.append(request.path)
                return InterceptedResponse(
                    403,
                    b"<Error><Code>AccessDenied</Code><Message>after the interrupt"
                    b"</Message></Error>",
                    [("Content-Type", "application/xml")],
                )
            if len(self.deletes) >= self.nth:
                pid = pid_of_client(request.client_port, request.server_port)
                assert pid is not None and pid != os.getpid(), (pid, request)
                os.kill(pid, self.signum)
                self.fired.set()
            self.through.append(request.path)
        return None

    def deleted(self) -> set[str]:
        """Bucket-relative keys the server deleted (the first ``nth``)."""
        return {p.lstrip("/").partition("/")[2] for p in self.through}


def cli(aws: EmbeddedAws, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DYNAMODB_"))}
    env.update(aws.environ())
    return subprocess.Popen(
        [sys.executable, "-m", "lancetx.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def every_listed_version_opens(table: DdbTable) -> dict[int, int]:
    """Open (and read whole) every version pylance lists: rows per version. Unlike
    :func:`check_every_version_opens` the oldest versions may be gone (cleanup's)."""
    latest = lance.dataset(table.uri, storage_options=table.options)
    rows: dict[int, int] = {}
    for info in latest.versions():
        version = int(info["version"])
        rows[version] = (
            lance.dataset(table.uri, version=version, storage_options=table.options)
            .to_table()
            .num_rows
        )
    listed = sorted(rows)
    assert listed == list(range(listed[0], latest.version + 1)), listed
    return rows


def overwritten_table(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, versions: int
) -> DdbTable:
    """``versions`` versions, each an overwrite: every version but the latest has data
    files of its own, which cleanup deletes."""
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    for seq in range(1, versions):
        lance.write_dataset(
            batch("w", seq, 5), table.uri, mode="overwrite", storage_options=table.options
        )
    return table


def plant_garbage(table: DdbTable, count: int) -> list[str]:
    """``count`` orphan data files (a failed job's), aged a day."""
    s3 = boto3.client("s3", **table.aws.client_kwargs())
    keys = [f"{table.path}/data/orphan-{i:03d}-{uuid.uuid4()}.lance" for i in range(count)]
    for key in keys:
        s3.put_object(Bucket=table.bucket, Key=key, Body=b"x" * 10)
    age_objects(table.bucket, keys, timedelta(days=1))
    return keys


@pytest.mark.slow  # two CLI processes each
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "kill"])
def test_gc_delete_interrupted_stops_and_the_next_run_finishes(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, signum: int
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=3)
    before = read_versions(table.uri, table.options)
    garbage = plant_garbage(table, 3 * PARALLELISM)
    fault = InterruptAtDelete(table.bucket, f"{table.path}/data/", INTERRUPT_AT, signum)
    aws.set_interceptor(fault)
    try:
        process = cli(aws, "gc", table.uri, "--older-than", "1h", "--delete")
        _, stderr = process.communicate(timeout=300)
    finally:
        aws.set_interceptor(None)
    assert fault.fired.is_set()
    assert process.returncode != 0, stderr
    left = [k for k in garbage if k in set(table.objects("data/"))]
    assert set(left) == set(garbage) - fault.deleted()
    if signum == signal.SIGINT:
        assert "Traceback" not in stderr, stderr[-2000:]
        assert "interrupted" in stderr, stderr[-2000:]
    check_every_version_opens(table.uri, table.options)
    assert read_versions(table.uri, table.options) == before

    again = run_cli(aws, "gc", table.uri, "--older-than", "1h", "--delete", "--json")
    assert again.code == 0, again.stdout + again.stderr
    assert {c["key"] for c in again.json["candidates"]} == set(left)
    assert not set(garbage) & set(table.objects("data/"))
    assert read_versions(table.uri, table.options) == before


@pytest.mark.slow  # three CLI processes each
@pytest.mark.parametrize(
    ("folder", "signum"),
    [("_versions/", signal.SIGKILL), ("data/", signal.SIGINT)],
    ids=["versions-kill", "data-sigint"],
)
def test_cleanup_interrupted_leaves_a_readable_table_and_the_next_run_finishes(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, signum: int, folder: str
) -> None:
    """Interrupted while deleting manifests (oldest first), or files."""
    table = overwritten_table(aws, bucket, ddb_table_name, versions=8)
    latest = read_versions(table.uri, table.options, [8])
    fault = InterruptAtDelete(table.bucket, f"{table.path}/{folder}", INTERRUPT_AT, signum)
    aws.set_interceptor(fault)
    try:
        process = cli(aws, "cleanup", table.uri, "--keep-versions", "2")
        _, stderr = process.communicate(timeout=300)
    finally:
        aws.set_interceptor(None)
    assert fault.fired.is_set(), (process.returncode, fault.deletes, stderr[-3000:])
    assert process.returncode != 0, stderr
    # cleanup deletes one object at a time, on the thread the signal interrupts:
    # nothing is sent after it.
    assert fault.after == [], stderr[-2000:]
    if signum == signal.SIGINT:
        assert "Traceback" not in stderr, stderr[-2000:]
        assert "interrupted" in stderr, stderr[-2000:]
    rows = every_listed_version_opens(table)
    assert max(rows) == 8 and read_versions(table.uri, table.options, [8]) == latest
    verified = run_cli(aws, "verify", table.uri, "--json")
    assert verified.code == 0, verified.stdout

    again = run_cli(aws, "cleanup", table.uri, "--keep-versions", "2", "--json")
    assert again.code == 0, again.stdout + again.stderr
    remaining = [
        v["version"] for v in lance.dataset(table.uri, storage_options=table.options).versions()
    ]
    assert remaining == [7, 8], remaining
    assert read_versions(table.uri, table.options, [8]) == latest
    # What the interrupted run had unlinked but not deleted is gc's (files no version
    # references): aged past gc's threshold, it goes, and nothing a version needs.
    age_objects(bucket, table.objects(), timedelta(days=1))
    swept = run_cli(aws, "gc", table.uri, "--older-than", "1h", "--delete", "--json")
    assert swept.code == 0, swept.stdout + swept.stderr
    assert read_versions(table.uri, table.options, [8]) == latest
    assert run_cli(aws, "verify", table.uri, "--deep").code == 0
