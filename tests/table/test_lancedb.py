"""LanceDB (its own bundled Lance, not pylance) opens a table lancetx committed through
``s3+ddb://``, reads every version, and searches it with its vector index after
``compact()``; a LanceDB writer on the same table claims its versions in the same
DynamoDB table, and lancetx continues after it."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest
from protocol_helpers import ensure_ddb_table
from table_helpers import ddb_uri

import lancetx
from lancetx.demo.embedded import EmbeddedAws

lancedb = pytest.importorskip("lancedb")  # a test-only dependency ([dev])

DIM = 16
ROWS_PER_FRAGMENT = 40
FRAGMENTS = 10


def _batch(rng: np.random.Generator, start: int) -> pa.Table:
    vectors = rng.standard_normal((ROWS_PER_FRAGMENT, DIM)).astype(np.float32)
    return pa.table(
        {
            "id": pa.array(range(start, start + ROWS_PER_FRAGMENT), pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM),
        }
    )


def test_lancedb_reads_every_version_and_searches_with_the_index_after_compact(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, ddb_table_name, "db/events.lance")
    rng = np.random.default_rng(21)
    table = lancetx.write_table(uri, _batch(rng, 0), storage_options=options)
    for n in range(1, FRAGMENTS):
        table.append(_batch(rng, n * ROWS_PER_FRAGMENT))
    table.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=4)
    table.delete("id % 7 = 0")
    table.compact()  # remaps the vector index: the search below uses the index it kept
    total = FRAGMENTS * ROWS_PER_FRAGMENT - len(range(0, FRAGMENTS * ROWS_PER_FRAGMENT, 7))
    assert table.count_rows() == total

    # What a LanceDB user writes: the folder of the table as the database, the
    # DynamoDB table in the URI, pylance's storage options.
    db = lancedb.connect(
        f"s3+ddb://{bucket}/db?ddbTableName={ddb_table_name}", storage_options=options
    )
    assert "events" in db.list_tables().tables
    events = db.open_table("events")

    versions = [v["version"] for v in events.list_versions()]
    assert versions == [v.version for v in table.history()]
    for version in versions:
        events.checkout(version)
        ours = table.checkout(version).to_table(columns=["id"])["id"].to_pylist()
        assert sorted(events.to_arrow()["id"].to_pylist()) == sorted(ours), version
    events.checkout_latest()
    assert events.version == table.version and events.count_rows() == total

    stats = events.index_stats("vec_idx")
    assert (stats.num_indexed_rows, stats.num_unindexed_rows) == (total, 0)
    query = rng.standard_normal(DIM).astype(np.float32)
    search = events.search(query, vector_column_name="vec").limit(10)
    plan = search.explain_plan(True)
    assert "ANNSubIndex" in plan and "name=vec_idx" in plan, plan
    found = search.to_arrow()["id"].to_pylist()
    ds = lance.dataset(uri, storage_options=options)
    theirs = ds.to_table(nearest={"column": "vec", "q": query, "k": 10}, columns=["id"])
    assert found == theirs["id"].to_pylist() and len(found) == 10

    # LanceDB writes through the same DynamoDB table; lancetx continues after it.
    events.add(_batch(rng, 10_000))
    after = lancetx.open(uri, options)
    assert after.version == table.version + 1 and after.count_rows() == total + ROWS_PER_FRAGMENT
    after.append(_batch(rng, 20_000))
    events.checkout_latest()
    assert events.count_rows() == total + 2 * ROWS_PER_FRAGMENT
