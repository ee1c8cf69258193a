"""merge_insert: pylance joins and writes (``execute_uncommitted``); lancetx commits.

The builder mirrors pylance's: ``when_matched_update_all`` (upsert),
``when_not_matched_insert_all`` (insert-if-not-exists), and
``when_not_matched_by_source_delete`` (replace a slice of the table). Because a
lost race is answered by planning again against the new version, the source data
must be readable twice: a stream is materialized once into an Arrow table.

**Inserted keys.** On a key that must stay unique — the table's unenforced primary
key (columns with ``lance-schema:unenforced-primary-key`` field metadata), or any
``on`` key after ``conflict_on_inserted_keys()`` — the plan records the keys it may
insert in the Update (``inserted_rows``, the bloom filter Lance's merge-insert
writes; pylance's uncommitted merge does not hand it over, so lancetx builds it
from the source). Two merges planned from one version that insert the same new key
then conflict (retryable): the loser plans again, finds the key, and updates it.
The filter holds every non-null source key when pylance reports inserted rows (an
update recorded as an insert costs at most a retry, never a duplicate), none when
it reports none and wrote no more rows than it updated; where the keys cannot be
hashed, it claims every key. A row with a null key is inserted by every merge (a
null matches nothing) and is never part of the unique set.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from lancetx.commit.engine.operations import Operation, Transaction, Update
from lancetx.commit.format.key_existence import (
    KeyExistenceFilter,
    UnhashableKeyError,
    inserted_keys_filter,
    key_hashes,
    primary_key_fields,
)
from lancetx.committing import PlanContext
from lancetx.convert import to_transaction
from lancetx.data import to_reader
from lancetx.errors import SchemaMismatchError, TableError, UnknownColumnError, pylance_gist

log = logging.getLogger(__name__)


@dataclass
class MergeSpec:
    """What a merge_insert does; applied to a fresh pylance builder for every plan."""

    on: list[str]
    matched_update: bool = False
    matched_condition: str | None = None
    not_matched_insert: bool = False
    not_matched_by_source_delete: bool = False
    not_matched_by_source_condition: str | None = None
    #: Record inserted keys on ``on`` even when it is not the table's primary key.
    conflict_on_inserted_keys: bool = False
    extra: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.matched_update:
            parts.append("update matched")
        if self.not_matched_insert:
            parts.append("insert not matched")
        if self.not_matched_by_source_delete:
            parts.append("delete not matched by source")
        return f"merge_insert on {self.on}: " + ", ".join(parts or ["no action"])


def materialize(uri: str, data: Any, schema: pa.Schema | None = None) -> pa.Table:
    """The source as an Arrow table (read once), so a re-plan can read it again."""
    if isinstance(data, pa.Table):
        return data
    reader, guard = to_reader(uri, data, schema)
    table = reader.read_all()
    guard.raise_if_failed()
    return table


def plan_merge_insert(spec: MergeSpec, source: pa.Table) -> Callable[[PlanContext], Transaction]:
    def plan(ctx: PlanContext) -> Transaction:
        missing = [c for c in spec.on if ctx.schema.get_field_index(c) < 0]
        if missing:
            raise UnknownColumnError(ctx.uri, missing, ctx.schema.names)
        absent = [c for c in spec.on if source.schema.get_field_index(c) < 0]
        if absent:
            raise SchemaMismatchError(ctx.uri, f"the source has no join column(s) {absent}")
        builder = ctx.dataset.merge_insert(spec.on if len(spec.on) > 1 else spec.on[0])
        if spec.matched_update:
            builder = builder.when_matched_update_all(spec.matched_condition)
        if spec.not_matched_insert:
            builder = builder.when_not_matched_insert_all()
        if spec.not_matched_by_source_delete:
            builder = builder.when_not_matched_by_source_delete(
                spec.not_matched_by_source_condition
            )
        for method, args in spec.extra:
            builder = getattr(builder, method)(*args)
        try:
            pylance_txn, stats = builder.execute_uncommitted(source)
        except ValueError as exc:  # pylance's "Invalid user input"; I/O errors stay OSError
            raise SchemaMismatchError(ctx.uri, f"pylance refused the merge source ({exc})") from exc
        except OSError as exc:
            # pylance 14 refuses a source whose columns do not fit the table (one the
            # table lacks, another type: a dict's all-None column is of type null) with
            # an OSError "Append with different schema", before writing anything.
            if "with different schema" not in str(exc):
                raise
            gist = pylance_gist(exc).split(", location:")[0]
            raise SchemaMismatchError(
                ctx.uri, f"pylance refused the merge source ({gist})"
            ) from exc
        txn = to_transaction(ctx.uri, pylance_txn, read_version=ctx.read_version)
        key = unique_key(spec, ctx)
        if key is None:
            return txn
        hashes = inserted_key_hashes(spec, ctx, source, key, stats, txn.operation)
        return with_inserted_keys(ctx, txn, key, hashes)

    return plan


@dataclass(frozen=True)
class UniqueKey:
    """The key columns whose inserted values a merge records, in key order."""

    columns: tuple[str, ...]
    field_ids: tuple[int, ...]


def unique_key(spec: MergeSpec, ctx: PlanContext) -> UniqueKey | None:
    """The key this merge keeps unique: the table's primary key when ``on`` names
    exactly its columns (in the key's order, whatever order ``on`` has, so the
    filter matches a pylance writer's), else ``on`` when asked for; None otherwise."""
    fields = list(ctx.manifest.fields)
    pk = primary_key_fields(fields)
    if pk and all(f.parent_id == -1 for f in pk) and sorted(f.name for f in pk) == sorted(spec.on):
        return UniqueKey(tuple(f.name for f in pk), tuple(f.id for f in pk))
    if not spec.conflict_on_inserted_keys:
        return None
    top = {f.name: f.id for f in fields if f.parent_id == -1}
    return UniqueKey(tuple(spec.on), tuple(top[c] for c in spec.on))


def inserted_key_hashes(
    spec: MergeSpec,
    ctx: PlanContext,
    source: pa.Table,
    key: UniqueKey,
    stats: Any,
    op: Operation | None = None,
) -> np.ndarray | None:
    """Hashes of the keys this merge may insert; None when they cannot be hashed
    (the filter then claims every key)."""
    if not spec.not_matched_insert or _inserts_nothing(stats, op):
        return np.zeros(0, dtype=np.uint64)
    try:
        # Hash the values as the table stores them, whatever width the source has.
        keys = pa.table({c: source.column(c).cast(ctx.schema.field(c).type) for c in key.columns})
        return key_hashes(keys, key.columns)
    except (UnhashableKeyError, TypeError, ValueError, pa.ArrowException) as exc:
        # Claiming every key is always safe: it costs concurrent inserters a retry.
        log.info(
            "%s: merge_insert cannot hash key %s (%s); recording it as inserting every "
            "key, so a concurrent insert on this key is retried",
            ctx.uri,
            list(key.columns),
            exc,
        )
        return None


def _inserts_nothing(stats: Any, op: Operation | None) -> bool:
    """pylance reports no inserted row, and the rows it wrote are no more than the
    rows it reports updated (a miscount must not hide an insert)."""
    if not isinstance(stats, Mapping):
        return False
    inserted, updated = stats.get("num_inserted_rows"), stats.get("num_updated_rows")
    if inserted != 0 or not isinstance(updated, int):
        return False
    if not isinstance(op, Update):
        return op is None
    written = sum(int(f.physical_rows) for f in op.new_fragments)
    return written <= updated


def with_inserted_keys(
    ctx: PlanContext, txn: Transaction, key: UniqueKey, hashes: np.ndarray | None
) -> Transaction:
    """``txn`` with its Update recording the keys it inserted."""
    op = txn.operation
    if not isinstance(op, Update):
        if hashes is not None and not len(hashes):
            return txn  # nothing inserted, nothing to record
        raise TableError(
            ctx.uri,
            f"pylance planned the merge_insert as {op.name}, not an Update, so the keys "
            f"it inserts on {list(key.columns)} cannot be recorded; nothing was committed",
        )
    keys: KeyExistenceFilter = inserted_keys_filter(key.field_ids, hashes)
    log.debug(
        "%s: merge_insert records %s inserted key(s) on %s",
        ctx.uri,
        "all" if hashes is None else len(hashes),
        list(key.columns),
    )
    return dataclasses.replace(txn, operation=dataclasses.replace(op, inserted_rows=keys))


def join_columns(on: str | Sequence[str]) -> list[str]:
    return [on] if isinstance(on, str) else list(on)


__all__ = [
    "MergeSpec",
    "UniqueKey",
    "inserted_key_hashes",
    "join_columns",
    "materialize",
    "plan_merge_insert",
    "unique_key",
    "with_inserted_keys",
]
