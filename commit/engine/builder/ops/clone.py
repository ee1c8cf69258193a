"""Clone: a new table whose first version is a version of another table (a shallow clone).

As Lance's ``Manifest::shallow_clone``: the source version's manifest as it was
(schema, fragments, config, metadata, counters), with the source registered as one
more base path (a dataset root, the next free id) and every data file, deletion file
and index that lived in the source's own folder pointed at it through that base id.
Files already stored under one of the source's bases keep their id (the base is
copied too). Nothing is copied: the clone reads the source's files.
"""

from __future__ import annotations

from datetime import UTC

from lancetx.commit.engine.builder.common import (
    FLAG_STABLE_ROW_IDS,
    BuiltManifest,
    clear_positions,
    copy_message,
)
from lancetx.commit.engine.builder.flags import apply_feature_flags, check_flags
from lancetx.commit.engine.builder.state import BuildState
from lancetx.commit.format.versioning import writer_version
from lancetx.protos import table_pb2

#: Per-fragment files Lance reads from the table's own folder whatever its bases:
#: a clone would read them from the wrong place, so such sources are refused.
_EXTERNAL_SEQUENCES = (
    "external_row_ids",
    "external_last_updated_at_versions",
    "external_created_at_versions",
)


def apply_clone(state: BuildState) -> BuiltManifest:
    op = state.txn.clone
    if state.previous is not None:
        raise state.fail(
            f"Clone can only be the first operation of a table, but the table exists "
            f"(version {state.previous.version})"
        )
    if not op.is_shallow:
        raise state.unsupported("a deep clone (is_shallow=false: copying the data files)")
    if op.HasField("branch_name"):
        raise state.unsupported(f"a clone into branch {op.branch_name!r} (Lance branches)")
    if not op.ref_path:
        raise state.fail("the Clone names no source (ref_path is empty)")
    if state.clone_source is None:
        raise state.fail(
            f"clone_source is required: pass the manifest and indices of version "
            f"{op.ref_version} of {op.ref_path!r}, the version being cloned"
        )
    source, source_indices = state.clone_source
    if source.version != op.ref_version:
        raise state.fail(
            f"clone_source is version {source.version}, but the transaction clones "
            f"version {op.ref_version}"
        )
    check_flags(state, source, f"version {op.ref_version} of {op.ref_path!r}")
    for fragment in source.fragments:
        external = [
            name
            for name in _EXTERNAL_SEQUENCES
            if fragment.HasField(name)  # type: ignore[arg-type]
        ]
        if external:
            raise state.unsupported(
                f"cloning fragment {fragment.id}, whose {', '.join(external)} are stored in "
                "a file of the source's folder (a clone would look for it in its own)"
            )

    manifest = copy_message(source)
    clear_positions(manifest)
    base_id = clone_base_id(source)
    for fragment in manifest.fragments:
        for data_file in fragment.files:
            if not data_file.HasField("base_id"):
                data_file.base_id = base_id
        if fragment.HasField("deletion_file") and not fragment.deletion_file.HasField("base_id"):
            fragment.deletion_file.base_id = base_id
    source_base = manifest.base_paths.add(id=base_id, is_dataset_root=True, path=op.ref_path)
    if op.HasField("ref_name"):
        source_base.name = op.ref_name
    indices = [copy_message(i) for i in source_indices]
    for index in indices:
        if not index.HasField("base_id"):
            # Only the source's own indices: one already under a base (the source is a
            # clone itself) keeps the base it names, which was copied with the others.
            index.base_id = base_id

    manifest.version = state.version
    manifest.writer_version.CopyFrom(writer_version())
    manifest.timestamp.FromDatetime(state.now.astimezone(UTC).replace(tzinfo=None))
    manifest.tag = ""
    manifest.ClearField("branch")
    manifest.transaction_file = state.transaction_file
    state.manifest = manifest
    state.use_stable_row_ids = bool(source.reader_feature_flags & FLAG_STABLE_ROW_IDS)
    apply_feature_flags(state)
    return BuiltManifest(manifest, indices)


def clone_base_id(source: table_pb2.Manifest) -> int:
    """The id a clone of ``source`` gives the source's own folder (the next free one)."""
    return max((b.id for b in source.base_paths), default=-1) + 1
