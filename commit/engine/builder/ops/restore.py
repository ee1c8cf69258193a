"""Restore: an old version's manifest and indices, as the new version."""

from __future__ import annotations

from datetime import UTC

from lancetx.commit.engine.builder.common import BuiltManifest, clear_positions, copy_message
from lancetx.commit.engine.builder.flags import check_flags
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import transaction_pb2

Transaction = transaction_pb2.Transaction


def apply_restore(state: BuildState) -> BuiltManifest:
    target = state.txn.restore.version
    if state.restore_source is None:
        raise state.fail(
            f"restore_source is required: pass the manifest and indices of version "
            f"{target}, the version being restored"
        )
    old, old_indices = state.restore_source
    if old.version != target:
        raise state.fail(
            f"restore_source is version {old.version}, but the transaction restores "
            f"version {target}"
        )
    check_flags(state, old, f"restored version {target}")
    # Transaction::restore_old_manifest: the old manifest as it was (writer
    # version, flags, tag, indices), with a new timestamp and transaction file;
    # the high-water mark never goes back.
    manifest = copy_message(old)
    clear_positions(manifest)
    manifest.version = state.version
    manifest.timestamp.FromDatetime(state.now.astimezone(UTC).replace(tzinfo=None))
    manifest.transaction_file = state.transaction_file
    prev = state.previous
    if (
        prev is not None
        and prev.HasField("max_fragment_id")
        and (
            not manifest.HasField("max_fragment_id")
            or manifest.max_fragment_id < prev.max_fragment_id
        )
    ):
        manifest.max_fragment_id = prev.max_fragment_id
    return BuiltManifest(manifest, [copy_message(i) for i in old_indices])
