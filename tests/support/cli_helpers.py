"""Running ``lancetx-sync`` as users do (a subprocess), and the table states it repairs."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import boto3
import lance
from protocol_helpers import batch, ddb_uri, ensure_ddb_table, pylance_append, pylance_create

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.stdout)
        return document


#: The ``lancetx-sync`` console script of the interpreter running the tests.
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "lancetx-sync")


def run_cli(
    aws: EmbeddedAws,
    *args: str,
    via_env: bool = True,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    console_script: bool = False,
) -> CliResult:
    """``python -m lancetx.cli ARGS`` (or the ``lancetx-sync`` console script) against the
    embedded server, its stdout and stderr pipes (not a terminal).

    ``via_env`` points the CLI at the server through environment variables (as
    a user's shell would); otherwise through ``-o`` storage options after the args.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DYNAMODB_"))}
    env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    command = (
        [CONSOLE_SCRIPT, *args] if console_script else [sys.executable, "-m", "lancetx.cli", *args]
    )
    if via_env:
        env.update(aws.environ())
    else:
        env["AWS_DEFAULT_REGION"] = "us-east-1"
        for key, value in aws.pylance_storage_options().items():
            command += ["-o", f"{key}={value}"]
    env.update(extra_env or {})
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    return CliResult(done.returncode, done.stdout, done.stderr)


def run_cli_on_pty(
    aws: EmbeddedAws, *args: str, extra_env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; return (code, output)."""
    env = {**os.environ, **aws.environ(), "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    env.update(extra_env or {})
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "lancetx.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    os.close(master)
    return process.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


@dataclass
class DdbTable:
    """A pylance table committed through DynamoDB."""

    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    path: str
    uri: str
    options: dict[str, str]

    @property
    def s3(self) -> Any:
        return boto3.client("s3", **self.aws.client_kwargs())

    @property
    def ddb(self) -> Any:
        return boto3.client("dynamodb", **self.aws.client_kwargs())

    def objects(self, folder: str = "") -> list[str]:
        prefix = f"{self.path}/{folder}"
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def items(self) -> list[dict[str, Any]]:
        found = self.ddb.query(
            TableName=self.ddb_table,
            KeyConditionExpression="base_uri = :b",
            ExpressionAttributeValues={":b": {"S": self.path}},
            ConsistentRead=True,
        )["Items"]
        return sorted(found, key=lambda i: int(i["version"]["N"]))


def make_table(
    aws: EmbeddedAws, bucket: str, ddb_table: str, path: str = "t.lance", versions: int = 2
) -> DdbTable:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table)
    uri = ddb_uri(bucket, path, ddb_table)
    pylance_create(uri, options, batch("w", 0, 5))
    for seq in range(1, versions):
        pylance_append(uri, options, batch("w", seq, 5))
    return DdbTable(aws, bucket, ddb_table, path, uri, options)


def read_versions(
    uri: str, options: Mapping[str, str], versions: Sequence[int] | None = None
) -> dict[int, list[tuple[Any, ...]]]:
    """Every version pylance lists (or ``versions``) → its rows, sorted."""
    ds = lance.dataset(uri, storage_options=dict(options))
    wanted = versions if versions is not None else [v["version"] for v in ds.versions()]
    out: dict[int, list[tuple[Any, ...]]] = {}
    for version in wanted:
        table = lance.dataset(uri, version=version, storage_options=dict(options)).to_table()
        columns = [table.column(name).to_pylist() for name in table.column_names]
        out[version] = sorted(zip(*columns, strict=True))
    return out


def read_every_version_once(
    uri: str, options: Mapping[str, str]
) -> tuple[int, list[tuple[Any, ...]]]:
    """pylance opens every version and reads each fragment the versions reference once
    (a missing or unreadable file raises); returns how many versions there are and the
    latest version's rows, sorted.

    For long histories: a version shares most of its fragments with the one before, so
    reading each version whole costs the square of the history's length; this costs
    its length."""
    ds = lance.dataset(uri, storage_options=dict(options))
    numbers = [v["version"] for v in ds.versions()]
    read: set[tuple[Any, ...]] = set()
    for number in numbers:
        view = lance.dataset(uri, version=number, storage_options=dict(options))
        for fragment in view.get_fragments():
            meta = fragment.metadata
            deletion = meta.deletion_file
            key = (
                tuple(f.path for f in meta.files),
                None if deletion is None else deletion.path(fragment.fragment_id),
            )
            if key not in read:
                fragment.to_table()
                read.add(key)
    latest = lance.dataset(uri, version=max(numbers), storage_options=dict(options)).to_table()
    columns = [latest.column(name).to_pylist() for name in latest.column_names]
    return len(numbers), sorted(zip(*columns, strict=True))


def claim_lands_and_staged_vanishes(aws: EmbeddedAws, bucket: str, fired: list[str]) -> Any:
    """An interceptor: the first claim lands, its writer sees a 500, and its staged
    manifest is removed — what pylance does when it takes the lost answer for a lost race."""
    s3 = boto3.client("s3", **aws.client_kwargs())

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if fired or request.target != "PutItem" or b"attribute_not_exists" not in request.body:
            return None
        staged = json.loads(request.body)["Item"]["path"]["S"]
        fired.append(staged)
        s3.delete_object(Bucket=bucket, Key=staged)
        body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"})
        return InterceptedResponse(
            500,
            body.encode(),
            [("Content-Type", "application/x-amz-json-1.0")],
            after_forwarding=True,
        )

    return interceptor


def wedge_with_pylance(table: DdbTable) -> tuple[str, str]:
    """Append with pylance so that its claim lands and its staged manifest is gone.
    Returns (the lost transaction file's key, the staged manifest the item points at)."""
    before = set(table.objects("_transactions/"))
    fired: list[str] = []
    table.aws.set_interceptor(claim_lands_and_staged_vanishes(table.aws, table.bucket, fired))
    try:
        pylance_append(table.uri, table.options, batch("lost", 0, 3))
    except OSError:
        pass  # pylance cannot tell what happened to its commit
    finally:
        table.aws.set_interceptor(None)
    assert len(fired) == 1
    (lost,) = set(table.objects("_transactions/")) - before
    return lost, fired[0]


def access_denied(target: str) -> Any:
    """An interceptor refusing DynamoDB ``target`` (e.g. ``DeleteItem``) with AccessDenied."""

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.service != "dynamodb" or request.target != target:
            return None
        body = json.dumps(
            {
                "__type": "com.amazon.coral.service#AccessDeniedException",
                "message": f"User is not authorized to perform: dynamodb:{target}",
            }
        )
        return InterceptedResponse(
            400, body.encode(), [("Content-Type", "application/x-amz-json-1.0")]
        )

    return interceptor


def age_objects(bucket: str, keys: Sequence[str], by: timedelta) -> None:
    """Make objects of the embedded server look ``by`` older (their Last-Modified):
    gc's age threshold can then stay far above any commit's duration in a fast test."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    for key in keys:
        stored = backend.get_object(bucket, key)
        assert stored is not None, key
        stored.last_modified = stored.last_modified - by
