"""A version wedged the way pylance wedges one: its claim landed, its staged manifest
was removed, and no final manifest exists.

Readers and writers (sync and async) refuse it with ``WedgedVersionError`` naming
the version, the item, the candidate transaction files and the repair command;
older versions still open (lancetx and pylance); nothing is written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import lance
import pytest
from protocol_helpers import (
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

from lancetx.commit.engine.committer import Committed, load_parent
from lancetx.commit.storage.s3store import S3Config
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.demo.embedded import (
    DEFAULT_REGION,
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    EmbeddedAws,
    InterceptedRequest,
    InterceptedResponse,
)
from lancetx.externalstore.commit_handler import (
    AsyncExternalStoreCommitHandler,
    ExternalStoreCommitHandler,
)
from lancetx.externalstore.connect import connect
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.errors import ManifestMissingError, WedgedVersionError
from lancetx.externalstore.wedged import find_candidates


@dataclass
class Wedged:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    uri: str
    options: dict[str, str]
    #: the transaction file of the pylance commit whose manifest was lost
    lost_txn: str
    #: the staged manifest the item points at
    staged: str
    #: what a lancetx writer committed just before (version 2), as a long-lived writer holds it
    parent: Committed

    def snapshot(self) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """Every object (key → ETag) of the bucket and every item of the DynamoDB table."""
        s3 = boto3.client("s3", **self.aws.client_kwargs())
        ddb = boto3.client("dynamodb", **self.aws.client_kwargs())
        objects = {
            o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=self.bucket).get("Contents", [])
        }
        items = sorted(
            ddb.scan(TableName=self.ddb_table, ConsistentRead=True)["Items"],
            key=lambda i: int(i["version"]["N"]),
        )
        return objects, items


def _claim_lands_and_staged_vanishes(aws: EmbeddedAws, bucket: str, fired: list[str]) -> Any:
    """The first claim lands but its writer sees a 500 and its staged manifest is
    removed: what pylance does when it takes the lost answer for a lost race."""
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


@pytest.fixture
def wedged(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Wedged]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "db/wedged.lance", ddb_table_name)
    pylance_create(uri, options, batch("create", 0, 5))
    conn = connect(uri, options)
    parent = lancetx_append(conn.handler, conn.base, conn.data_uri, options, batch("lancetx", 0, 4))
    s3 = boto3.client("s3", **legacy_aws.client_kwargs())
    before = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    fired: list[str] = []
    legacy_aws.set_interceptor(_claim_lands_and_staged_vanishes(legacy_aws, bucket, fired))
    with pytest.raises(OSError):  # pylance cannot tell what happened to its commit
        pylance_append(uri, options, batch("pylance", 0, 3))
    legacy_aws.set_interceptor(None)
    assert len(fired) == 1
    after = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    (lost_txn,) = [k for k in after - before if "/_transactions/" in k]
    yield Wedged(legacy_aws, bucket, ddb_table_name, uri, options, lost_txn, fired[0], parent)


def _check(error: WedgedVersionError, wedged: Wedged) -> None:
    assert error.version == 3
    assert error.base_uri == "db/wedged.lance"
    assert error.item_path == wedged.staged
    assert error.candidates == [wedged.lost_txn]
    assert error.repair_command == f"lancetx-sync repair '{wedged.uri}' --version 3"
    message = str(error)
    for part in (wedged.staged, wedged.lost_txn, error.repair_command, "version 3", "wedged"):
        assert part in message
    assert isinstance(error, ManifestMissingError)  # callers catching the older error still do


def test_readers_and_writers_refuse_a_wedged_version_and_write_nothing(wedged: Wedged) -> None:
    before = wedged.snapshot()
    assert before[1][-1]["path"]["S"] == wedged.staged  # the item points at nothing
    assert wedged.staged not in before[0]

    conn = connect(wedged.uri, wedged.options)
    handler = conn.handler
    assert isinstance(handler, ExternalStoreCommitHandler)
    with pytest.raises(WedgedVersionError) as reader:
        load_parent(handler, conn.base)
    _check(reader.value, wedged)
    with pytest.raises(WedgedVersionError) as by_version:
        handler.resolve_version(conn.base, 3)
    _check(by_version.value, wedged)
    with pytest.raises(WedgedVersionError) as writer:  # a writer opens the table first
        lancetx_append(handler, conn.base, conn.data_uri, wedged.options, batch("late", 0, 2))
    _check(writer.value, wedged)

    # Older versions stay readable, by lancetx and by pylance.
    for version in (1, 2):
        parent = load_parent(handler, conn.base, version)
        assert parent is not None and parent.version == version
        ds = lance.dataset(wedged.uri, version=version, storage_options=wedged.options)
        assert ds.count_rows() == (5 if version == 1 else 9)

    assert find_candidates(handler.store, handler.entries, conn.base, 3) == [wedged.lost_txn]
    assert wedged.snapshot() == before


def test_the_async_handler_refuses_it_too(wedged: Wedged) -> None:
    before = wedged.snapshot()
    s3_config = S3Config(
        endpoint_url=wedged.aws.endpoint,
        region=DEFAULT_REGION,
        access_key_id=FAKE_ACCESS_KEY,
        secret_access_key=FAKE_SECRET_KEY,
    )

    async def main() -> WedgedVersionError:
        async with (
            AsyncS3ObjectStore(wedged.bucket, config=s3_config, legacy=True) as store,
            AsyncDynamoDBManifestStore.open(
                wedged.ddb_table, DynamoDBConfig.from_options(wedged.options)
            ) as entries,
        ):
            handler = AsyncExternalStoreCommitHandler(store, entries)
            older = await handler.resolve_version("db/wedged.lance", 2)
            assert older.version == 2
            assert (await handler.read_manifest("db/wedged.lance", older)).version == 2
            try:
                await handler.resolve_latest("db/wedged.lance")
            except WedgedVersionError as exc:
                return exc
            raise AssertionError("the wedged version was not reported")

    _check(asyncio.run(main()), wedged)
    assert wedged.snapshot() == before


def test_candidates_leave_out_committed_transactions_even_under_another_name(
    wedged: Wedged,
) -> None:
    """A transaction file that a committed manifest references — or whose transaction
    was committed under another file name (rewritten after a rebase) — is no
    candidate; an unreferenced one with a read version at or above the wedged
    version is none either."""
    s3 = boto3.client("s3", **wedged.aws.client_kwargs())
    committed = [
        k
        for k in wedged.snapshot()[0]
        if "/_transactions/" in k and k != wedged.lost_txn and k.rsplit("/", 1)[-1][0] == "1"
    ]
    (create_txn,) = committed  # lancetx's append, read version 1
    uuid = create_txn.rsplit("/", 1)[-1].split("-", 1)[1]
    rebased_copy = f"db/wedged.lance/_transactions/0-{uuid}"
    s3.put_object(Bucket=wedged.bucket, Key=rebased_copy, Body=b"x")
    too_new = "db/wedged.lance/_transactions/3-00000000-0000-4000-8000-000000000000.txn"
    s3.put_object(Bucket=wedged.bucket, Key=too_new, Body=b"x")
    stray = "db/wedged.lance/_transactions/0-00000000-0000-4000-8000-000000000001.txn"
    s3.put_object(Bucket=wedged.bucket, Key=stray, Body=b"x")
    conn = connect(wedged.uri, wedged.options)
    assert isinstance(conn.handler, ExternalStoreCommitHandler)
    found = find_candidates(conn.handler.store, conn.handler.entries, conn.base, 3)
    assert found == sorted([wedged.lost_txn, stray])


def test_a_writer_holding_an_older_parent_learns_it_when_it_loses_the_claim(
    wedged: Wedged,
) -> None:
    """A long-lived writer still holds version 2: its claim of version 3 loses to the
    wedged item, and loading the "winner" reports the wedge instead of a bare
    missing object."""
    conn = connect(wedged.uri, wedged.options)
    items_before = wedged.snapshot()[1]
    with pytest.raises(WedgedVersionError) as raised:
        lancetx_append(
            conn.handler,
            conn.base,
            conn.data_uri,
            wedged.options,
            batch("holder", 0, 1),
            parent=wedged.parent,
        )
    error = raised.value
    assert error.version == 3 and error.item_path == wedged.staged
    # The writer's own transaction file still existed when it learned of the wedge;
    # it is removed with the failed commit, leaving the one real candidate.
    assert wedged.lost_txn in error.candidates
    handler = conn.handler
    assert isinstance(handler, ExternalStoreCommitHandler)
    assert find_candidates(handler.store, handler.entries, conn.base, 3) == [wedged.lost_txn]
    assert wedged.snapshot()[1] == items_before
    objects = wedged.snapshot()[0]
    assert wedged.staged not in objects
    assert not [k for k in objects if "/_versions/" in k and "manifest-" in k]  # no staged left
