"""Types round trip through the data source; reads: time travel, pruning, pushdown."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import lance
import pyarrow as pa
import pytest


def test_types_round_trip(spark: Any, tmp_path: Any) -> None:
    uri = str(tmp_path / "types.lance")
    df = spark.sql(
        """
        SELECT id,
               timestamp'2026-03-01 12:34:56.123456' + make_interval(0,0,0,0,0,0,id) AS ts,
               timestamp_ntz'2026-03-01 01:02:03' AS ntz,
               date'2026-02-28' AS day,
               cast(id * 1.25 AS decimal(12, 3)) AS amount,
               cast('bytes' AS binary) AS raw,
               array(id, id + 1) AS ints,
               map('k', id) AS attrs,
               named_struct('name', cast(id AS string), 'tags', array('a', 'b')) AS info,
               array(cast(id AS float), 0.5f, 1.5f) AS emb
        FROM range(0, 6, 1, 2)
        """
    )
    df.write.format("lancetx").mode("overwrite").option("vector_columns", "emb:3").save(uri)
    schema = lance.dataset(uri).schema
    assert schema.field("emb").type == pa.list_(pa.float32(), 3)
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("ntz").type == pa.timestamp("us")
    assert schema.field("amount").type == pa.decimal128(12, 3)
    assert all(f.nullable for f in schema)  # created nullable by default

    back = spark.read.format("lancetx").load(uri).orderBy("id").collect()
    expected = df.orderBy("id").collect()
    assert back == expected
    row = back[2]
    assert row.ts == datetime.datetime(2026, 3, 1, 12, 34, 58, 123456)
    assert row.amount == decimal.Decimal("2.500")
    assert row.attrs == {"k": 2} and row.info.tags == ["a", "b"] and row.emb == [2.0, 0.5, 1.5]


def test_a_vector_of_the_wrong_length_names_the_column(spark: Any, tmp_path: Any) -> None:
    uri = str(tmp_path / "v.lance")
    df = spark.sql("SELECT id, array(1.0f, 2.0f) AS emb FROM range(0, 2, 1, 1)")
    with pytest.raises(Exception, match=r"column 'emb'"):
        df.write.format("lancetx").mode("append").option("vector_columns", "emb:3").save(uri)


@pytest.fixture
def versions_table(spark: Any, tmp_path: Any) -> str:
    """Version 1: ids 0..99 in 4 fragments; version 2: ids 100..199 added."""
    uri = str(tmp_path / "read.lance")
    base = spark.range(0, 100, 1, 4).selectExpr("id", "concat('k', cast(id % 10 AS string)) AS key")
    base.write.format("lancetx").mode("append").save(uri)
    base.selectExpr("id + 100 AS id", "key").write.format("lancetx").mode("append").save(uri)
    return uri


def _scanned_rows(df: Any) -> int:
    """Rows the data-source scan produced (Spark's metric of the scan node)."""
    df.collect()
    plan = df._jdf.queryExecution().executedPlan()
    found: list[int] = []

    def visit(node: Any) -> None:
        if "BatchScan" in node.nodeName() or "PythonDataSource" in node.nodeName():
            metrics = node.metrics()
            if metrics.contains("numOutputRows"):
                found.append(int(metrics.apply("numOutputRows").value()))
        children = node.children()
        for i in range(children.size()):
            visit(children.apply(i))
        inner = node.innerChildren()
        for i in range(inner.size()):
            child = inner.apply(i)
            if hasattr(child, "nodeName"):
                visit(child)

    visit(plan)
    assert found, f"no scan node in {plan.toString()}"
    return sum(found)


def test_read_version_and_columns(spark: Any, versions_table: str) -> None:
    uri = versions_table
    assert spark.read.format("lancetx").load(uri).count() == 200
    old = spark.read.format("lancetx").option("version", "1").load(uri)
    assert sorted(r.id for r in old.collect()) == list(range(100))
    now = datetime.datetime.now(datetime.UTC).isoformat()
    assert spark.read.format("lancetx").option("timestamp", now).load(uri).count() == 200
    pruned = spark.read.format("lancetx").option("columns", "key").load(uri)
    assert pruned.columns == ["key"]
    by_schema = spark.read.format("lancetx").schema("id long").load(uri)
    assert by_schema.columns == ["id"] and by_schema.count() == 200
    per_fragment = spark.read.format("lancetx").option("rows_per_partition", "25").load(uri)
    assert per_fragment.rdd.getNumPartitions() >= 4


def test_a_dataframe_stays_on_the_version_it_was_planned_on(
    spark: Any, versions_table: str
) -> None:
    df = spark.read.format("lancetx").load(versions_table)
    assert df.count() == 200
    spark.range(0, 5, 1, 1).selectExpr("id + 1000 AS id", "'z' AS key").write.format(
        "lancetx"
    ).mode("append").save(versions_table)
    assert df.count() == 200
    assert spark.read.format("lancetx").load(versions_table).count() == 205


def test_pushed_down_filters_reduce_the_rows_scanned(spark: Any, versions_table: str) -> None:
    uri = versions_table
    key = "spark.sql.python.filterPushdown.enabled"
    spark.conf.set(key, "false")
    try:
        off = spark.read.format("lancetx").load(uri).where("id >= 150 AND key LIKE 'k1%'")
        assert sorted(r.id for r in off.collect()) == [151, 161, 171, 181, 191]
        assert _scanned_rows(off) == 200  # graceful: Spark filters everything itself
        spark.conf.set(key, "true")
        on = spark.read.format("lancetx").load(uri).where("id >= 150 AND key LIKE 'k1%'")
        assert sorted(r.id for r in on.collect()) == [151, 161, 171, 181, 191]
        assert _scanned_rows(on) == 5
        # Filters Lance cannot take exactly stay with Spark; the result is still right.
        mixed = spark.read.format("lancetx").load(uri).where("id < 3 OR id > 197")
        assert sorted(r.id for r in mixed.collect()) == [0, 1, 2, 198, 199]
    finally:
        spark.conf.unset(key)


def test_filter_translation() -> None:
    from pyspark.sql.datasource import (
        EqualNullSafe,
        EqualTo,
        GreaterThan,
        In,
        IsNull,
        Not,
        StringContains,
        StringStartsWith,
    )

    from pyspark_lancetx.filters import translate

    assert translate(EqualTo(("a b",), "it's")) == "`a b` = 'it''s'"
    assert translate(GreaterThan(("s", "x"), 2)) == "`s`.`x` > 2"
    assert translate(In(("a",), (1, 2))) == "`a` IN (1, 2)"
    assert translate(Not(IsNull(("a",)))) == "NOT (`a` IS NULL)"
    assert translate(StringStartsWith(("a",), "k1")) == "starts_with(`a`, 'k1')"
    assert translate(StringContains(("a",), "%")) == "strpos(`a`, '%') > 0"
    assert translate(EqualNullSafe(("a",), 1)) == "`a` = 1"
    assert translate(Not(EqualNullSafe(("a",), 1))) is None  # NULL rows differ under NOT
    assert translate(EqualTo(("a",), datetime.datetime(2026, 1, 1))) is None
