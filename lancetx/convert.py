"""pylance objects a user (or pylance's own uncommitted APIs) hands us → lancetx's model.

Accepted: ``lance.fragment.FragmentMetadata`` (and its JSON dict), ``lance.dataset.Index``,
``lance.LanceDataset``-style ``Transaction`` and the ``LanceOperation`` kinds lancetx can
commit (Append, Overwrite, Delete, Update, Merge, Restore, Rewrite, CreateIndex,
Project, UpdateConfig, DataReplacement). Anything else is refused with
:class:`~lancetx.errors.UnsupportedInputError` naming the Python type, before anything
is written.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyroaring import BitMap

from lancetx.commit.engine import operations as ops
from lancetx.commit.format.fragments import fragment_from_json, fragment_from_pylance
from lancetx.commit.format.schema import arrow_schema_to_fields
from lancetx.errors import UnsupportedInputError
from lancetx.protos import file_pb2, table_pb2

_FRAGMENT_HINT = (
    "pass lance.fragment.FragmentMetadata (from lance.fragment.write_fragments), its "
    "to_json() dict, or a lance.table.DataFragment message"
)


def to_fragment(uri: str, obj: object) -> table_pb2.DataFragment:
    """One fragment as a ``DataFragment`` proto (a copy)."""
    if isinstance(obj, table_pb2.DataFragment):
        out = table_pb2.DataFragment()
        out.CopyFrom(obj)
        return out
    if isinstance(obj, Mapping):
        return fragment_from_json(obj)
    if type(obj).__name__ == "FragmentMetadata" and hasattr(obj, "to_json"):
        return fragment_from_pylance(obj)  # type: ignore[arg-type]
    raise UnsupportedInputError(uri, obj, _FRAGMENT_HINT)


def to_fragments(uri: str, objs: Iterable[object]) -> tuple[table_pb2.DataFragment, ...]:
    """Many fragments (see :func:`to_fragment`); a single fragment is refused, not iterated."""
    if isinstance(objs, str | bytes | Mapping) or not isinstance(objs, Iterable):
        raise UnsupportedInputError(uri, objs, "expected a list of fragments: " + _FRAGMENT_HINT)
    return tuple(to_fragment(uri, o) for o in objs)


def lance_schema_to_fields(uri: str, schema: object) -> list[file_pb2.Field]:
    """Fields (with pylance's field ids) of a ``LanceSchema``; a ``pa.Schema`` gets
    fresh ids from 0 (as for a new table)."""
    if isinstance(schema, pa.Schema):
        return arrow_schema_to_fields(schema)[0]
    if not (hasattr(schema, "to_pyarrow") and hasattr(schema, "fields")):
        raise UnsupportedInputError(uri, schema, "expected a lance.schema.LanceSchema")
    fields, _ = arrow_schema_to_fields(schema.to_pyarrow())
    # arrow_schema_to_fields numbers fields in depth-first pre-order; walking the
    # LanceSchema the same way pairs each with the id pylance gave it.
    ids: list[int] = []

    def walk(nodes: Sequence[Any]) -> None:
        for node in nodes:
            ids.append(int(node.id()))
            walk(node.children())

    walk(schema.fields())
    if len(ids) != len(fields):
        raise UnsupportedInputError(
            uri, schema, "its fields do not line up with its Arrow schema (a nested type?)"
        )
    renumber = {f.id: new for f, new in zip(fields, ids, strict=True)}
    for f in fields:
        f.id = renumber[f.id]
        if f.parent_id >= 0:
            f.parent_id = renumber[f.parent_id]
    return fields


def to_index(uri: str, index: object) -> table_pb2.IndexMetadata:
    """A pylance ``lance.dataset.Index`` (from ``create_index_uncommitted``) as IndexMetadata."""
    if isinstance(index, table_pb2.IndexMetadata):
        out = table_pb2.IndexMetadata()
        out.CopyFrom(index)
        return out
    if type(index).__name__ != "Index" or not hasattr(index, "fragment_ids"):
        raise UnsupportedInputError(uri, index, "expected a lance.dataset.Index")
    i: Any = index
    meta = table_pb2.IndexMetadata(
        uuid=table_pb2.UUID(uuid=uuidlib.UUID(str(i.uuid)).bytes),
        name=i.name,
        dataset_version=int(i.dataset_version),
        fragment_bitmap=BitMap(int(f) for f in i.fragment_ids).serialize(),
        index_version=int(i.index_version),
    )
    meta.fields.extend(int(f) for f in i.fields)
    if isinstance(i.created_at, datetime):
        meta.created_at = int(i.created_at.timestamp() * 1000)
    if i.base_id is not None:
        meta.base_id = int(i.base_id)
    for file in i.files or ():
        meta.files.add(path=file.path, size_bytes=int(file.size_bytes))
    if i.index_details is not None:
        type_url, value = i.index_details
        meta.index_details.type_url = type_url
        meta.index_details.value = value
    if getattr(i, "covering_fields", None):
        raise UnsupportedInputError(
            uri, index, "covering (included) fields on an index are not supported by lancetx yet"
        )
    return meta


def _base_path(b: Any) -> table_pb2.BasePath:
    """A ``lance.DatasetBasePath`` as the BasePath the manifest stores (ids as given)."""
    out = table_pb2.BasePath(
        id=int(b.id), path=str(b.path), is_dataset_root=bool(b.is_dataset_root)
    )
    if b.name is not None:
        out.name = str(b.name)
    return out


def _update_map(m: Any) -> ops.UpdateMap | None:
    if m is None:
        return None
    return ops.update_map(dict(m.updates), replace=bool(m.replace))


def to_operation(uri: str, op: object) -> ops.Operation:
    """A ``LanceOperation.*`` (or one of our operations) as our :class:`Operation`."""
    if isinstance(op, ops.Operation):
        return op
    name = type(op).__name__
    qual = type(op).__qualname__
    if not qual.startswith("LanceOperation."):
        raise UnsupportedInputError(
            uri, op, "expected a lance.LanceOperation.* or a lancetx operation"
        )
    o: Any = op
    if name == "Append":
        return ops.Append(fragments=to_fragments(uri, o.fragments))
    if name == "Overwrite":
        schema = o.new_schema
        arrow = schema if isinstance(schema, pa.Schema) else schema.to_pyarrow()
        fields = lance_schema_to_fields(uri, schema)
        metadata = {k.decode(): v for k, v in (arrow.metadata or {}).items()}
        return ops.Overwrite(
            fragments=to_fragments(uri, o.fragments),
            schema=tuple(fields),
            schema_metadata=metadata,
            initial_bases=tuple(_base_path(b) for b in o.initial_bases or ()),
        )
    if name == "Delete":
        return ops.Delete(
            updated_fragments=to_fragments(uri, o.updated_fragments),
            deleted_fragment_ids=tuple(int(i) for i in o.deleted_fragment_ids),
            predicate=o.predicate or "",
        )
    if name == "Update":
        mode = (
            ops.UpdateMode.REWRITE_COLUMNS
            if str(o.update_mode) == "rewrite_columns"
            else ops.UpdateMode.REWRITE_ROWS
        )
        offsets = {
            int(k): tuple(int(x) for x in BitMap.deserialize(v))
            for k, v in (o.updated_fragment_offsets or {}).items()
        }
        return ops.Update(
            removed_fragment_ids=tuple(int(i) for i in o.removed_fragment_ids),
            updated_fragments=to_fragments(uri, o.updated_fragments),
            new_fragments=to_fragments(uri, o.new_fragments),
            fields_modified=tuple(int(i) for i in o.fields_modified),
            fields_for_preserving_frag_bitmap=tuple(
                int(i) for i in o.fields_for_preserving_frag_bitmap
            ),
            update_mode=mode,
            updated_fragment_offsets=offsets,
        )
    if name == "Merge":
        return ops.Merge(
            fragments=to_fragments(uri, o.fragments),
            schema=tuple(lance_schema_to_fields(uri, o.schema)),
        )
    if name == "Project":
        return ops.Project(schema=tuple(lance_schema_to_fields(uri, o.schema)))
    if name == "Restore":
        return ops.Restore(version=int(o.version))
    if name == "Rewrite":
        groups = tuple(
            ops.RewriteGroup(
                old_fragments=to_fragments(uri, g.old_fragments),
                new_fragments=to_fragments(uri, g.new_fragments),
            )
            for g in o.groups
        )
        rewritten = tuple(
            ops.RewrittenIndex(
                old_id=table_pb2.UUID(uuid=uuidlib.UUID(r.old_id).bytes),
                new_id=table_pb2.UUID(uuid=uuidlib.UUID(r.new_id).bytes),
                new_index_details=_any(r.new_details_type_url, r.new_details_value),
                new_index_version=int(r.new_index_version),
            )
            for r in o.rewritten_indices
        )
        return ops.Rewrite(groups=groups, rewritten_indices=rewritten)
    if name == "CreateIndex":
        return ops.CreateIndex(
            new_indices=tuple(to_index(uri, i) for i in o.new_indices),
            removed_indices=tuple(to_index(uri, i) for i in o.removed_indices),
        )
    if name == "UpdateConfig":
        return ops.UpdateConfig(
            config_updates=_update_map(o.config_updates),
            table_metadata_updates=_update_map(o.table_metadata_updates),
            schema_metadata_updates=_update_map(o.schema_metadata_updates),
            field_metadata_updates={
                int(k): m
                for k, v in (o.field_metadata_updates or {}).items()
                if (m := _update_map(v)) is not None
            },
        )
    if name == "DataReplacement":
        replacements = []
        for r in o.replacements:
            holder = to_fragment(
                uri, {"id": 0, "files": [_data_file_json(r.new_file)], "physical_rows": None}
            )
            replacements.append(
                ops.DataReplacementGroup(fragment_id=int(r.fragment_id), new_file=holder.files[0])
            )
        return ops.DataReplacement(replacements=tuple(replacements))
    raise UnsupportedInputError(
        uri,
        op,
        f"lancetx does not commit LanceOperation.{name}; supported: Append, Overwrite, Delete, "
        "Update, Merge, Project, Restore, Rewrite, CreateIndex, UpdateConfig, DataReplacement",
    )


def _any(type_url: str, value: bytes) -> Any:
    from google.protobuf import any_pb2

    return any_pb2.Any(type_url=type_url, value=value)


def _data_file_json(f: Any) -> dict[str, Any]:
    return {
        "path": f.path,
        "fields": list(f.fields),
        "column_indices": list(f.column_indices),
        "file_major_version": f.file_major_version,
        "file_minor_version": f.file_minor_version,
        "file_size_bytes": getattr(f, "file_size_bytes", None),
        "base_id": getattr(f, "base_id", None),
    }


def to_transaction(uri: str, obj: object, *, read_version: int) -> ops.Transaction:
    """A pylance ``Transaction`` / ``LanceOperation`` or our Transaction / Operation as
    our :class:`Transaction`; ``read_version`` applies when ``obj`` carries none."""
    if isinstance(obj, ops.Transaction):
        return obj
    if type(obj).__name__ == "Transaction" and hasattr(obj, "operation"):
        t: Any = obj
        return ops.Transaction(
            read_version=int(t.read_version),
            operation=to_operation(uri, t.operation),
            uuid=str(t.uuid),
            properties=dict(t.transaction_properties or {}),
        )
    return ops.Transaction(read_version=read_version, operation=to_operation(uri, obj))


__all__ = [
    "lance_schema_to_fields",
    "to_fragment",
    "to_fragments",
    "to_index",
    "to_operation",
    "to_transaction",
]
