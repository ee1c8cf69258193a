"""The inserted-keys filter lancetx builds is the one pylance builds, bit for bit.

pylance's merge-insert on a primary key writes ``Update.inserted_rows`` (a split-block
bloom filter over the inserted keys) into its transaction file; lancetx builds the
filter itself from the source (pylance's uncommitted merge does not hand it over).
Both must agree bit for bit, or a pylance writer and lancetx would not see each
other's inserted keys. Local pylance datasets; no server.
"""

from __future__ import annotations

import datetime
import random
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

from lancetx.commit.format.key_existence import (
    BLOOM_NUMBER_OF_ITEMS,
    BLOOM_PROBABILITY,
    UnhashableKeyError,
    bloom_num_bytes,
    blooms_may_share_key,
    inserted_keys_filter,
    key_bytes,
    key_hashes,
    primary_key_fields,
    xxh64,
    xxh64_of_u64,
)
from lancetx.commit.format.schema import arrow_schema_to_fields
from lancetx.protos import transaction_pb2

PK = {"lance-schema:unenforced-primary-key": "true"}


def pylance_filter(path: Path) -> transaction_pb2.Transaction.KeyExistenceFilter:
    """The inserted_rows filter of the newest transaction file pylance wrote."""
    files = sorted((path / "_transactions").glob("*.txn"), key=lambda p: int(p.name.split("-")[0]))
    txn = transaction_pb2.Transaction()
    txn.ParseFromString(files[-1].read_bytes())
    assert txn.WhichOneof("operation") == "update"
    assert txn.update.HasField("inserted_rows"), "pylance recorded no inserted keys"
    return txn.update.inserted_rows


def pylance_upsert(
    path: Path, schema: pa.Schema, seed: dict[str, Any], new: dict[str, Any], on: Any
) -> None:
    lance.write_dataset(pa.table(seed, schema=schema), path)
    lance.dataset(path).merge_insert(
        on
    ).when_matched_update_all().when_not_matched_insert_all().execute(pa.table(new, schema=schema))


def key(name: str, t: pa.DataType) -> pa.Field:
    return pa.field(name, t, nullable=False, metadata=PK)


