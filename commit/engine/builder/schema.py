"""The schema step: replacing the field list (checked for pre-order and unique ids)
and the schema metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lancetx.commit.engine.builder.common import copy_message
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import file_pb2


def set_schema(
    state: BuildState,
    fields: Sequence[file_pb2.Field],
    schema_metadata: Mapping[str, bytes],
    *,
    replace_metadata: bool,
) -> None:
    ids: set[int] = set()
    for f in fields:
        if f.id in ids:
            raise state.fail(f"the new schema has field id {f.id} twice")
        if f.parent_id != -1 and f.parent_id not in ids:
            raise state.fail(
                f"field {f.name!r} (id {f.id}) names parent id {f.parent_id}, which does not "
                "precede it in the schema (fields must be in depth-first pre-order)"
            )
        ids.add(f.id)
    state.manifest.ClearField("fields")
    state.manifest.fields.extend(copy_message(f) for f in fields)
    if replace_metadata:
        state.manifest.ClearField("schema_metadata")
        for key, value in schema_metadata.items():
            state.manifest.schema_metadata[key] = value
