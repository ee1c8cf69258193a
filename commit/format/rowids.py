"""Stable row ids and per-row version runs, as Lance encodes them in fragments.

With the stable-row-ids feature (reader/writer flag 2) every fragment carries
``inline_row_ids``: a serialized :class:`~lancetx.protos.rowids_pb2.RowIdSequence`
listing the row id of each physical row, in row order. It may also carry
``inline_created_at_versions`` / ``inline_last_updated_at_versions``: serialized
:class:`~lancetx.protos.rowids_pb2.RowDatasetVersionSequence` messages, run-length
lists of table versions indexed by row *offset*.

Encodings follow ``rust/lance-table/src/rowids/`` (``segment.rs``,
``encoded_array.rs``, ``bitmap.rs``, ``serde.rs``, ``version.rs``):

* ``Range`` ``[start, end)``; ``RangeWithHoles`` ``[start, end)`` minus the
  listed *absolute* values (the Rust doc comment says offsets, the code
  compares values); ``RangeWithBitmap`` ``[start, end)`` filtered by a bitmap
  whose bit ``i`` is ``byte[i // 8] >> (i % 8) & 1`` (LSB first; our proto
  comment's "MSB first" is wrong); ``SortedArray`` / ``Array`` of
  :class:`EncodedU64Array` (``base`` + little-endian u16/u32 offsets, or raw u64).
* A version run's ``span`` is a segment of row offsets; only its length matters.

Encoders produce what Lance produces: ``RowIdSequence::from(range)`` is one
``Range`` segment, ``RowIdSequence::from(&[u64])`` picks the smallest encoding
(:func:`encode_segment`), and version runs use ``Range`` spans.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from lancetx.commit.errors import FormatError
from lancetx.protos import rowids_pb2

_U16_MAX = 2**16 - 1
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


class RowIdFormatError(FormatError):
    """A row-id or row-version sequence does not decode."""

    kind = "row id sequence"


# ---------------------------------------------------------------- EncodedU64Array


def _decode_array(array: rowids_pb2.EncodedU64Array, where: str) -> list[int]:
    kind = array.WhichOneof("array")
    if kind == "u16_array":
        data = array.u16_array.offsets
        if len(data) % 2:
            raise RowIdFormatError(where, f"u16 offsets have an odd byte length {len(data)}")
        base = array.u16_array.base
        return [base + o for (o,) in struct.iter_unpack("<H", data)]
    if kind == "u32_array":
        data = array.u32_array.offsets
        if len(data) % 4:
            raise RowIdFormatError(
                where, f"u32 offsets byte length {len(data)} is not a multiple of 4"
            )
        base = array.u32_array.base
        return [base + o for (o,) in struct.iter_unpack("<I", data)]
    if kind == "u64_array":
        data = array.u64_array.values
        if len(data) % 8:
            raise RowIdFormatError(
                where, f"u64 values byte length {len(data)} is not a multiple of 8"
            )
        return [v for (v,) in struct.iter_unpack("<Q", data)]
    raise RowIdFormatError(where, "EncodedU64Array has no array set")


def _encode_array(values: Sequence[int]) -> rowids_pb2.EncodedU64Array:
    """``EncodedU64Array::from(Vec<u64>)``: u16 or u32 offsets from the minimum when they fit."""
    out = rowids_pb2.EncodedU64Array()
    if not values:
        out.u64_array.SetInParent()
        return out
    lo, hi = min(values), max(values)
    if hi - lo <= _U16_MAX:
        out.u16_array.base = lo
        out.u16_array.offsets = struct.pack(f"<{len(values)}H", *(v - lo for v in values))
    elif hi - lo <= _U32_MAX:
        out.u32_array.base = lo
        out.u32_array.offsets = struct.pack(f"<{len(values)}I", *(v - lo for v in values))
    else:
        out.u64_array.values = struct.pack(f"<{len(values)}Q", *values)
    return out


# ---------------------------------------------------------------------- segments


def segment_values(segment: rowids_pb2.U64Segment, where: str = "segment") -> list[int]:
    """The values of one segment, in order."""
    kind = segment.WhichOneof("segment")
    if kind == "range":
        return list(range(segment.range.start, segment.range.end))
    if kind == "range_with_holes":
        r = segment.range_with_holes
        holes = set(_decode_array(r.holes, where))
        return [v for v in range(r.start, r.end) if v not in holes]
    if kind == "range_with_bitmap":
        rb = segment.range_with_bitmap
        bits = rb.bitmap
        n = rb.end - rb.start
        if len(bits) * 8 < n:
            raise RowIdFormatError(where, f"bitmap has {len(bits)} bytes for a range of {n} values")
        return [rb.start + i for i in range(n) if bits[i // 8] >> (i % 8) & 1]
    if kind == "sorted_array":
        return _decode_array(segment.sorted_array, where)
    if kind == "array":
        return _decode_array(segment.array, where)
    raise RowIdFormatError(where, "U64Segment has no segment set")


def segment_len(segment: rowids_pb2.U64Segment, where: str = "segment") -> int:
    """The number of values in a segment (without expanding ranges)."""
    if segment.WhichOneof("segment") == "range":
        return max(0, segment.range.end - segment.range.start)
    return len(segment_values(segment, where))


def encode_segment(values: Sequence[int]) -> rowids_pb2.U64Segment:
    """``U64Segment::from_slice``: the smallest of Range / RangeWithHoles /
    RangeWithBitmap / SortedArray for sorted distinct values, Array otherwise."""
    out = rowids_pb2.U64Segment()
    count = len(values)
    if count == 0:
        out.range.start = 0
        out.range.end = 0
        return out
    lo, hi = min(values), max(values)
    is_sorted = all(values[i] <= values[i + 1] for i in range(count - 1))
    if not is_sorted:
        out.array.CopyFrom(_encode_array(values))
        return out
    slots = hi - lo + 1
    n_holes = slots - count
    if n_holes == 0 and hi < _U64_MAX:
        out.range.start = lo
        out.range.end = hi + 1
        return out
    if hi == _U64_MAX:
        out.sorted_array.CopyFrom(_encode_array(values))
        return out
    with_holes = 24 + 4 * n_holes
    with_bitmap = 24 + (slots + 7) // 8
    sorted_array = 24 + 2 * count
    best = min(with_holes, with_bitmap, sorted_array)
    present = set(values)
    if best == with_holes:
        holes = [v for v in range(lo, hi + 1) if v not in present]
        out.range_with_holes.start = lo
        out.range_with_holes.end = hi + 1
        out.range_with_holes.holes.CopyFrom(_encode_array(holes))
    elif best == with_bitmap:
        bitmap = bytearray((slots + 7) // 8)
        for v in present:
            i = v - lo
            bitmap[i // 8] |= 1 << (i % 8)
        out.range_with_bitmap.start = lo
        out.range_with_bitmap.end = hi + 1
        out.range_with_bitmap.bitmap = bytes(bitmap)
    else:
        out.sorted_array.CopyFrom(_encode_array(values))
    return out


# ----------------------------------------------------------------- row id sequences


def _parse_row_ids(data: bytes, where: str) -> rowids_pb2.RowIdSequence:
    seq = rowids_pb2.RowIdSequence()
    try:
        seq.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
        raise RowIdFormatError(
            where, f"does not decode as lance.table.RowIdSequence: {exc}"
        ) from None
    return seq


def decode_row_ids(data: bytes, where: str = "inline_row_ids") -> list[int]:
    """Every row id of a serialized ``RowIdSequence``, in row order."""
    out: list[int] = []
    for segment in _parse_row_ids(data, where).segments:
        out.extend(segment_values(segment, where))
    return out


def row_id_count(data: bytes, where: str = "inline_row_ids") -> int:
    """How many row ids a serialized ``RowIdSequence`` holds."""
    return sum(segment_len(s, where) for s in _parse_row_ids(data, where).segments)


def row_id_bounds(data: bytes, where: str = "inline_row_ids") -> tuple[int, int] | None:
    """``(min, max)`` over the row ids of a sequence, or None when it is empty."""
    values = decode_row_ids(data, where)
    if not values:
        return None
    return min(values), max(values)


def encode_row_id_range(start: int, end: int) -> bytes:
    """``RowIdSequence::from(start..end)``: one ``Range`` segment."""
    seq = rowids_pb2.RowIdSequence()
    segment = seq.segments.add()
    segment.range.start = start
    segment.range.end = end
    return seq.SerializeToString()


def encode_row_ids(values: Sequence[int]) -> bytes:
    """``RowIdSequence::from(&[u64])``: one segment in the smallest encoding."""
    seq = rowids_pb2.RowIdSequence()
    seq.segments.append(encode_segment(values))
    return seq.SerializeToString()


# ------------------------------------------------------------- version sequences


def decode_versions(data: bytes, where: str = "version sequence") -> list[int]:
    """The version of each row offset of a serialized ``RowDatasetVersionSequence``."""
    seq = rowids_pb2.RowDatasetVersionSequence()
    try:
        seq.ParseFromString(data)
    except Exception as exc:
        raise RowIdFormatError(
            where, f"does not decode as lance.table.RowDatasetVersionSequence: {exc}"
        ) from None
    out: list[int] = []
    for run in seq.runs:
        if not run.HasField("span"):
            raise RowIdFormatError(where, "a RowDatasetVersionRun has no span")
        out.extend([run.version] * segment_len(run.span, where))
    return out


def encode_versions(versions: Iterable[int]) -> bytes:
    """Run-length encode per-row versions with ``Range`` spans of offsets
    (``encode_version_runs`` in Lance's ``transaction.rs``)."""
    seq = rowids_pb2.RowDatasetVersionSequence()
    current: int | None = None
    start = 0
    i = 0
    for i, version in enumerate(versions):
        if current is None:
            current = version
        elif version != current:
            run = seq.runs.add(version=current)
            run.span.range.start = start
            run.span.range.end = i
            current, start = version, i
    if current is not None:
        run = seq.runs.add(version=current)
        run.span.range.start = start
        run.span.range.end = i + 1
    return seq.SerializeToString()


def uniform_versions(row_count: int, version: int) -> bytes:
    """``RowDatasetVersionSequence::from_uniform_row_count``: one run (none if no rows)."""
    seq = rowids_pb2.RowDatasetVersionSequence()
    if row_count > 0:
        run = seq.runs.add(version=version)
        run.span.range.start = 0
        run.span.range.end = row_count
    return seq.SerializeToString()


def iter_runs(data: bytes, where: str = "version sequence") -> Iterator[tuple[int, int]]:
    """``(row_count, version)`` of each run of a serialized version sequence."""
    seq = rowids_pb2.RowDatasetVersionSequence()
    try:
        seq.ParseFromString(data)
    except Exception as exc:
        raise RowIdFormatError(
            where, f"does not decode as lance.table.RowDatasetVersionSequence: {exc}"
        ) from None
    for run in seq.runs:
        yield segment_len(run.span, where), run.version


__all__ = [
    "RowIdFormatError",
    "decode_row_ids",
    "decode_versions",
    "encode_row_id_range",
    "encode_row_ids",
    "encode_segment",
    "encode_versions",
    "iter_runs",
    "row_id_bounds",
    "row_id_count",
    "segment_len",
    "segment_values",
    "uniform_versions",
]
