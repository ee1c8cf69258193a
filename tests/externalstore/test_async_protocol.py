"""Sync/async parity of the external-store protocol on the moto server.

Every scenario is written once, as a coroutine over a :class:`Side`, and runs
twice: through :class:`ExternalStoreCommitHandler` (boto3: ``S3ObjectStore`` +
``DynamoDBManifestStore``) and through :class:`AsyncExternalStoreCommitHandler`
(aioboto3: ``AsyncS3ObjectStore`` + ``AsyncDynamoDBManifestStore``), each under
``asyncio.run``. The S3 side is a legacy bucket (If-None-Match ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import boto3
import lance
import pytest
from protocol_helpers import (
    BOUNDARIES,
    Crash,
    batch,
    crash_after,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_create,
)

from lancetx.commit.errors import VersionAlreadyExistsError
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme, manifest_key
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
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
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore
from lancetx.externalstore.errors import (
    ManifestMissingError,
    UntrustedManifestPathError,
)
from lancetx.externalstore.protocol import (
    CommitOutcome,
    Steps,
    run,
    run_async,
)

ROWS = 10
BASE = "db/t.lance"
V2 = NamingScheme.V2


@dataclass
class Env:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    options: dict[str, str]

    @property
    def uri(self) -> str:
        return ddb_uri(self.bucket, BASE, self.ddb_table)

    def s3(self) -> Any:
        return boto3.client("s3", **self.aws.client_kwargs())

    def items(self) -> list[dict[str, Any]]:
        client = boto3.client("dynamodb", **self.aws.client_kwargs("dynamodb"))
        return list(
            client.query(
                TableName=self.ddb_table,
                KeyConditionExpression="base_uri = :b",
                ExpressionAttributeValues={":b": {"S": BASE}},
                ConsistentRead=True,
            )["Items"]
        )

    def item(self, version: int) -> dict[str, Any]:
        (found,) = [i for i in self.items() if int(i["version"]["N"]) == version]
        return found

    def object_keys(self) -> list[str]:
        listing = self.s3().list_objects_v2(Bucket=self.bucket, Prefix=f"{BASE}/_versions/")
        return [o["Key"] for o in listing.get("Contents", [])]

    def staged(self) -> list[str]:
        return [k for k in self.object_keys() if "-" in k.rsplit("/", 1)[-1]]

    def body(self, key: str) -> bytes:
        return bytes(self.s3().get_object(Bucket=self.bucket, Key=key)["Body"].read())


class Side:
    """One handler (sync or async) behind coroutines, so a scenario is written once."""

    def __init__(self, kind: str, handler: Any, store: Any, entries: Any) -> None:
        self.kind = kind
        self.handler = handler
        self.store = store
        self.entries = entries

    async def _call(self, value: Any) -> Any:
        return await value if isinstance(value, Awaitable) else value

    async def commit(self, version: int, manifest: bytes) -> ManifestLocation:
        return await self._call(self.handler.commit(BASE, version, manifest, V2))  # type: ignore[no-any-return]

    async def resolve_latest(self) -> ManifestLocation | None:
        return await self._call(self.handler.resolve_latest(BASE))  # type: ignore[no-any-return]

    async def resolve_version(self, version: int) -> ManifestLocation:
        return await self._call(self.handler.resolve_version(BASE, version))  # type: ignore[no-any-return]

    async def list_versions(self) -> list[ManifestLocation]:
        return await self._call(self.handler.list_versions(BASE, 0))  # type: ignore[no-any-return]

    async def run(self, steps: Steps[Any]) -> Any:
        if self.kind == "async":
            return await run_async(steps, self.store, self.entries)
        return run(steps, self.store, self.entries)

    @property
    def last_outcome(self) -> CommitOutcome | None:
        return self.handler.last_outcome  # type: ignore[no-any-return]


def s3_config(aws: EmbeddedAws) -> S3Config:
    return S3Config(
        endpoint_url=aws.endpoint,
        region=DEFAULT_REGION,
        access_key_id=FAKE_ACCESS_KEY,
        secret_access_key=FAKE_SECRET_KEY,
    )


@contextlib.asynccontextmanager
async def open_side(kind: str, env: Env) -> AsyncIterator[Side]:
    config = DynamoDBConfig.from_options(env.options)
    if kind == "sync":
        store = S3ObjectStore(env.bucket, config=s3_config(env.aws), legacy=True)
        entries = DynamoDBManifestStore.from_config(env.ddb_table, config)
        try:
            yield Side(kind, ExternalStoreCommitHandler(store, entries), store, entries)
        finally:
            store.close()
        return
    async with (
        AsyncS3ObjectStore(env.bucket, config=s3_config(env.aws), legacy=True) as astore,
        AsyncDynamoDBManifestStore.open(env.ddb_table, config) as aentries,
    ):
        yield Side(kind, AsyncExternalStoreCommitHandler(astore, aentries), astore, aentries)


Scenario = Callable[[Side, Env], Awaitable[None]]


@pytest.fixture
def env(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Env:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    made = Env(legacy_aws, bucket, ddb_table_name, options)
    pylance_create(made.uri, options, batch("setup", 0, ROWS))  # version 1, through DynamoDB
    return made


def play(kind: str, env: Env, scenario: Scenario) -> None:
    async def main() -> None:
        async with open_side(kind, env) as side:
            await scenario(side, env)

    try:
        asyncio.run(main())
    finally:
        env.aws.set_interceptor(None)


class CapturingHandler(ExternalStoreCommitHandler):
    """Builds a real manifest through the committer but commits nothing: the bytes
    are captured and the "process" dies, so another handler can commit them."""

    captured: list[tuple[int, bytes]]

    def commit(
        self,
        base: str,
        version: int,
        manifest: bytes,
        scheme: NamingScheme,
        summary: TransactionSummary | None = None,
    ) -> ManifestLocation:
        self.captured.append((version, manifest))
        raise Crash(0, None)


def real_manifest(env: Env, writer: str) -> tuple[int, bytes]:
    """The manifest lancetx would commit for an append of ``ROWS`` rows by ``writer``."""
    from lancetx.externalstore.connect import connect

    conn = connect(env.uri, env.options)
    capture = CapturingHandler(conn.handler.store, conn.handler.entries)  # type: ignore[attr-defined]
    capture.captured = []
    with pytest.raises(Crash):
        lancetx_append(capture, conn.base, conn.data_uri, env.options, batch(writer, 0, ROWS))
    (found,) = capture.captured
    return found


KINDS = ["sync", "async"]


# ---------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize("kind", KINDS)
def test_commit(kind: str, env: Env) -> None:
    version, manifest = real_manifest(env, "w")
    assert version == 2

    async def scenario(side: Side, env: Env) -> None:
        location = await side.commit(2, manifest)
        assert location.version == 2 and location.key == manifest_key(BASE, 2, V2)
        assert side.last_outcome is not None and side.last_outcome.finalized
        latest = await side.resolve_latest()
        assert latest is not None and latest.key == location.key

    play(kind, env, scenario)
    item = env.item(2)
    assert item["path"]["S"] == manifest_key(BASE, 2, V2) and "commit_token" in item
    assert env.staged() == []
    assert env.body(manifest_key(BASE, 2, V2)) == manifest
    ds = lance.dataset(env.uri, storage_options=env.options)
    assert ds.version == 2 and ds.count_rows() == 2 * ROWS


@pytest.mark.parametrize("kind", KINDS)
def test_conflict_names_the_winner(kind: str, env: Env) -> None:
    async def scenario(side: Side, env: Env) -> None:
        winner = await side.commit(2, b"winner")
        with pytest.raises(VersionAlreadyExistsError) as info:
            await side.commit(2, b"loser")
        assert info.value.version == 2
        assert info.value.winner is not None and info.value.winner.key == winner.key

    play(kind, env, scenario)
    assert env.staged() == []  # the loser removed its staged manifest
    assert env.body(manifest_key(BASE, 2, V2)) == b"winner"


@pytest.mark.parametrize("kind", KINDS)
def test_reader_finalizes_after_a_crash_after_the_claim(kind: str, env: Env) -> None:
    _, manifest = real_manifest(env, "crashed")

    async def scenario(side: Side, env: Env) -> None:
        steps = side.handler.commit_steps(BASE, 2, manifest, V2)
        with pytest.raises(Crash):
            await side.run(crash_after(steps, BOUNDARIES["after_claim"]))
        assert env.item(2)["path"]["S"] in env.staged()
        location = await side.resolve_latest()
        assert location is not None and location.version == 2
        assert location.key == manifest_key(BASE, 2, V2) and location.alternate_key is None
        # recovery: the next commit goes on top
        assert (await side.commit(3, b"next")).version == 3

    play(kind, env, scenario)
    assert env.item(2)["path"]["S"] == manifest_key(BASE, 2, V2)
    assert env.staged() == []
    assert env.body(manifest_key(BASE, 2, V2)) == manifest


@pytest.mark.parametrize("kind", KINDS)
def test_pylance_reads_a_version_we_left_staged(kind: str, env: Env) -> None:
    _, manifest = real_manifest(env, "crashed")

    async def scenario(side: Side, env: Env) -> None:
        steps = side.handler.commit_steps(BASE, 2, manifest, V2)
        with pytest.raises(Crash):
            await side.run(crash_after(steps, BOUNDARIES["after_claim"]))

    play(kind, env, scenario)
    ds = lance.dataset(env.uri, storage_options=env.options)  # pylance finalizes it
    assert ds.version == 2 and ds.count_rows() == 2 * ROWS
    assert env.item(2)["path"]["S"] == manifest_key(BASE, 2, V2)


@pytest.mark.parametrize("kind", KINDS)
def test_staged_missing_falls_back_to_the_final_object(kind: str, env: Env) -> None:
    async def scenario(side: Side, env: Env) -> None:
        steps = side.handler.commit_steps(BASE, 2, b"copied", V2)
        with pytest.raises(Crash):
            await side.run(crash_after(steps, BOUNDARIES["after_copy"]))
        (staged,) = env.staged()
        env.s3().delete_object(Bucket=env.bucket, Key=staged)
        location = await side.resolve_version(2)
        assert location.key == manifest_key(BASE, 2, V2)

    play(kind, env, scenario)
    assert env.item(2)["path"]["S"] == manifest_key(BASE, 2, V2)


@pytest.mark.parametrize("kind", KINDS)
def test_staged_and_final_missing_is_manifest_missing(kind: str, env: Env) -> None:
    async def scenario(side: Side, env: Env) -> None:
        steps = side.handler.commit_steps(BASE, 2, b"lost", V2)
        with pytest.raises(Crash):
            await side.run(crash_after(steps, BOUNDARIES["after_claim"]))
        (staged,) = env.staged()
        env.s3().delete_object(Bucket=env.bucket, Key=staged)
        with pytest.raises(ManifestMissingError) as info:
            await side.resolve_latest()
        assert info.value.version == 2 and info.value.staged == staged
        with pytest.raises(ManifestMissingError):
            await side.resolve_version(2)

    play(kind, env, scenario)
    assert env.item(2)["path"]["S"].endswith(".manifest") is False  # never flipped


@pytest.mark.parametrize("kind", KINDS)
def test_claim_landed_but_answered_with_a_500(kind: str, env: Env) -> None:
    fired: list[str] = []

    def landed_then_500(r: InterceptedRequest) -> InterceptedResponse | None:
        if r.target == "PutItem" and b"attribute_not_exists" in r.body and not fired:
            fired.append(r.target)
            body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"})
            return InterceptedResponse(
                500,
                body.encode(),
                [("Content-Type", "application/x-amz-json-1.0")],
                after_forwarding=True,
            )
        return None

    async def scenario(side: Side, env: Env) -> None:
        env.aws.set_interceptor(landed_then_500)
        location = await side.commit(2, b"mine")
        env.aws.set_interceptor(None)
        assert fired and location.version == 2
        assert side.last_outcome is not None and side.last_outcome.finalized

    play(kind, env, scenario)
    assert len(env.items()) == 2
    assert env.body(manifest_key(BASE, 2, V2)) == b"mine"


@pytest.mark.parametrize("kind", KINDS)
def test_untrusted_entry_is_refused(kind: str, env: Env) -> None:
    client = boto3.client("dynamodb", **env.aws.client_kwargs("dynamodb"))
    client.put_item(
        TableName=env.ddb_table,
        Item={
            "base_uri": {"S": BASE},
            "version": {"N": "2"},
            "path": {"S": "elsewhere/_versions/2.manifest-00000000-0000-4000-8000-000000000000"},
            "size": {"N": "1"},
        },
    )

    async def scenario(side: Side, env: Env) -> None:
        with pytest.raises(UntrustedManifestPathError):
            await side.resolve_latest()
        with pytest.raises(UntrustedManifestPathError):
            await side.resolve_version(2)
        with pytest.raises(UntrustedManifestPathError):
            await side.list_versions()

    play(kind, env, scenario)
    assert env.item(2)["path"]["S"].startswith("elsewhere/")  # not finalized into our table
    assert manifest_key(BASE, 2, V2) not in env.object_keys()


@pytest.mark.parametrize("kind", KINDS)
def test_a_table_written_before_dynamodb_is_onboarded_not_empty(
    kind: str, legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A table with manifests but no items is not an empty table: resolving its
    latest version onboards it (a caller told "no version" would commit version
    1 and its copy would overwrite the existing version 1 manifest)."""
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    env = Env(legacy_aws, bucket, ddb_table_name, options)
    plain = f"s3://{bucket}/{BASE}"
    pylance_create(plain, options, batch("plain", 0, ROWS))
    lance.write_dataset(batch("plain", 1, ROWS), plain, mode="append", storage_options=options)
    assert env.items() == []

    async def scenario(side: Side, env: Env) -> None:
        latest = await side.resolve_latest()
        assert latest is not None and latest.version == 2
        assert latest.key == manifest_key(BASE, 2, V2)
        with pytest.raises(VersionAlreadyExistsError):
            await side.commit(2, b"stale")

    play(kind, env, scenario)
    assert [int(i["version"]["N"]) for i in env.items()] == [2]
    ds = lance.dataset(plain, storage_options=options)
    assert ds.version == 2 and ds.count_rows() == 2 * ROWS
