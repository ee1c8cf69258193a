"""The keys a merge-insert inserted, as Lance records them: ``Update.inserted_rows``.

A merge-insert on a table's unenforced primary key records the keys of the rows it
inserted in its transaction (``KeyExistenceFilter`` in ``transaction.proto``:
the key columns' field ids plus a filter). Two concurrent merge-inserts whose
filters share a key conflict (retryable), so a key is inserted once. Lance writes
the filter as a *split-block bloom filter* (the Parquet SBBF: 32-byte blocks of
eight 32-bit words, XXH64 with seed 0 over the key's bytes, the block chosen by
the hash's high half, one bit per word from the low half times eight odd salts),
sized for 8,192 keys at a 0.00057 false-positive rate, and a pylance writer
compares two filters only when both have that sizing. This module builds the
same filter bit for bit, so a pylance writer beside lancetx honours lancetx's
inserted keys and lancetx honours pylance's.

The bytes of one key, as Lance's merge-insert takes them: a string its UTF-8
bytes, a binary its bytes, a signed integer of 32 or 64 bits its value as a
little-endian ``i64``, an unsigned one as a little-endian ``u64``; a key of
several columns the concatenation of each part's bytes followed by a zero byte.
A row with a null in any key column has no key (a null never matches in a
merge-insert's join, so such a row is inserted on every run and is never part of
a unique set). Column types Lance's merge-insert does not hash (it leaves those
keys out of its filter) get an encoding of ours in which equal keys have equal
bytes (see :func:`key_bytes`); a type with no such encoding makes the filter
*full* (every bit set): it then conflicts with every concurrent insert, which
costs a retry, never a duplicate.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lancetx.protos import file_pb2, transaction_pb2

# numpy and pyarrow are imported by the functions that use them: the conflict rules
# import this module, and opening a table loads those rules but never hashes a key
# (``tests/test_import_cost.py``).
if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

KeyExistenceFilter = transaction_pb2.Transaction.KeyExistenceFilter

#: Field metadata marking a column as part of the table's (unenforced) primary key.
PRIMARY_KEY = "lance-schema:unenforced-primary-key"
#: Optional 1-based position of the column within a primary key of several columns.
PRIMARY_KEY_POSITION = "lance-schema:unenforced-primary-key:position"

#: The sizing Lance gives every inserted-keys filter (and requires of two it compares).
BLOOM_NUMBER_OF_ITEMS = 8192
BLOOM_PROBABILITY = 0.00057

_M64 = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
_SALT = (
    0x47B6137B,
    0x44974D91,
    0x8824AD5B,
    0xA2B7289D,
    0x705495C7,
    0x2DF1424B,
    0x9EFC4947,
    0x5C6BFB31,
)
_BLOCK_BYTES = 32


# ------------------------------------------------------------------- primary key


def _primary_key_position(field: file_pb2.Field) -> int | None:
    raw = field.metadata.get(PRIMARY_KEY_POSITION)
    if raw is not None:
        try:
            position = int(raw.decode())
        except (UnicodeDecodeError, ValueError):
            position = -1
        if 0 <= position < 2**32:
            return position
    flag = field.metadata.get(PRIMARY_KEY)
    if flag is not None and flag.decode(errors="replace").lower() in ("true", "1", "yes"):
        return 0
    return None


def primary_key_fields(fields: Sequence[file_pb2.Field]) -> list[file_pb2.Field]:
    """The table's unenforced primary key columns in key order, as Lance orders them:
    those with a position (> 0) by position, then those only flagged, by field id."""
    keyed = [(f, p) for f in fields if (p := _primary_key_position(f)) is not None]
    keyed.sort(key=lambda fp: (False, fp[1], fp[0].id) if fp[1] > 0 else (True, fp[0].id, 0))
    return [f for f, _ in keyed]


# ------------------------------------------------------------------------- XXH64


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def _avalanche(h: int) -> int:
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def xxh64(data: bytes) -> int:
    """XXH64 of ``data`` with seed 0 (the hash Lance's bloom filters use)."""
    n = len(data)
    p = 0
    if n >= 32:
        v1, v2, v3, v4 = (_P1 + _P2) & _M64, _P2, 0, (-_P1) & _M64
        while p + 32 <= n:
            a, b, c, d = struct.unpack_from("<4Q", data, p)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            p += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M64
        for v in (v1, v2, v3, v4):
            h = ((h ^ _round(0, v)) * _P1 + _P4) & _M64
    else:
        h = _P5
    h = (h + n) & _M64
    while p + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, p)
        h = (_rotl(h ^ _round(0, lane), 27) * _P1 + _P4) & _M64
        p += 8
    if p + 4 <= n:
        (word,) = struct.unpack_from("<I", data, p)
        h = (_rotl(h ^ ((word * _P1) & _M64), 23) * _P2 + _P3) & _M64
        p += 4
    while p < n:
        h = (_rotl(h ^ ((data[p] * _P5) & _M64), 11) * _P1) & _M64
        p += 1
    return _avalanche(h)


