"""The commit queue in DynamoDB (``externalstore/dynamodb/commit_queue.py``), on the moto server.

* Tickets count up; ``served`` only ever moves up; the queue item is invisible
  to pylance and to the table's own entries.
* A writer that meets contention takes a ticket and claims only once every
  ticket before it was served; its claim serves its own (the entry records
  the ticket), and waiters learn their turn from the claims — also from a claim
  whose ticket a pylance reader's finalization stripped from the entry.
* A ticket nobody serves (its writer died) holds the queue up for the stall
  limit only; serving a later ticket skips it.
* A turn that ends without a claim is served in the queue item, which a
  waiter reads when the queue stands still.
* While pylance commits to the table, lancetx writers do not queue (fair to it).
* Without ``dynamodb:UpdateItem`` the commit still lands (random backoff) and
  the warning names the action.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lance
import pytest
from protocol_helpers import (
    RequestLog,
    batch,
    ddb_uri,
    ensure_ddb_table,
    lancetx_append,
    pylance_append,
    pylance_create,
)

from lancetx.commit.engine import committer, contention
from lancetx.commit.engine.committer import CommitOptions, Committed, Parent, load_parent
from lancetx.commit.engine.events import CommitEvent
from lancetx.commit.handlers.queue import Turns
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.dynamodb.commit_queue import QUEUE_SUFFIX
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.errors import AccessDeniedError

ROWS = 10


@dataclass
class Queued:
    conn: TableConnection
    options: dict[str, str]
    log: RequestLog

    @property
    def handler(self) -> ExternalStoreCommitHandler:
        handler = self.conn.handler
        assert isinstance(handler, ExternalStoreCommitHandler)
        return handler

    @property
    def entries(self) -> DynamoDBManifestStore:
        entries = self.handler.entries
        assert isinstance(entries, DynamoDBManifestStore)
        return entries

    def append(
        self,
        seq: int,
        options: CommitOptions | None = None,
        *,
        parent: Parent | Committed | None = None,
    ) -> Committed:
        return lancetx_append(
            self.handler,
            self.conn.base,
            self.conn.data_uri,
            self.options,
            batch("queued", seq, ROWS),
            parent,
            options,
        )


@pytest.fixture
def queued(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Queued]:
    monkeypatch.setattr(contention, "_tables", {})  # no contention remembered from other tests
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "queue.lance", ddb_table_name)
    pylance_create(uri, options, batch("setup", 0, ROWS))
    conn = connect(uri, options)
    log = RequestLog()
    log.attach(conn.handler.entries.client, "dynamodb")  # type: ignore[attr-defined]
    yield Queued(conn, options, log)


def contended(queued: Queued) -> None:
    """As if this process had just met contention on the table."""
    uri = queued.handler.store.uri(queued.conn.base)
    contention.table_contention(uri).queued(time.monotonic())


def test_tickets_count_up_and_served_never_moves_down(queued: Queued) -> None:
    entries, base = queued.entries, queued.conn.base
    assert entries.read_turns(base) == Turns(issued=0, served=0)  # no item yet
    assert entries.take_ticket(base) == Turns(issued=1, served=0)
    assert entries.take_ticket(base) == Turns(issued=2, served=0)
    before = time.time()
    entries.end_turn(base, 2, version=7)
    entries.end_turn(base, 1, version=6)  # late: must not move the mark back
    turns = entries.read_turns(base)
    assert (turns.issued, turns.served, turns.served_version) == (2, 2, 7)
    assert before - 1 <= turns.served_at <= time.time() + 1  # when the turn after it began
    assert entries.take_ticket(base).issued == 3


def test_the_queue_item_is_invisible_to_the_table_and_to_pylance(queued: Queued) -> None:
    entries, base = queued.entries, queued.conn.base
    entries.take_ticket(base)
    assert [e.version for e in entries.list_entries(base)] == [1]
    assert entries.latest(base) is not None and entries.latest(base).version == 1  # type: ignore[union-attr]
    assert not any(e.base_uri.endswith(QUEUE_SUFFIX) for e in entries.list_entries(base))
    ds = lance.dataset(queued.conn.uri, storage_options=queued.options)
    assert ds.version == 1 and ds.count_rows() == ROWS


def test_a_contended_writer_claims_only_after_the_tickets_before_it(queued: Queued) -> None:
    entries, base = queued.entries, queued.conn.base
    ahead = entries.take_ticket(base).issued  # another writer waits before us
    served_at: list[float] = []

    def other_writer_finishes() -> None:
        time.sleep(0.4)
        served_at.append(time.monotonic())
        entries.end_turn(base, ahead)

    contended(queued)
    claims: list[float] = []

    def observe(event: CommitEvent) -> None:
        claims.append(time.monotonic())

    finisher = threading.Thread(target=other_writer_finishes)
    finisher.start()
    queued.log.clear()
    committed = queued.append(0, CommitOptions(observer=observe))
    finisher.join()

    assert committed.version == 2 and committed.attempts == 1
    assert served_at and claims[0] >= served_at[0]  # waited for its turn
    ops = queued.log.operations()
    assert ops.index("UpdateItem") < ops.index("PutItem")  # a ticket before any claim
    # The turn ahead ended without a claim: only the queue item shows it, and
    # a waiter reads it once the queue has stood still for a while.
    assert "GetItem" in ops
    # Its own claim served its ticket (recorded in the entry): no request
    # between the claim and the pointer flip, the queue item left as it was.
    assert ops[-2:] == ["PutItem", "PutItem"]
    turns = entries.read_turns(base)
    assert (turns.issued, turns.served) == (ahead + 1, ahead)
    entry = entries.get(base, 2)
    assert entry.summary is not None and entry.summary.ticket == ahead + 1
    assert entry.summary.claimed_at is not None and claims[0] - 60 < entry.summary.claimed_at


def test_a_waiter_learns_its_turn_from_the_claim_before_it(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Claims serve their tickets in their entries; the queue item is not touched.
    # If the waiter did not watch the claims it would wait the whole stall limit.
    monkeypatch.setattr(contention, "MIN_STALL", 30.0)
    monkeypatch.setattr(contention, "MIN_QUEUE_CHECK", 30.0)
    entries, base = queued.entries, queued.conn.base
    first = connect(queued.conn.uri, queued.options)
    assert isinstance(first.handler, ExternalStoreCommitHandler)
    slow_commit = first.handler.commit

    def after_a_while(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)  # the first writer's turn takes a while
        return slow_commit(*args, **kwargs)

    monkeypatch.setattr(first.handler, "commit", after_a_while)
    read_queue: list[str] = []
    reading = entries.read_turns

    def read_turns(base_uri: str) -> Turns:
        read_queue.append(base_uri)
        return reading(base_uri)

    monkeypatch.setattr(entries, "read_turns", read_turns)
    contended(queued)
    done: list[Committed] = []
    writer = threading.Thread(
        target=lambda: done.append(
            lancetx_append(
                first.handler,
                first.base,
                first.data_uri,
                queued.options,
                batch("first", 0, ROWS),
                None,
            )
        )
    )
    s3_log = RequestLog().attach(queued.handler.store.client, "s3")  # type: ignore[attr-defined]
    writer.start()
    deadline = time.monotonic() + 10
    while reading(base).issued < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the first writer holds ticket 1
    queued.log.clear()
    began = time.monotonic()
    ours = queued.append(0)
    waited = time.monotonic() - began
    writer.join()

    assert done and done[0].version == 2 and ours.version == 3
    assert ours.attempts == 1  # it waited for its turn instead of losing a round
    assert waited < 10  # learnt from the first claim, not from the stall limit
    assert read_queue == []  # it never read the queue item
    # Its looks that found nothing new did not make the handler list the
    # object store (for history recorded nowhere else).
    assert "ListObjectsV2" not in s3_log.operations()
    # Each look read the version it expected next, by key (a GetItem): none was a
    # Query from its parent on, whose cost grows with the table's history.
    ops = queued.log.operations("dynamodb")
    looks = ops[ops.index("UpdateItem") + 1 :]  # after it took its ticket
    assert "GetItem" in looks and "Query" not in looks, ops
    turns = reading(base)
    assert (turns.issued, turns.served) == (2, 0)  # nobody served in the queue item
    tickets = [e.summary.ticket for e in entries.list_entries(base, 1) if e.summary]
    assert tickets == [1, 2]


def test_a_waiter_learns_its_turn_from_a_claim_whose_ticket_pylance_stripped(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first writer's claim serves ticket 1, then a pylance reader's finalization
    rewrites its item with Lance's attributes only (after the writer's own flip:
    nobody can put the ticket back). The waiter holding ticket 2 sees a version
    without a ticket after the last claim that showed one, and goes: it does not
    wait out the stall limit (30 s here) for a ticket it can no longer see."""
    monkeypatch.setattr(contention, "MIN_STALL", 30.0)
    monkeypatch.setattr(contention, "MIN_QUEUE_CHECK", 30.0)
    entries, base = queued.entries, queued.conn.base
    first = connect(queued.conn.uri, queued.options)
    assert isinstance(first.handler, ExternalStoreCommitHandler)
    first_commit = first.handler.commit
    stripped = threading.Event()

    def then_stripped(*args: Any, **kwargs: Any) -> Any:
        location = first_commit(*args, **kwargs)
        # pylance's put_if_exists: a PutItem of the whole item, Lance's attributes only.
        entries.client.put_item(
            TableName=entries.table_name,
            Item={
                "base_uri": {"S": base},
                "version": {"N": str(location.version)},
                "path": {"S": location.key},
                "size": {"N": str(location.size)},
                "committer": {"S": "lancedb"},
            },
            ConditionExpression="attribute_exists(base_uri) AND attribute_exists(version)",
        )
        stripped.set()
        return location

    monkeypatch.setattr(first.handler, "commit", then_stripped)
    listing = queued.handler.list_versions

    def list_after_the_strip(base_: str, since: int = 0) -> Any:
        stripped.wait(30)  # our looks come after pylance's rewrite, whenever they come
        return listing(base_, since)

    monkeypatch.setattr(queued.handler, "list_versions", list_after_the_strip)
    reading_entries = entries.get_entries

    def read_after_the_strip(base_uri: str, versions: Any) -> Any:
        stripped.wait(30)  # the same for the looks that read the versions by key
        return reading_entries(base_uri, versions)

    monkeypatch.setattr(entries, "get_entries", read_after_the_strip)
    read_queue: list[str] = []
    reading = entries.read_turns
    monkeypatch.setattr(entries, "read_turns", lambda b: read_queue.append(b) or reading(b))
    # Ours builds on version 1, read now: were it to read the latest when it starts, it
    # could find version 2 still staged and finish it itself, putting the ticket back.
    parent = load_parent(queued.handler, base)
    contended(queued)
    done: list[Committed] = []
    writer = threading.Thread(
        target=lambda: done.append(
            lancetx_append(
                first.handler, first.base, first.data_uri, queued.options, batch("first", 0, ROWS)
            )
        )
    )
    writer.start()
    deadline = time.monotonic() + 10
    while reading(base).issued < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the first writer holds ticket 1
    began = time.monotonic()
    ours = queued.append(0, parent=parent)
    waited = time.monotonic() - began
    writer.join()

    assert done and done[0].version == 2 and ours.version == 3
    assert entries.get(base, 2).summary is None  # the ticket of the first claim is gone
    assert ours.attempts == 1
    assert waited < 10, f"waited {waited:.1f} s: the stall limit, not the claim"
    assert read_queue == []


