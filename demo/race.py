"""lancetx-demo: concurrent Python writers on a legacy S3 bucket, made safe by DynamoDB.

Starts an embedded moto server (S3 + DynamoDB on 127.0.0.1, fake credentials)
whose S3 silently ignores ``If-None-Match`` — the kind of store lancetx exists
for — then:

1. creates the Lance-layout DynamoDB table and a Lance table (pylance,
   ``s3+ddb://``);
2. runs lancetx writer threads and a pylance writer appending at the same time,
   every commit claimed through DynamoDB;
3. checks with pylance that the history is linear (versions 1..N, no gap) and
   that every acknowledged append is there;
4. prints the versions as lancetx's own reader sees them.

``--external`` runs the same workload on the S3 and DynamoDB that the
environment points at (e.g. LocalStack + dynalite, see ``localstack/``),
configured by environment variables alone. Run ``lancetx-demo --help`` (or
``python -m lancetx.demo.race --help``) for the knobs. ``make demo`` is
the Spark version of this race (:mod:`lancetx.demo.spark`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import boto3
import lance
import pyarrow as pa

from lancetx.commit.engine.committer import Committed, Parent, commit_transaction, load_parent
from lancetx.commit.engine.operations import Append, Transaction
from lancetx.commit.errors import MissingExtraError
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.format.manifest import data_file_signature, serialized_for_pylance
from lancetx.commit.format.snapshot import load_snapshot
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.config import make_client as make_ddb_client
from lancetx.externalstore.dynamodb.store import create_table

BUCKET = "lancetx-demo"
DDB_TABLE = "lancetx_demo_manifests"


@dataclass
class Tally:
    """Acknowledged appends, by writer."""

    rows: dict[str, int] = field(default_factory=dict)
    commits: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, writer: str, rows: int) -> None:
        with self.lock:
            self.rows[writer] = self.rows.get(writer, 0) + rows
            self.commits[writer] = self.commits.get(writer, 0) + 1


def batch(writer: str, seq: int, rows: int) -> pa.Table:
    """``rows`` rows tagged with the writer and its append number."""
    return pa.table(
        {
            "writer": pa.array([writer] * rows, pa.string()),
            "seq": pa.array([seq] * rows, pa.int64()),
            "value": pa.array([float(i) for i in range(rows)], pa.float64()),
        }
    )


#: pylance datasets that write data files, by (data URI, data-file signature).
_writers: dict[tuple[str, bytes], lance.LanceDataset] = {}
_writers_lock = threading.Lock()


def data_writer(conn: TableConnection, parent: Parent | Committed) -> lance.LanceDataset:
    """A pylance dataset to write ``parent``'s next data files with.

    Handing ``write_fragments`` a URI makes pylance open the table itself (LIST of
    ``_versions/`` and a manifest GET) before it writes. Data files depend only on the
    schema and data format (:func:`data_file_signature`), so one dataset, opened from
    the manifest already in hand (one HEAD), serves every later version with the same
    signature: back-to-back appends send nothing but the data file PUT."""
    manifest = parent.manifest
    key = (conn.data_uri, data_file_signature(manifest.manifest))
    with _writers_lock:
        found = _writers.get(key)
    if found is not None:
        return found
    ds = lance.LanceDataset(
        conn.data_uri,
        version=parent.version,
        storage_options=conn.storage_options or None,
        serialized_manifest=serialized_for_pylance(manifest),
    )
    with _writers_lock:
        if len(_writers) >= 64:  # schema changes are rare; drop the oldest
            _writers.pop(next(iter(_writers)))
        return _writers.setdefault(key, ds)


def lancetx_append(
    conn: TableConnection, data: pa.Table, parent: Parent | Committed | None
) -> Committed:
    """Write data files with pylance, commit the Append with lancetx."""
    if parent is None:
        parent = load_parent(conn.handler, conn.base)
        if parent is None:
            raise RuntimeError(f"table {conn.uri} does not exist")
    fragments = lance.fragment.write_fragments(
        data, data_writer(conn, parent), storage_options=conn.storage_options
    )
    txn = Transaction(
        read_version=parent.version,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        properties={"writer": "lancetx-demo"},
    )
    return commit_transaction(conn.handler, conn.base, txn, parent=parent)


def lancetx_writer(conn: TableConnection, name: str, appends: int, rows: int, tally: Tally) -> None:
    """Append ``appends`` batches with lancetx, each commit the parent of the next."""
    parent: Parent | Committed | None = None
    for seq in range(appends):
        parent = lancetx_append(conn, batch(name, seq, rows), parent)
        tally.add(name, rows)


def pylance_writer(
    uri: str, options: dict[str, str], name: str, appends: int, rows: int, tally: Tally
) -> None:
    """Append ``appends`` batches with pylance through the same ``s3+ddb://`` table."""
    for seq in range(appends):
        lance.write_dataset(batch(name, seq, rows), uri, mode="append", storage_options=options)
        tally.add(name, rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0 when the history is linear and every acknowledged row is present."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--lancetx-writers", type=int, default=4, help="concurrent lancetx writer threads"
    )
    parser.add_argument(
        "--pylance-writers", type=int, default=1, help="concurrent pylance writer threads"
    )
    parser.add_argument("--appends", type=int, default=5, help="appends per writer")
    parser.add_argument("--rows", type=int, default=100, help="rows per append")
    parser.add_argument(
        "--external",
        action="store_true",
        help="use the S3 and DynamoDB the environment points at (AWS_ENDPOINT_URL_S3, "
        "DYNAMODB_ENDPOINT, AWS_ALLOW_HTTP, credentials) instead of the embedded server",
    )
    parser.add_argument("--bucket", default=BUCKET, help="bucket (created if absent)")
    parser.add_argument("--ddb-table", default=DDB_TABLE, help="DynamoDB table (created if absent)")
    args = parser.parse_args(argv)

    if args.external:
        return _external(args)
    try:
        server = EmbeddedAws(legacy_s3=True).start()
    except MissingExtraError as missing:
        print(f"lancetx-demo: {missing}", file=sys.stderr)
        return 2
    with server as aws:
        print(f"embedded S3 + DynamoDB (moto) at {aws.endpoint}; S3 ignores If-None-Match (legacy)")
        boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket=args.bucket)
        create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), args.ddb_table)
        uri = f"s3+ddb://{args.bucket}/events.lance?ddbTableName={args.ddb_table}"
        return workload(uri, aws.pylance_storage_options(), args)


