"""delete(predicate) and update(predicate, values).

pylance finds the rows (one filtered scan returning row addresses, using the
table's indices and statistics); lancetx writes the new deletion vectors itself
(``_deletions/{fragment}-{read_version}-{id}``, cumulative per fragment, as Lance
does). An update also has pylance evaluate the new values (SQL expressions over
the old row) in the same scan and write the rewritten rows as new fragments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from lancetx.commit.engine.operations import Delete, Transaction, Update, UpdateMode
from lancetx.commit.format.deletion import (
    decode_deletion_vector,
    deletion_file_key,
    encode_deletion_vector,
    locate_deletion_file,
)
from lancetx.commit.format.rowids import encode_row_ids
from lancetx.commit.storage.stores import open_object_store
from lancetx.committing import PlanContext
from lancetx.convert import to_fragment
from lancetx.errors import InvalidPredicateError, SchemaMismatchError, UnknownColumnError
from lancetx.protos import table_pb2
from lancetx.verbs.deletion_cache import DELETION_FILES

_ROW_ADDRESS = "_rowaddr"
_ROW_ID = "_rowid"
_STABLE_ROW_IDS = 2  # reader/writer feature flag


def _with_row_ids(
    fragments: tuple[table_pb2.DataFragment, ...], ids: list[int]
) -> tuple[table_pb2.DataFragment, ...]:
    """The rows' old ids, in the order pylance wrote them across ``fragments``."""
    start = 0
    for fragment in fragments:
        end = start + fragment.physical_rows
        fragment.inline_row_ids = encode_row_ids(ids[start:end])
        start = end
    return fragments


def _scan(
    ctx: PlanContext, predicate: str, columns: Any, what: str | None = None, row_ids: bool = False
) -> pa.Table:
    try:
        table: pa.Table = ctx.dataset.to_table(
            columns=columns, filter=predicate, with_row_address=True, with_row_id=row_ids
        )
    except ValueError as exc:  # pylance's "Invalid user input" (I/O errors are OSError)
        raise InvalidPredicateError(ctx.uri, what or predicate, str(exc).splitlines()[0]) from None
    return table


def _offsets_by_fragment(addresses: pa.ChunkedArray) -> dict[int, BitMap]:
    values = addresses.to_numpy().astype(np.uint64)
    fragments = (values >> np.uint64(32)).astype(np.int64)
    offsets = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    out: dict[int, BitMap] = {}
    for fragment_id in np.unique(fragments):
        out[int(fragment_id)] = BitMap(offsets[fragments == fragment_id])
    return out


def _deleted_rows(ctx: PlanContext, fragment: table_pb2.DataFragment) -> BitMap:
    """The fragment's deletion vector, wherever its file is: the table's own, or under
    a base path (a shallow clone reads its source's), in another bucket too. A file
    this process wrote or read before is not read again (deletion files never change:
    see :mod:`lancetx.verbs.deletion_cache`)."""
    where = locate_deletion_file(
        ctx.store, ctx.base, fragment.id, fragment.deletion_file, ctx.manifest.base_paths
    )
    data = DELETION_FILES.get(where.uri)
    if data is None:
        if where.key is not None:
            data = ctx.store.get(where.key)
        else:
            # Another bucket (or store): read with the table's storage options, as pylance does.
            other, key = open_object_store(where.uri, ctx.state.conn.storage_options)
            data = other.get(key)
        DELETION_FILES.put(where.uri, data)
    return decode_deletion_vector(data, fragment.deletion_file, path=where.uri)


def _write_deletions(ctx: PlanContext, fragment_id: int, rows: BitMap) -> table_pb2.DeletionFile:
    """Write the fragment's new (cumulative) deletion file; its bytes are kept for the
    next delete of the fragment once the PUT returned."""
    deletion_file, data = encode_deletion_vector(ctx.read_version, rows)
    key = deletion_file_key(ctx.base, fragment_id, deletion_file)
    ctx.store.put(key, data)
    DELETION_FILES.put(ctx.store.uri(key), data)
    return deletion_file


