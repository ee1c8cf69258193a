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

The other rebase merges the fragment reuse index (:mod:`.frag_reuse`): a
CreateIndex writing it (a cleanup) against committed changes to it -- a
compaction with deferred index remapping that added a version, or another
cleanup that removed some -- gets a new index whose versions carry both
sides' changes, replacing the index that is current now.

Not implemented, and surfacing as a retryable conflict with that reason:
merging MemWAL index details, and a Rewrite carrying its own fragment reuse
index (a compaction that defers index remapping is planned again instead).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyroaring import BitMap

from lancetx.commit.engine.conflicts import RebaseKind, RebaseNeeded
from lancetx.commit.engine.effects import (
    GetObject,
    Names,
    PutObject,
    Steps,
    WithStore,
    run_store,
)
from lancetx.commit.engine.frag_reuse import build_frag_reuse_index, merge_versions, read_versions
from lancetx.commit.engine.operations import (
    FRAG_REUSE_INDEX_NAME,
    CreateIndex,
    DataFragment,
    Delete,
    IndexMetadata,
    Rewrite,
    Transaction,
    Update,
)
from lancetx.commit.errors import BasePathError, RetryableConflictError
from lancetx.commit.format.deletion import (
    decode_deletion_vector,
    deletion_file_key,
    encode_deletion_vector,
    locate_deletion_file,
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
    store_names: Names,
    base: str,
    ours: Transaction,
    needed: Sequence[RebaseNeeded],
    *,
    read_fragments: Mapping[int, DataFragment],
    latest: table_pb2.Manifest,
    committed_operations: Mapping[int | None, str] | None = None,
) -> Steps[Transaction]:
    """:func:`rebase_transaction` as steps: deletion files are read and written by
    effects; the fragment-reuse merge runs on the driver's store (:class:`WithStore`)."""
    uri = store_names.uri(base)
    names = committed_operations or {}
    index_merges = [n for n in needed if n.kind is not RebaseKind.MERGE_DELETION_VECTORS]
    if index_merges:
        unsupported = _unsupported_index_merges(ours, index_merges)
        if unsupported:
            kinds = ", ".join(sorted({n.kind.value for n, _ in unsupported}))
            raise RetryableConflictError(
                uri,
                ours.uuid,
                ours.operation.name,
                ours.read_version,
                [
                    (
                        n.committed_version,
                        names.get(n.committed_version, n.kind.value),
                        f"lancetx cannot yet rebase by '{kinds}' ({why}); re-read the table "
                        "and retry",
                    )
                    for n, why in unsupported
                ],
            )
        merged: Transaction = yield WithStore(
            lambda store: _merge_frag_reuse_index(store, base, ours, index_merges, latest.version)
        )
        return merged
    fragment_ids = frozenset().union(*(n.fragment_ids for n in needed)) if needed else frozenset()
    op = ours.operation
    if not fragment_ids or not isinstance(op, Delete | Update):
        return dataclasses.replace(ours, read_version=latest.version)
    latest_by_id = {f.id: f for f in latest.fragments}
    try:
        updated, emptied = yield from _merge(
            _Where(store_names, base, tuple(latest.base_paths)),
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


def _committed_fri(needed: RebaseNeeded) -> IndexMetadata | None:
    found = [i for i in needed.indices if i.name == FRAG_REUSE_INDEX_NAME]
    return found[-1] if found else None


def _unsupported_index_merges(
    ours: Transaction, needed: Sequence[RebaseNeeded]
) -> list[tuple[RebaseNeeded, str]]:
    """The index merges this step cannot do, with why: only a CreateIndex that
    writes the fragment reuse index, against committed fragment reuse indices."""
    op = ours.operation
    if not isinstance(op, CreateIndex) or op.frag_reuse_index is None:
        why = (
            "a rewrite carrying a fragment reuse index is planned again, not rebased"
            if isinstance(op, Rewrite)
            else "only fragment reuse index details are merged"
        )
        return [(n, why) for n in needed]
    return [
        (n, "only fragment reuse index details are merged (not MemWAL index details)")
        for n in needed
        if _committed_fri(n) is None
    ]


def _merge_frag_reuse_index(
    store: ObjectStore,
    base: str,
    ours: Transaction,
    needed: Sequence[RebaseNeeded],
    latest_version: int,
) -> Transaction:
    """Ours (a CreateIndex writing the fragment reuse index, e.g. a cleanup)
    with every committed change to that index folded in, replacing the
    index that is current now."""
    op = ours.operation
    assert isinstance(op, CreateIndex) and op.frag_reuse_index is not None
    mine = op.frag_reuse_index
    read_index = next((i for i in op.removed_indices if i.name == FRAG_REUSE_INDEX_NAME), None)
    read = read_versions(store, base, read_index) if read_index is not None else []
    versions = read_versions(store, base, mine)
    current = read_index
    for n in sorted(needed, key=lambda n: n.committed_version or 0):
        committed = _committed_fri(n)
        assert committed is not None
        theirs = read_versions(store, base, committed)
        versions = merge_versions(versions, read, theirs)
        read, current = theirs, committed
    merged = build_frag_reuse_index(
        store, base, versions, dataset_version=latest_version, template=mine
    )
    new_indices = tuple(merged if i.name == FRAG_REUSE_INDEX_NAME else i for i in op.new_indices)
    # The builder removes indices by uuid: the one to replace is the current one.
    removed = tuple(i for i in op.removed_indices if i.name != FRAG_REUSE_INDEX_NAME)
    if current is not None:
        removed += (current,)
    rebased = dataclasses.replace(op, new_indices=new_indices, removed_indices=removed)
    return dataclasses.replace(ours, operation=rebased, read_version=latest_version)


@dataclass(frozen=True)
class _Where:
    """The table's store and base key, and its base paths (deletion files a clone
    reads from its source live under one)."""

    names: Names
    base: str
    bases: tuple[table_pb2.BasePath, ...]


def _merge(
    where: _Where,
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
        _require_only_deletions(fragment, read_fragments.get(fragment.id), current)
        before = yield from _vector(where, read_fragments.get(fragment.id))
        mine = yield from _vector(where, fragment)
        affected = mine - before
        theirs = yield from _vector(where, current)
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
        deletion_file, data = encode_deletion_vector(latest_version, merged)
        yield PutObject(deletion_file_key(where.base, rebased.id, deletion_file), data)
        rebased.deletion_file.CopyFrom(deletion_file)
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


def _vector(where: _Where, fragment: DataFragment | None) -> Steps[BitMap]:
    if fragment is None or not fragment.HasField("deletion_file"):
        return BitMap()
    try:
        location = locate_deletion_file(
            where.names, where.base, fragment.id, fragment.deletion_file, where.bases
        )
    except BasePathError as exc:
        raise _Overlap(
            f"the deletion file of fragment {fragment.id} cannot be read: {exc}"
        ) from None
    if location.key is None:
        # Under a base in another bucket (a clone's source): planned again, ours reads
        # the latest version, whose deletion file of this fragment is the table's own.
        raise _Overlap(
            f"the deletion file of fragment {fragment.id} is {location.uri}, outside the "
            "table's store, which a rebase does not read"
        )
    data: bytes = yield GetObject(location.key)
    return decode_deletion_vector(data, fragment.deletion_file, path=location.uri)