VALUE = pa.field("v", pa.string())
N = 60
STRINGS = [""] + ["k" * i for i in range(1, 70)] + ["é" * 40, "日本語キー"]
CASES: dict[str, tuple[pa.DataType, list[Any], Any]] = {
    "int64": (pa.int64(), [-(2**62), -1, *range(N), 2**62], -5),
    "int32": (pa.int32(), [-(2**31), *range(N), 2**31 - 1], -5),
    "uint32": (pa.uint32(), [*range(N), 2**32 - 1], 10**6),
    "uint64": (pa.uint64(), [*range(N), 2**64 - 1], 10**6),
    # Every length from 0 to 69 bytes: each branch of the hash (32-byte stripes,
    # 8-byte lanes, a 4-byte word, single bytes).
    "string": (pa.string(), STRINGS, "seed"),
    "large_string": (pa.large_string(), STRINGS, "seed"),
    "binary": (pa.binary(), [bytes(range(i)) for i in range(70)], b"seed"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_key_column_matches_pylance(tmp_path: Path, name: str) -> None:
    t, keys, seed_key = CASES[name]
    schema = pa.schema([key("id", t), VALUE])
    pylance_upsert(
        tmp_path, schema, {"id": [seed_key], "v": ["s"]}, {"id": keys, "v": ["x"] * len(keys)}, "id"
    )
    theirs = pylance_filter(tmp_path)
    ours = inserted_keys_filter([0], key_hashes(pa.table({"id": pa.array(keys, t)}), ["id"]))
    assert (theirs.bloom.number_of_items, theirs.bloom.probability) == (
        BLOOM_NUMBER_OF_ITEMS,
        BLOOM_PROBABILITY,
    )
    assert ours.bloom.num_bits == theirs.bloom.num_bits == 8 * bloom_num_bytes()
    assert any(theirs.bloom.bitmap)
    assert ours.bloom.bitmap == theirs.bloom.bitmap
    assert ours == theirs


def test_two_key_columns_match_pylance(tmp_path: Path) -> None:
    schema = pa.schema([key("a", pa.int64()), key("b", pa.string()), VALUE])
    a, b = list(range(N)), [f"s{i}" * (i % 9) for i in range(N)]
    pylance_upsert(
        tmp_path,
        schema,
        {"a": [-1], "b": ["q"], "v": ["s"]},
        {"a": a, "b": b, "v": ["x"] * N},
        ["a", "b"],
    )
    theirs = pylance_filter(tmp_path)
    assert list(theirs.field_ids) == [0, 1]
    ours = inserted_keys_filter([0, 1], key_hashes(pa.table({"a": a, "b": b}), ["a", "b"]))
    assert ours == theirs


def test_default_size_is_lances() -> None:
    # 8,192 keys at 0.00057: 32 KiB (the size pylance writes, checked above).
    assert bloom_num_bytes() == bloom_num_bytes(BLOOM_NUMBER_OF_ITEMS, BLOOM_PROBABILITY) == 32768
    assert bloom_num_bytes(0, 0.01) == 32 and bloom_num_bytes(10**12, 1e-9) == 2**27


def test_hash_vectors_and_the_vectorized_form_agree() -> None:
    assert xxh64(b"") == 17241709254077376921  # Lance's own test vector
    rng = np.random.default_rng(7)
    values = rng.integers(0, 2**63, size=500, dtype=np.int64).view(np.uint64)
    fast = xxh64_of_u64(values)
    slow = [xxh64(int(v).to_bytes(8, "little")) for v in values]
    assert [int(h) for h in fast] == slow
    # Keys of every length from 0 to 99, many of each: hashed together per length.
    rnd = random.Random(5)
    keys = [rnd.randbytes(n) for n in range(100) for _ in range(20)] + [b""]
    hashed = key_hashes(pa.table({"k": pa.array([*keys, None], pa.binary())}), ["k"])
    assert [int(h) for h in hashed] == [xxh64(k) for k in keys]


def test_null_keys_are_left_out() -> None:
    table = pa.table({"a": pa.array([1, None, 3], pa.int64()), "b": ["x", "y", None]})
    assert key_bytes(table, ["a", "b"]) == [
        (1).to_bytes(8, "little") + b"\x00x\x00",
        None,
        None,
    ]
    assert len(key_hashes(table, ["a"])) == 2
    assert len(key_hashes(table, ["a", "b"])) == 1


def test_equal_keys_of_other_types_hash_alike() -> None:
    """Types pylance does not hash get an encoding where equal keys share bytes."""
    table = pa.table(
        {
            "small": pa.array([7, 7, -7], pa.int16()),
            "day": pa.array([datetime.date(2020, 1, 1)] * 2 + [datetime.date(2021, 1, 1)]),
            "f": pa.array([0.0, -0.0, float("nan")]),
            "d": pa.array(["a", "a", "b"]).dictionary_encode(),
        }
    )
    for column in table.column_names:
        b = key_bytes(table, [column])
        assert b[0] == b[1] and b[0] != b[2], column
    nested = pa.table({"l": pa.array([[1], [2]])})
    with pytest.raises(UnhashableKeyError):
        key_bytes(nested, ["l"])


def test_primary_key_order_follows_positions_then_field_ids() -> None:
    def pk(position: str | None) -> dict[str, str]:
        return PK | ({"lance-schema:unenforced-primary-key:position": position} if position else {})

    schema = pa.schema(
        [
            pa.field("c", pa.int32(), False, metadata=pk(None)),
            pa.field("a", pa.int32(), False, metadata=pk("2")),
            pa.field("v", pa.string()),
            pa.field("b", pa.int64(), False, metadata=pk("1")),
            pa.field(
                "d", pa.int64(), False, metadata={"lance-schema:unenforced-primary-key": "YES"}
            ),
        ]
    )
    fields, _ = arrow_schema_to_fields(schema)
    assert [f.name for f in primary_key_fields(fields)] == ["b", "a", "c", "d"]
    assert primary_key_fields(arrow_schema_to_fields(pa.schema([VALUE]))[0]) == []


def _bits(keys: list[int]) -> bytes:
    return inserted_keys_filter([0], xxh64_of_u64(np.array(keys, dtype=np.uint64))).bloom.bitmap


def test_a_shared_key_is_always_seen() -> None:
    rng = random.Random(3)
    for _ in range(200):
        common = rng.getrandbits(64)
        a = [rng.getrandbits(64) for _ in range(rng.randrange(0, 3000))] + [common]
        b = [rng.getrandbits(64) for _ in range(rng.randrange(0, 3000))] + [common]
        assert blooms_may_share_key(_bits(a), _bits(b))


def test_disjoint_keys_rarely_conflict_where_a_common_bit_would() -> None:
    """Lance's test (any common bit) makes two 300-key merges conflict; ours sees
    that no block holds a common key."""
    a, b = list(range(0, 300)), list(range(1000, 1300))
    bits_a, bits_b = _bits(a), _bits(b)
    assert any(x & y for x, y in zip(bits_a, bits_b, strict=True))  # Lance: conflict
    assert not blooms_may_share_key(bits_a, bits_b)
    assert not blooms_may_share_key(_bits([]), _bits(a))
    full = inserted_keys_filter([0], None).bloom.bitmap
    assert blooms_may_share_key(full, _bits([5]))
    assert not blooms_may_share_key(full, _bits([]))
