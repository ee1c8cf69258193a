"""Every file a new version stores under a base path names a base it registers.

A data file, deletion file or index with a ``base_id`` is read from that base
(``Manifest.base_paths``); a version naming an id it does not register is one no
reader can read (pylance: "base_path id N not found"). Checked on every built
manifest, whatever the operation and door, so such a version is never committed.
"""

from __future__ import annotations

from lancetx.commit.engine.builder.common import BuiltManifest
from lancetx.commit.engine.builder.state import BuildState
from lancetx.commit.format.bases import referenced_base_ids


def check_base_ids(state: BuildState, built: BuiltManifest) -> BuiltManifest:
    """``built`` if every base id it uses is registered (and every deletion file's
    base is a dataset root, where Lance looks for ``_deletions/``), else
    InvalidTransactionError naming the first file that breaks the rule."""
    manifest = built.manifest
    registered = {b.id: b for b in manifest.base_paths}
    used = referenced_base_ids(manifest.fragments, built.indices)
    for base_id, what in sorted(used.items()):
        if base_id not in registered:
            ids = ", ".join(str(i) for i in sorted(registered)) or "none"
            raise state.fail(
                f"{what} is stored under base path id {base_id}, which the new version does "
                f"not register (registered ids: {ids}); register the base first "
                "(UpdateBases, or initial_bases when creating the table)"
            )
    for fragment in manifest.fragments:
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
