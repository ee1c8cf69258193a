"""A long-lived worker process of the randomized history harness (``history_harness``).

Started once (through a fork server that has imported everything below) and fed
jobs over a pipe: create a table, write as one actor (lancetx sync, lancetx
async, pylance), read/finalize, or check a finished history with pylance alone.
Every acknowledged commit is reported the moment it returns, so a writer killed
with SIGKILL later has reported exactly the commits it acknowledged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import sys
from multiprocessing.connection import Connection
from typing import Any

import boto3
import lance
import pyarrow as pa
from protocol_helpers import FAST_COMMIT, batch, lancetx_append

from lancetx.commit.engine.builder import build_manifest
from lancetx.commit.engine.committer import Committed, load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.manifest import decode_manifest, encode_manifest
from lancetx.commit.format.naming import transaction_key
from lancetx.commit.format.transaction_file import transaction_file_name
from lancetx.commit.handlers.interface import VersionAlreadyExistsError
from lancetx.commit.storage.s3store import S3Config
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.externalstore.commit_handler import AsyncExternalStoreCommitHandler
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb import DynamoDBConfig
from lancetx.externalstore.dynamodb_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.uri import parse_ddb_uri

ASYNC_ATTEMPTS = 60


def serve(conn: Connection) -> None:
    """Answer jobs until the pipe closes. Every job ends with one ``{"done": True}``."""
    # Pylance's and our logs must not reach the parent's terminal as noise.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    while True:
        try:
            job: dict[str, Any] = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = JOBS[job["job"]](job, conn)
        except BaseException as exc:  # reported, the worker lives on
            result = {"error": _describe(exc)}
        conn.send({"done": True, **result})


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


_CLIENTS: dict[tuple[str, str], Any] = {}


def _client(service: str, endpoint: str) -> Any:
    key = (service, endpoint)
    if key not in _CLIENTS:
        _CLIENTS[key] = boto3.client(
            service,
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
    return _CLIENTS[key]


def _init(job: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """Version 1 of a new table: a copy of the template table (its objects, and its
    item rewritten for the new path) — four requests instead of a whole write."""
    template = job["template"]
    s3 = _client("s3", job["endpoint"])
    old, new = template["base"], job["base"]
    for key in template["objects"]:
        s3.copy_object(
            Bucket=job["bucket"],
            Key=new + key[len(old) :],
            CopySource={"Bucket": job["bucket"], "Key": key},
        )
    item = dict(template["item"])
    item["base_uri"] = {"S": new}
    item["path"] = {"S": new + item["path"]["S"][len(old) :]}
    _client("dynamodb", job["endpoint"]).put_item(TableName=job["ddb_table"], Item=item)
    return {"version": 1}


def _write(job: dict[str, Any], conn: Connection) -> dict[str, Any]:
    errors: list[str] = []
    role = job["role"]
    if role == "async":
        asyncio.run(_write_async(job, conn, errors))
        return {"errors": errors}
    parent: Committed | None = None
    handler_conn = connect(job["uri"], job["options"]) if role == "lancetx" else None
    for seq in job["appends"]:
        data = batch(job["actor"], seq, 1)
        try:
            if handler_conn is None:
                ds = lance.write_dataset(
                    data, job["uri"], mode="append", storage_options=job["options"]
                )
                version = int(ds.version)
            else:
                parent = lancetx_append(
                    handler_conn.handler,
                    handler_conn.base,
                    handler_conn.data_uri,
                    job["options"],
                    data,
                    parent,
                    FAST_COMMIT,
                )
                version = parent.version
        except Exception as exc:
            errors.append(_describe(exc))
            parent = None  # reopen: the table moved on, or our outcome is unknown
            continue
        conn.send({"ack": seq, "version": version})
    return {"errors": errors}


async def _write_async(job: dict[str, Any], conn: Connection, errors: list[str]) -> None:
    """Appends through the asyncio handler: resolve the latest version, build on it,
    claim; a lost claim builds again on the new latest (appends never conflict)."""
    options: dict[str, str] = job["options"]
    parsed = parse_ddb_uri(job["uri"])
    bucket = parsed.s3_uri[len("s3://") :].split("/", 1)[0]
    base = parsed.base_key
    async with (
        AsyncS3ObjectStore(bucket, config=S3Config.from_options(options), legacy=True) as store,
        AsyncDynamoDBManifestStore.open(
            parsed.table_name, DynamoDBConfig.from_options(options)
        ) as entries,
    ):
        handler = AsyncExternalStoreCommitHandler(store, entries)
        for seq in job["appends"]:
            try:
                version = await _append_async(
                    handler, store, base, parsed.s3_uri, options, batch(job["actor"], seq, 1)
                )
            except Exception as exc:
                errors.append(_describe(exc))
                continue
            conn.send({"ack": seq, "version": version})


async def _append_async(
    handler: AsyncExternalStoreCommitHandler,
    store: AsyncS3ObjectStore,
    base: str,
    data_uri: str,
    options: dict[str, str],
    data: pa.Table,
) -> int:
    files = lance.fragment.write_fragments(data, data_uri, storage_options=options)
    fragments = tuple(fragment_from_pylance(f) for f in files)
    for _ in range(ASYNC_ATTEMPTS):
        latest = await handler.resolve_latest(base)
        assert latest is not None, "the table has no version"
        try:
            raw = await store.get(latest.key)
        except ObjectNotFoundError:
            if latest.alternate_key is None:
                raise
            raw = await store.get(latest.alternate_key)
        parent = decode_manifest(raw, path=store.uri(latest.key))
        txn = Transaction(read_version=latest.version, operation=Append(fragments=fragments))
        txn_pb = txn.to_proto()
        name = transaction_file_name(txn_pb)
        built = build_manifest(
            parent.manifest,
            parent.indices or [],
            txn_pb,
            version=latest.version + 1,
            transaction_file=name,
        )
        await store.put(transaction_key(base, name), txn_pb.SerializeToString())
        encoded = encode_manifest(
            built.manifest, indices=list(built.indices) or None, transaction=txn_pb
        )
        try:
            location = await handler.commit(base, latest.version + 1, encoded, latest.scheme)
        except VersionAlreadyExistsError:
            with contextlib.suppress(Exception):
                await store.delete(transaction_key(base, name))
            continue
        return location.version
    raise RuntimeError(f"async append lost {ASYNC_ATTEMPTS} races in a row")


def _read(job: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """A reader that finalizes what it finds (lancetx), then reads through pylance."""
    errors: list[str] = []
    try:
        opened = connect(job["uri"], job["options"])
        parent = load_parent(opened.handler, opened.base)
        opened.handler.list_versions(opened.base, 0)
        conn.send({"read": parent.version if parent else 0})
    except Exception as exc:
        errors.append(_describe(exc))
    return {"errors": errors}


def _check(job: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """pylance alone: a fresh writer commits next; versions contiguous; every version
    opens; the rows of the latest version by (writer, seq)."""
    uri, options = job["uri"], job["options"]
    try:
        fresh = lance.write_dataset(
            batch("fresh", 0, 1), uri, mode="append", storage_options=options
        )
    except Exception as exc:
        return {"wedged": _describe(exc)}
    ds = lance.dataset(uri, storage_options=options)
    versions = sorted(int(v["version"]) for v in ds.versions())
    unopenable: list[str] = []
    # Version 1 is the template's; listing the versions read every manifest once.
    # Opening goes through the DynamoDB item, which is what writers and readers follow.
    for version in versions[1:-1]:
        try:
            ds.checkout_version(version).count_rows()
        except Exception as exc:
            unopenable.append(f"v{version}: {_describe(exc)}")
    table = ds.to_table(columns=["writer", "seq"])
    rows = collections.Counter(
        f"{w}/{s}"
        for w, s in zip(table["writer"].to_pylist(), table["seq"].to_pylist(), strict=True)
    )
    return {
        "fresh": int(fresh.version),
        "latest": int(ds.version),
        "versions": versions,
        "unopenable": unopenable,
        "rows": dict(rows),
    }


def _warm(job: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """A fresh process's first pylance and boto3 calls are slow (runtimes, SDK
    setup): pay for them before the worker is handed a history."""
    lance.dataset(job["uri"], storage_options=job["options"]).count_rows()
    opened = connect(job["uri"], job["options"])
    load_parent(opened.handler, opened.base)
    _client("s3", job["options"]["aws_endpoint"])
    _client("dynamodb", job["options"]["aws_endpoint"])
    return {}


JOBS = {"warm": _warm, "init": _init, "write": _write, "read": _read, "check": _check}