def _np_rotl(x: np.ndarray, r: int) -> np.ndarray:
    import numpy as np

    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _np_round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    import numpy as np

    return _np_rotl(acc + lane * np.uint64(_P2), 31) * np.uint64(_P1)


def _np_words(rows: np.ndarray, p: int, width: int) -> np.ndarray:
    """The little-endian ``width``-byte word at byte ``p`` of every row, as uint64."""
    import numpy as np

    chunk = np.ascontiguousarray(rows[:, p : p + width])
    return chunk.view("<u8" if width == 8 else "<u4").reshape(-1).astype(np.uint64)


def xxh64_rows(rows: np.ndarray) -> np.ndarray:
    """XXH64 (seed 0) of every row of an ``(n, length)`` uint8 array, all rows at once
    (numpy's uint64 arithmetic wraps, as the hash's does)."""
    import numpy as np

    n, length = rows.shape
    p = 0
    with np.errstate(over="ignore"):
        if length >= 32:
            v = [
                np.full(n, (_P1 + _P2) & _M64, np.uint64),
                np.full(n, _P2, np.uint64),
                np.zeros(n, np.uint64),
                np.full(n, (-_P1) & _M64, np.uint64),
            ]
            while p + 32 <= length:
                v = [_np_round(v[i], _np_words(rows, p + 8 * i, 8)) for i in range(4)]
                p += 32
            h = _np_rotl(v[0], 1) + _np_rotl(v[1], 7) + _np_rotl(v[2], 12) + _np_rotl(v[3], 18)
            for lane in v:
                h = (h ^ _np_round(np.zeros(n, np.uint64), lane)) * np.uint64(_P1) + np.uint64(_P4)
        else:
            h = np.full(n, _P5, np.uint64)
        h = h + np.uint64(length)
        while p + 8 <= length:
            lane = _np_round(np.zeros(n, np.uint64), _np_words(rows, p, 8))
            h = _np_rotl(h ^ lane, 27) * np.uint64(_P1) + np.uint64(_P4)
            p += 8
        if p + 4 <= length:
            h ^= _np_words(rows, p, 4) * np.uint64(_P1)
            h = _np_rotl(h, 23) * np.uint64(_P2) + np.uint64(_P3)
            p += 4
        while p < length:
            h ^= rows[:, p].astype(np.uint64) * np.uint64(_P5)
            h = _np_rotl(h, 11) * np.uint64(_P1)
            p += 1
        h ^= h >> np.uint64(33)
        h *= np.uint64(_P2)
        h ^= h >> np.uint64(29)
        h *= np.uint64(_P3)
        h ^= h >> np.uint64(32)
    out: np.ndarray = h
    return out


def xxh64_of_u64(values: np.ndarray) -> np.ndarray:
    """XXH64 (seed 0) of each value's 8 little-endian bytes."""
    import numpy as np

    raw = np.ascontiguousarray(values.astype("<u8", copy=False))
    return xxh64_rows(raw.view(np.uint8).reshape(-1, 8))


# ------------------------------------------------------------------------- sizing


def _false_positive_rate(ndv: int, log2_bytes: int) -> float:
    """The SBBF's false-positive rate with ``ndv`` keys in ``2**log2_bytes`` bytes
    (the Poisson sum Lance and Parquet use to size a filter)."""
    if ndv == 0:
        return 0.0
    bits = float(1 << log2_bytes) * 8
    if ndv / bits > 2.0:
        return 1.0
    lam = 8 * 32 / (bits / ndv)
    loglam = math.log(lam)
    total = 0.0
    for i in range(749, -1, -1):
        logp = i * loglam - lam - math.lgamma(i + 1)
        logf = 8 * math.log(1.0 - (1.0 - 1.0 / 32) ** i) if i else -math.inf
        total += math.exp(logp + logf)
    return min(total, 1.0)


