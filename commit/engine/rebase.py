"""Rebasing a transaction onto versions committed since it read the table.

The only rebase that changes data is Delete/Update against Delete/Update on
the same fragments (the spec's "rebasable conflict"): both sides only wrote
deletion vectors, so ours is moved onto the latest version by merging vectors.

* our affected rows = rows deleted in our new deletion file that were not
  deleted at our read version;
* if any of them is already deleted at the latest version, both transactions
  touched the same rows: a RETRYABLE conflict (nothing is written for ours);
* otherwise the union is written as a new deletion file (``read_version`` =
  the latest version); a fragment whose rows are now all deleted moves to the
  removed list.

Singleton-index rebases (fragment-reuse and MemWAL index details) are not
implemented: such a verdict surfaces as a retryable conflict, with that reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pyroaring import BitMap

from lancetx.commit.engine.conflicts import RebaseKind, RebaseNeeded
from lancetx.commit.engine.effects import GetObject, Names, PutObject, Steps, run_store
from lancetx.commit.engine.operations import DataFragment, Delete, Transaction, Update
from lancetx.commit.errors import RetryableConflictError
from lancetx.commit.format.deletion import (
    check_deletion_base,
    decode_deletion_vector,
    deletion_file_key,
    encode_deletion_vector,
)
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import table_pb2


class _Overlap(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def rebase_transaction(
    store: ObjectStore,
    base: str,
    ours: Transaction,
    needed: Sequence[RebaseNeeded],
    *,
    read_fragments: Mapping[int, DataFragment],
    latest: table_pb2.Manifest,
    committed_operations: Mapping[int | None, str] | None = None,
) -> Transaction:
    """``ours`` rebased onto ``latest``; raises RetryableConflictError when it cannot be.

    ``committed_operations`` names the operation committed at each version, for
    the error's ``conflicts`` (``(version, operation, reason)``). Blocking I/O
    on ``store``; :func:`rebase_steps` is the same without I/O."""
    steps = rebase_steps(
        store,
        base,
        ours,
        needed,
        read_fragments=read_fragments,
        latest=latest,
        committed_operations=committed_operations,
    )
    return run_store(steps, store)


def rebase_steps(
    names: Names,
    base: str,
    ours: Transaction,
    needed: Sequence[RebaseNeeded],
    *,
    read_fragments: Mapping[int, DataFragment],
    latest: table_pb2.Manifest,
    committed_operations: Mapping[int | None, str] | None = None,
) -> Steps[Transaction]:
    """:func:`rebase_transaction` as steps (reads and writes deletion files by effects)."""
    uri = names.uri(base)
    operation_names = committed_operations or {}
    unsupported = [n for n in needed if n.kind is not RebaseKind.MERGE_DELETION_VECTORS]
    if unsupported:
        kinds = ", ".join(sorted({n.kind.value for n in unsupported}))
        raise RetryableConflictError(
            uri,
            ours.uuid,
            ours.operation.name,
            ours.read_version,
            [
                (
                    n.committed_version,
                    operation_names.get(n.committed_version, n.kind.value),
                    f"lancetx cannot yet rebase by '{kinds}'; re-read the table and retry",
                )
                for n in unsupported
            ],
        )
    fragment_ids = frozenset().union(*(n.fragment_ids for n in needed)) if needed else frozenset()
    op = ours.operation
    if not fragment_ids or not isinstance(op, Delete | Update):
        return dataclasses.replace(ours, read_version=latest.version)
    latest_by_id = {f.id: f for f in latest.fragments}
    try:
        updated, emptied = yield from _merge(
            names,
            base,
            op.updated_fragments,
            fragment_ids,
            read_fragments,
            latest_by_id,
            latest.version,
        )
    except _Overlap as overlap:
        versions = [n.committed_version for n in needed]
        raise RetryableConflictError(
            uri,
            ours.uuid,
            op.name,
            ours.read_version,
            [(v, operation_names.get(v, "Delete/Update"), overlap.reason) for v in versions],
        ) from None
    new_op: Delete | Update
    if isinstance(op, Delete):
        new_op = dataclasses.replace(
            op,
            updated_fragments=updated,
            deleted_fragment_ids=tuple(op.deleted_fragment_ids) + emptied,
        )
    else:
        new_op = dataclasses.replace(
            op,
            updated_fragments=updated,
            removed_fragment_ids=tuple(op.removed_fragment_ids) + emptied,
        )
    return dataclasses.replace(ours, operation=new_op, read_version=latest.version)


def _merge(
    names: Names,
    base: str,
    ours: Sequence[DataFragment],
    fragment_ids: frozenset[int],
    read_fragments: Mapping[int, DataFragment],
    latest_by_id: Mapping[int, DataFragment],
    latest_version: int,
) -> Steps[tuple[tuple[DataFragment, ...], tuple[int, ...]]]:
    # Every fragment is merged and checked before anything is written, so an
    # overlap found on a later fragment leaves no deletion file behind.
    plan: list[tuple[DataFragment, DataFragment | None, BitMap]] = []
    emptied: list[int] = []
    for fragment in ours:
        if fragment.id not in fragment_ids:
            plan.append((fragment, None, BitMap()))
            continue
        current = latest_by_id.get(fragment.id)
        if current is None:
            raise _Overlap(f"fragment {fragment.id} was removed by the committed transaction")
        before = yield from _vector(names, base, read_fragments.get(fragment.id))
        mine = yield from _vector(names, base, fragment)
        affected = mine - before
        theirs = yield from _vector(names, base, current)
        both = theirs & affected
        if both:
            sample = ", ".join(str(r) for r in list(both)[:5])
            raise _Overlap(
                f"both deleted rows {sample}{'…' if len(both) > 5 else ''} of fragment {fragment.id}"
            )
        merged = theirs | affected
        if len(merged) >= current.physical_rows > 0:
            emptied.append(fragment.id)
            continue
        plan.append((fragment, current, merged))
    updated: list[DataFragment] = []
    for fragment, current, merged in plan:
        if current is None:
            updated.append(fragment)
            continue
        rebased = DataFragment()
        rebased.CopyFrom(current)
        deletion_file, data = encode_deletion_vector(latest_version, merged)
        yield PutObject(deletion_file_key(base, fragment.id, deletion_file), data)
        rebased.deletion_file.CopyFrom(deletion_file)
        updated.append(rebased)
    return tuple(updated), tuple(emptied)


def _vector(names: Names, base: str, fragment: DataFragment | None) -> Steps[BitMap]:
    if fragment is None or not fragment.HasField("deletion_file"):
        return BitMap()
    key = deletion_file_key(base, fragment.id, fragment.deletion_file)
    check_deletion_base(names.uri(key), fragment.deletion_file)
    data: bytes = yield GetObject(key)
    return decode_deletion_vector(data, fragment.deletion_file, path=names.uri(key))