def _external(args: argparse.Namespace) -> int:
    """Set up on the servers the environment names; every setting comes from it."""
    ddb_config = DynamoDBConfig.from_options({})
    s3 = boto3.client("s3")
    print(
        f"S3 at {s3.meta.endpoint_url}, DynamoDB at {ddb_config.endpoint_url or 'AWS'} "
        "(from the environment)"
    )
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=args.bucket)
    create_table(make_ddb_client(ddb_config), args.ddb_table)
    # A fresh table each run, so the history check sees only this run's commits.
    uri = (
        f"s3+ddb://{args.bucket}/events-{uuid.uuid4().hex[:8]}.lance?ddbTableName={args.ddb_table}"
    )
    return workload(uri, {}, args)


def workload(uri: str, options: dict[str, str], args: argparse.Namespace) -> int:
    """Concurrent lancetx and pylance appends to the new table ``uri``, then the checks."""
    print(f"table {uri}")
    lance.write_dataset(batch("setup", 0, args.rows), uri, storage_options=options)
    tally = Tally()
    tally.add("setup", args.rows)
    conn = connect(uri, options)

    threads = [
        threading.Thread(
            target=lancetx_writer, args=(conn, f"lancetx-{i}", args.appends, args.rows, tally)
        )
        for i in range(args.lancetx_writers)
    ] + [
        threading.Thread(
            target=pylance_writer,
            args=(uri, options, f"pylance-{i}", args.appends, args.rows, tally),
        )
        for i in range(args.pylance_writers)
    ]
    started = time.perf_counter()
    errors: list[BaseException] = []

    def guarded(thread: threading.Thread) -> None:
        try:
            thread.run()
        except BaseException as exc:  # report every writer's failure, not just the first
            errors.append(exc)

    runners = [threading.Thread(target=guarded, args=(t,)) for t in threads]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join()
    elapsed = time.perf_counter() - started
    if errors:
        for exc in errors:
            print(f"writer failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1

    commits = sum(tally.commits.values())
    print(f"{commits} commits from {len(threads) + 1} writers in {elapsed:.2f}s")
    ds = lance.dataset(uri, storage_options=options)
    versions = [v["version"] for v in ds.versions()]
    expected_rows = sum(tally.rows.values())
    linear = versions == list(range(1, commits + 1))
    complete = ds.count_rows() == expected_rows
    print(f"pylance sees versions 1..{max(versions)}: {'linear, no gap' if linear else versions}")
    print(
        f"pylance counts {ds.count_rows()} rows; acknowledged {expected_rows}: {'all present' if complete else 'LOST ROWS'}"
    )

    print("\nversion  operation  committed by  rows")
    for location in conn.handler.list_versions(conn.base, 0):
        snap = load_snapshot(conn.handler.store, conn.base, location)
        txn = snap.transaction()
        op = txn.WhichOneof("operation") if txn is not None else "?"
        writer = snap.manifest.writer_version.library
        print(f"{snap.version:>7}  {op:<9}  {writer:<12}  {snap.num_rows}")
    return 0 if linear and complete else 1


if __name__ == "__main__":
    sys.exit(main())
