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

The rebased fragment is ours' copy with the merged deletion file, so every
change ours made to it is carried. A fragment whose data files ours (or
theirs) changed is never merged -- the rules classify it RETRYABLE, and this
step refuses it too -- and a rebase that would leave out a data file ours
references is refused before anything is written.

Singleton-index rebases (fragment-reuse and MemWAL index details) are not
implemented: such a verdict surfaces as a retryable conflict, with that reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pyroaring import BitMap

from lancetx.commit.engine.conflicts import RebaseKind, RebaseNeeded
from lancetx.commit.engine.operations import DataFragment, Delete, Transaction, Update
from lancetx.commit.errors import RetryableConflictError
from lancetx.commit.format.deletion import read_deletion_vector, write_deletion_vector
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
    the error's ``conflicts`` (``(version, operation, reason)``)."""
    uri = store.uri(base)
    names = committed_operations or {}
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
                    names.get(n.committed_version, n.kind.value),
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
        updated, emptied = _merge(
            store,
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
            [(v, names.get(v, "Delete/Update"), overlap.reason) for v in versions],
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
    store: ObjectStore,
    base: str,
    ours: Sequence[DataFragment],
    fragment_ids: frozenset[int],
    read_fragments: Mapping[int, DataFragment],
    latest_by_id: Mapping[int, DataFragment],
    latest_version: int,
) -> tuple[tuple[DataFragment, ...], tuple[int, ...]]:
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
        _require_only_deletions(fragment, read_fragments.get(fragment.id), current)
        before = _vector(store, base, read_fragments.get(fragment.id))
        mine = _vector(store, base, fragment)
        affected = mine - before
        theirs = _vector(store, base, current)
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
    to_write: list[tuple[DataFragment, BitMap]] = []
    for fragment, current, merged in plan:
        if current is None:
            updated.append(fragment)
            continue
        # Ours' copy, not theirs: every change ours made to the fragment is kept
        # and only the deletion vector is replaced by the merged one.
        rebased = DataFragment()
        rebased.CopyFrom(fragment)
        updated.append(rebased)
        to_write.append((rebased, merged))
    baseline = {**latest_by_id, **read_fragments}
    _check_keeps_data_files(ours, updated, emptied, baseline)
    for rebased, merged in to_write:
        rebased.deletion_file.CopyFrom(
            write_deletion_vector(store, base, rebased.id, latest_version, merged)
        )
    return tuple(updated), tuple(emptied)


def _data_files(fragment: DataFragment) -> list[tuple[str, tuple[int, ...]]]:
    return [(f.path, tuple(f.fields)) for f in fragment.files]


def _require_only_deletions(
    ours: DataFragment, read: DataFragment | None, current: DataFragment
) -> None:
    """Refuse to merge a fragment whose data files are not the ones both sides
    read: the merge rewrites deletion vectors only, so any data-file change
    (ours or theirs) would be dropped or half-applied."""
    if read is not None and _data_files(ours) != _data_files(read):
        added = sorted({p for p, _ in _data_files(ours)} - {p for p, _ in _data_files(read)})
        what = f"data file(s) {', '.join(added)}" if added else "changed data files"
        raise _Overlap(
            f"this transaction gave fragment {ours.id} {what}; a rebase only merges "
            "deletion vectors and would not carry them"
        )
    if _data_files(current) != _data_files(ours):
        raise _Overlap(
            f"the data files of fragment {ours.id} changed since it was read; a rebase only "
            "merges deletion vectors"
        )


def _check_keeps_data_files(
    ours: Sequence[DataFragment],
    updated: Sequence[DataFragment],
    emptied: Sequence[int],
    baseline: Mapping[int, DataFragment],
) -> None:
    """Every data file ours references must survive the rebase: in the
    rebased copy of its fragment, or (only if ours did not add it: it is in
    ``baseline``, the fragment as read) in a fragment the merged deletions
    removed entirely. Checked before any deletion file is written."""
    by_id = {f.id: f for f in updated}
    for fragment in ours:
        read = baseline.get(fragment.id)
        before = {p for p, _ in _data_files(read)} if read is not None else set()
        rebased = by_id.get(fragment.id)
        kept = {p for p, _ in _data_files(rebased)} if rebased is not None else set()
        lost = [
            p
            for p, _ in _data_files(fragment)
            if p not in kept and not (fragment.id in emptied and p in before)
        ]
        if lost:
            raise _Overlap(
                f"the rebase would drop data file(s) {', '.join(lost)} of fragment "
                f"{fragment.id} that this transaction references; refusing"
            )


def _vector(store: ObjectStore, base: str, fragment: DataFragment | None) -> BitMap:
    if fragment is None or not fragment.HasField("deletion_file"):
        return BitMap()
    return read_deletion_vector(store, base, fragment.id, fragment.deletion_file)