def _delete_rows(
    ctx: PlanContext, offsets: Mapping[int, BitMap]
) -> tuple[tuple[table_pb2.DataFragment, ...], tuple[int, ...]]:
    """New deletion vectors for the rows at ``offsets``: (updated fragments, emptied ids)."""
    by_id = {f.id: f for f in ctx.manifest.fragments}
    updated: list[table_pb2.DataFragment] = []
    emptied: list[int] = []
    for fragment_id, rows in sorted(offsets.items()):
        fragment = by_id[fragment_id]
        merged = BitMap(rows)
        if fragment.HasField("deletion_file"):
            merged |= _deleted_rows(ctx, fragment)
        if fragment.physical_rows and len(merged) >= fragment.physical_rows:
            emptied.append(fragment_id)
            continue
        out = table_pb2.DataFragment()
        out.CopyFrom(fragment)
        out.deletion_file.CopyFrom(_write_deletions(ctx, fragment_id, merged))
        updated.append(out)
    return tuple(updated), tuple(emptied)


def plan_delete(predicate: str) -> Any:
    """A plan deleting the rows matching ``predicate``."""

    def plan(ctx: PlanContext) -> Transaction:
        scanned = _scan(ctx, predicate, [])
        updated, emptied = _delete_rows(ctx, _offsets_by_fragment(scanned[_ROW_ADDRESS]))
        return Transaction(
            read_version=ctx.read_version,
            operation=Delete(
                updated_fragments=updated, deleted_fragment_ids=emptied, predicate=predicate
            ),
        )

    return plan


def check_columns(ctx: PlanContext, names: list[str]) -> None:
    unknown = [n for n in names if ctx.schema.get_field_index(n) < 0]
    if unknown:
        raise UnknownColumnError(ctx.uri, unknown, ctx.schema.names)


def plan_update(
    predicate: str | None, values: Mapping[str, Any], write_params: Mapping[str, Any]
) -> Any:
    """A plan setting ``values`` (SQL expression strings, or Python/Arrow scalars) on
    the rows matching ``predicate`` (every row when None)."""
    if not values:
        raise ValueError("update needs at least one column to set")

    def plan(ctx: PlanContext) -> Transaction:
        from lance.fragment import write_fragments

        check_columns(ctx, list(values))
        schema = ctx.schema
        exprs = {v_name: v for v_name, v in values.items() if isinstance(v, str)}
        projection = {name: exprs.get(name, f"`{name}`") for name in schema.names}
        sets = ", ".join(f"{k} = {v}" for k, v in exprs.items())
        # With stable row ids an updated row keeps its id (as Lance does): the new
        # fragments carry the ids of the rows they replace.
        stable = bool(ctx.manifest.reader_feature_flags & _STABLE_ROW_IDS)
        scanned = _scan(
            ctx,
            predicate or "true",
            projection,
            f"WHERE {predicate or 'true'} SET {sets}",
            row_ids=stable,
        )
        offsets = _offsets_by_fragment(scanned[_ROW_ADDRESS])
        kept_ids = scanned[_ROW_ID].to_pylist() if stable else []
        rows = scanned.drop_columns([_ROW_ADDRESS] + ([_ROW_ID] if stable else []))
        for name, value in values.items():
            if not isinstance(value, str):
                field = schema.field(name)
                try:
                    constant = pa.array([value] * rows.num_rows, type=field.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                    raise SchemaMismatchError(ctx.uri, f"value for {name!r}: {exc}") from None
                rows = rows.set_column(rows.schema.get_field_index(name), field, constant)
        try:
            rows = rows.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise SchemaMismatchError(
                ctx.uri, f"the new values do not fit the columns: {exc}"
            ) from None
        new_fragments: tuple[table_pb2.DataFragment, ...] = ()
        if rows.num_rows:
            written = write_fragments(
                rows,
                ctx.dataset,
                mode="append",
                storage_options=ctx.state.pylance_storage_options(),
                **write_params,
            )
            new_fragments = tuple(to_fragment(ctx.uri, f) for f in written)
            if stable:
                new_fragments = _with_row_ids(new_fragments, kept_ids)
        updated, emptied = _delete_rows(ctx, offsets)
        return Transaction(
            read_version=ctx.read_version,
            operation=Update(
                removed_fragment_ids=emptied,
                updated_fragments=updated,
                new_fragments=new_fragments,
                update_mode=UpdateMode.REWRITE_ROWS,
            ),
        )

    return plan


__all__ = ["check_columns", "plan_delete", "plan_update"]
