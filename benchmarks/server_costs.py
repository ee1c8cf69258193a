"""What one request costs the embedded server, by kind (its CPU, not the client's).

The embedded moto server answers one request at a time, in this process; a
client in a spawned process sends ``--requests`` requests of one kind at a
time, and this process's ``time.process_time`` over each batch (it only serves
meanwhile) divided by the batch is the server's CPU per request. Items look
like lancetx's claimed entries (ten attributes, the queue ticket and stamp
included); objects are 3 KiB, like a small manifest.

What it shows (``benchmarks/README.md``, issue 25): every item a read returns
costs the server more than the request around it, so the waiters of a commit
queue, which each read every claim once, cost it in proportion to their number.

Run: ``python benchmarks/server_costs.py [--requests 150]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from lancetx.demo.embedded import EmbeddedAws

TABLE = "costs"
BUCKET = "server-costs"
BASE = "s3://server-costs/t.lance"


def _item(version: int, handover: bool = False) -> dict[str, Any]:
    item: dict[str, Any] = {
        "base_uri": {"S": BASE},
        "version": {"N": str(version)},
        "path": {"S": f"{BASE}/_versions/{version}.manifest"},
        "size": {"N": "3000"},
        "committer": {"S": "lancetx"},
        "txn_operation": {"S": "Append"},
        "txn_uuid": {"S": "0" * 36},
        "queue_ticket": {"N": str(version)},
        "claimed_at": {"N": "1700000000123"},
    }
    if handover:
        item["lancetx_manifest"] = {"B": os.urandom(3000)}
    return item


def _key(version: int) -> dict[str, Any]:
    return {"base_uri": {"S": BASE}, "version": {"N": str(version)}}


def _client(endpoint: str, requests: int, conn: Connection) -> None:
    import boto3

    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    from lancetx.externalstore.dynamodb.plans import create_table_request

    ddb.create_table(**create_table_request(TABLE))  # Lance's layout, as lancetx makes it
    s3.create_bucket(Bucket=BUCKET)
    for v in range(1, 200):
        ddb.put_item(TableName=TABLE, Item=_item(v))

    def batch(keys: list[dict[str, Any]]) -> None:
        ddb.batch_get_item(RequestItems={TABLE: {"Keys": keys, "ConsistentRead": True}})

    kinds: list[tuple[str, Callable[[int], object]]] = [
        (
            "GetItem (an item)",
            lambda i: ddb.get_item(TableName=TABLE, Key=_key(1 + i % 100), ConsistentRead=True),
        ),
        (
            "GetItem (no item)",
            lambda i: ddb.get_item(TableName=TABLE, Key=_key(10_000 + i), ConsistentRead=True),
        ),
        ("BatchGetItem (2 items)", lambda i: batch([_key(j + 1) for j in range(2)])),
        ("BatchGetItem (8 items)", lambda i: batch([_key(j + 1) for j in range(8)])),
        ("BatchGetItem (14 items)", lambda i: batch([_key(j + 1) for j in range(14)])),
        ("BatchGetItem (14 keys, no item)", lambda i: batch([_key(10_000 + j) for j in range(14)])),
        (
            "PutItem (conditional, 3 KiB handover)",
            lambda i: ddb.put_item(
                TableName=TABLE,
                Item=_item(1000 + i, handover=True),
                ConditionExpression="attribute_not_exists(version)",
            ),
        ),
        (
            "UpdateItem (a ticket)",
            lambda i: ddb.update_item(
                TableName=TABLE,
                Key={"base_uri": {"S": BASE + "#queue"}, "version": {"N": "0"}},
                UpdateExpression="ADD #issued :one",
                ExpressionAttributeNames={"#issued": "issued"},
                ExpressionAttributeValues={":one": {"N": "1"}},
                ReturnValues="ALL_NEW",
            ),
        ),
        (
            "PutObject (3 KiB)",
            lambda i: s3.put_object(Bucket=BUCKET, Key=f"o{i}", Body=b"m" * 3000),
        ),
        ("HeadObject", lambda i: s3.head_object(Bucket=BUCKET, Key=f"o{i}")),
        ("GetObject (3 KiB)", lambda i: s3.get_object(Bucket=BUCKET, Key=f"o{i}")["Body"].read()),
        (
            "CopyObject",
            lambda i: s3.copy_object(
                Bucket=BUCKET, Key=f"c{i}", CopySource={"Bucket": BUCKET, "Key": f"o{i}"}
            ),
        ),
        ("DeleteObject", lambda i: s3.delete_object(Bucket=BUCKET, Key=f"c{i}")),
    ]
    for name, send in kinds:
        conn.send(name)
        conn.recv()  # the server's clock is read
        for i in range(requests):
            send(i)
        conn.send(None)
        conn.recv()
    conn.send("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=150, help="requests per kind")
    args = parser.parse_args()
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    ctx = multiprocessing.get_context("spawn")
    with EmbeddedAws(legacy_s3=True).start() as aws:
        ours, theirs = ctx.Pipe()
        client = ctx.Process(target=_client, args=(aws.endpoint, args.requests, theirs))
        client.start()
        print(f"load average {os.getloadavg()[0]:.1f}")
        print("| request | server CPU ms | wall ms |")
        print("|---|---:|---:|")
        while name := ours.recv():
            cpu, wall = time.process_time(), time.perf_counter()
            ours.send(None)
            ours.recv()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            n = args.requests
            print(f"| {name} | {1000 * cpu / n:.2f} | {1000 * wall / n:.2f} |")
            ours.send(None)
        client.join()


if __name__ == "__main__":
    main()
