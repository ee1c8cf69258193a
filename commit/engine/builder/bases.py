"""Every file a new version stores under a base path names a base it registers.

A data file, deletion file or index with a ``base_id`` is read from that base
(``Manifest.base_paths``); a version naming an id it does not register is one no
reader can read (pylance: "base_path id N not found"). Checked for every build,
whatever the operation and door (what the transaction brings in; a clone whole), so
such a version is never committed.
"""

from __future__ import annotations

from google.protobuf.message import Message

from lancetx.commit.engine.builder.common import BuiltManifest
from lancetx.commit.engine.builder.state import BuildState
from lancetx.commit.format.bases import referenced_base_ids
from lancetx.protos import table_pb2


def check_base_ids(state: BuildState, built: BuiltManifest) -> BuiltManifest:
    """``built`` if every base id it uses is registered (and every deletion file's
    base is a dataset root, where Lance looks for ``_deletions/``), else
    InvalidTransactionError naming the first file that breaks the rule."""
    manifest = built.manifest
    registered = {b.id: b for b in manifest.base_paths}
    if state.op_key == "clone":
        fragments, indices = list(manifest.fragments), list(built.indices)
    else:
        # Base paths are only ever added (a Restore brings back a whole consistent
        # version): only what the transaction brings in can name an unknown id, and
        # checking just that keeps a commit's cost independent of the table's size.
        fragments, indices = _carried(state.txn)
    used = referenced_base_ids(fragments, indices)
    for base_id, what in sorted(used.items()):
        if base_id not in registered:
            ids = ", ".join(str(i) for i in sorted(registered)) or "none"
            raise state.fail(
                f"{what} is stored under base path id {base_id}, which the new version does "
                f"not register (registered ids: {ids}); register the base first "
                "(UpdateBases, or initial_bases when creating the table)"
            )
    for fragment in fragments:
        deletion = fragment.deletion_file
        if (
            fragment.HasField("deletion_file")
            and deletion.HasField("base_id")
            and not registered[deletion.base_id].is_dataset_root
        ):
            raise state.fail(
                f"the deletion file of fragment {fragment.id} is stored under base path id "
                f"{deletion.base_id}, which is not a dataset root (Lance keeps deletion "
                "files only under a dataset root's _deletions/)",
                [fragment.id],
            )
    return built


def _carried(
    msg: Message,
) -> tuple[list[table_pb2.DataFragment], list[table_pb2.IndexMetadata]]:
    """Every fragment and index a transaction carries, at any depth."""
    fragments: list[table_pb2.DataFragment] = []
    indices: list[table_pb2.IndexMetadata] = []

    def walk(item: Message) -> None:
        if isinstance(item, table_pb2.DataFragment):
            fragments.append(item)
            return
        if isinstance(item, table_pb2.IndexMetadata):
            indices.append(item)
            return
        for descriptor, value in item.ListFields():
            if descriptor.message_type is None or descriptor.message_type.GetOptions().map_entry:
                continue
            for child in value if descriptor.is_repeated else [value]:
                walk(child)

    walk(msg)
    return fragments, indices