def bloom_num_bytes(ndv: int = BLOOM_NUMBER_OF_ITEMS, fpp: float = BLOOM_PROBABILITY) -> int:
    """Bytes of the smallest power-of-two SBBF (32 B .. 128 MiB) for ``ndv`` keys at
    false-positive rate ``fpp`` (Lance's sizing)."""
    low, high = 0, 64
    while high > low + 1:
        mid = (low + high) // 2
        if _false_positive_rate(ndv, mid) <= fpp:
            high = mid
        else:
            low = mid
    return 1 << min(max(high, 5), 27)


_DEFAULT_BYTES: int | None = None


def default_bloom_bytes() -> int:
    global _DEFAULT_BYTES
    if _DEFAULT_BYTES is None:
        _DEFAULT_BYTES = bloom_num_bytes()
    return _DEFAULT_BYTES


# ------------------------------------------------------------------------- keys


class UnhashableKeyError(TypeError):
    """A key column whose type has no byte encoding here (the filter becomes full)."""


def _bytes_type() -> pa.DataType:
    import pyarrow as pa

    return pa.large_binary()


def _fixed_bytes(column: pa.Array, values: np.ndarray) -> pa.Array:
    """``values`` (one fixed-width little-endian number per row) as binary, null
    where ``column`` is null."""
    import numpy as np
    import pyarrow as pa

    width = values.dtype.itemsize
    raw = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(values), [None, pa.py_buffer(np.ascontiguousarray(values).tobytes())]
    ).cast(_bytes_type())
    if column.null_count == 0:
        return raw
    import pyarrow.compute as pc  # only a commit with keys needs it: opens stay lighter

    return pc.if_else(column.is_null(), pa.scalar(None, _bytes_type()), raw)


def _column_bytes(column: pa.Array) -> pa.Array:
    """Each value's key bytes (null for null): Lance's encoding where Lance has one,
    ours (equal keys, equal bytes) for the other scalar types."""
    import numpy as np
    import pyarrow as pa

    t = column.type
    if pa.types.is_dictionary(t):
        return _column_bytes(column.cast(t.value_type))
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return column.cast(_bytes_type())
    if pa.types.is_signed_integer(t):
        return _fixed_bytes(column, column.cast(pa.int64()).fill_null(0).to_numpy().astype("<i8"))
    if pa.types.is_unsigned_integer(t):
        return _fixed_bytes(column, column.cast(pa.uint64()).fill_null(0).to_numpy().astype("<u8"))
    if pa.types.is_temporal(t):  # dates, times, timestamps, durations: their integer storage
        storage = column.view(pa.int32() if t.bit_width == 32 else pa.int64())
        return _fixed_bytes(column, storage.cast(pa.int64()).fill_null(0).to_numpy().astype("<i8"))
    if pa.types.is_boolean(t):
        return _fixed_bytes(column, column.cast(pa.uint8()).fill_null(0).to_numpy().astype("u1"))
    if pa.types.is_floating(t):
        # -0.0 and 0.0 (and every NaN) share bytes: a join telling them apart only
        # makes the filter claim more, never less.
        values = column.cast(pa.float64()).fill_null(0.0).to_numpy().astype("<f8") + 0.0
        values[np.isnan(values)] = np.nan
        return _fixed_bytes(column, values)
    if pa.types.is_decimal(t):
        return column.cast(pa.string()).cast(_bytes_type())
    raise UnhashableKeyError(str(t))


def key_bytes_array(table: pa.Table, columns: Sequence[str]) -> pa.Array:
    """Each row's key bytes over ``columns`` (in that order) as a binary array, null
    for a row with a null in any key column. Raises :class:`UnhashableKeyError`
    for a column type with no encoding (nested types)."""
    import pyarrow as pa

    parts = [_column_bytes(table.column(c).combine_chunks()) for c in columns]
    if len(parts) == 1:
        return parts[0]
    # Each part followed by a zero byte: the parts joined by b"\0" after an empty last part.
    empty, zero = pa.scalar(b"", _bytes_type()), pa.scalar(b"\x00", _bytes_type())
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(*parts, empty, zero)


