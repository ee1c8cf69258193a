"""One module per operation kind: how the operation changes the manifest.

Each ``apply_<op>(state)`` returns the new version's fragments (in any order; the
driver sorts them) and may change the schema, indices and counters on ``state``.
An optional ``finish_<op>(state)`` runs once the fragments and max_fragment_id
are final. Restore (:mod:`.restore`) and Clone (:mod:`.clone`) do not go through
this table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lancetx.commit.engine.builder.ops.append import apply_append
from lancetx.commit.engine.builder.ops.create_index import apply_create_index
from lancetx.commit.engine.builder.ops.data_replacement import apply_data_replacement
from lancetx.commit.engine.builder.ops.delete import apply_delete
from lancetx.commit.engine.builder.ops.merge import apply_merge
from lancetx.commit.engine.builder.ops.overwrite import apply_overwrite, finish_overwrite
from lancetx.commit.engine.builder.ops.project import apply_project
from lancetx.commit.engine.builder.ops.reserve_fragments import (
    apply_reserve_fragments,
    finish_reserve_fragments,
)
from lancetx.commit.engine.builder.ops.rewrite import apply_rewrite
from lancetx.commit.engine.builder.ops.update import apply_update
from lancetx.commit.engine.builder.ops.update_bases import apply_update_bases, finish_update_bases
from lancetx.commit.engine.builder.ops.update_config import (
    apply_update_config,
    finish_update_config,
)
from lancetx.commit.engine.builder.ops.update_mem_wal_state import apply_update_mem_wal_state
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2


@dataclass(frozen=True)
class Operation:
    """How one operation kind is built."""

    apply: Callable[[BuildState], list[table_pb2.DataFragment]]
    finish: Callable[[BuildState], None] | None = None


# Keyed by the oneof field name of ``transaction_pb2.Transaction.operation``.
OPERATIONS: dict[str, Operation] = {
    "append": Operation(apply_append),
    "delete": Operation(apply_delete),
    "update": Operation(apply_update),
    "overwrite": Operation(apply_overwrite, finish_overwrite),
    "create_index": Operation(apply_create_index),
    "rewrite": Operation(apply_rewrite),
    "merge": Operation(apply_merge),
    "project": Operation(apply_project),
    "reserve_fragments": Operation(apply_reserve_fragments, finish_reserve_fragments),
    "update_config": Operation(apply_update_config, finish_update_config),
    "update_bases": Operation(apply_update_bases, finish_update_bases),
    "data_replacement": Operation(apply_data_replacement),
    "update_mem_wal_state": Operation(apply_update_mem_wal_state),
}
