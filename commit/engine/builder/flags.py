"""Feature flags: refusing manifests with flags we do not know, and computing the
new version's reader/writer flags from the finished manifest."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import (
    FLAG_BASE_PATHS,
    FLAG_DELETION_FILES,
    FLAG_DISABLE_TRANSACTION_FILE,
    FLAG_STABLE_ROW_IDS,
    FLAG_TABLE_CONFIG,
    KNOWN_FEATURE_FLAGS,
    NEWER_FLAG_NAMES,
)
from lancetx.commit.engine.builder.errors import UnsupportedTransactionError
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

Manifest = table_pb2.Manifest


def check_flags(state: BuildState, manifest: Manifest, what: str) -> None:
    unknown = (manifest.reader_feature_flags | manifest.writer_feature_flags) & ~KNOWN_FEATURE_FLAGS
    if unknown:
        names = []
        for bit in range(64):
            if unknown >> bit & 1:
                known = NEWER_FLAG_NAMES.get(1 << bit)
                names.append(f"1<<{bit} ({known})" if known else f"1<<{bit}")
        raise UnsupportedTransactionError(
            state.op_name,
            f"feature flag(s) {', '.join(names)} set on {what}",
            unknown,
        )


def apply_feature_flags(state: BuildState) -> None:
    """``apply_feature_flags``, computed from the finished manifest."""
    manifest = state.manifest
    reader = writer = 0
    if any(f.HasField("deletion_file") for f in manifest.fragments):
        reader |= FLAG_DELETION_FILES
        writer |= FLAG_DELETION_FILES
    with_row_ids = [f.WhichOneof("row_id_sequence") is not None for f in manifest.fragments]
    if any(with_row_ids) or state.use_stable_row_ids:
        if not all(with_row_ids):
            missing = [
                f.id for f, has in zip(manifest.fragments, with_row_ids, strict=True) if not has
            ]
            raise state.fail(
                f"All fragments must have row ids (stable row ids); fragment(s) {missing} have none",
                missing,
            )
        reader |= FLAG_STABLE_ROW_IDS
        writer |= FLAG_STABLE_ROW_IDS
    if manifest.config:
        writer |= FLAG_TABLE_CONFIG
    if manifest.base_paths:
        reader |= FLAG_BASE_PATHS
        writer |= FLAG_BASE_PATHS
    if not state.transaction_file:
        writer |= FLAG_DISABLE_TRANSACTION_FILE
    manifest.reader_feature_flags = reader
    manifest.writer_feature_flags = writer
