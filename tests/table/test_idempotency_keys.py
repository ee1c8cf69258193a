"""An idempotency key lands at most once, however close the other commit and however far back.

* The look-up before a commit runs once the parent is in hand: a same-key commit that
  lands between the look-up and the parent is seen by the commit loop (an injected
  interleaving, on a table without key items and on one with them).
* No horizon: a key committed 2,000 versions ago is found by the look-up (history
  read in full on a table without key items; the key item on a table with them) and
  refused by the claim itself (key items), where the commit loop never looks.
* A key whose version ``cleanup`` removed is still refused by its key item: the caller
  gets the version number, ``deduplicated``, and keeps its files.
* Two keys sharing a slot are told apart (IdempotencyKeyCollisionError, nothing
  committed); ``delete_all`` removes a table's key items with its entries.

The 2,000-version histories live on ``/dev/shm`` when there is one (local disk's fsyncs
would cost tens of seconds) and are written through the engine (a config update per
version: small manifests), so each takes a few seconds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table, pylance_create

import lancetx
from lancetx.commit.engine.committer import (
    IDEMPOTENCY_KEY,
    CommitOptions,
    Committed,
    Parent,
    commit_transaction,
    load_parent,
)
from lancetx.commit.engine.operations import Append, Transaction, UpdateConfig
from lancetx.commit.format.fragments import fragment_from_pylance
from lancetx.commit.handlers.interface import CommitHandler
from lancetx.commit.storage.stores import open_object_store
from lancetx.committing import run_verb
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.memory import MemoryManifestStore
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table
from lancetx.state import TableState
from lancetx.table import Table
from lancetx.verbs.writing import fragments_verb

#: Versions committed after the key's before it is used again.
LATER = 2000


@pytest.fixture
def fast_dir() -> Iterator[Path]:
    """A directory on a RAM disk when there is one (fsync is free there)."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=root) as path:
        yield Path(path)


def _data(tag: str, seq: int) -> pa.Table:
    return batch(tag, seq, 3)


def _keyed_table(path: str) -> Table:
    """A local table whose versions are claimed in an in-memory manifest store (which
    keeps key items, as DynamoDB does)."""
    lance.write_dataset(_data("setup", -1), path)
    store, base = open_object_store(path)
    handler = ExternalStoreCommitHandler(store, MemoryManifestStore())
    conn = TableConnection(uri=path, handler=handler, base=base, data_uri=path)
    return Table(TableState(conn))


def _plain_table(path: str) -> Table:
    """A local table: conditional PUT, no key items."""
    return lancetx.write_table(path, _data("setup", -1))


def _fill(handler: CommitHandler, base: str, count: int) -> Committed | Parent:
    """``count`` later versions, each a small config update, through the engine."""
    parent: Committed | Parent | None = load_parent(handler, base)
    assert parent is not None
    for i in range(count):
        txn = Transaction(parent.version, UpdateConfig(upsert_values={"filler": str(i)}))
        parent = commit_transaction(handler, base, txn, parent=parent)
    return parent


def _rows_of(table: Table, tag: str) -> int:
    rows = lance.dataset(table.uri).to_table(columns=["writer"])["writer"].to_pylist()
    return sum(1 for w in rows if w == tag)


def _state(table: Table) -> TableState:
    state: TableState = table._state  # the door under test, with its connection
    return state


def _commit_fragments(state: TableState, tag: str, key: str) -> lancetx.CommitResult:
    """``commit_fragments`` through ``state``'s connection (any handler)."""
    data = _data(tag, 0)
    fragments = lance.fragment.write_fragments(
        data, state.conn.data_uri, storage_options=state.pylance_storage_options()
    )
    verb = fragments_verb(
        state.uri,
        fragments,
        schema=data.schema,
        mode="append",
        commit_message=None,
        properties=None,
        idempotency_key=key,
        expected_version=None,
        fresh_field_ids=False,
        merge_schema=False,
        null_counts=None,
        idempotency_since=0,
        commit_timeout=None,
    )
    return run_verb(state, *verb)


