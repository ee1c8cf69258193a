"""UpdateBases: new base paths registered; fragments unchanged."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import copy_message
from lancetx.commit.engine.builder.fragment_ids import existing
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_update_bases(state: BuildState) -> list[DataFragment]:
    """UpdateBases keeps every fragment; its base paths are added by the finish step."""
    return existing(state)


def finish_update_bases(state: BuildState) -> None:
    """Register the new base paths (after the config step, as Lance does); base
    ids of 0 get the next free id."""
    manifest = state.manifest
    for new_base in state.txn.update_bases.new_bases:
        new_name = new_base.name if new_base.HasField("name") else None
        for known in manifest.base_paths:
            existing_name = known.name if known.HasField("name") else None
            # Lance compares Option<String> names, so two unnamed bases conflict.
            if existing_name == new_name or known.path == new_base.path:
                raise state.fail(
                    f"Conflict detected: Base path with name {new_name!r} or path "
                    f"{new_base.path!r} already exists. Existing: name={existing_name!r}, "
                    f"path={known.path!r}"
                )
        base = copy_message(new_base)
        if base.id == 0:
            base.id = max((b.id for b in manifest.base_paths), default=0) + 1
        elif any(b.id == base.id for b in manifest.base_paths):
            raise state.fail(f"a base path with id {base.id} already exists")
        manifest.base_paths.append(base)
