"""The transaction in brief, and the claim's place in the commit queue, as
DynamoDB item attributes (``externalstore/dynamodb/plans.py``).

* Written with the claim and read back whole: operation, uuid, idempotency
  key, queue ticket, claim time (milliseconds).
* Items without them (pylance's) have no summary; half a summary is none.
* A queue ticket or claim time that is not a whole number is dropped, not an
  error: it only times waits, it decides nothing.
* A cleanup's ``removed_at`` mark round-trips (any number counts).
"""

from __future__ import annotations

from lancetx.commit.format.location import TransactionSummary
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.dynamodb.plans import entry_from_item, item_from_entry
from lancetx.externalstore.errors import DynamoDBTarget

TARGET = DynamoDBTarget("t")


def entry(summary: TransactionSummary | None) -> ManifestEntry:
    return ManifestEntry(base_uri="t.lance", version=3, path="t.lance/_versions/x", summary=summary)


def test_a_claims_summary_and_queue_place_round_trip() -> None:
    summary = TransactionSummary("Append", "u-1", "key", ticket=42, claimed_at=1700000000.123)
    item = item_from_entry(entry(summary), "lancetx")
    assert item["queue_ticket"] == {"N": "42"}
    assert item["claimed_at"] == {"N": "1700000000123"}
    assert entry_from_item(item, TARGET, "Query").summary == summary


def test_a_claim_outside_the_queue_has_a_time_but_no_ticket() -> None:
    summary = TransactionSummary("Delete", "u-2", claimed_at=1700000000.5)
    item = item_from_entry(entry(summary), "lancetx")
    assert "queue_ticket" not in item
    assert entry_from_item(item, TARGET, "Query").summary == summary


def test_items_without_a_summary_or_with_half_of_one_have_none() -> None:
    item = item_from_entry(entry(None), "pylance")
    assert not {"txn_operation", "queue_ticket", "claimed_at"} & item.keys()
    assert entry_from_item(item, TARGET, "Query").summary is None
    item["queue_ticket"] = {"N": "7"}  # a ticket without the transaction is no summary
    item["txn_operation"] = {"S": "Append"}
    assert entry_from_item(item, TARGET, "Query").summary is None


def test_a_queue_mark_that_is_not_a_whole_number_is_dropped() -> None:
    summary = TransactionSummary("Append", "u-3", ticket=5, claimed_at=1700000000.0)
    item = item_from_entry(entry(summary), "lancetx")
    item["queue_ticket"] = {"N": "5.5"}
    item["claimed_at"] = {"N": "-1"}
    assert entry_from_item(item, TARGET, "Query").summary == TransactionSummary("Append", "u-3")


def test_a_cleanups_removed_mark_round_trips_and_any_number_counts() -> None:
    """``removed_at`` (epoch ms) is what cleanup sets on the items it keeps as fences;
    an item a tool rewrote with a fraction is still marked; pylance's items are not."""
    marked = ManifestEntry(
        base_uri="t.lance", version=3, path="t.lance/_versions/x", committer="c", removed_at=5
    )
    item = item_from_entry(marked, "lancetx")
    assert item["removed_at"] == {"N": "5"}
    assert entry_from_item(item, TARGET, "Query") == marked
    assert entry_from_item({**item, "removed_at": {"N": "1.5e3"}}, TARGET, "Query").is_removed
    assert not entry_from_item(item_from_entry(entry(None), "lancedb"), TARGET, "Query").is_removed
