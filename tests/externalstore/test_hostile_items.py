"""Hostile items: an item that cannot vouch for what it points at is refused with a
typed error naming the item and the problem; nothing is followed, changed or deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table, lancetx_append, pylance_create

from lancetx.commit.engine.committer import load_parent
from lancetx.commit.engine.effects import run
from lancetx.commit.engine.loading import load_newer
from lancetx.commit.format.naming import NamingScheme, manifest_key, staged_manifest_key
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.connect import connect
from lancetx.externalstore.errors import (
    CorruptManifestError,
    DanglingEntryError,
    MalformedEntryError,
    ManifestSizeMismatchError,
    ManifestVersionMismatchError,
)

BASE = "db/hostile.lance"


@dataclass
class World:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    uri: str
    options: dict[str, str]

    @property
    def s3(self) -> Any:
        return boto3.client("s3", **self.aws.client_kwargs())

    @property
    def ddb(self) -> Any:
        return boto3.client("dynamodb", **self.aws.client_kwargs())

    def state(self) -> tuple[dict[str, str], list[Any]]:
        objects = {
            o["Key"]: o["ETag"] for o in self.s3.list_objects_v2(Bucket=self.bucket)["Contents"]
        }
        items = self.ddb.scan(TableName=self.ddb_table, ConsistentRead=True)["Items"]
        return objects, sorted(items, key=lambda i: (len(i["version"]["N"]), i["version"]["N"]))

    def item(self, version: int) -> dict[str, Any]:
        key = {"base_uri": {"S": BASE}, "version": {"N": str(version)}}
        return dict(self.ddb.get_item(TableName=self.ddb_table, Key=key)["Item"])

    def put(self, item: dict[str, Any]) -> None:
        self.ddb.put_item(TableName=self.ddb_table, Item=item)

    def final(self, version: int) -> str:
        return manifest_key(BASE, version, NamingScheme.V2)

    def body(self, key: str) -> bytes:
        return bytes(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())


@pytest.fixture
def world(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> World:
    options = aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, BASE, ddb_table_name)
    pylance_create(uri, options, batch("create", 0, 5))
    conn = connect(uri, options)
    lancetx_append(conn.handler, conn.base, conn.data_uri, options, batch("lancetx", 0, 4))
    return World(aws, bucket, ddb_table_name, uri, options)


def _legit_v3(world: World) -> dict[str, Any]:
    conn = connect(world.uri, world.options)
    lancetx_append(conn.handler, conn.base, conn.data_uri, world.options, batch("v3", 0, 2))
    return world.item(3)


def dangling_final(world: World) -> str:
    item = world.item(2)
    world.put({**item, "version": {"N": "3"}, "path": {"S": world.final(3)}})
    return "does not exist"


def dangling_final_pylance_item(world: World) -> str:
    item = {k: v for k, v in world.item(2).items() if k != "bucket"}
    world.put({**item, "version": {"N": "3"}, "path": {"S": world.final(3)}})
    return "does not exist"


def huge_version(world: World) -> str:
    world.put({**world.item(2), "version": {"N": "1" + "0" * 30}})
    return "0..2**64-1"


def fractional_version(world: World) -> str:
    world.put({**world.item(2), "version": {"N": "7.5"}})
    return "'7.5'"


def missing_size(world: World) -> str:
    world.put({k: v for k, v in _legit_v3(world).items() if k != "size"})
    return "no size"


def oversized_size(world: World) -> str:
    world.put({**_legit_v3(world), "size": {"N": str(10**15)}})
    return f"size {10**15}"


def truncated_manifest(world: World) -> str:
    _legit_v3(world)
    key = world.final(3)
    world.s3.put_object(Bucket=world.bucket, Key=key, Body=world.body(key)[:-40])
    return "cannot be read"


def corrupted_manifest(world: World) -> str:
    _legit_v3(world)
    key = world.final(3)
    data = bytearray(world.body(key))
    for i in range(8, len(data) - 16, 7):
        data[i] ^= 0x5A
    world.s3.put_object(Bucket=world.bucket, Key=key, Body=bytes(data))
    return "cannot be read"


def other_versions_manifest(world: World) -> str:
    item = world.item(2)
    world.s3.put_object(Bucket=world.bucket, Key=world.final(3), Body=world.body(world.final(2)))
    world.put({**item, "version": {"N": "3"}, "path": {"S": world.final(3)}})
    return "encodes version 2, not 3"


def _staged_v3(world: World, size: int | None) -> None:
    """Version 3's item pointing at a staged manifest (its final copy not made yet),
    the item recording ``size`` (None: no size)."""
    item = _legit_v3(world)
    final = world.final(3)
    staged = staged_manifest_key(BASE, 3, NamingScheme.V2, "44444444-4444-4444-8444-444444444444")
    world.s3.put_object(Bucket=world.bucket, Key=staged, Body=world.body(final))
    world.s3.delete_object(Bucket=world.bucket, Key=final)
    item = {k: v for k, v in item.items() if k != "size"}
    if size is not None:
        item["size"] = {"N": str(size)}
    world.put({**item, "path": {"S": staged}})


def staged_wrong_size(world: World) -> str:
    # A reader must not copy the staged object over version 3's final name before
    # the item's size has been checked: the copy would be a change already.
    _staged_v3(world, 123456)
    return "size 123456"


def staged_missing_size(world: World) -> str:
    _staged_v3(world, None)
    return "no size"


CASES: list[tuple[Callable[[World], str], type[Exception]]] = [
    (dangling_final, DanglingEntryError),
    (dangling_final_pylance_item, DanglingEntryError),
    (huge_version, MalformedEntryError),
    (fractional_version, MalformedEntryError),
    (missing_size, ManifestSizeMismatchError),
    (oversized_size, ManifestSizeMismatchError),
    (truncated_manifest, CorruptManifestError),
    (corrupted_manifest, CorruptManifestError),
    (other_versions_manifest, ManifestVersionMismatchError),
    (staged_wrong_size, ManifestSizeMismatchError),
    (staged_missing_size, ManifestSizeMismatchError),
]


@pytest.mark.parametrize(("make", "error"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_hostile_item_is_refused_naming_item_and_problem(
    world: World, make: Callable[[World], str], error: type[Exception]
) -> None:
    problem = make(world)
    before = world.state()
    conn = connect(world.uri, world.options)
    with pytest.raises(error) as raised:
        load_parent(conn.handler, conn.base)
    message = str(raised.value)
    assert BASE in message and problem in message
    if error is not MalformedEntryError:
        assert "version 3" in message and world.ddb_table in message
    else:
        assert "malformed manifest item" in message
    # A writer opening the table is refused the same way.
    with pytest.raises(error):
        lancetx_append(conn.handler, conn.base, conn.data_uri, world.options, batch("x", 0, 1))
    # So is a writer catching up from version 1 (versions 2 and 3 read together, the
    # catch-up's lean reads: see test_catch_up_reads.py).
    with pytest.raises(error) as caught_up:
        run(load_newer(conn.handler.store, conn.base, 1), conn.handler)
    assert BASE in str(caught_up.value) and problem in str(caught_up.value)
    assert world.state() == before
    # The versions before it are intact.
    older = load_parent(conn.handler, conn.base, 2)
    assert older is not None and older.version == 2