def test_a_ticket_nobody_serves_holds_the_queue_for_the_stall_limit_only(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(contention, "MIN_STALL", 0.3)
    entries, base = queued.entries, queued.conn.base
    dead = entries.take_ticket(base).issued  # its writer died holding it
    contended(queued)
    began = time.monotonic()
    committed = queued.append(0)
    waited = time.monotonic() - began

    assert committed.version == 2
    assert waited >= 0.3  # it did wait for the dead ticket...
    assert waited < 10  # ...but not for long
    # Our claim served our ticket, past the dead one: nobody waits for it again.
    entry = entries.get(base, 2)
    assert entry.summary is not None and entry.summary.ticket == dead + 1
    # Were the dead ticket waited for again, the stall limit (now 30 s) would show.
    monkeypatch.setattr(contention, "MIN_STALL", 30.0)
    began = time.monotonic()
    assert queued.append(1).version == 3
    assert time.monotonic() - began < 10


def test_without_update_item_the_commit_lands_and_the_warning_names_the_action(
    queued: Queued, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def denied(base_uri: str) -> Turns:
        raise AccessDeniedError(
            "dynamodb:UpdateItem", "arn:aws:dynamodb:::table/t", "AccessDeniedException", "no"
        )

    monkeypatch.setattr(queued.entries, "take_ticket", denied)
    contended(queued)
    with caplog.at_level(logging.WARNING, logger="lancetx.externalstore.commit_handler"):
        first = queued.append(0)
        second = queued.append(1)
    assert (first.version, second.version) == (2, 3)
    warnings = [r.getMessage() for r in caplog.records if "commit queue" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once: the handler stops asking
    assert "dynamodb:UpdateItem" in warnings[0]
    parent = load_parent(queued.handler, queued.conn.base)
    assert parent is not None and parent.version == 3


def test_without_batch_get_item_waiters_list_and_the_warning_names_the_action(
    queued: Queued, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A policy written before waiters looked by key denies their point reads: they
    list the versions instead (as they did before), once told, and every commit lands."""
    calls: list[int] = []

    def denied(base_uri: str, versions: Any) -> Any:
        calls.append(1)
        raise AccessDeniedError(
            "dynamodb:BatchGetItem", "arn:aws:dynamodb:::table/t", "AccessDeniedException", "no"
        )

    monkeypatch.setattr(queued.entries, "get_entries", denied)
    contended(queued)
    with caplog.at_level(logging.WARNING, logger="lancetx.externalstore.commit_handler"):
        first = queued.append(0)
        second = queued.append(1, parent=first)
    assert (first.version, second.version) == (2, 3)
    assert len(calls) == 1  # looks are off for the handler after the first refusal
    warnings = [r.getMessage() for r in caplog.records if "commit queue" in r.getMessage()]
    assert len(warnings) == 1 and "dynamodb:BatchGetItem" in warnings[0], warnings
    assert "Query" in queued.log.operations("dynamodb")  # listed instead


def test_writers_stop_taking_turns_while_pylance_commits_to_the_table(queued: Queued) -> None:
    # Queued writers claim back to back; a pylance writer (no queue, slower attempts)
    # would lose nearly every round until its retry budget ran out.
    contended(queued)
    first = queued.append(0)
    pylance_append(queued.conn.uri, queued.options, batch("pylance", 0, ROWS))
    second = queued.append(1, parent=first)  # stale: the look before staging lists pylance's
    assert second.version == first.version + 2
    queued.log.clear()
    third = queued.append(2, parent=second)
    assert third.version == second.version + 1
    assert "UpdateItem" not in queued.log.operations()  # no ticket while pylance writes here


def test_a_failure_serving_the_ticket_never_leaves_a_won_claim_unfinished(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim is won before the ticket is served: whatever serving raises (even a
    # bug, not a typed error), the version is copied, flipped and reported as ours.
    def broken(base_uri: str, ticket: int, version: int | None = None) -> None:
        raise KeyError("UpdateItem")

    monkeypatch.setattr(queued.entries, "end_turn", broken)
    # A claim without a summary to record the ticket in serves it in the queue item.
    monkeypatch.setattr(committer, "_summary", lambda ours: None)
    contended(queued)
    committed = queued.append(0)
    assert committed.version == 2
    entry = queued.entries.get(queued.conn.base, 2)
    assert not entry.is_staged  # finalized: the final manifest, not the staged one
    assert queued.handler.last_outcome is not None and queued.handler.last_outcome.finalized


def race_once(queued: Queued, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make another writer claim the next version while our first claim is under
    way (after our attempt began); returns the version it took, once it did."""
    other = connect(queued.conn.uri, queued.options)
    claim = queued.handler.commit
    raced: list[int] = []

    def raced_by_another_writer(*args: Any, **kwargs: Any) -> Any:
        if not raced:
            winner = lancetx_append(
                other.handler, other.base, other.data_uri, queued.options, batch("w", 0, ROWS)
            )
            raced.append(winner.version)
        return claim(*args, **kwargs)

    monkeypatch.setattr(queued.handler, "commit", raced_by_another_writer)
    return raced


def test_a_round_lost_to_a_claim_made_while_we_tried_joins_the_queue(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lost to a winner that claimed while we tried: contention, so it queues at
    # once. (A parent that was stale before we began is retried at once instead:
    # test_request_budget's lost-race tests.) Retrying at once under contention
    # would stage, claim and lose again.
    raced = race_once(queued, monkeypatch)
    parent = load_parent(queued.handler, queued.conn.base)
    queued.log.clear()
    ours = queued.append(0, parent=parent)
    assert raced == [2] and ours.version == 3 and ours.attempts == 2
    assert "UpdateItem" in queued.log.operations()  # took a ticket after the lost round
    entry = queued.entries.get(queued.conn.base, 3)
    assert entry.summary is not None and entry.summary.ticket is not None


def test_without_a_queue_a_round_lost_to_a_claim_made_while_we_tried_backs_off(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No queue to join (here: UpdateItem denied): contention still means a random
    # wait before the next attempt, not the immediate retry a stale parent gets.
    def denied(base_uri: str) -> Turns:
        raise AccessDeniedError(
            "dynamodb:UpdateItem", "arn:aws:dynamodb:::table/t", "AccessDeniedException", "no"
        )

    monkeypatch.setattr(queued.entries, "take_ticket", denied)
    backoffs: list[int] = []
    delay = contention.delay

    def recorded(policy: Any, losses: int, slot: float, rng: Any = None) -> float:
        backoffs.append(losses)
        return delay(policy, losses, slot, rng)

    monkeypatch.setattr(contention, "delay", recorded)
    raced = race_once(queued, monkeypatch)
    ours = queued.append(0, parent=load_parent(queued.handler, queued.conn.base))
    assert raced == [2] and ours.version == 3 and ours.attempts == 2
    assert backoffs == [1]  # backed off once, after the lost round


class _Ticketed:
    """Another writer's handler whose claims carry ``ticket``: a writer that took it
    in another process (its claim serves it; this process never saw it served)."""

    def __init__(self, inner: ExternalStoreCommitHandler, ticket: int) -> None:
        self._inner = inner
        self._ticket = ticket

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        base, version, manifest, scheme, summary = args[:5]
        summary = dataclasses.replace(summary, ticket=self._ticket)
        return self._inner.commit(base, version, manifest, scheme, summary)


def test_a_writer_that_loaded_the_claim_serving_the_ticket_ahead_goes_at_once(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen in the randomized histories: a writer lost a round to a claim made from the
    # queue (another process's, carrying ticket 1), loaded it, then took ticket 2. The
    # queue item still said "served 0" (claims serve their tickets in their entries),
    # and the versions after the one it had loaded can never show ticket 1's claim:
    # it stood still for the stall limit (8.9 s there) before going anyway.
    monkeypatch.setattr(contention, "MIN_STALL", 30.0)
    monkeypatch.setattr(contention, "MIN_QUEUE_CHECK", 30.0)
    entries, base = queued.entries, queued.conn.base
    held = entries.take_ticket(base).issued  # the other process's ticket
    other = connect(queued.conn.uri, queued.options)
    assert isinstance(other.handler, ExternalStoreCommitHandler)
    claim = queued.handler.commit
    raced: list[int] = []

    def raced_by_a_queued_writer(*args: Any, **kwargs: Any) -> Any:
        if not raced:
            winner = lancetx_append(
                _Ticketed(other.handler, held),  # type: ignore[arg-type]
                other.base,
                other.data_uri,
                queued.options,
                batch("w", 0, ROWS),
            )
            raced.append(winner.version)
        return claim(*args, **kwargs)

    monkeypatch.setattr(queued.handler, "commit", raced_by_a_queued_writer)
    read_queue: list[str] = []
    reading = entries.read_turns
    monkeypatch.setattr(entries, "read_turns", lambda b: read_queue.append(b) or reading(b))
    parent = load_parent(queued.handler, base)
    began = time.monotonic()
    ours = queued.append(0, parent=parent)
    waited = time.monotonic() - began

    assert raced == [2] and ours.version == 3 and ours.attempts == 2
    claimed = entries.get(base, 2)
    assert claimed.summary is not None and claimed.summary.ticket == held
    entry = entries.get(base, 3)
    assert entry.summary is not None and entry.summary.ticket == held + 1  # it did queue
    assert waited < 10, f"waited {waited:.1f} s for ticket {held}, served before it queued"
    assert read_queue == []  # it never stood still long enough to read the queue item
