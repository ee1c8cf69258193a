"""The state one build works on: the inputs, the manifest being built, and the
counters the steps advance (next fragment id, next row id)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from lancetx.commit.engine.builder.common import copy_message, op_name
from lancetx.commit.engine.builder.errors import (
    InvalidTransactionError,
    UnsupportedTransactionError,
)
from lancetx.protos import table_pb2, transaction_pb2

Manifest = table_pb2.Manifest
IndexMetadata = table_pb2.IndexMetadata
DataFragment = table_pb2.DataFragment
Transaction = transaction_pb2.Transaction


class BuildState:
    """Inputs and working state of one ``build_manifest`` call; the build steps
    (functions taking it as ``state``) read and advance it."""

    # Set by the driver before any operation runs (not for Restore).
    manifest: Manifest
    indices: list[IndexMetadata]
    use_stable_row_ids: bool
    next_row_id: int | None
    next_fragment_id: int
    prev_fragments: dict[int, DataFragment]

    def __init__(
        self,
        previous: Manifest | None,
        previous_indices: Sequence[IndexMetadata],
        txn: Transaction,
        *,
        version: int,
        transaction_file: str,
        restore_source: tuple[Manifest, Sequence[IndexMetadata]] | None,
        clone_source: tuple[Manifest, Sequence[IndexMetadata]] | None = None,
        now: datetime | None,
        data_storage_version: str | None,
        enable_stable_row_ids: bool,
        frag_reuse_index: IndexMetadata | None = None,
    ) -> None:
        self.previous = previous
        self.previous_indices = [copy_message(i) for i in previous_indices]
        self.txn = txn
        self.version = version
        self.transaction_file = transaction_file
        self.restore_source = restore_source
        self.clone_source = clone_source
        if now is None:
            now = datetime.now(UTC)
        elif now.tzinfo is None:
            now = now.replace(tzinfo=UTC)  # a naive time is taken as UTC
        self.now = now
        self.requested_storage_version = data_storage_version
        self.enable_stable_row_ids = enable_stable_row_ids
        self.frag_reuse_index = frag_reuse_index
        op = txn.WhichOneof("operation")
        self.op_key = op or ""
        self.op_name = op_name(op) if op else "(no operation)"

    def fail(self, problem: str, fragment_ids: Iterable[int] = ()) -> InvalidTransactionError:
        return InvalidTransactionError(
            self.op_name,
            problem,
            read_version=self.txn.read_version,
            previous_version=self.previous.version if self.previous is not None else None,
            version=self.version,
            fragment_ids=fragment_ids,
        )

    def unsupported(self, feature: str, flags: int = 0) -> UnsupportedTransactionError:
        return UnsupportedTransactionError(self.op_name, feature, flags)

    def require_previous(self) -> Manifest:
        if self.previous is None:
            raise self.fail(
                f"Cannot apply operation {self.op_name} to non-existent dataset; "
                "create the table with an Overwrite first"
            )
        return self.previous
