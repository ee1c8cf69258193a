"""Stable row ids: assigning row-id sequences to new fragments and keeping the
created/last-updated version sequences of their rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lancetx.commit.engine.builder.common import (
    FLAG_STABLE_ROW_IDS,
    UNKNOWN_CREATED_AT_VERSION,
    row_count,
)
from lancetx.commit.engine.builder.state import BuildState
from lancetx.commit.format import rowids
from lancetx.protos import table_pb2, transaction_pb2

DataFragment = table_pb2.DataFragment
Transaction = transaction_pb2.Transaction


def assign_row_ids(state: BuildState, fragments: Sequence[DataFragment]) -> None:
    """``Transaction::assign_row_ids``: give rows without a row id the next ones."""
    assert state.next_row_id is not None
    for frag in fragments:
        physical = frag.physical_rows
        if physical <= 0:
            raise state.fail(
                f"fragment {frag.id} does not have physical_rows; stable row ids need the row count",
                [frag.id],
            )
        kind = frag.WhichOneof("row_id_sequence")
        if kind == "external_row_ids":
            raise state.unsupported(
                f"row-id sequences stored in external files (fragment {frag.id})",
                FLAG_STABLE_ROW_IDS,
            )
        if kind == "inline_row_ids":
            where = f"fragment {frag.id} row ids"
            existing = rowids.decode_row_ids(frag.inline_row_ids, where)
            if len(existing) == physical:
                continue
            if len(existing) > physical:
                raise state.fail(
                    f"Fragment has more row IDs ({len(existing)}) than physical rows ({physical})",
                    [frag.id],
                )
            remaining = physical - len(existing)
            start = state.next_row_id
            frag.inline_row_ids = rowids.encode_row_ids(
                existing + list(range(start, start + remaining))
            )
            state.next_row_id += remaining
        else:
            frag.inline_row_ids = rowids.encode_row_id_range(
                state.next_row_id, state.next_row_id + physical
            )
            state.next_row_id += physical


def set_uniform_version_meta(
    state: BuildState, frag: DataFragment, *, created: bool, updated: bool
) -> None:
    """``build_version_meta``: every row at the new version (none without rows)."""
    if frag.physical_rows > 0:
        data = rowids.uniform_versions(frag.physical_rows, state.version)
        if created:
            frag.inline_created_at_versions = data
        if updated:
            frag.inline_last_updated_at_versions = data
    else:
        if created:
            frag.ClearField("created_at_version_sequence")
        if updated:
            frag.ClearField("last_updated_at_version_sequence")


def refresh_full_last_updated(state: BuildState, frag: DataFragment) -> None:
    """``refresh_row_latest_update_meta_for_full_frag_rewrite_cols``."""
    if frag.physical_rows <= 0 and frag.WhichOneof("row_id_sequence") == "external_row_ids":
        raise state.unsupported(f"row-id sequences stored in external files (fragment {frag.id})")
    count = row_count(frag)
    if count > 0:
        frag.inline_last_updated_at_versions = rowids.uniform_versions(count, state.version)


def refresh_partial_last_updated(
    state: BuildState, frag: DataFragment, offsets: Iterable[int], prev_version: int
) -> None:
    """``refresh_row_latest_update_meta_for_partial_frag_rewrite_cols``."""
    if frag.physical_rows <= 0 and frag.WhichOneof("row_id_sequence") == "external_row_ids":
        raise state.unsupported(f"row-id sequences stored in external files (fragment {frag.id})")
    count = row_count(frag)
    if count <= 0:
        return
    kind = frag.WhichOneof("last_updated_at_version_sequence")
    if kind == "external_last_updated_at_versions":
        raise state.unsupported(
            f"row version sequences stored in external files (fragment {frag.id})"
        )
    base = [prev_version] * count
    try:
        existing = rowids.decode_versions(frag.inline_last_updated_at_versions)
    except rowids.RowIdFormatError:
        existing = []
    for i, v in enumerate(existing[:count]):
        base[i] = v
    for pos in offsets:
        if pos < count:
            base[pos] = state.version
    frag.inline_last_updated_at_versions = rowids.encode_versions(base)


def resolve_update_version_metadata(
    state: BuildState, existing: list[DataFragment], new: list[DataFragment]
) -> None:
    """``resolve_update_version_metadata``: created-at from the rows' sources,
    last-updated at the new version."""
    new_ids: dict[int, list[int]] = {}
    for frag in new:
        if frag.WhichOneof("row_id_sequence") == "inline_row_ids":
            new_ids[frag.id] = rowids.decode_row_ids(
                frag.inline_row_ids, f"fragment {frag.id} row ids"
            )
    needed = {rid for ids in new_ids.values() for rid in ids}
    source: dict[int, tuple[int, int]] = {}
    if needed:
        lo, hi = min(needed), max(needed)
        for frag in sorted(existing, key=lambda f: f.id):
            if frag.WhichOneof("row_id_sequence") != "inline_row_ids":
                continue
            try:
                values = rowids.decode_row_ids(frag.inline_row_ids)
            except rowids.RowIdFormatError:
                continue
            if not values or max(values) < lo or min(values) > hi:
                continue
            for offset, rid in enumerate(values):
                if rid in needed and rid not in source:
                    source[rid] = (frag.id, offset)
    cache: dict[int, list[int]] = {}
    by_id = {f.id: f for f in existing}
    for frag_id in {fid for fid, _ in source.values()}:
        frag = by_id[frag_id]
        if frag.WhichOneof("created_at_version_sequence") != "inline_created_at_versions":
            continue
        try:
            cache[frag_id] = rowids.decode_versions(frag.inline_created_at_versions)
        except rowids.RowIdFormatError:
            continue  # Lance: an undecodable created_at counts as unknown (version 1)

    for frag in new:
        ids = new_ids.get(frag.id)
        if ids is None:
            set_uniform_version_meta(state, frag, created=True, updated=True)
            continue
        created = []
        for rid in ids:
            if rid in source:
                frag_id, offset = source[rid]
                versions = cache.get(frag_id)
                created.append(
                    versions[offset]
                    if versions is not None and offset < len(versions)
                    else UNKNOWN_CREATED_AT_VERSION
                )
            else:
                created.append(state.version)
        frag.inline_created_at_versions = rowids.encode_versions(created)
        set_uniform_version_meta(state, frag, created=False, updated=True)


def collect_pure_rewrite_row_fragment_ids(
    state: BuildState, fragments: Sequence[DataFragment]
) -> list[int]:
    out = []
    for frag in fragments:
        if frag.physical_rows <= 0:
            raise state.fail("Fragment does not have physical rows", [frag.id])
        kind = frag.WhichOneof("row_id_sequence")
        if kind is None:
            continue
        count = rowids.row_id_count(frag.inline_row_ids) if kind == "inline_row_ids" else 0
        if count == frag.physical_rows:
            out.append(frag.id)
    return out
