"""Two operators at once: a ``cleanup`` (or ``gc``) that runs while another ``cleanup``
removes versions.

A cleanup deletes the oldest manifests first. One running beside it lists
``_versions/``, then reads the manifests it listed: those the other removed in
between are gone. Both ``gc`` and ``cleanup`` used to take that for a wedged table
(``WedgedTableError`` … "their repair may need files this would delete. Run
lancetx-sync verify first"), exit 1 and send the operator to repair a table that is
fine. The interleaving is injected (the other cleanup runs, whole, between the
second one's listing and its reads): no timing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import lance
import pytest
from cli_helpers import DdbTable, make_table
from protocol_helpers import batch

from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops import preflight
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.gc import collect_garbage
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table

VERSIONS = 8


@pytest.fixture
def table(legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> DdbTable:
    """``VERSIONS`` versions, each an overwrite (every old version has files of its own),
    version 3 tagged."""
    made = make_table(legacy_aws, bucket, ddb_table_name, versions=1)
    for seq in range(1, VERSIONS):
        lance.write_dataset(
            batch("w", seq, 5), made.uri, mode="overwrite", storage_options=made.options
        )
    lance.dataset(made.uri, storage_options=made.options).tags.create("keep", 3)
    return made


def _cleanup_between_listing_and_reads(
    table: DdbTable, monkeypatch: pytest.MonkeyPatch
) -> list[Any]:
    """The next ``check_table`` (the victim's) lists ``_versions/``, then a whole other
    cleanup runs (keep 2, items deleted at once), then the victim reads its manifests."""
    original = preflight.read_manifests
    others: list[Any] = []
    started: list[bool] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if not started:  # the victim's first read; the other cleanup's go straight through
            started.append(True)
            others.append(
                cleanup_versions(
                    open_table(table.uri, table.options),
                    keep_versions=2,
                    items_older_than=timedelta(0),
                )
            )
        return original(*args, **kwargs)

    monkeypatch.setattr(preflight, "read_manifests", racing)
    return others


VICTIMS: dict[str, Callable[[DdbTable], Any]] = {
    "cleanup": lambda t: cleanup_versions(
        open_table(t.uri, t.options), keep_versions=4, items_older_than=timedelta(0)
    ),
    "gc": lambda t: collect_garbage(
        open_table(t.uri, t.options), older_than=timedelta(days=7), dry_run=False
    ),
}


@pytest.mark.parametrize("victim", VICTIMS)
def test_versions_another_cleanup_removes_meanwhile_are_not_a_wedged_table(
    victim: str, table: DdbTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    others = _cleanup_between_listing_and_reads(table, monkeypatch)
    report = VICTIMS[victim](table)
    assert others and others[0].ok and others[0].removed_versions == [1, 2, 4, 5, 6]
    assert report.ok, report
    if victim == "cleanup":
        assert report.removed_versions == [] and report.tagged_versions == [3]
    monkeypatch.undo()
    for version in (3, 7, 8):
        ds = lance.dataset(table.uri, version=version, storage_options=table.options)
        assert ds.to_table().num_rows == 5
    verified = verify_table(open_table(table.uri, table.options))
    assert verified.ok, verified.findings
