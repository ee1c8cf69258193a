"""build_manifest: the checks every transaction passes and the order of the build steps."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from lancetx.commit.engine.builder.bases import check_base_ids
from lancetx.commit.engine.builder.common import (
    FLAG_STABLE_ROW_IDS,
    BuiltManifest,
    clear_positions,
    copy_message,
    high_water_mark,
)
from lancetx.commit.engine.builder.data_format import apply_data_format
from lancetx.commit.engine.builder.flags import apply_feature_flags, check_flags
from lancetx.commit.engine.builder.fragment_ids import (
    check_new_fragments,
    finish_fragments,
    update_max_fragment_id,
)
from lancetx.commit.engine.builder.ops import OPERATIONS
from lancetx.commit.engine.builder.ops.clone import apply_clone
from lancetx.commit.engine.builder.ops.restore import apply_restore
from lancetx.commit.engine.builder.state import BuildState
from lancetx.commit.format.versioning import writer_version
from lancetx.protos import table_pb2, transaction_pb2

Manifest = table_pb2.Manifest
IndexMetadata = table_pb2.IndexMetadata
Transaction = transaction_pb2.Transaction


def build_manifest(
    previous: Manifest | None,
    previous_indices: Sequence[IndexMetadata],
    txn: Transaction,
    *,
    version: int,
    transaction_file: str,
    restore_source: tuple[Manifest, Sequence[IndexMetadata]] | None = None,
    clone_source: tuple[Manifest, Sequence[IndexMetadata]] | None = None,
    now: datetime | None = None,
    data_storage_version: str | None = None,
    enable_stable_row_ids: bool = False,
    frag_reuse_index: IndexMetadata | None = None,
) -> BuiltManifest:
    """Build the manifest of ``version`` by applying ``txn`` to ``previous``.

    ``previous`` is the latest manifest (None to create a table: only Overwrite
    can), ``previous_indices`` its indices, ``version`` the new version (chosen
    by the caller, normally ``previous.version + 1``), ``transaction_file`` the
    name written to ``_transactions/`` (``""`` when only an inline transaction
    is written: writer flag 32 is then set, as Lance does). For Restore,
    ``restore_source`` is the restored version's manifest and indices; for Clone,
    ``clone_source`` is the cloned version's (of the source table). ``now``
    defaults to the current UTC time. ``data_storage_version`` is the data
    storage version the writer requested (Lance's ``WriteParams``): it is checked
    against a new table's data files and replaces the format on Overwrite.
    ``enable_stable_row_ids`` turns stable row ids on for a new table.
    ``frag_reuse_index`` is the fragment reuse index a Rewrite that defers index
    remapping carries (Lance keeps it in memory, never in the transaction): it
    replaces the table's one in the new version.

    Raises InvalidTransactionError when the transaction does not fit
    ``previous``, UnsupportedTransactionError / UnsupportedFeatureError for a
    feature lancetx does not build, and RowIdFormatError for undecodable
    row-id sequences. The inputs are never modified.
    """
    return build(
        BuildState(
            previous,
            previous_indices,
            txn,
            version=version,
            transaction_file=transaction_file,
            restore_source=restore_source,
            clone_source=clone_source,
            now=now,
            data_storage_version=data_storage_version,
            enable_stable_row_ids=enable_stable_row_ids,
            frag_reuse_index=frag_reuse_index,
        )
    )


def build(state: BuildState) -> BuiltManifest:
    """Check the version and flags, then build: Restore and Clone stand apart; every
    other operation goes through :func:`build_regular`."""
    if not state.op_key:
        raise state.fail("the transaction has no operation")
    if state.version < 1:
        raise state.fail(
            f"version {state.version} is not a valid new version (versions start at 1)"
        )
    if state.previous is not None:
        if state.version <= state.previous.version:
            raise state.fail(
                f"the new version {state.version} must be greater than the previous "
                f"version {state.previous.version}"
            )
        check_flags(state, state.previous, f"version {state.previous.version}")
    if state.op_key == "restore":
        return apply_restore(state)
    if state.op_key == "clone":
        return check_base_ids(state, apply_clone(state))
    return check_base_ids(state, build_regular(state))


def build_regular(state: BuildState) -> BuiltManifest:
    """``Transaction::build_manifest``: a copy of the previous manifest, the
    operation's fragments (see :mod:`.ops`), then the shared finishing steps."""
    prev = state.previous
    op = state.op_key

    if prev is None and op != "overwrite":
        raise state.fail(
            f"Cannot apply operation {state.op_name} to non-existent dataset; "
            "create the table with an Overwrite first"
        )

    start_from_previous(state)
    manifest = state.manifest
    check_new_fragments(state)

    fragments = OPERATIONS[op].apply(state)

    finish_fragments(state, fragments)
    apply_data_format(state)
    manifest.tag = state.txn.tag
    manifest.timestamp.FromDatetime(state.now.astimezone(UTC).replace(tzinfo=None))
    update_max_fragment_id(state)
    # Steps some operations take once the fragments and max_fragment_id are final
    # (config maps, base paths, reserved ids: Lance's order).
    finish = OPERATIONS[op].finish
    if finish is not None:
        finish(state)
    manifest.transaction_file = state.transaction_file
    if state.next_row_id is not None:
        manifest.next_row_id = state.next_row_id
    apply_feature_flags(state)
    return BuiltManifest(manifest, state.indices)


def start_from_previous(state: BuildState) -> None:
    """``Manifest::new_from_previous``: the counters (row ids, fragment ids) and the
    copy of the previous manifest every operation starts from."""
    prev = state.previous
    # Stable row ids: on when the previous version has them (CommitBuilder
    # uses the dataset's flag), or when a new table asks for them.
    if prev is not None:
        state.use_stable_row_ids = bool(prev.reader_feature_flags & FLAG_STABLE_ROW_IDS)
        if state.enable_stable_row_ids and not state.use_stable_row_ids:
            raise state.fail("Cannot enable stable row ids on existing dataset")
        state.next_row_id = prev.next_row_id if state.use_stable_row_ids else None
    else:
        state.use_stable_row_ids = state.enable_stable_row_ids
        state.next_row_id = 0 if state.enable_stable_row_ids else None

    # Fragment ids continue after the high-water mark, for every operation
    # (pylance 14 measured: an Overwrite of a table whose high-water mark is 3
    # gives its new fragment id 4).
    high = high_water_mark(prev) if prev is not None else None
    state.next_fragment_id = high + 1 if high is not None else 0
    state.prev_fragments = {f.id: f for f in prev.fragments} if prev is not None else {}
    state.indices = state.previous_indices

    # Manifest::new_from_previous / Manifest::new
    if prev is not None:
        manifest = copy_message(prev)
        clear_positions(manifest)
        manifest.ClearField("fragments")
        manifest.ClearField("timestamp")
        manifest.tag = ""
        manifest.transaction_file = ""
        manifest.reader_feature_flags = 0
        manifest.writer_feature_flags = 0
    else:
        manifest = Manifest()
    manifest.version = state.version
    manifest.writer_version.CopyFrom(writer_version())
    state.manifest = manifest
