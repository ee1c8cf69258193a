"""The conflict matrix, as data to read against the transaction spec.

Three tables:

* :data:`MATRIX` -- every ordered pair of the 15 operations (225 cells). Row =
  the operation being committed (*ours*), column = one committed since ours'
  read version (*theirs*), as the spec words its lists ("from the perspective
  of the operation being committed"). A cell holds the outcomes its variants
  produce: ``C`` compatible, ``B`` rebase, ``R`` retryable, ``N`` incompatible.
  A one-letter cell without listed variants is checked with the representative
  operations of :data:`REPRESENTATIVE`; a cell with several letters (the
  spec's "(only if ...)" cases) has :data:`VARIANTS`, one or more per letter.
* :data:`LANCE_TEST_CONFLICTS` -- Lance's own ``test_conflicts`` table
  (``shared/reference/lance-commit-facts.md`` §5, an older Lance), every cell.
* :data:`LANCE_DATA_REPLACEMENT_CASES` -- Lance's ``test_conflicts_data_replacement``.

Every cell / variant names its source:

* ``spec: <section>: <list entry>`` -- the spec's compatibility list says so;
* ``lance: conflict_resolver.rs <fn> ...`` -- the spec is silent, Lance decides;
* ``divergence: Lance test_conflicts says X; spec says Y because ...`` -- the
  older Lance table disagrees with the spec, and the spec wins;
* ``divergence: from the spec's wording ...`` -- lancetx follows Lance where a
  literal reading of the spec would refuse something that commutes (two
  UpdateConfig removals of the same key).

``lance_now`` notes where *current* Lance (``conflict_resolver.rs`` at the
mirrored HEAD) answers differently from the spec; the spec wins there too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from google.protobuf.any_pb2 import Any as AnyPb
from pyroaring import BitMap

from lancetx.commit.engine.conflicts import ConflictContext, Outcome
from lancetx.commit.engine.operations import (
    FRAG_REUSE_INDEX_NAME,
    MEM_WAL_INDEX_NAME,
    Append,
    BasePath,
    Clone,
    CreateIndex,
    DataFile,
    DataFragment,
    DataReplacement,
    DataReplacementGroup,
    Delete,
    Field,
    IndexMetadata,
    KeyExistenceFilter,
    Merge,
    MergedGeneration,
    Operation,
    OperationKind,
    Overwrite,
    Project,
    ReserveFragments,
    Restore,
    Rewrite,
    RewriteGroup,
    Update,
    UpdateBases,
    UpdateConfig,
    UpdateMemWalState,
    UpdateMode,
    update_map,
)
from lancetx.commit.format.key_existence import inserted_keys_filter, xxh64_of_u64
from lancetx.protos import table_pb2, transaction_pb2

C, B, R, N = Outcome.COMPATIBLE, Outcome.REBASE, Outcome.RETRYABLE, Outcome.INCOMPATIBLE
LETTER = {"C": C, "B": B, "R": R, "N": N}

K = OperationKind
ABBREVIATIONS: dict[str, OperationKind] = {
    "App": K.APPEND,
    "Del": K.DELETE,
    "Ovw": K.OVERWRITE,
    "CIx": K.CREATE_INDEX,
    "Rwr": K.REWRITE,
    "Mrg": K.MERGE,
    "Prj": K.PROJECT,
    "Rst": K.RESTORE,
    "Rsv": K.RESERVE_FRAGMENTS,
    "Cln": K.CLONE,
    "Upd": K.UPDATE,
    "UCf": K.UPDATE_CONFIG,
    "DRp": K.DATA_REPLACEMENT,
    "MWS": K.UPDATE_MEM_WAL_STATE,
    "UBs": K.UPDATE_BASES,
}

# fmt: off
MATRIX_TEXT = """
ours \\ theirs       App  Del  Ovw  CIx  Rwr  Mrg  Prj  Rst  Rsv  Cln  Upd  UCf  DRp  MWS  UBs
Append               C    C    N    C    C    C    C    N    C    C    C    C    C    N    C
Delete               C    BRC  N    C    RC   RC   C    N    C    C    BRC  C    RC   N    C
Overwrite            C    C    R    C    C    C    C    C    C    C    C    RC   C    R    C
CreateIndex          C    C    N    BC   NBRC C    C    N    C    C    C    C    RC   N    C
Rewrite              C    RC   N    NBRC RC   R    C    N    C    C    RC   C    RC   C    C
Merge                R    R    N    C    R    R    N    N    C    C    R    C    R    N    C
Project              C    C    N    C    C    R    R    N    C    C    C    C    C    N    C
Restore              C    C    C    C    C    C    C    C    C    C    C    C    C    N    C
ReserveFragments     C    C    N    C    C    C    C    N    C    C    C    C    C    C    C
Clone                C    C    C    C    C    C    C    C    C    C    C    C    C    C    C
Update               RC   BRC  N    C    RC   R    C    N    C    C    BRC  C    RC   NRC  C
UpdateConfig         C    C    N    C    C    C    C    C    C    C    C    NC   C    C    C
DataReplacement      C    NC   N    RC   RC   R    C    N    C    C    RC   C    RC   N    C
UpdateMemWalState    N    N    N    NRC  C    N    N    N    C    C    NRC  C    N    NRC  C
UpdateBases          C    C    C    C    C    C    C    C    C    C    C    C    C    C    NC
"""
# fmt: on


def parse_matrix(
    text: str = MATRIX_TEXT,
) -> dict[tuple[OperationKind, OperationKind], frozenset[Outcome]]:
    """``{(ours, theirs): outcomes}`` from the text grid."""
    lines = [line.split() for line in text.strip().splitlines()]
    columns = [ABBREVIATIONS[a] for a in lines[0][3:]]
    grid: dict[tuple[OperationKind, OperationKind], frozenset[Outcome]] = {}
    for row in lines[1:]:
        ours = OperationKind(row[0])
        if len(row) != len(columns) + 1:
            raise ValueError(f"row {row[0]} has {len(row) - 1} cells")
        for theirs, letters in zip(columns, row[1:], strict=True):
            grid[(ours, theirs)] = frozenset(LETTER[c] for c in letters)
    return grid


MATRIX = parse_matrix()


# ======================================================== the spec's own lists
# Verbatim from shared/seeds/transaction-spec-rendered.txt, "<Op> Compatibility".


@dataclass(frozen=True)
class SpecSection:
    title: str
    conflict_with: tuple[str, ...] = ()
    retryable: tuple[str, ...] = ()
    rebaseable: tuple[str, ...] = ()

    def entries(self, kind: OperationKind) -> list[tuple[str, str]]:
        """``(list name, entry text)`` of every entry naming ``kind``."""
        found = []
        for list_name, entries in (
            ("conflict with", self.conflict_with),
            ("retryable", self.retryable),
            ("rebaseable", self.rebaseable),
        ):
            for entry in entries:
                if entry.split(" ")[0] == kind.value:
                    found.append((list_name, entry))
        return found


SPEC: dict[OperationKind, SpecSection] = {
    K.APPEND: SpecSection(
        "Append Compatibility", conflict_with=("Overwrite", "Restore", "UpdateMemWalState")
    ),
    K.DELETE: SpecSection(
        "Delete Compatibility",
        conflict_with=("Overwrite", "Restore", "UpdateMemWalState"),
        retryable=(
            "Merge (only if there are overlapping fragments)",
            "Rewrite (only if there are overlapping fragments)",
            "DataReplacement (only if there are overlapping fragments)",
        ),
        rebaseable=("Delete", "Update"),
    ),
    K.OVERWRITE: SpecSection(
        "Overwrite Compatibility",
        retryable=(
            "UpdateConfig (only if the two operations modify the same config key)",
            "Overwrite (always)",
            "UpdateMemWalState (always)",
        ),
    ),
    K.CREATE_INDEX: SpecSection(
        "CreateIndex Compatibility",
        conflict_with=("Overwrite", "Restore", "UpdateMemWalState"),
        retryable=(
            "Rewrite (only if overlapping fragments, no stable row ids, and no fragment reuse index)",
            "DataReplacement (only if overlapping fragments and the column being replaced is being indexed)",
        ),
        rebaseable=(
            "CreateIndex (only if both operations are modifying the same singleton index)",
        ),
    ),
    K.REWRITE: SpecSection(
        "Rewrite Compatibility",
        conflict_with=("Overwrite", "Restore"),
        retryable=(
            "Merge (always)",
            "DataReplacement (only if overlapping fragments)",
            "Delete (only if overlapping fragments)",
            "Update (only if overlapping fragments)",
            "Rewrite (if overlapping fragments or both carry a fragment reuse index)",
            "CreateIndex (overlapping fragments and no fragment reuse index or stable row ids)",
        ),
        rebaseable=(
            "CreateIndex (if the CreateIndex is writing the fragment reuse index and the "
            "Rewrite is carrying a fragment reuse index)",
        ),
    ),
    K.MERGE: SpecSection(
        "Merge Compatibility",
        conflict_with=("Overwrite", "Restore", "UpdateMemWalState", "Project"),
        retryable=(
            "Update (always)",
            "Append (always)",
            "Delete (always)",
            "Merge (always)",
            "Rewrite (always)",
            "DataReplacement (always)",
        ),
    ),
    K.PROJECT: SpecSection(
        "Project Compatibility",
        conflict_with=("Overwrite", "Restore", "UpdateMemWalState"),
        retryable=("Project (always)", "Merge (always)"),
    ),
    K.RESTORE: SpecSection("Restore Compatibility", conflict_with=("UpdateMemWalState",)),
    K.RESERVE_FRAGMENTS: SpecSection(
        "ReserveFragments Compatibility", conflict_with=("Overwrite", "Restore")
    ),
    K.CLONE: SpecSection('Clone Compatibility ("there is no such thing as a conflict with Clone")'),
    K.UPDATE: SpecSection(
        "Update Compatibility",
        conflict_with=("Overwrite", "Restore"),
        retryable=(
            "Rewrite (only if overlapping fragments)",
            "DataReplacement (only if overlapping fragments)",
            "Merge (always)",
        ),
        rebaseable=("Delete", "Update"),
    ),
    K.UPDATE_CONFIG: SpecSection(
        "UpdateConfig Compatibility",
        conflict_with=(
            "Overwrite",
            "UpdateConfig (only if the two operations modify the same config)",
        ),
    ),
    K.DATA_REPLACEMENT: SpecSection(
        "DataReplacement Compatibility",
        conflict_with=("Overwrite", "Restore", "UpdateMemWalState"),
        retryable=(
            "DataReplacement (only if same field and overlapping fragments)",
            "CreateIndex (only if the field being replaced is being indexed)",
            "Rewrite (only if overlapping fragments)",
            "Update (only if overlapping fragments)",
            "Merge (always)",
        ),
    ),
    # The spec's UpdateMemWalState section has no compatibility list.
    K.UPDATE_BASES: SpecSection(
        "UpdateBases Compatibility",
        conflict_with=(
            "UpdateBases (only conflicts if the two operations have base paths with the "
            "same id, name, or path)",
        ),
    ),
}

#: Rows the spec has no compatibility list for: Lance decides the whole row.
SPEC_SILENT_ROWS = {
    K.UPDATE_MEM_WAL_STATE: "lance: conflict_resolver.rs check_update_mem_wal_state_txn"
}


def spec_outcomes(ours: OperationKind, theirs: OperationKind) -> frozenset[Outcome] | None:
    """What the spec's lists allow for a cell (None for spec-silent rows).

    Unconditional entries allow only their list's outcome; "(only if ...)"
    entries also allow compatible; rebaseable entries allow retryable too
    ("if both operations modified the same rows, then the conflict becomes a
    retryable conflict") and compatible (nothing to rebase); unlisted kinds
    are compatible.
    """
    if ours in SPEC_SILENT_ROWS:
        return None
    entries = SPEC[ours].entries(theirs)
    if not entries:
        return frozenset({C})
    allowed: set[Outcome] = set()
    for list_name, text in entries:
        conditional = "(" in text and "(always)" not in text
        if list_name == "conflict with":
            allowed |= {N, C} if conditional else {N}
        elif list_name == "retryable":
            allowed |= {R, C} if conditional else {R}
        else:
            allowed |= {B, R, C}
    return frozenset(allowed)


def spec_source(ours: OperationKind, theirs: OperationKind) -> str:
    """``spec: ...`` quoting the list entry for a cell (or "not listed")."""
    section = SPEC[ours]
    entries = section.entries(theirs)
    if not entries:
        return f"spec: {section.title}: {theirs.value} not listed -> compatible"
    quoted = "; ".join(f"{name}: {text!r}" for name, text in entries)
    return f"spec: {section.title}: {quoted}"


# ===================================================================== fixtures


def data_file(path: str, fields: Iterable[int]) -> DataFile:
    ids = list(fields)
    return DataFile(
        path=path,
        fields=ids,
        column_indices=list(range(len(ids))),
        file_major_version=2,
        file_minor_version=0,
    )


def deletion(file_id: int, read_version: int = 3, rows: int = 2) -> table_pb2.DeletionFile:
    return table_pb2.DeletionFile(
        file_type=table_pb2.DeletionFile.ARROW_ARRAY,
        read_version=read_version,
        id=file_id,
        num_deleted_rows=rows,
    )


def fragment(
    fragment_id: int,
    *files: DataFile,
    deletion_file: table_pb2.DeletionFile | None = None,
    rows: int = 100,
) -> DataFragment:
    out = DataFragment(id=fragment_id, files=list(files), physical_rows=rows)
    if deletion_file is not None:
        out.deletion_file.CopyFrom(deletion_file)
    return out


def with_deletion(frag: DataFragment, file_id: int) -> DataFragment:
    out = DataFragment()
    out.CopyFrom(frag)
    out.deletion_file.CopyFrom(deletion(file_id))
    return out


def with_files(frag: DataFragment, *files: DataFile) -> DataFragment:
    out = DataFragment()
    out.CopyFrom(frag)
    out.files.extend(files)
    return out


def index(
    name: str,
    fields: Iterable[int] = (0,),
    fragments: Iterable[int] | None = (0, 1, 2, 3),
    *,
    details: AnyPb | None = None,
    version: int = 3,
) -> IndexMetadata:
    out = IndexMetadata(name=name, fields=list(fields), dataset_version=version)
    out.uuid.uuid = bytes(range(16))
    if fragments is not None:
        out.fragment_bitmap = BitMap(list(fragments)).serialize()
    if details is not None:
        out.index_details.CopyFrom(details)
    return out


def frag_reuse_index(version: int = 3, fragments: Iterable[int] = (10,)) -> IndexMetadata:
    return index(FRAG_REUSE_INDEX_NAME, fields=(), fragments=fragments, version=version)


def region(n: int) -> table_pb2.UUID:
    return table_pb2.UUID(uuid=bytes([n]) * 16)


def generation(region_n: int, gen: int) -> MergedGeneration:
    return MergedGeneration(region_id=region(region_n), generation=gen)


def mem_wal_index(*gens: MergedGeneration) -> IndexMetadata:
    details = AnyPb()
    details.Pack(table_pb2.MemWalIndexDetails(merged_generations=list(gens)))
    return index(MEM_WAL_INDEX_NAME, fields=(), fragments=None, details=details)


def exact_keys(*hashes: int, fields: Iterable[int] = (0,)) -> KeyExistenceFilter:
    return KeyExistenceFilter(
        field_ids=list(fields),
        exact=transaction_pb2.Transaction.ExactKeySetFilter(key_hashes=list(hashes)),
    )


def bloom_keys(*keys: int, fields: Iterable[int] = (0,)) -> KeyExistenceFilter:
    """Lance's inserted-keys bloom filter over integer keys (as a merge-insert on an
    int64 primary key writes it)."""
    hashes = xxh64_of_u64(np.array(keys, dtype=np.uint64))
    return inserted_keys_filter(list(fields), hashes)


def _resized(keys: KeyExistenceFilter) -> KeyExistenceFilter:
    out = KeyExistenceFilter()
    out.CopyFrom(keys)
    out.bloom.number_of_items = 4096
    return out


def field_(name: str, field_id: int, parent: int = -1) -> Field:
    return Field(name=name, id=field_id, parent_id=parent, logical_type="int64", type=Field.LEAF)


SCHEMA = (field_("a", 0), field_("b", 1))
SCHEMA_WITH_C = (*SCHEMA, field_("c", 2))

# The table at the read version (v3): four fragments, columns a (0) and b (1).
F = {i: fragment(i, data_file(f"f{i}.lance", (0, 1))) for i in range(4)}
#: Read-version state of the fragments ours modifies (Lance's initial_fragments).
DEFAULT_CONTEXT = ConflictContext(read_fragments=dict(F))


def merged(frag: DataFragment) -> DataFragment:
    """``frag`` after a Merge added column c."""
    return with_files(frag, data_file(f"f{frag.id}-c.lance", (2,)))


def rewrite(
    *groups: tuple[Iterable[int], Iterable[int]], fri: IndexMetadata | None = None
) -> Rewrite:
    return Rewrite(
        groups=tuple(
            RewriteGroup(
                old_fragments=[F.get(i, fragment(i)) for i in old],
                new_fragments=[fragment(i, data_file(f"r{i}.lance", (0, 1))) for i in new],
            )
            for old, new in groups
        ),
        frag_reuse_index=fri,
    )


def replace(fragment_id: int, *fields: int) -> DataReplacementGroup:
    return DataReplacementGroup(
        fragment_id=fragment_id, new_file=data_file(f"f{fragment_id}-repl.lance", fields)
    )


# Representative operations: the typical instance of each kind, touching
# fragment 0 where it touches any.
REPRESENTATIVE: dict[OperationKind, Operation] = {
    K.APPEND: Append(fragments=(fragment(0, data_file("new.lance", (0, 1))),)),
    K.DELETE: Delete(updated_fragments=(with_deletion(F[0], 11),), predicate="a < 10"),
    K.OVERWRITE: Overwrite(fragments=(fragment(0, data_file("o.lance", (0, 1))),), schema=SCHEMA),
    K.CREATE_INDEX: CreateIndex(new_indices=(index("a_idx"),)),
    K.REWRITE: rewrite(((0, 1), (10,))),
    K.MERGE: Merge(fragments=tuple(merged(F[i]) for i in range(4)), schema=SCHEMA_WITH_C),
    K.PROJECT: Project(schema=SCHEMA[:1]),
    K.RESTORE: Restore(version=1),
    K.RESERVE_FRAGMENTS: ReserveFragments(num_fragments=4),
    K.CLONE: Clone(is_shallow=True, ref_version=1, ref_path="s3://source/t.lance"),
    K.UPDATE: Update(
        updated_fragments=(with_deletion(F[0], 12),),
        new_fragments=(fragment(0, data_file("upd.lance", (0, 1))),),
        fields_modified=(1,),
    ),
    K.UPDATE_CONFIG: UpdateConfig(config_updates=update_map({"lance.auto_cleanup.interval": "10"})),
    K.DATA_REPLACEMENT: DataReplacement(replacements=(replace(0, 1),)),
    K.UPDATE_MEM_WAL_STATE: UpdateMemWalState(merged_generations=(generation(1, 5),)),
    K.UPDATE_BASES: UpdateBases(new_bases=(BasePath(id=1, name="archive", path="s3://archive/t"),)),
}


# ===================================================================== variants


@dataclass(frozen=True)
class Variant:
    """One conditional instance of a cell."""

    name: str
    expect: Outcome
    source: str
    ours: Operation | None = None  # None: REPRESENTATIVE[ours kind]
    theirs: Operation | None = None
    context: ConflictContext = DEFAULT_CONTEXT
    #: How current Lance (conflict_resolver.rs at HEAD) answers, where it differs.
    lance_now: str = ""


def _spec(ours: OperationKind, theirs: OperationKind, note: str = "") -> str:
    return spec_source(ours, theirs) + (f" -- {note}" if note else "")


def _delete(*frags: DataFragment, removed: Iterable[int] = ()) -> Delete:
    return Delete(updated_fragments=frags, deleted_fragment_ids=tuple(removed), predicate="b > 5")


def _update(
    *frags: DataFragment,
    removed: Iterable[int] = (),
    mode: UpdateMode = UpdateMode.REWRITE_ROWS,
    fields: Iterable[int] = (1,),
    new: Iterable[DataFragment] = (),
    keys: KeyExistenceFilter | None = None,
    gens: Iterable[MergedGeneration] = (),
) -> Update:
    return Update(
        updated_fragments=frags,
        removed_fragment_ids=tuple(removed),
        new_fragments=tuple(new),
        fields_modified=tuple(fields),
        update_mode=mode,
        inserted_rows=keys,
        merged_generations=tuple(gens),
    )


def _deletion_vector_variants(
    ours_kind: OperationKind, theirs_kind: OperationKind
) -> list[Variant]:
    """Delete/Update vs Delete/Update: rebase, retryable, compatible."""
    ours = REPRESENTATIVE[ours_kind]
    make = _delete if theirs_kind is K.DELETE else _update
    return [
        Variant(
            "same fragment, only its deletion file changed",
            B,
            _spec(ours_kind, theirs_kind, "deletion masks are merged"),
            ours,
            make(with_deletion(F[0], 21)),
        ),
        Variant(
            "they removed our fragment outright",
            R,
            _spec(
                ours_kind,
                theirs_kind,
                "Conflict Scenarios: rebasable only when just deletion vectors changed "
                "(a removed fragment cannot take a merged mask); Lance check_delete_txn",
            ),
            ours,
            make(removed=(0,)),
        ),
        Variant(
            "same fragment, but the committer cannot say which rows it touched",
            R,
            "lance: conflict_resolver.rs check_delete_txn/check_update_txn "
            "(overlap with affected_rows=None -> retryable)",
            ours,
            make(with_deletion(F[0], 21)),
            ConflictContext(read_fragments=dict(F), affected_rows_known=False),
        ),
        Variant(
            "different fragments",
            C,
            _spec(ours_kind, theirs_kind, "nothing overlaps, nothing to rebase"),
            ours,
            make(with_deletion(F[1], 21)),
        ),
    ]


def _column_rewrite_variants(hit: Operation, miss: Operation) -> list[Variant]:
    """Our Update in REWRITE_COLUMNS mode (a new data file for fragment 0) vs
    their Delete / row-rewriting Update: the lost-update cells."""
    ours = _update(
        with_files(F[0], data_file("f0-b2.lance", (1,))), mode=UpdateMode.REWRITE_COLUMNS
    )
    theirs_kind = hit.kind
    note = (
        "Conflict Scenarios: rebasable only because the transaction 'only modified deletion "
        "vectors (not data files)'; merging masks into either copy of the fragment would drop "
        "one side's change"
    )
    lance_now = (
        "B (check_update_txn compares only the committed side's data files; "
        "finish_delete_update then keeps ours' files and merges the masks)"
    )
    return [
        Variant(
            "same fragment, we rewrote its columns (new data file)",
            R,
            _spec(K.UPDATE, theirs_kind, note),
            ours,
            hit,
            lance_now=lance_now,
        ),
        Variant(
            "same fragment, we rewrote its columns, read state unknown",
            R,
            _spec(K.UPDATE, theirs_kind, note + "; without the read state the mode decides"),
            ours,
            hit,
            ConflictContext(),
            lance_now=lance_now,
        ),
        Variant(
            "we rewrote the columns of another fragment",
            C,
            _spec(K.UPDATE, theirs_kind, "nothing overlaps"),
            ours,
            miss,
        ),
    ]


def _overlap_variants(
    ours_kind: OperationKind,
    theirs_kind: OperationKind,
    hit: Operation,
    miss: Operation,
    ours: Operation | None = None,
    *,
    lance_now_miss: str = "",
) -> list[Variant]:
    return [
        Variant("overlapping fragments", R, _spec(ours_kind, theirs_kind), ours, hit),
        Variant(
            "no overlapping fragments",
            C,
            _spec(ours_kind, theirs_kind),
            ours,
            miss,
            lance_now=lance_now_miss,
        ),
    ]


_LANCE_DATA_REPLACEMENT = "lance: conflict_resolver.rs check_data_replacement_txn"
_MEM_WAL = "lance: conflict_resolver.rs check_merged_generations_conflict (spec silent on MemWAL generations)"

VARIANTS: dict[tuple[OperationKind, OperationKind], list[Variant]] = {
    # ------------------------------------------------------------------ Delete
    (K.DELETE, K.DELETE): _deletion_vector_variants(K.DELETE, K.DELETE),
    (K.DELETE, K.UPDATE): [
        *_deletion_vector_variants(K.DELETE, K.UPDATE),
        Variant(
            "same fragment, the update rewrote its columns (new data files)",
            R,
            _spec(K.DELETE, K.UPDATE, "only deletion masks can be merged; Lance check_delete_txn"),
            None,
            _update(
                with_files(F[0], data_file("f0-b2.lance", (1,))), mode=UpdateMode.REWRITE_COLUMNS
            ),
        ),
    ],
    (K.DELETE, K.REWRITE): _overlap_variants(
        K.DELETE, K.REWRITE, rewrite(((0, 1), (10,))), rewrite(((2, 3), (10,)))
    ),
    (K.DELETE, K.DATA_REPLACEMENT): _overlap_variants(
        K.DELETE,
        K.DATA_REPLACEMENT,
        DataReplacement(replacements=(replace(0, 1),)),
        DataReplacement(replacements=(replace(2, 1),)),
    ),
    (K.DELETE, K.MERGE): [
        Variant(
            "the merge rewrote our fragment (added a column)",
            R,
            _spec(K.DELETE, K.MERGE),
            None,
            REPRESENTATIVE[K.MERGE],
        ),
        Variant(
            "the merge's final fragment list drops our fragment",
            R,
            _spec(
                K.DELETE,
                K.MERGE,
                "Merge: 'The set of fragments provided in the operation will be the final set', "
                "so a dropped fragment overlaps",
            ),
            _delete(with_deletion(F[1], 11)),
            Merge(fragments=(merged(F[0]), merged(F[2])), schema=SCHEMA_WITH_C),
        ),
        Variant(
            "the merge lists our fragment exactly as we read it",
            C,
            _spec(K.DELETE, K.MERGE),
            None,
            Merge(fragments=(F[0], merged(F[1]), merged(F[2]), merged(F[3])), schema=SCHEMA_WITH_C),
            lance_now="R (check_delete_txn: Merge always retryable)",
        ),
    ],
    # --------------------------------------------------------------- Overwrite
    (K.OVERWRITE, K.OVERWRITE): [
        Variant(
            "concurrent overwrites",
            R,
            "divergence: Lance test_conflicts (§5) says C; spec says R ('Overwrite (always)') "
            "because 'the overwrite does not necessarily rewrite the table config', so the "
            "writer must decide whether its overwrite still applies",
            None,
            Overwrite(fragments=(fragment(0),), config_upsert_values={"overwrite-key": "v"}),
        ),
        Variant(
            "concurrent overwrites setting the same config key",
            R,
            _spec(K.OVERWRITE, K.OVERWRITE),
            Overwrite(config_upsert_values={"k": "1"}),
            Overwrite(config_upsert_values={"k": "2"}),
            lance_now="N (check_overwrite_txn: upsert_key_conflict -> incompatible)",
        ),
    ],
    (K.OVERWRITE, K.UPDATE_CONFIG): [
        Variant(
            "both set the same config key",
            R,
            _spec(K.OVERWRITE, K.UPDATE_CONFIG),
            Overwrite(config_upsert_values={"lance.auto_cleanup.interval": "20"}),
            None,
            lance_now="N (check_overwrite_txn: upsert_key_conflict -> incompatible)",
        ),
        Variant(
            "the overwrite sets a key the update removes",
            R,
            _spec(K.OVERWRITE, K.UPDATE_CONFIG),
            Overwrite(config_upsert_values={"k": "1"}),
            UpdateConfig(config_updates=update_map({"k": None})),
            lance_now="N (check_overwrite_txn)",
        ),
        Variant(
            "different config keys",
            C,
            _spec(K.OVERWRITE, K.UPDATE_CONFIG),
            Overwrite(config_upsert_values={"other": "1"}),
        ),
        Variant("the overwrite sets no config", C, _spec(K.OVERWRITE, K.UPDATE_CONFIG)),
    ],
    (K.OVERWRITE, K.UPDATE_MEM_WAL_STATE): [
        Variant(
            "MemWAL state changed",
            R,
            _spec(K.OVERWRITE, K.UPDATE_MEM_WAL_STATE),
            lance_now="N (check_overwrite_txn: UpdateMemWalState -> incompatible)",
        )
    ],
    (K.OVERWRITE, K.RESTORE): [
        Variant("a restore", C, _spec(K.OVERWRITE, K.RESTORE, "'we do not care what has happened'"))
    ],
    # ------------------------------------------------------------- CreateIndex
    (K.CREATE_INDEX, K.CREATE_INDEX): [
        Variant(
            "both write the fragment reuse index (singleton)",
            B,
            _spec(K.CREATE_INDEX, K.CREATE_INDEX),
            CreateIndex(new_indices=(frag_reuse_index(),), removed_indices=(frag_reuse_index(2),)),
            CreateIndex(new_indices=(frag_reuse_index(4),), removed_indices=(frag_reuse_index(2),)),
            lance_now="R (check_create_index_txn: both frag reuse -> retryable)",
        ),
        Variant(
            "both write the MemWAL index (singleton)",
            B,
            _spec(K.CREATE_INDEX, K.CREATE_INDEX),
            CreateIndex(new_indices=(mem_wal_index(),)),
            CreateIndex(new_indices=(mem_wal_index(generation(1, 3)),)),
            lance_now="R (check_create_index_txn: both mem wal -> retryable)",
        ),
        Variant(
            "same regular index name",
            C,
            _spec(
                K.CREATE_INDEX,
                K.CREATE_INDEX,
                "'If the indexes have the same name then the second operation will win and replace the first'",
            ),
            None,
            CreateIndex(new_indices=(index("a_idx", fragments=(0, 1)),)),
            lance_now="R (check_create_index_txn: same-name -> retryable)",
        ),
        Variant(
            "different index names",
            C,
            _spec(K.CREATE_INDEX, K.CREATE_INDEX),
            None,
            CreateIndex(new_indices=(index("b_idx", fields=(1,)),)),
        ),
    ],
    (K.CREATE_INDEX, K.REWRITE): [
        Variant("the rewrite replaced covered fragments", R, _spec(K.CREATE_INDEX, K.REWRITE)),
        Variant(
            "the index has no fragment bitmap (covers everything)",
            R,
            "lance: conflict_resolver.rs check_create_index_txn (fragment_bitmap None -> retryable)",
            CreateIndex(new_indices=(index("a_idx", fragments=None),)),
        ),
        Variant(
            "the rewrite touched only uncovered fragments",
            C,
            _spec(K.CREATE_INDEX, K.REWRITE),
            CreateIndex(new_indices=(index("a_idx", fragments=(2, 3)),)),
        ),
        Variant(
            "stable row ids",
            C,
            _spec(K.CREATE_INDEX, K.REWRITE),
            context=ConflictContext(read_fragments=dict(F), stable_row_ids=True),
            lance_now="R (check_create_index_txn ignores stable row ids)",
        ),
        Variant(
            "the rewrite carries a fragment reuse index",
            C,
            _spec(K.CREATE_INDEX, K.REWRITE),
            theirs=rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
        ),
        Variant(
            "we write the fragment reuse index and the rewrite carries one",
            B,
            "lance: conflict_resolver.rs check_create_index_txn (collects the committed FRI); "
            "spec Rebase Mechanism: 'Accumulates fragment reuse index updates when concurrent "
            "Rewrites change fragment IDs'",
            CreateIndex(new_indices=(frag_reuse_index(),), removed_indices=(frag_reuse_index(2),)),
            rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
        ),
        Variant(
            "we commit the fragment reuse index mixed with another index",
            N,
            "lance: conflict_resolver.rs check_create_index_txn ('we don't support committing "
            "a mixture of frag_reuse_index and other indices')",
            CreateIndex(
                new_indices=(frag_reuse_index(), index("a_idx")),
                removed_indices=(frag_reuse_index(2),),
            ),
            rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
        ),
    ],
    (K.CREATE_INDEX, K.DATA_REPLACEMENT): [
        Variant(
            "an indexed column of a covered fragment was replaced",
            R,
            _spec(K.CREATE_INDEX, K.DATA_REPLACEMENT),
            theirs=DataReplacement(replacements=(replace(0, 0),)),
        ),
        Variant(
            "an unindexed column was replaced",
            C,
            _spec(K.CREATE_INDEX, K.DATA_REPLACEMENT),
            theirs=DataReplacement(replacements=(replace(0, 1),)),
        ),
        Variant(
            "the indexed column was replaced in a fragment the index does not cover",
            C,
            _spec(K.CREATE_INDEX, K.DATA_REPLACEMENT),
            CreateIndex(new_indices=(index("a_idx", fragments=(2, 3)),)),
            DataReplacement(replacements=(replace(0, 0),)),
            lance_now="R (check_create_index_txn checks fields only)",
        ),
    ],
    (K.CREATE_INDEX, K.UPDATE_MEM_WAL_STATE): [
        Variant(
            "we write the MemWAL index",
            N,
            _spec(K.CREATE_INDEX, K.UPDATE_MEM_WAL_STATE),
            CreateIndex(new_indices=(mem_wal_index(),)),
            lance_now="C, collecting the generations to rebase (check_create_index_txn)",
        ),
    ],
    # ----------------------------------------------------------------- Rewrite
    (K.REWRITE, K.DELETE): _overlap_variants(
        K.REWRITE, K.DELETE, _delete(with_deletion(F[1], 21)), _delete(with_deletion(F[2], 21))
    ),
    (K.REWRITE, K.UPDATE): _overlap_variants(
        K.REWRITE, K.UPDATE, _update(with_deletion(F[0], 21)), _update(removed=(3,))
    ),
    (K.REWRITE, K.DATA_REPLACEMENT): _overlap_variants(
        K.REWRITE,
        K.DATA_REPLACEMENT,
        DataReplacement(replacements=(replace(1, 1),)),
        DataReplacement(replacements=(replace(2, 1),)),
    ),
    (K.REWRITE, K.REWRITE): [
        Variant(
            "overlapping fragments", R, _spec(K.REWRITE, K.REWRITE), None, rewrite(((1, 2), (11,)))
        ),
        Variant(
            "both carry a fragment reuse index",
            R,
            _spec(K.REWRITE, K.REWRITE),
            rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
            rewrite(((2, 3), (11,)), fri=frag_reuse_index(4)),
        ),
        Variant(
            "disjoint fragments", C, _spec(K.REWRITE, K.REWRITE), None, rewrite(((2, 3), (11,)))
        ),
    ],
    (K.REWRITE, K.CREATE_INDEX): [
        Variant("their index covers rewritten fragments", R, _spec(K.REWRITE, K.CREATE_INDEX)),
        Variant(
            "their index covers other fragments",
            C,
            _spec(K.REWRITE, K.CREATE_INDEX),
            theirs=CreateIndex(new_indices=(index("a_idx", fragments=(2, 3)),)),
        ),
        Variant(
            "stable row ids",
            C,
            _spec(K.REWRITE, K.CREATE_INDEX),
            context=ConflictContext(read_fragments=dict(F), stable_row_ids=True),
            lance_now="R (check_rewrite_txn ignores stable row ids)",
        ),
        Variant(
            "they write the fragment reuse index and we carry one",
            B,
            _spec(K.REWRITE, K.CREATE_INDEX),
            rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
            CreateIndex(new_indices=(frag_reuse_index(),), removed_indices=(frag_reuse_index(2),)),
        ),
        Variant(
            "they write the fragment reuse index, we carry none",
            C,
            "lance: conflict_resolver.rs check_rewrite_txn ('Rewrite with remapping and "
            "frag_reuse_index creation can commit without conflict')",
            None,
            CreateIndex(new_indices=(frag_reuse_index(),), removed_indices=(frag_reuse_index(2),)),
        ),
        Variant(
            "they commit the fragment reuse index mixed with another index",
            N,
            "lance: conflict_resolver.rs check_rewrite_txn ('we don't support committing a "
            "mixture of frag_reuse_index and other indices')",
            rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
            CreateIndex(
                new_indices=(frag_reuse_index(), index("a_idx")),
                removed_indices=(frag_reuse_index(2),),
            ),
        ),
        Variant(
            "we carry a fragment reuse index, groups align with their index",
            C,
            _spec(K.REWRITE, K.CREATE_INDEX, "no conflict with a fragment reuse index"),
            rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
            CreateIndex(new_indices=(index("a_idx", fragments=(0, 1)),)),
        ),
        Variant(
            "we carry a fragment reuse index, a group straddles their index's bitmap",
            R,
            "lance: conflict_resolver.rs check_rewrite_txn (a group mixing indexed and "
            "unindexed fragments would produce an invalid bitmap)",
            rewrite(((0, 1), (10,)), fri=frag_reuse_index(4)),
            CreateIndex(new_indices=(index("a_idx", fragments=(0, 2)),)),
        ),
    ],
    # ------------------------------------------------------------------ Update
    (K.UPDATE, K.APPEND): [
        Variant("a plain update", C, _spec(K.UPDATE, K.APPEND)),
        Variant(
            "a merge-insert that checks key uniqueness",
            R,
            "lance: conflict_resolver.rs check_update_txn (inserted_rows_filter vs Append -> "
            "retryable; the spec only says the filter is 'used for conflict detection')",
            _update(with_deletion(F[0], 12), keys=exact_keys(1, 2)),
        ),
    ],
    (K.UPDATE, K.DELETE): [
        *_deletion_vector_variants(K.UPDATE, K.DELETE),
        *_column_rewrite_variants(
            _delete(with_deletion(F[0], 21)), _delete(with_deletion(F[1], 21))
        ),
    ],
    (K.UPDATE, K.UPDATE): [
        *_deletion_vector_variants(K.UPDATE, K.UPDATE),
        *_column_rewrite_variants(
            _update(with_deletion(F[0], 22), new=(fragment(0, data_file("u.lance", (0, 1))),)),
            _update(with_deletion(F[1], 22), new=(fragment(0, data_file("u.lance", (0, 1))),)),
        ),
        Variant(
            "merge-inserts that may have inserted the same key",
            R,
            "lance: conflict_resolver.rs check_update_txn (KeyExistenceFilter intersects)",
            _update(with_deletion(F[0], 12), keys=exact_keys(1, 2)),
            _update(with_deletion(F[1], 22), keys=exact_keys(2, 3)),
        ),
        Variant(
            "merge-inserts with disjoint inserted keys",
            C,
            "lance: conflict_resolver.rs check_update_txn (no key intersection)",
            _update(with_deletion(F[0], 12), keys=exact_keys(1, 2)),
            _update(with_deletion(F[1], 22), keys=exact_keys(3, 4)),
        ),
        Variant(
            "merge-inserts whose bloom filters hold a common key",
            R,
            "lance: conflict_resolver.rs check_update_txn (bloom filters intersect)",
            _update(with_deletion(F[0], 12), keys=bloom_keys(*range(0, 300), 7777)),
            _update(with_deletion(F[1], 22), keys=bloom_keys(*range(1000, 1300), 7777)),
        ),
        Variant(
            "merge-inserts whose bloom filters share bits but cannot share a key",
            C,
            "lance: conflict_resolver.rs check_update_txn compares the filters; Lance on "
            "any common bit (a needless retry here), lancetx on a block where all eight "
            "words share a bit, which a common key always leaves",
            _update(with_deletion(F[0], 12), keys=bloom_keys(*range(0, 300))),
            _update(with_deletion(F[1], 22), keys=bloom_keys(*range(1000, 1300))),
        ),
        Variant(
            "merge-inserts with bloom filters of different sizing",
            R,
            "lance: conflict_resolver.rs check_update_txn (config mismatch -> conflict)",
            _update(with_deletion(F[0], 12), keys=bloom_keys(1)),
            _update(with_deletion(F[1], 22), keys=_resized(bloom_keys(2))),
        ),
        Variant(
            "our merge-insert tracks keys, theirs did not",
            R,
            "lance: conflict_resolver.rs check_update_txn ((Some, None) -> retryable)",
            _update(with_deletion(F[0], 12), keys=exact_keys(1)),
            _update(with_deletion(F[1], 22)),
        ),
    ],
    (K.UPDATE, K.REWRITE): _overlap_variants(
        K.UPDATE, K.REWRITE, rewrite(((0,), (10,))), rewrite(((2,), (10,)))
    ),
    (K.UPDATE, K.DATA_REPLACEMENT): _overlap_variants(
        K.UPDATE,
        K.DATA_REPLACEMENT,
        DataReplacement(replacements=(replace(0, 1),)),
        DataReplacement(replacements=(replace(2, 1),)),
    ),
    (K.UPDATE, K.UPDATE_MEM_WAL_STATE): [
        Variant(
            "an update merging no MemWAL generations", C, _spec(K.UPDATE, K.UPDATE_MEM_WAL_STATE)
        ),
        Variant(
            "the region was already merged to a later generation",
            N,
            _MEM_WAL,
            _update(with_deletion(F[0], 12), gens=(generation(1, 4),)),
        ),
        Variant(
            "the region was merged to an earlier generation",
            R,
            _MEM_WAL,
            _update(with_deletion(F[0], 12), gens=(generation(1, 9),)),
        ),
    ],
    # ------------------------------------------------------------ UpdateConfig
    (K.UPDATE_CONFIG, K.OVERWRITE): [
        Variant(
            "a config-key update vs an overwrite setting another key",
            N,
            "divergence: Lance test_conflicts says C for config-key-only updates (it checks only "
            "upsert-key conflicts, and schema/field metadata); spec says N ('Here are the "
            "operations that conflict with UpdateConfig: Overwrite', unconditionally) because "
            "the overwrite replaced the table the update was planned against",
            None,
            Overwrite(config_upsert_values={"overwrite-key": "v"}),
            lance_now="C (check_update_config_txn)",
        ),
        Variant(
            "a schema-metadata update vs an overwrite",
            N,
            _spec(K.UPDATE_CONFIG, K.OVERWRITE),
            UpdateConfig(schema_metadata_updates=update_map({"k": "v"})),
        ),
    ],
    (K.UPDATE_CONFIG, K.UPDATE_CONFIG): [
        Variant(
            "both set the same config key",
            N,
            _spec(K.UPDATE_CONFIG, K.UPDATE_CONFIG),
            None,
            UpdateConfig(config_updates=update_map({"lance.auto_cleanup.interval": "5"})),
        ),
        Variant(
            "one sets the key the other removes",
            N,
            _spec(K.UPDATE_CONFIG, K.UPDATE_CONFIG),
            None,
            UpdateConfig(config_updates=update_map({"lance.auto_cleanup.interval": None})),
        ),
        Variant(
            "both remove the same config key",
            C,
            "divergence: from the spec's wording ('only if the two operations modify the same "
            "config', which would make it N), not from Lance: lancetx follows Lance "
            "(test_conflicts C; upsert_key_conflict ignores delete/delete) because two removals "
            "of one key commute -- either order leaves the key absent -- so both land",
            UpdateConfig(config_updates=update_map({"remove-key": None})),
            UpdateConfig(config_updates=update_map({"remove-key": None})),
        ),
        Variant(
            "both remove the same key, one also sets another the other removes",
            N,
            _spec(
                K.UPDATE_CONFIG, K.UPDATE_CONFIG, "a set and a removal of one key do not commute"
            ),
            UpdateConfig(config_updates=update_map({"remove-key": None, "k2": "v"})),
            UpdateConfig(config_updates=update_map({"remove-key": None, "k2": None})),
        ),
        Variant(
            "one replaces the whole config map",
            N,
            _spec(K.UPDATE_CONFIG, K.UPDATE_CONFIG, "a replace modifies every key"),
            None,
            UpdateConfig(config_updates=update_map({"x": "1"}, replace=True)),
            lance_now="C (upsert_key_conflict ignores replace for config)",
        ),
        Variant(
            "different config keys",
            C,
            _spec(K.UPDATE_CONFIG, K.UPDATE_CONFIG),
            None,
            UpdateConfig(config_updates=update_map({"other": "1"})),
        ),
        Variant(
            "both change schema metadata",
            N,
            "lance: conflict_resolver.rs check_update_config_txn / modifies_same_metadata "
            "(spec silent on metadata)",
            UpdateConfig(schema_metadata_updates=update_map({"a": "1"})),
            UpdateConfig(schema_metadata_updates=update_map({"b": "1"})),
        ),
        Variant(
            "both change the same table-metadata key",
            N,
            "lance: transaction.rs modifies_same_metadata / update_maps_conflict (spec silent)",
            UpdateConfig(table_metadata_updates=update_map({"owner": "x"})),
            UpdateConfig(table_metadata_updates=update_map({"owner": "y"})),
        ),
        Variant(
            "different table-metadata keys",
            C,
            "lance: transaction.rs update_maps_conflict (spec silent)",
            UpdateConfig(table_metadata_updates=update_map({"owner": "x"})),
            UpdateConfig(table_metadata_updates=update_map({"team": "y"})),
        ),
        Variant(
            "the same field's metadata",
            N,
            "lance: transaction.rs modifies_same_metadata (spec silent)",
            UpdateConfig(field_metadata_updates={0: update_map({"unit": "m"})}),
            UpdateConfig(field_metadata_updates={0: update_map({"desc": "x"})}),
        ),
        Variant(
            "different fields' metadata",
            C,
            "lance: transaction.rs modifies_same_metadata (spec silent)",
            UpdateConfig(field_metadata_updates={0: update_map({"unit": "m"})}),
            UpdateConfig(field_metadata_updates={1: update_map({"unit": "m"})}),
        ),
    ],
    # --------------------------------------------------------- DataReplacement
    (K.DATA_REPLACEMENT, K.DELETE): [
        Variant(
            "the delete only changed the fragment's deletion file",
            C,
            _spec(K.DATA_REPLACEMENT, K.DELETE),
            None,
            _delete(with_deletion(F[0], 21)),
        ),
        Variant(
            "the delete removed our target fragment",
            N,
            f"{_LANCE_DATA_REPLACEMENT} (spec silent on a target fragment that no longer exists: "
            "'DataReplacement target fragment was removed')",
            None,
            _delete(removed=(0,)),
        ),
    ],
    (K.DATA_REPLACEMENT, K.CREATE_INDEX): [
        Variant(
            "their index indexes the replaced field",
            R,
            _spec(K.DATA_REPLACEMENT, K.CREATE_INDEX),
            theirs=CreateIndex(new_indices=(index("b_idx", fields=(1,)),)),
        ),
        Variant("their index indexes another field", C, _spec(K.DATA_REPLACEMENT, K.CREATE_INDEX)),
    ],
    (K.DATA_REPLACEMENT, K.REWRITE): _overlap_variants(
        K.DATA_REPLACEMENT, K.REWRITE, rewrite(((0,), (10,))), rewrite(((2, 3), (10,)))
    ),
    (K.DATA_REPLACEMENT, K.UPDATE): [
        Variant(
            "the update changed rows of our fragment",
            R,
            _spec(K.DATA_REPLACEMENT, K.UPDATE),
            None,
            _update(with_deletion(F[0], 22), fields=(0,)),
        ),
        Variant(
            "a column rewrite of another field on our fragment",
            R,
            _spec(K.DATA_REPLACEMENT, K.UPDATE),
            None,
            _update(
                with_files(F[0], data_file("f0-a2.lance", (0,))),
                mode=UpdateMode.REWRITE_COLUMNS,
                fields=(0,),
            ),
            lance_now="C (check_data_replacement_txn: in-place rewrite of other fields stays aligned)",
        ),
        Variant(
            "the update removed our fragment",
            R,
            _spec(K.DATA_REPLACEMENT, K.UPDATE),
            None,
            _update(removed=(0,)),
            lance_now="N (data_replacement_target_removed_err)",
        ),
        Variant(
            "the update touched another fragment",
            C,
            _spec(K.DATA_REPLACEMENT, K.UPDATE),
            None,
            _update(with_deletion(F[2], 22)),
        ),
    ],
    (K.DATA_REPLACEMENT, K.DATA_REPLACEMENT): [
        Variant(
            "same field of the same fragment",
            R,
            _spec(K.DATA_REPLACEMENT, K.DATA_REPLACEMENT),
            theirs=DataReplacement(replacements=(replace(0, 1),)),
        ),
        Variant(
            "other field of the same fragment",
            C,
            _spec(K.DATA_REPLACEMENT, K.DATA_REPLACEMENT),
            theirs=DataReplacement(replacements=(replace(0, 0),)),
        ),
        Variant(
            "same field of another fragment",
            C,
            _spec(K.DATA_REPLACEMENT, K.DATA_REPLACEMENT),
            theirs=DataReplacement(replacements=(replace(1, 1),)),
        ),
    ],
    # ------------------------------------------------------- UpdateMemWalState
    (K.UPDATE_MEM_WAL_STATE, K.UPDATE_MEM_WAL_STATE): [
        Variant(
            "same region, committed generation higher",
            N,
            _MEM_WAL,
            theirs=UpdateMemWalState(merged_generations=(generation(1, 10),)),
        ),
        Variant(
            "same region, same generation",
            N,
            _MEM_WAL,
            theirs=UpdateMemWalState(merged_generations=(generation(1, 5),)),
        ),
        Variant(
            "same region, committed generation lower",
            R,
            _MEM_WAL,
            theirs=UpdateMemWalState(merged_generations=(generation(1, 3),)),
        ),
        Variant(
            "different regions",
            C,
            _MEM_WAL,
            theirs=UpdateMemWalState(merged_generations=(generation(2, 10),)),
        ),
    ],
    (K.UPDATE_MEM_WAL_STATE, K.UPDATE): [
        Variant("the update merged no generations", C, _MEM_WAL),
        Variant(
            "the update merged the region further",
            N,
            _MEM_WAL,
            theirs=_update(gens=(generation(1, 7),)),
        ),
        Variant(
            "the update merged the region less far",
            R,
            _MEM_WAL,
            theirs=_update(gens=(generation(1, 2),)),
        ),
    ],
    (K.UPDATE_MEM_WAL_STATE, K.CREATE_INDEX): [
        Variant("a regular index", C, _MEM_WAL),
        Variant(
            "a MemWAL index that merged the region further",
            N,
            _MEM_WAL,
            theirs=CreateIndex(new_indices=(mem_wal_index(generation(1, 10)),)),
        ),
        Variant(
            "a MemWAL index that merged the region less far",
            R,
            _MEM_WAL,
            theirs=CreateIndex(new_indices=(mem_wal_index(generation(1, 3)),)),
        ),
    ],
    (K.UPDATE_MEM_WAL_STATE, K.CLONE): [
        Variant(
            "a clone",
            C,
            "spec: Clone Compatibility ('there is no such thing as a conflict with Clone'); the "
            "UpdateMemWalState row is otherwise Lance's",
            lance_now="N (check_update_mem_wal_state_txn), unreachable: a clone is always version 1",
        )
    ],
    # ------------------------------------------------------------- UpdateBases
    (K.UPDATE_BASES, K.UPDATE_BASES): [
        Variant(
            "same base id",
            N,
            _spec(K.UPDATE_BASES, K.UPDATE_BASES),
            theirs=UpdateBases(new_bases=(BasePath(id=1, path="s3://other/t"),)),
        ),
        Variant(
            "same base name",
            N,
            _spec(K.UPDATE_BASES, K.UPDATE_BASES),
            theirs=UpdateBases(new_bases=(BasePath(id=2, name="archive", path="s3://other/t"),)),
        ),
        Variant(
            "same base path",
            N,
            _spec(K.UPDATE_BASES, K.UPDATE_BASES),
            theirs=UpdateBases(new_bases=(BasePath(id=2, path="s3://archive/t"),)),
        ),
        Variant(
            "different id, name and path",
            C,
            _spec(K.UPDATE_BASES, K.UPDATE_BASES),
            theirs=UpdateBases(new_bases=(BasePath(id=2, name="cold", path="s3://cold/t"),)),
        ),
        Variant(
            "unassigned ids (0) and no names never clash",
            C,
            "lance: conflict_resolver.rs check_add_bases_txn (id 0 / missing name are not compared)",
            UpdateBases(new_bases=(BasePath(id=0, path="s3://a/t"),)),
            UpdateBases(new_bases=(BasePath(id=0, path="s3://b/t"),)),
        ),
    ],
}


def cell_variants(ours: OperationKind, theirs: OperationKind) -> list[Variant]:
    """The variants of a cell; a plain cell gets one from REPRESENTATIVE."""
    listed = VARIANTS.get((ours, theirs))
    if listed is not None:
        return listed
    if ours in SPEC_SILENT_ROWS:
        source = f"{SPEC_SILENT_ROWS[ours]} ({theirs.value})"
    else:
        source = spec_source(ours, theirs)
    (expect,) = MATRIX[(ours, theirs)]
    return [Variant("representative operations", expect, source)]


def resolve(
    variant: Variant, ours: OperationKind, theirs: OperationKind
) -> tuple[Operation, Operation]:
    return (
        variant.ours if variant.ours is not None else REPRESENTATIVE[ours],
        variant.theirs if variant.theirs is not None else REPRESENTATIVE[theirs],
    )


# ================================================ Lance's test_conflicts (§5)

_f0, _f1, _f2 = DataFragment(id=0), DataFragment(id=1), DataFragment(id=2)
_lance_index0 = IndexMetadata(name="test", fields=[0], dataset_version=1)  # fragment_bitmap None


def _lance_update_config(
    upsert: Mapping[str, str] | None = None,
    delete: Iterable[str] = (),
    schema: Mapping[str, str] | None = None,
    fields: Mapping[int, Mapping[str, str]] | None = None,
) -> UpdateConfig:
    """Lance's create_update_config_for_test: translate_config_updates (incremental)
    and translate_schema_metadata_updates (replace)."""
    config: dict[str, str | None] = dict(upsert or {})
    config.update(dict.fromkeys(delete))
    return UpdateConfig(
        config_updates=update_map(config) if config else None,
        schema_metadata_updates=update_map(dict(schema), replace=True) if schema else None,
        field_metadata_updates={
            k: update_map(dict(v), replace=True) for k, v in (fields or {}).items()
        },
    )


#: The "other" transactions, in §5 column order.
LANCE_OTHERS: list[tuple[str, Operation]] = [
    ("App", Append(fragments=(_f0,))),
    ("CIdx", CreateIndex(new_indices=(_lance_index0,), removed_indices=(_lance_index0,))),
    ("Del", Delete(updated_fragments=(_f0,), deleted_fragment_ids=(2,), predicate="x > 2")),
    ("Merge", Merge(fragments=(_f0, _f2))),
    ("Ovw", Overwrite(fragments=(_f0, _f2), config_upsert_values={"overwrite-key": "value"})),
    ("Rewr", Rewrite(groups=(RewriteGroup(old_fragments=[_f0], new_fragments=[_f1]),))),
    ("Resv", ReserveFragments(num_fragments=3)),
    (
        "Upd",
        Update(
            removed_fragment_ids=(1,),
            updated_fragments=(_f0,),
            new_fragments=(_f2,),
            fields_modified=(0,),
        ),
    ),
    (
        "UCfg",
        _lance_update_config(
            {"lance.test": "value"},
            ["remove-key"],
            {"schema-key": "schema-value"},
            {0: {"field-key": "field-value"}},
        ),
    ),
]

#: Lance's test runs without affected rows and without read-version fragments.
LANCE_CONTEXT = ConflictContext(affected_rows_known=False)


@dataclass(frozen=True)
class LanceRow:
    name: str
    ours: Operation
    #: Lance's expectations, one letter per LANCE_OTHERS column.
    lance: str
    #: Column -> (our outcome letter, "divergence: ...") where the spec disagrees.
    divergences: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: Column -> how current Lance's test_conflicts differs from §5 (no effect on the check).
    lance_now: Mapping[str, str] = field(default_factory=dict)


_OVERWRITE_VS_UPDATE_CONFIG = (
    "N",
    "divergence: Lance test_conflicts says C; spec says N ('Here are the operations that "
    "conflict with UpdateConfig: Overwrite', with no condition) because the overwrite replaced "
    "the table (and possibly its config) that the update was planned against",
)

LANCE_TEST_CONFLICTS: list[LanceRow] = [
    LanceRow("Append[f0]", Append(fragments=(_f0,)), "C C C C N C C C C"),
    LanceRow(
        "Delete upd[f1]", Delete(updated_fragments=(_f1,), predicate="x > 2"), "C C C R N C C R C"
    ),
    LanceRow(
        "Delete upd[f0,f2]",
        Delete(updated_fragments=(_f0, _f2), predicate="x > 2"),
        "C C R R N R C R C",
    ),
    LanceRow(
        "Overwrite (no cfg)",
        Overwrite(fragments=(_f0, _f2)),
        "C C C C C C C C C",
        divergences={
            "Ovw": (
                "R",
                "divergence: Lance test_conflicts says C; spec says R ('Overwrite (always)') "
                "because the overwrite does not necessarily rewrite the table config, so the "
                "writer must decide whether it still applies",
            )
        },
        lance_now={"Ovw": "current Lance's test_conflicts also says Retryable"},
    ),
    LanceRow(
        "CreateIndex idx0",
        CreateIndex(new_indices=(_lance_index0,), removed_indices=(_lance_index0,)),
        "C C C C N R C C C",
        lance_now={
            "CIdx": "current Lance says Retryable (same name); the spec says the second wins"
        },
    ),
    LanceRow(
        "Rewrite f1->f0",
        Rewrite(groups=(RewriteGroup(old_fragments=[_f1], new_fragments=[_f0]),)),
        "C R C R N C C R C",
    ),
    LanceRow(
        "Rewrite [f0,f2]->f0",
        Rewrite(groups=(RewriteGroup(old_fragments=[_f0, _f2], new_fragments=[_f0]),)),
        "C R R R N R C R C",
    ),
    LanceRow("Merge[f0,f2]", Merge(fragments=(_f0, _f2)), "R C R R N R C R C"),
    LanceRow("Reserve(2)", ReserveFragments(num_fragments=2), "C C C C N C C C C"),
    LanceRow(
        "Update upd f0, new f2",
        Update(updated_fragments=(_f0,), new_fragments=(_f2,), fields_modified=(0,)),
        "C C R R N R C R C",
    ),
    LanceRow(
        "UCfg upsert other-key",
        _lance_update_config({"other-key": "new-value"}),
        "C C C C C C C C C",
        divergences={"Ovw": _OVERWRITE_VS_UPDATE_CONFIG},
    ),
    LanceRow(
        "UCfg upsert lance.test",
        _lance_update_config({"lance.test": "new-value"}),
        "C C C C C C C C N",
        divergences={"Ovw": _OVERWRITE_VS_UPDATE_CONFIG},
    ),
    LanceRow(
        "UCfg upsert remove-key",
        _lance_update_config({"remove-key": "new-value"}),
        "C C C C C C C C N",
        divergences={"Ovw": _OVERWRITE_VS_UPDATE_CONFIG},
    ),
    LanceRow(
        "UCfg delete remove-key",
        _lance_update_config(delete=["remove-key"]),
        "C C C C C C C C C",
        # UCfg: C as Lance says (both delete remove-key: removals commute); the
        # 225 matrix marks this as a divergence from the spec's wording.
        divergences={"Ovw": _OVERWRITE_VS_UPDATE_CONFIG},
    ),
    LanceRow(
        "UCfg delete lance.test",
        _lance_update_config(delete=["lance.test"]),
        "C C C C C C C C N",
        divergences={"Ovw": _OVERWRITE_VS_UPDATE_CONFIG},
    ),
    LanceRow(
        "UCfg schema-md",
        _lance_update_config(schema={"schema-key": "new-value"}),
        "C C C C N C C C N",
    ),
    LanceRow(
        "UCfg field0 md",
        _lance_update_config(fields={0: {"field_key": "field_value"}}),
        "C C C C N C C C N",
    ),
    LanceRow(
        "UCfg field1 md",
        _lance_update_config(fields={1: {"field_key": "field_value"}}),
        "C C C C N C C C C",
    ),
]


# =============================== Lance's test_conflicts_data_replacement


def _legacy_file(path: str, fields: Iterable[int]) -> DataFile:
    """DataFile::new_legacy_from_fields."""
    return DataFile(path=path, fields=list(fields))


@dataclass(frozen=True)
class LanceCase:
    name: str
    ours: Operation
    theirs: Operation
    lance: Outcome
    expect: Outcome
    source: str
    #: "§5" (in the older Lance the facts describe) or "current" (added since).
    origin: str


_DR01 = DataReplacement(
    replacements=(DataReplacementGroup(fragment_id=0, new_file=_legacy_file("path0_01", (0, 1))),)
)


def _dr(fragment_id: int, path: str, fields: Iterable[int]) -> DataReplacement:
    return DataReplacement(
        replacements=(
            DataReplacementGroup(fragment_id=fragment_id, new_file=_legacy_file(path, fields)),
        )
    )


def _lance_update(
    updated: Iterable[int] = (),
    removed: Iterable[int] = (),
    new: Iterable[int] = (),
    fields: Iterable[int] = (),
    mode: UpdateMode = UpdateMode.REWRITE_ROWS,
) -> Update:
    return Update(
        updated_fragments=tuple(DataFragment(id=i) for i in updated),
        removed_fragment_ids=tuple(removed),
        new_fragments=tuple(DataFragment(id=i) for i in new),
        fields_modified=tuple(fields),
        update_mode=mode,
    )


_DR_SPEC = "spec: DataReplacement Compatibility"
_DR_UPDATE_DIVERGENCE = (
    "divergence: Lance's test_conflicts_data_replacement says {lance}; spec says R ('Update (only if "
    "overlapping fragments)') because the update touched the fragment being replaced"
)

LANCE_DATA_REPLACEMENT_CASES: list[LanceCase] = [
    LanceCase("Different fragments", _DR01, _dr(1, "path1_01", (0, 1)), C, C, _DR_SPEC, "§5"),
    LanceCase(
        "Same fragment, different fields", _DR01, _dr(0, "path0_23", (2, 3)), C, C, _DR_SPEC, "§5"
    ),
    LanceCase(
        "Same fragment, same fields", _DR01, _dr(0, "path0_01", (0, 1)), R, R, _DR_SPEC, "§5"
    ),
    LanceCase(
        "Same fragment, overlapping fields", _DR01, _dr(0, "path0_12", (1, 2)), R, R, _DR_SPEC, "§5"
    ),
    LanceCase(
        "vs Rewrite on same fragment",
        _DR01,
        Rewrite(groups=(RewriteGroup(old_fragments=[_f0], new_fragments=[_f1]),)),
        R,
        R,
        _DR_SPEC,
        "§5",
    ),
    LanceCase(
        "vs Rewrite on different fragment",
        _DR01,
        Rewrite(groups=(RewriteGroup(old_fragments=[_f1], new_fragments=[_f0]),)),
        C,
        C,
        _DR_SPEC,
        "§5",
    ),
    LanceCase(
        "vs Update (RewriteColumns) on a different field",
        _DR01,
        _lance_update(updated=(0,), fields=(2,), mode=UpdateMode.REWRITE_COLUMNS),
        C,
        R,
        _DR_UPDATE_DIVERGENCE.format(lance="C"),
        "current",
    ),
    LanceCase(
        "vs Update (RewriteColumns) with inserts on a different field",
        _DR01,
        _lance_update(updated=(0,), new=(5,), fields=(2,), mode=UpdateMode.REWRITE_COLUMNS),
        C,
        R,
        _DR_UPDATE_DIVERGENCE.format(lance="C"),
        "current",
    ),
    LanceCase(
        "vs Update (RewriteColumns) that rewrote one of our fields",
        _DR01,
        _lance_update(updated=(0,), fields=(1,), mode=UpdateMode.REWRITE_COLUMNS),
        R,
        R,
        _DR_SPEC,
        "current",
    ),
    LanceCase(
        "vs Update (RewriteRows) that moved our rows",
        _DR01,
        _lance_update(updated=(0,), new=(5,)),
        R,
        R,
        _DR_SPEC,
        "current",
    ),
    LanceCase(
        "vs Update that removed our fragment",
        _DR01,
        _lance_update(removed=(0,)),
        N,
        R,
        _DR_UPDATE_DIVERGENCE.format(lance="N (target removed)"),
        "current",
    ),
    LanceCase(
        "vs Update (RewriteRows) that moved a different fragment's rows",
        _DR01,
        _lance_update(updated=(1,), new=(5,)),
        C,
        C,
        _DR_SPEC,
        "current",
    ),
    LanceCase(
        "vs Delete (deletion-vector only) on same fragment",
        _DR01,
        Delete(updated_fragments=(DataFragment(id=0),), predicate="a > 0"),
        C,
        C,
        _DR_SPEC,
        "current",
    ),
    LanceCase(
        "vs Delete that removes the fragment",
        _DR01,
        Delete(deleted_fragment_ids=(0,), predicate="a > 0"),
        N,
        N,
        f"{_LANCE_DATA_REPLACEMENT} (spec silent on a removed target fragment)",
        "current",
    ),
    LanceCase("vs Merge", _DR01, Merge(fragments=(DataFragment(id=0),)), R, R, _DR_SPEC, "current"),
]
