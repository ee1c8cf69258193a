"""Table config, table metadata, field metadata and base paths: UpdateConfig,
Overwrite's config upserts and UpdateBases."""

from __future__ import annotations

from lancetx.commit.engine.builder.common import (
    CK_POSITION_KEY,
    PK_KEY,
    PK_POSITION_KEY,
    apply_bytes_map,
    apply_str_map,
    parse_u32,
)
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import transaction_pb2

Transaction = transaction_pb2.Transaction


def apply_config_updates(state: BuildState) -> None:
    """UpdateConfig's changes to the config, table metadata, schema metadata and
    field metadata maps (the new-style UpdateMaps or the old upsert/delete lists)."""
    op = state.txn.update_config
    manifest = state.manifest
    has_new = (
        op.HasField("config_updates")
        or op.HasField("table_metadata_updates")
        or op.HasField("schema_metadata_updates")
        or bool(op.field_metadata_updates)
    )
    has_old = bool(op.upsert_values or op.delete_keys or op.schema_metadata or op.field_metadata)
    if has_new and has_old:
        raise state.fail("Cannot mix old and new style UpdateConfig fields")

    Entries = list[tuple[str, str | None]]
    config: tuple[Entries, bool] | None = None
    table_metadata: tuple[Entries, bool] | None = None
    schema_metadata: tuple[Entries, bool] | None = None
    field_updates: list[tuple[int, Entries, bool]] = []
    if has_old:
        # translate_config_updates / translate_schema_metadata_updates
        if op.upsert_values or op.delete_keys:
            entries: Entries = [(k, v) for k, v in op.upsert_values.items()]
            entries += [(k, None) for k in op.delete_keys]
            config = (entries, False)
        if op.schema_metadata:
            schema_metadata = ([(k, v) for k, v in op.schema_metadata.items()], True)
        for old_fid, old_update in op.field_metadata.items():
            field_updates.append(
                (int(old_fid), [(k, v) for k, v in old_update.metadata.items()], True)
            )
    else:

        def entries_of(m: transaction_pb2.Transaction.UpdateMap) -> tuple[Entries, bool]:
            return (
                [(e.key, e.value if e.HasField("value") else None) for e in m.update_entries],
                m.replace,
            )

        if op.HasField("config_updates"):
            config = entries_of(op.config_updates)
        if op.HasField("table_metadata_updates"):
            table_metadata = entries_of(op.table_metadata_updates)
        if op.HasField("schema_metadata_updates"):
            schema_metadata = entries_of(op.schema_metadata_updates)
        for fid, update in op.field_metadata_updates.items():
            field_updates.append((int(fid), *entries_of(update)))

    if config is not None:
        apply_str_map(manifest.config, *config)
    if table_metadata is not None:
        apply_str_map(manifest.table_metadata, *table_metadata)
    if schema_metadata is not None:
        apply_bytes_map(manifest.schema_metadata, *schema_metadata)
    if not field_updates:
        return

    def pk_fields() -> list[int]:
        marked = [
            f
            for f in manifest.fields
            if f.unenforced_primary_key or f.unenforced_primary_key_position > 0
        ]
        marked.sort(
            key=lambda f: (
                (False, f.unenforced_primary_key_position, f.id)
                if f.unenforced_primary_key_position > 0
                else (True, f.id, f.id)
            )
        )
        return [f.id for f in marked]

    def ck_fields() -> list[int]:
        marked = [f for f in manifest.fields if f.unenforced_clustering_key_position > 0]
        marked.sort(key=lambda f: f.unenforced_clustering_key_position)
        return [f.id for f in marked]

    pk_before, ck_before = pk_fields(), ck_fields()
    writes_pk = any(
        k in (PK_KEY, PK_POSITION_KEY) for _, entries, _ in field_updates for k, _ in entries
    )
    writes_ck = any(k == CK_POSITION_KEY for _, entries, _ in field_updates for k, _ in entries)
    by_id = {f.id: f for f in manifest.fields}
    for fid, entries, replace in field_updates:
        target = by_id.get(fid)
        if target is None:
            raise state.fail(f"Field with id {fid} does not exist")
        apply_bytes_map(target.metadata, entries, replace)
        meta = {k: v.decode("utf-8", "replace") for k, v in target.metadata.items()}
        pk_position = parse_u32(meta.get(PK_POSITION_KEY))
        if pk_position is None and meta.get(PK_KEY, "").lower() in ("true", "1", "yes"):
            pk_position = 0
        target.unenforced_primary_key = pk_position is not None
        target.unenforced_primary_key_position = pk_position or 0
        ck_position = parse_u32(meta.get(CK_POSITION_KEY))
        target.unenforced_clustering_key_position = ck_position or 0
    pk_after, ck_after = pk_fields(), ck_fields()
    if pk_before:
        if writes_pk or pk_after != pk_before:
            raise state.fail(
                "the unenforced primary key is a reserved key and cannot be changed once set"
            )
    elif writes_pk and not pk_after:
        raise state.fail(
            "the unenforced primary key is a reserved key and cannot be set to an invalid value"
        )
    if ck_before:
        if writes_ck or ck_after != ck_before:
            raise state.fail(
                "the unenforced clustering key is a reserved key and cannot be changed once set"
            )
    elif writes_ck and not ck_after:
        raise state.fail(
            "the unenforced clustering key is a reserved key and cannot be set to an invalid value"
        )
