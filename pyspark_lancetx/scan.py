"""Batch reads: a pinned version cut into Spark partitions, and each partition read.

Partitions follow Spark's own file-source rules (``spark.sql.files.*``), with a
fragment's live rows in the place of a file's bytes:

* each fragment is sized by the bytes of the columns read (its data files' sizes,
  shared among its columns by their type widths) and its live rows (physical rows
  less those its deletion vector removes); empty fragments are left out;
* the target size of a partition is ``min(max_partition_bytes, max(open cost,
  total / min_partitions))`` — Spark's ``maxSplitBytes`` — so a small table still
  spreads over the cores and a large one is cut at ``max_partition_bytes``;
* a fragment larger than that is split into ranges of its live rows; smaller
  fragments and pieces are packed in fragment order, each costing an open cost on
  top of its bytes, until a partition is full (``rows_per_partition`` caps rows).

Reading a piece that is a row range must be exact whatever the fragment holds:
pylance's ``offset``/``limit`` count live rows (the deletion vector applied), and
without a filter they become a range read of just those rows. With a filter they
would count *matching* rows instead, so a filtered range is read in two steps: the
row ids of the range (``offset``/``limit``, no filter, no column data), then the
filtered scan restricted to those ids (pylance's ``row_addr_allowlist``, which
reads only the rows it names). Row ids, not addresses: on a table with stable row
ids the allow-list is keyed by row id, and on any other table the two are equal.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

from pyspark_lancetx.filters import conjunction

if TYPE_CHECKING:
    import pyarrow as pa

#: What opening one more fragment costs, in bytes (Spark's ``openCostInBytes`` default).
OPEN_COST_BYTES = 4 * 1024 * 1024
#: Width assumed for a value whose size the type does not fix (strings, binaries, lists).
VARIABLE_WIDTH = 32


@dataclass(frozen=True)
class Piece:
    """Live rows ``[offset, offset + limit)`` of one fragment (``limit`` None: all of them)."""

    fragment_id: int
    offset: int = 0
    limit: int | None = None

    @property
    def whole(self) -> bool:
        return self.offset == 0 and self.limit is None


class LanceTxPartition(InputPartition):  # type: ignore[misc]
    """Whole fragments and fragment row ranges read by one Spark task."""

    def __init__(self, pieces: Sequence[Piece]) -> None:
        super().__init__(tuple(pieces))
        self.pieces = tuple(pieces)

    @property
    def fragment_ids(self) -> tuple[int, ...]:
        """The fragments this partition reads (all or part of)."""
        return tuple(dict.fromkeys(p.fragment_id for p in self.pieces))


@dataclass(frozen=True)
class FragmentSize:
    """What planning knows of one fragment: live rows and the bytes of the columns read."""

    fragment_id: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class Sizing:
    """The partition-size options (see :mod:`pyspark_lancetx.options`)."""

    max_partition_bytes: int
    min_partitions: int
    rows_per_partition: int | None = None
    open_cost: int = OPEN_COST_BYTES


def split_size(fragments: Sequence[FragmentSize], sizing: Sizing) -> int:
    """Spark's ``maxSplitBytes``: the bytes a partition is filled up to."""
    total = sum(f.bytes + sizing.open_cost for f in fragments)
    return min(sizing.max_partition_bytes, max(sizing.open_cost, total // sizing.min_partitions))


def _pieces(fragment: FragmentSize, target: int, max_rows: int | None) -> list[tuple[Piece, int]]:
    """``fragment`` as one piece, or as near-equal row ranges of at most ``target`` bytes."""
    per_row = fragment.bytes / fragment.rows
    rows = max(1, int(target // per_row)) if per_row > 0 else fragment.rows
    if max_rows is not None:
        rows = min(rows, max_rows)
    if fragment.rows <= rows:
        return [(Piece(fragment.fragment_id), fragment.bytes)]
    count = math.ceil(fragment.rows / rows)
    out: list[tuple[Piece, int]] = []
    for i in range(count):
        start = fragment.rows * i // count
        end = fragment.rows * (i + 1) // count
        piece = Piece(fragment.fragment_id, start, end - start)
        out.append((piece, math.ceil(per_row * (end - start))))
    return out


def plan_partitions(fragments: Sequence[FragmentSize], sizing: Sizing) -> list[LanceTxPartition]:
    """Every live row of ``fragments`` in exactly one partition (none for an empty table)."""
    live = [f for f in fragments if f.rows > 0]
    target = split_size(live, sizing)
    partitions: list[list[Piece]] = []
    size = rows = 0
    for fragment in live:
        for piece, piece_bytes in _pieces(fragment, target, sizing.rows_per_partition):
            piece_rows = piece.limit if piece.limit is not None else fragment.rows
            full = size + piece_bytes > target or (
                sizing.rows_per_partition is not None
                and rows + piece_rows > sizing.rows_per_partition
            )
            if not partitions or (partitions[-1] and full):
                partitions.append([])
                size = rows = 0
            partitions[-1].append(piece)
            size += piece_bytes + sizing.open_cost
            rows += piece_rows
    return [LanceTxPartition(p) for p in partitions]


# --------------------------------------------------------------------------- sizes


def _width(dtype: pa.DataType) -> float:
    """Bytes per value of an Arrow type (an estimate for variable-size types)."""
    import pyarrow as pa

    t = pa.types
    if t.is_fixed_size_list(dtype):
        return float(dtype.list_size) * _width(dtype.value_type)
    if t.is_struct(dtype):
        return sum(_width(f.type) for f in dtype.fields) or 1.0
    if t.is_dictionary(dtype):
        return _width(dtype.index_type)
    if t.is_boolean(dtype):
        return 0.125
    try:
        return float(dtype.byte_width) or 1.0
    except ValueError:  # variable-size: strings, binaries, lists, maps
        return float(VARIABLE_WIDTH)


def column_share(schema: pa.Schema, columns: Sequence[str]) -> float:
    """The estimated share of a row's stored bytes that ``columns`` hold."""
    widths = {f.name: _width(f.type) for f in schema}
    total = sum(widths.values())
    if total <= 0:
        return 1.0
    return min(1.0, sum(widths.get(c, 0.0) for c in columns) / total)


def fragment_sizes(dataset: Any, columns: Sequence[str]) -> list[FragmentSize]:
    """Live rows and estimated bytes read, per fragment of a pylance dataset (from its
    manifest only: no data or deletion file is opened)."""
    share = column_share(dataset.schema, columns)
    row_width = sum(_width(f.type) for f in dataset.schema) or 1.0
    out = []
    for fragment in dataset.get_fragments():
        meta = fragment.metadata
        physical = int(meta.physical_rows or 0)
        deleted = meta.deletion_file.num_deleted_rows if meta.deletion_file is not None else 0
        # An old deletion file may lack its count: then pylance reads it.
        rows = int(fragment.count_rows()) if deleted is None else physical - int(deleted)
        stored = sum(int(getattr(f, "file_size_bytes", 0) or 0) for f in meta.files)
        if stored <= 0:
            stored = int(physical * row_width)
        live_bytes = stored * rows / physical if physical else 0
        out.append(FragmentSize(fragment.fragment_id, rows, math.ceil(live_bytes * share)))
    return out


def default_min_partitions() -> int:
    """The cores of this machine (in local mode, the executors' too)."""
    return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class ScanPlan:
    """A read pinned to one version (plain data).

    ``data_uri`` is where pylance reads it (``s3://…`` for an ``s3+ddb://`` table):
    the version was resolved through lancetx at planning, so the tasks never ask
    DynamoDB again."""

    uri: str
    #: The storage options pylance gets (lancetx's own removed). Not in the repr: it
    #: holds credentials.
    storage_options: dict[str, str] = field(repr=False)
    version: int
    columns: tuple[str, ...]
    filters: tuple[str, ...] = ()
    batch_size: int = 8192
    rows_per_partition: int | None = None
    data_uri: str | None = None
    max_partition_bytes: int = 128 * 1024 * 1024
    min_partitions: int | None = None

    def open(self) -> Any:
        """The pylance dataset at the pinned version; VersionNotFoundError (naming it)
        when a cleanup removed it since the DataFrame was planned."""
        import lance

        try:
            return lance.dataset(
                self.data_uri or self.uri,
                version=self.version,
                storage_options=self.storage_options or None,
            )
        except Exception as exc:
            raise self.failure(exc) from exc

    @property
    def filter(self) -> str | None:
        """All filters (the ``filter`` option and pushed-down ones) as one Lance filter."""
        return conjunction(self.filters)

    @property
    def sizing(self) -> Sizing:
        return Sizing(
            max_partition_bytes=self.max_partition_bytes,
            min_partitions=self.min_partitions or default_min_partitions(),
            rows_per_partition=self.rows_per_partition,
        )

    def partitions(self) -> list[LanceTxPartition]:
        """The pinned version cut into partitions (at least one, maybe empty)."""
        dataset = self.open()
        try:
            sizes = fragment_sizes(dataset, self.columns)
        except Exception as exc:
            raise self.failure(exc) from exc
        return plan_partitions(sizes, self.sizing) or [LanceTxPartition(())]

    def batches(self, pieces: Sequence[Piece]) -> Iterator[pa.RecordBatch]:
        """The rows of ``pieces`` (in the read's columns, filtered), as pylance's batches."""
        if not pieces:
            return
        dataset = self.open()
        try:
            yield from self._scan(dataset, pieces)
        except Exception as exc:
            raise self.failure(exc) from exc

    def _scan(self, dataset: Any, pieces: Sequence[Piece]) -> Iterator[pa.RecordBatch]:
        whole = [self._fragment(dataset, p.fragment_id) for p in pieces if p.whole]
        if whole:
            yield from self._scanner(dataset, fragments=whole).to_batches()
        for piece in (p for p in pieces if not p.whole):
            fragment = [self._fragment(dataset, piece.fragment_id)]
            if self.filter is None:
                # Live-row offsets; pylance reads just that range of the files.
                yield from self._scanner(
                    dataset, fragments=fragment, offset=piece.offset, limit=piece.limit
                ).to_batches()
                continue
            from lance.dataset import serialize_row_addrs

            ids = dataset.scanner(
                columns=[],
                with_row_id=True,
                fragments=fragment,
                offset=piece.offset,
                limit=piece.limit,
            ).to_table()
            allow = serialize_row_addrs(ids.column("_rowid").to_numpy().tolist())
            yield from self._scanner(
                dataset, fragments=fragment, row_addr_allowlist=allow
            ).to_batches()

    def _scanner(self, dataset: Any, **kwargs: Any) -> Any:
        return dataset.scanner(
            columns=list(self.columns),
            filter=self.filter,
            batch_size=self.batch_size,
            **kwargs,
        )

    def _fragment(self, dataset: Any, fragment_id: int) -> Any:
        from lancetx.commit.errors import ManifestFormatError

        fragment = dataset.get_fragment(fragment_id)
        if fragment is None:  # planned from this version's manifest: it must be there
            raise ManifestFormatError(
                f"{self.uri} (version {self.version})",
                f"pylance finds no fragment {fragment_id} in the version this read was "
                "planned on; run lancetx-sync verify on the table",
            )
        return fragment

    def failure(self, exc: Exception) -> Exception:
        """``exc``, or VersionNotFoundError when the pinned version is gone (a cleanup
        removed it while this DataFrame was being read)."""
        import lance

        from lancetx.commit.errors import LancetxError, VersionNotFoundError
        from lancetx.errors import pylance_gist, says_not_found

        if isinstance(exc, LancetxError):
            return exc
        try:
            lance.dataset(
                self.data_uri or self.uri,
                version=self.version,
                storage_options=self.storage_options or None,
            )
        except Exception as probe:
            if not says_not_found(probe):
                return exc  # the probe failed too (a network error, say): nothing told apart
            return VersionNotFoundError(
                self.uri,
                self.version,
                "this DataFrame was planned on it and a cleanup has removed it since "
                f"(pylance: {pylance_gist(exc)}); load the table again to read a current "
                "version, or keep versions longer than your jobs read them (cleanup's "
                "older-than)",
            )
        return exc