# ------------------------------------------------------------- look-up vs parent


@pytest.mark.parametrize("kind", ["conditional-put", "key-items"])
def test_a_same_key_commit_between_the_look_up_and_the_parent_is_found(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process commits the key right after our look-up found nothing: ours must
    come back deduplicated with that version, not commit the key a second time."""
    path = str(tmp_path / "t.lance")
    table = _keyed_table(path) if kind == "key-items" else _plain_table(path)
    conn = _state(table).conn
    look_up = TableState.find_idempotency_key
    injected: list[lancetx.CommitResult] = []
    first = [True]

    def then_the_other_commits(self: TableState, key: str, *, since: int = 0) -> int | None:
        found = look_up(self, key, since=since)
        if first.pop() if first else False:  # only after our own (the first) look-up
            injected.append(_commit_fragments(TableState(conn), "other", key))
        return found

    monkeypatch.setattr(TableState, "find_idempotency_key", then_the_other_commits)
    ours = _commit_fragments(TableState(conn), "ours", "job-7")

    assert not injected[0].deduplicated and injected[0].version == 2
    assert (ours.version, ours.deduplicated) == (2, True)
    assert lance.dataset(path).version == 2
    assert (_rows_of(table, "other"), _rows_of(table, "ours")) == (3, 0)


# -------------------------------------------------------------------- no horizon


@pytest.mark.slow  # two 2,000-version histories: a few seconds each
@pytest.mark.parametrize("kind", ["conditional-put", "key-items"])
def test_a_key_is_found_after_2000_later_commits(fast_dir: Path, kind: str) -> None:
    path = str(fast_dir / "t.lance")
    table = _keyed_table(path) if kind == "key-items" else _plain_table(path)
    state = _state(table)
    assert table.append(_data("first", 0), idempotency_key="job-1") == 2
    _fill(state.conn.handler, state.conn.base, LATER)

    again = lancetx.Table(TableState(state.conn))  # a new process's view: nothing cached
    assert again.append(_data("retry", 0), idempotency_key="job-1") == 2
    assert again.last_commit is not None and again.last_commit.deduplicated
    fragments = _commit_fragments(TableState(state.conn), "retry-fragments", "job-1")
    assert (fragments.version, fragments.deduplicated) == (2, True)
    assert lance.dataset(path).version == 2 + LATER
    assert _rows_of(table, "retry") == _rows_of(table, "retry-fragments") == 0
    assert again.find_idempotency_key("job-1") == 2


@pytest.mark.slow  # a 2,000-version history: a few seconds
def test_the_claim_refuses_a_key_committed_2000_versions_before_the_parent(
    fast_dir: Path,
) -> None:
    """The engine alone (no look-up before it) on a handler that claims keys: the key
    item refuses the claim, and the version it names comes back, deduplicated."""
    path = str(fast_dir / "t.lance")
    table = _keyed_table(path)
    state = _state(table)
    handler, base = state.conn.handler, state.conn.base
    first = table.append(_data("first", 0), idempotency_key="job-1")
    latest = _fill(handler, base, LATER)

    fragments = lance.fragment.write_fragments(_data("again", 0), path)
    txn = Transaction(
        latest.version, Append(fragments=tuple(fragment_from_pylance(f) for f in fragments))
    )
    done = commit_transaction(
        handler, base, txn, parent=latest, options=CommitOptions(idempotency_key="job-1")
    )
    assert done.deduplicated and done.version == first == 2
    assert done.transaction.properties[IDEMPOTENCY_KEY] == "job-1"
    assert lance.dataset(path).version == 2 + LATER
    staged = [p.name for p in (Path(path) / "_versions").iterdir() if "-" in p.name]
    assert staged == []  # the refused claim's staged manifest is gone


# ------------------------------------------------------------------ after cleanup


@pytest.fixture
def ddb_table(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> tuple[str, dict[str, str]]:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "keys.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", -1, 3))
    return uri, options


def test_a_key_whose_version_cleanup_removed_is_refused_with_its_version(
    ddb_table: tuple[str, dict[str, str]],
) -> None:
    uri, options = ddb_table
    table = lancetx.open(uri, storage_options=options)
    assert table.append(_data("first", 0), idempotency_key="job-1") == 2
    for i in range(3):
        table.append(_data("later", i))
    report = cleanup_versions(
        open_table(uri, options),
        keep_versions=1,
        older_than=timedelta(0),
        items_older_than=timedelta(0),
    )
    assert report.ok and 2 in report.removed_versions and 2 in report.items_deleted

    # Every door: deduplicated, with the version number (its manifest is gone).
    again = lancetx.open(uri, storage_options=options)
    assert again.append(_data("retry", 0), idempotency_key="job-1") == 2
    assert again.last_commit is not None and again.last_commit.deduplicated
    fragments_result = _commit_fragments(TableState.connect(uri, options), "fragments", "job-1")
    assert (fragments_result.version, fragments_result.deduplicated) == (2, True)
    assert again.find_idempotency_key("job-1") == 2
    ds = lance.dataset(uri, storage_options=options)
    assert ds.version == 5
    assert set(ds.to_table(columns=["writer"])["writer"].to_pylist()) == {"setup", "first", "later"}

    # The engine, holding the latest version: the key item refuses the claim, and the
    # version it names cannot be read any more.
    from lancetx.commit.errors import KeyAlreadyCommittedError

    conn = connect(uri, options)
    parent = load_parent(conn.handler, conn.base)
    assert parent is not None
    fragments = lance.fragment.write_fragments(
        _data("engine", 0), conn.data_uri, storage_options=options
    )
    txn = Transaction(
        parent.version, Append(fragments=tuple(fragment_from_pylance(f) for f in fragments))
    )
    with pytest.raises(KeyAlreadyCommittedError) as refused:
        commit_transaction(
            conn.handler,
            conn.base,
            txn,
            parent=parent,
            options=CommitOptions(idempotency_key="job-1"),
        )
    assert refused.value.version == 2 and refused.value.key == "job-1"
    assert lance.dataset(uri, storage_options=options).version == 5


# -------------------------------------------------------------- slots and tables


def test_two_keys_sharing_a_slot_are_told_apart(
    ddb_table: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lancetx.commit.errors import IdempotencyKeyCollisionError
    from lancetx.externalstore import base as store_base

    uri, options = ddb_table
    monkeypatch.setattr(store_base, "key_slot", lambda key: 42)
    table = lancetx.open(uri, storage_options=options)
    assert table.append(_data("first", 0), idempotency_key="job-1") == 2
    with pytest.raises(IdempotencyKeyCollisionError, match=r"'job-2'.*'job-1'.*version 2"):
        table.append(_data("second", 0), idempotency_key="job-2")
    with pytest.raises(IdempotencyKeyCollisionError):
        table.find_idempotency_key("job-2")
    assert lance.dataset(uri, storage_options=options).version == 2
    conn = connect(uri, options)
    names = [m.key.rsplit("/", 1)[-1] for m in conn.handler.store.list(f"{conn.base}/_versions/")]
    assert [n for n in names if "-" in n] == []  # the refused claim's staged manifest is gone


def test_delete_all_removes_the_key_items(ddb_table: tuple[str, dict[str, str]]) -> None:
    uri, options = ddb_table
    table = lancetx.open(uri, storage_options=options)
    table.append(_data("first", 0), idempotency_key="job-1")
    conn = connect(uri, options)
    handler = conn.handler
    assert isinstance(handler, ExternalStoreCommitHandler)
    assert handler.find_key(conn.base, "job-1") == 2
    handler.entries.delete_all(conn.base)
    assert handler.entries.list_entries(conn.base) == []
    assert handler.find_key(conn.base, "job-1") is None


# --------------------------------------------------------------- more at once


@pytest.mark.parametrize("kind", ["conditional-put", "s3+ddb"])
def test_eight_threads_committing_one_key_land_it_once(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "s3+ddb":
        uri, options = request.getfixturevalue("ddb_table")
    else:
        uri, options = str(tmp_path / "t.lance"), {}
        _plain_table(uri)
    data_uri = connect(uri, options).data_uri
    writers = 8
    prepared = [
        lance.fragment.write_fragments(_data(f"w{n}", 0), data_uri, storage_options=options or None)
        for n in range(writers)
    ]
    barrier = threading.Barrier(writers, timeout=120)
    results: dict[int, lancetx.CommitResult] = {}
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            barrier.wait()
            results[n] = lancetx.commit_fragments(
                uri,
                prepared[n],
                schema=_data("x", 0).schema,
                storage_options=options,
                idempotency_key="job-8",
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    winners = [n for n, r in results.items() if not r.deduplicated]
    assert len(winners) == 1, results
    assert {r.version for r in results.values()} == {2}
    rows = lance.dataset(uri, storage_options=options or None).to_table(columns=["writer"])
    assert sorted(set(rows["writer"].to_pylist())) == sorted({"setup", f"w{winners[0]}"})
    assert lance.dataset(uri, storage_options=options or None).version == 2


def test_the_async_door_finds_a_key_through_its_key_item(
    ddb_table: tuple[str, dict[str, str]],
) -> None:
    import lancetx.aio

    uri, options = ddb_table

    async def main() -> tuple[int, int, int, bool]:
        table = await lancetx.aio.open(uri, options)
        first = await table.append(_data("first", 0), idempotency_key="job-a")
        await table.append(_data("later", 0))
        other = await lancetx.aio.open(uri, options)
        again = await other.append(_data("again", 0), idempotency_key="job-a")
        assert other.last_commit is not None
        return (
            first,
            again,
            await other.find_idempotency_key("job-a") or 0,
            other.last_commit.deduplicated,
        )

    first, again, found, deduplicated = asyncio.run(main())
    assert (first, again, found, deduplicated) == (2, 2, 2, True)
    assert lance.dataset(uri, storage_options=options).version == 3


def test_a_key_item_that_outlived_its_versions_is_reported_not_taken(tmp_path: Path) -> None:
    """A key item naming a version that holds another transaction (its table's items were
    deleted by hand, the key items left): the claim stops with a typed error, nothing
    committed and nothing taken for a match."""
    from lancetx.commit.errors import InvalidCommitError
    from lancetx.externalstore.base import KeyRecord, key_slot, keys_base_uri

    path = str(tmp_path / "t.lance")
    table = _keyed_table(path)
    assert table.append(_data("plain", 0)) == 2
    entries = _state(table).conn.handler.entries  # type: ignore[attr-defined]
    assert isinstance(entries, MemoryManifestStore)
    base = _state(table).conn.base
    stale = KeyRecord(base, "job-x", 2, transaction_uuid="gone", commit_token="gone")
    entries._keys.setdefault(keys_base_uri(base), {})[key_slot("job-x")] = stale
    fresh = lancetx.Table(TableState(_state(table).conn))
    with pytest.raises(InvalidCommitError, match=r"key item of idempotency key 'job-x'.*outlived"):
        # The look-up believes the item (version 2): so go through the engine.
        parent = load_parent(fresh._state.conn.handler, base)
        assert parent is not None
        fragments = lance.fragment.write_fragments(_data("x", 0), path)
        commit_transaction(
            fresh._state.conn.handler,
            base,
            Transaction(
                parent.version,
                Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
            ),
            parent=parent,
            options=CommitOptions(idempotency_key="job-x"),
        )
    assert lance.dataset(path).version == 2
