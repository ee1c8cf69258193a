"""No secret in Spark's plans, exceptions or the data source's objects.

Distinctive fake secrets go in as ``storage.*`` options of reads and writes, good
and bad; every exception text (the AnalysisException Spark raises carries the
worker's traceback), every plan Spark prints and the repr of every object the data
source plans with is searched for them (the library and the CLI: ``tests/test_secrets.py``).
"""

from __future__ import annotations

import contextlib
import io
import traceback
import uuid
from typing import Any

import pyarrow as pa
import pytest
from spark_helpers import spark_options

import lancetx
from lancetx.demo.embedded import EmbeddedAws
from pyspark_lancetx.commit import JobCommit
from pyspark_lancetx.datasource import ScanPlan
from pyspark_lancetx.options import ReadOptions, WriteOptions
from pyspark_lancetx.write_task import WritePlan

SECRET = f"SECRETxyz{uuid.uuid4().hex}"
OTHER_SECRET = f"SECRETxyz{uuid.uuid4().hex}"
TOKEN = f"TOKENxyz{uuid.uuid4().hex}"


def assert_clean(text: str, where: str) -> None:
    for secret in (SECRET, OTHER_SECRET, TOKEN):
        assert secret not in text, f"{where}: secret {secret[:12]}… printed in {text[:3000]}"


def texts_of(exc: BaseException) -> str:
    return "\n".join([str(exc), repr(exc), "".join(traceback.format_exception(exc))])


def test_spark_plans_exceptions_and_option_objects_show_no_secret(
    spark: Any, aws: EmbeddedAws, ddb_uri: str
) -> None:
    storage = {
        **aws.pylance_storage_options(),
        "aws_access_key_id": "AKIDxyz",
        "aws_secret_access_key": SECRET,
        "aws_session_token": TOKEN,
    }
    opts = spark_options(storage)
    lancetx.write_table(ddb_uri, pa.table({"id": [1, 2, 3]}), storage_options=storage)
    df = spark.range(0, 6, 1, 2)

    # Planning only (no task runs): the plan is what Spark prints and logs.
    read = spark.read.format("lancetx").options(**opts).load(ddb_uri).where("id > 2")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        read.explain(mode="extended")
    assert "lancetx" in printed.getvalue().lower()  # the plan was printed
    assert_clean(printed.getvalue(), "explain")
    assert_clean(read._jdf.queryExecution().toString(), "query execution")

    raw = {**opts, "path": ddb_uri}
    write_options, read_options = WriteOptions.parse(raw), ReadOptions.parse(raw)
    write_plan = WritePlan(ddb_uri, ddb_uri, write_options.storage_options, b"")
    objects = (
        write_options,
        read_options,
        write_plan,
        JobCommit(plan=write_plan, job_id="j", mode="append"),
        ScanPlan(ddb_uri, read_options.storage_options, 1, ("id",)),
    )
    for obj in objects:
        assert_clean(repr(obj), type(obj).__name__)

    failures: list[tuple[str, BaseException]] = []
    bad_writes = {
        "secret under two spellings": {**opts, "storage.secret_access_key": OTHER_SECRET},
        "bad option": {**opts, "nullable": "sometimes"},
    }
    for what, options in bad_writes.items():
        with pytest.raises(Exception) as failed:
            df.write.format("lancetx").mode("append").options(**options).save(ddb_uri)
        failures.append((f"write, {what}", failed.value))
    bad_reads = {
        "bad option": ({**opts, "version": "first"}, ddb_uri),
        "no such table": (opts, ddb_uri.replace("t.lance", "missing.lance")),
    }
    for what, (options, uri) in bad_reads.items():
        with pytest.raises(Exception) as failed:
            spark.read.format("lancetx").options(**options).load(uri).collect()
        failures.append((f"read, {what}", failed.value))
    for what, exc in failures:
        assert_clean(texts_of(exc), what)
    assert "not shown" in texts_of(failures[0][1])
