"""pylance and lancetx on one table, through the same DynamoDB table.

* Concurrent appends from pylance (``s3+ddb://``) and lancetx: no loss, a
  linear history (every version holds all fragments of the one before), and
  each side reads every version the other wrote — our snapshot loader reads
  pylance's manifests, ``lance.dataset(uri, version=v)`` opens ours.
* Onboarding: a table written by plain pylance (``s3://``) before DynamoDB
  was involved opens through the store; the first commit through the store
  continues its history and pylance reads it through ``s3+ddb://``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import lance
import pytest
from protocol_helpers import (
    FaultyObjectStore,
    Tally,
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_append_landing,
    pylance_create,
    run_threads,
    verify_history,
)

from lancetx.commit.engine.committer import Committed, load_parent
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.format.snapshot import load_snapshot
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.connect import connect
from lancetx.externalstore.memory import MemoryManifestStore

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

ROWS = 10


@dataclass
class Env:
    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    options: dict[str, str]

    def items(self, base: str) -> list[dict[str, Any]]:
        client = boto3.client("dynamodb", **self.aws.client_kwargs("dynamodb"))
        return list(
            client.query(
                TableName=self.ddb_table,
                KeyConditionExpression="base_uri = :b",
                ExpressionAttributeValues={":b": {"S": base}},
                ConsistentRead=True,
            )["Items"]
        )


@pytest.fixture
def env(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> Iterator[Env]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    yield Env(legacy_aws, bucket, ddb_table_name, options)


def fragment_ids_by_version(uri: str, options: dict[str, str], latest: int) -> dict[int, list[int]]:
    return {
        v: sorted(
            f.fragment_id
            for f in lance.dataset(uri, version=v, storage_options=options).get_fragments()
        )
        for v in range(1, latest + 1)
    }


def test_pylance_and_lancetx_append_concurrently(env: Env) -> None:
    uri = ddb_uri(env.bucket, "mixed.lance", env.ddb_table)
    pylance_create(uri, env.options, batch("setup", 0, ROWS))
    tally = Tally()
    tally.add("setup", 0, ROWS)
    appends = 3

    def lancetx_writer(index: int) -> None:
        conn = connect(uri, env.options)
        parent: Committed | None = None
        for seq in range(appends):
            parent = lancetx_append(
                conn.handler,
                conn.base,
                conn.data_uri,
                env.options,
                batch(f"lancetx-{index}", seq, ROWS),
                parent,
            )
            tally.add(f"lancetx-{index}", seq, ROWS)

    def pylance_writer(index: int) -> None:
        for seq in range(appends):
            # Not bound by pylance's own commit budget (it runs out under load).
            pylance_append_landing(uri, env.options, batch(f"pylance-{index}", seq, ROWS))
            tally.add(f"pylance-{index}", seq, ROWS)

    targets: list[Any] = [lambda i=i: lancetx_writer(i) for i in range(3)]
    targets += [lambda i=i: pylance_writer(i) for i in range(2)]
    errors = run_threads(targets)
    assert errors == [], errors

    conn = connect(uri, env.options)
    latest = verify_history(
        uri, env.options, conn.handler, conn.base, tally.rows, versions=tally.commits
    )

    # Linear: every version keeps all fragments of the previous one (appends only),
    # seen identically by both readers.
    theirs = fragment_ids_by_version(uri, env.options, latest)
    libraries: set[str] = set()
    for location in conn.handler.list_versions(conn.base, 0):
        snap = load_snapshot(conn.handler.store, conn.base, location)
        libraries.add(snap.manifest.writer_version.library)
        assert sorted(snap.fragment_ids) == theirs[location.version], location.version
        if location.version > 1:
            assert set(theirs[location.version - 1]) < set(theirs[location.version])
    assert len(libraries) == 2, f"expected versions written by both sides, got {libraries}"
    assert all(i["path"]["S"].endswith(".manifest") for i in env.items(conn.base))
    assert sorted(int(i["version"]["N"]) for i in env.items(conn.base)) == list(
        range(1, latest + 1)
    )


# ------------------------------------------------------------------------ onboarding


@pytest.mark.parametrize("v2_names", [True, False])
@pytest.mark.parametrize("first_opener", ["lancetx", "pylance"])
def test_onboarding_a_table_written_before_dynamodb(
    env: Env, v2_names: bool, first_opener: str
) -> None:
    plain = f"s3://{env.bucket}/old.lance"
    lance.write_dataset(
        batch("plain", 0, ROWS),
        plain,
        storage_options=env.options,
        enable_v2_manifest_paths=v2_names,
    )
    lance.write_dataset(batch("plain", 1, ROWS), plain, mode="append", storage_options=env.options)
    uri = ddb_uri(env.bucket, "old.lance", env.ddb_table)
    conn = connect(uri, env.options)
    assert env.items(conn.base) == []  # nothing in DynamoDB yet
    expected = {("plain", 0): ROWS, ("plain", 1): ROWS}

    if first_opener == "pylance":
        assert lance.dataset(uri, storage_options=env.options).version == 2
    location = conn.handler.resolve_latest(conn.base)
    assert location is not None and location.version == 2
    scheme = NamingScheme.V2 if v2_names else NamingScheme.V1
    assert location.scheme is scheme
    assert [int(i["version"]["N"]) for i in env.items(conn.base)] == [2]

    committed = lancetx_append(
        conn.handler, conn.base, conn.data_uri, env.options, batch("lancetx", 0, ROWS)
    )
    expected[("lancetx", 0)] = ROWS
    assert committed.version == 3 and committed.location.scheme is scheme
    assert [int(i["version"]["N"]) for i in env.items(conn.base)] == [2, 3]

    ds = lance.dataset(uri, storage_options=env.options)
    assert ds.version == 3 and ds.count_rows() == 3 * ROWS
    assert lance.dataset(plain, storage_options=env.options).version == 3  # finalized: portable

    assert pylance_append(uri, env.options, batch("pylance", 0, ROWS)) == 4
    expected[("pylance", 0)] = ROWS
    fresh = connect(uri, env.options)
    assert [loc.version for loc in fresh.handler.list_versions(fresh.base, 0)] == [1, 2, 3, 4]
    assert fresh.handler.resolve_version(fresh.base, 1).version == 1  # pre-onboarding history
    verify_history(uri, env.options, fresh.handler, fresh.base, expected, versions=4)


class HidingStore(FaultyObjectStore):
    """A store whose listing misses the newest manifests (a stale legacy listing)."""

    def __init__(self, inner: LocalObjectStore, hidden: set[str]) -> None:
        super().__init__(inner)
        self.hidden = hidden

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        return iter([m for m in self.inner.list(prefix) if m.key not in self.hidden])


def test_onboarding_probes_past_a_stale_listing(tmp_path: Any) -> None:
    path = str(tmp_path / "t.lance")
    pylance_create(path, None, batch("a", 0, ROWS))
    pylance_append(path, None, batch("a", 1, ROWS))
    pylance_append(path, None, batch("a", 2, ROWS))
    base = os.path.abspath(path).lstrip("/")
    newest = [f"{base}/_versions/{NamingScheme.V2.file_name(v)}" for v in (2, 3)]
    store = HidingStore(LocalObjectStore("/"), set(newest))
    entries = MemoryManifestStore()
    handler = ExternalStoreCommitHandler(store, entries)
    location = handler.resolve_latest(base)
    assert isinstance(location, ManifestLocation)
    assert location.version == 3 and location.key == newest[-1]
    assert [(e.version, e.path) for e in entries.entries()] == [(3, newest[-1])]
    committed = lancetx_append(handler, base, path, None, batch("lancetx", 0, ROWS))
    assert committed.version == 4
    assert lance.dataset(path).count_rows() == 4 * ROWS


@pytest.mark.parametrize("first_opener", ["lancetx", "pylance"])
def test_commit_on_a_pre_onboarding_parent_does_not_rewrite_history(
    env: Env, first_opener: str
) -> None:
    """A writer that builds on an old version (time travel) of an onboarded table
    claims ``old + 1``. Versions written before DynamoDB have no item, so without
    one the claim would win and the copy would overwrite that version's manifest:
    history rewritten, and the append acknowledged but absent from the latest
    version. The claim must lose like any other, and the commit land on top."""
    plain = f"s3://{env.bucket}/hist.lance"
    pylance_create(plain, env.options, batch("plain", 0, ROWS))
    pylance_append(plain, env.options, batch("plain", 1, ROWS))
    pylance_append(plain, env.options, batch("plain", 2, ROWS))
    uri = ddb_uri(env.bucket, "hist.lance", env.ddb_table)
    conn = connect(uri, env.options)
    if first_opener == "pylance":
        assert lance.dataset(uri, storage_options=env.options).version == 3
    latest = conn.handler.resolve_latest(conn.base)
    assert latest is not None and latest.version == 3
    v2_before = lance.dataset(plain, version=2, storage_options=env.options).to_table()

    old = load_parent(conn.handler, conn.base, 1)  # time travel to version 1
    assert sorted(int(i["version"]["N"]) for i in env.items(conn.base)) == [1, 2, 3]
    committed = lancetx_append(
        conn.handler, conn.base, conn.data_uri, env.options, batch("late", 0, ROWS), parent=old
    )
    assert committed.version == 4
    v2_after = lance.dataset(plain, version=2, storage_options=env.options).to_table()
    assert v2_after.equals(v2_before), "version 2 was rewritten"
    expected = {("plain", 0): ROWS, ("plain", 1): ROWS, ("plain", 2): ROWS, ("late", 0): ROWS}
    verify_history(uri, env.options, conn.handler, conn.base, expected, versions=4)