def key_bytes(table: pa.Table, columns: Sequence[str]) -> list[bytes | None]:
    """:func:`key_bytes_array` as Python bytes (for tests and messages)."""
    return key_bytes_array(table, columns).to_pylist()  # type: ignore[no-any-return]


def key_hashes(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """XXH64 of every non-null key of ``table`` over ``columns`` (uint64 array)."""
    import numpy as np
    import pyarrow as pa

    keys = key_bytes_array(table, columns).drop_null()
    out = np.empty(len(keys), dtype=np.uint64)
    if not len(keys):
        return out
    import pyarrow.compute as pc

    lengths = pc.binary_length(keys).to_numpy()
    for length in np.unique(lengths):
        index = np.flatnonzero(lengths == length)
        if length == 0:
            out[index] = xxh64(b"")
            continue
        group = keys.take(pa.array(index))
        offsets = np.frombuffer(group.buffers()[1], dtype=np.int64, count=len(group) + 1)
        data = np.frombuffer(group.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
        out[index] = xxh64_rows(data.reshape(len(index), int(length)))
    return out


# ------------------------------------------------------------------------- filter


def bloom_words(hashes: np.ndarray, num_bytes: int) -> np.ndarray:
    """The SBBF over ``hashes`` as ``(blocks, 8)`` uint32 words."""
    import numpy as np

    blocks = num_bytes // _BLOCK_BYTES
    words = np.zeros((blocks, 8), dtype=np.uint32)
    if len(hashes) == 0:
        return words
    h = hashes.astype(np.uint64, copy=False)
    with np.errstate(over="ignore"):
        index = ((h >> np.uint64(32)) * np.uint64(blocks)) >> np.uint64(32)
        low = h & np.uint64(0xFFFFFFFF)
        for i, salt in enumerate(_SALT):
            bit = ((low * np.uint64(salt)) & np.uint64(0xFFFFFFFF)) >> np.uint64(27)
            np.bitwise_or.at(
                words[:, i], index.astype(np.intp), (np.uint64(1) << bit).astype(np.uint32)
            )
    return words


def inserted_keys_filter(field_ids: Sequence[int], hashes: np.ndarray | None) -> KeyExistenceFilter:
    """The ``inserted_rows`` filter over ``hashes`` (None: the keys are unknown, every
    bit is set), with Lance's sizing."""
    num_bytes = default_bloom_bytes()
    if hashes is None:
        bitmap = b"\xff" * num_bytes
    else:
        bitmap = bloom_words(hashes, num_bytes).astype("<u4").tobytes()
    out = KeyExistenceFilter(field_ids=list(field_ids))
    out.bloom.bitmap = bitmap
    out.bloom.num_bits = num_bytes * 8
    out.bloom.number_of_items = BLOOM_NUMBER_OF_ITEMS
    out.bloom.probability = BLOOM_PROBABILITY
    return out


def blooms_may_share_key(a: bytes, b: bytes) -> bool:
    """Whether two same-sized SBBF bitmaps may hold a common key.

    A key sets one bit in each of the eight words of one block, so a key in both
    filters leaves a block where all eight words of ``a & b`` are non-zero. No such
    block: no common key (exact). Lance's own check is coarser (any common bit), so
    this answers "no" more often, and never wrongly.
    """
    import numpy as np

    if len(a) != len(b) or len(a) % _BLOCK_BYTES:
        return True
    both = np.frombuffer(a, dtype="<u4") & np.frombuffer(b, dtype="<u4")
    return bool((both.reshape(-1, 8) != 0).all(axis=1).any())


__all__ = [
    "BLOOM_NUMBER_OF_ITEMS",
    "BLOOM_PROBABILITY",
    "PRIMARY_KEY",
    "PRIMARY_KEY_POSITION",
    "KeyExistenceFilter",
    "UnhashableKeyError",
    "bloom_num_bytes",
    "bloom_words",
    "blooms_may_share_key",
    "inserted_keys_filter",
    "key_bytes",
    "key_bytes_array",
    "key_hashes",
    "primary_key_fields",
    "xxh64",
    "xxh64_of_u64",
    "xxh64_rows",
]
