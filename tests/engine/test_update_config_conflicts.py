"""Concurrent UpdateConfig commits on a real pylance table.

Two writers that both remove the same config key commute (either order leaves
the key absent), so both land -- as Lance lets them. A removal racing a write
of the same key does not commute: the second is refused, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import EngineTable, make_table

from lancetx.commit.engine.operations import Transaction, UpdateConfig, update_map
from lancetx.commit.errors import IncompatibleConflictError


@pytest.fixture
def table(tmp_path: Path) -> EngineTable:
    table = make_table(str(tmp_path / "t.lance"), sizes=(5,))
    table.dataset().update_config({"team.owner": "ana", "team.tier": "gold"})  # v2, pylance
    return table


@pytest.mark.parametrize("how", ["stale-held", "resolved"])
def test_two_removals_of_the_same_key_both_land(table: EngineTable, how: str) -> None:
    read = table.latest()
    first = Transaction(read.version, UpdateConfig(config_updates=update_map({"team.owner": None})))
    second = Transaction(
        read.version, UpdateConfig(config_updates=update_map({"team.owner": None}))
    )

    won = table.commit(first, parent=read)
    landed = table.commit(second, parent=read if how == "stale-held" else None)

    assert (won.version, landed.version) == (3, 4)
    assert table.versions() == [1, 2, 3, 4]
    assert table.dataset().config() == {"team.tier": "gold"}
    assert table.dataset(version=2).config()["team.owner"] == "ana"


def test_a_removal_racing_a_write_of_the_same_key_is_refused(table: EngineTable) -> None:
    read = table.latest()
    table.commit(
        Transaction(read.version, UpdateConfig(config_updates=update_map({"team.owner": "bo"}))),
        parent=read,
    )
    versions = table.listing("_versions")

    with pytest.raises(IncompatibleConflictError) as info:
        table.commit(
            Transaction(
                read.version, UpdateConfig(config_updates=update_map({"team.owner": None}))
            ),
            parent=read,
        )

    assert "team.owner" in str(info.value)
    assert table.listing("_versions") == versions
    assert table.dataset().config()["team.owner"] == "bo"
