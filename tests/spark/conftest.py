"""One local-mode SparkSession for the whole test run, and table helpers.

Spark's Python workers inherit this process's environment (fake AWS
credentials from ``tests/conftest.py``) and reach the embedded moto server on
127.0.0.1. ``local[2,3]``: two cores, and a failed task is retried (local mode
does not retry by default).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from lancetx.externalstore.dynamodb import create_table
from lancetx.externalstore.embedded import EmbeddedAws

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"


def build_session(app_name: str = "lancetx-tests") -> Any:
    """A small local-mode session (also used by the examples' test)."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2,3]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session shared by every Spark test."""
    session = build_session()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def storage(aws: EmbeddedAws) -> dict[str, str]:
    """pylance storage options for the embedded server."""
    return aws.pylance_storage_options()


def spark_options(storage_options: dict[str, str]) -> dict[str, str]:
    """The same options as data-source options (``storage.<name>``)."""
    return {f"storage.{k}": v for k, v in storage_options.items()}


@pytest.fixture
def ddb_uri(aws: EmbeddedAws, bucket: str) -> str:
    """An ``s3+ddb://`` URI on a fresh bucket and a fresh DynamoDB table."""
    table = f"lancetx_{uuid.uuid4().hex[:10]}"
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), table)
    return f"s3+ddb://{bucket}/t.lance?ddbTableName={table}"


def lance_ids(
    uri: str, storage_options: dict[str, str] | None = None, column: str = "id"
) -> list[int]:
    """The sorted ``column`` values pylance reads from the latest version."""
    import lance

    ds = lance.dataset(uri, storage_options=storage_options or None)
    return sorted(ds.to_table(columns=[column]).column(column).to_pylist())


def data_files(uri: str, storage_options: dict[str, str] | None = None) -> set[str]:
    """Every data file under the table's ``data/`` directory."""
    from lancetx.commit.storage.stores import open_object_store
    from lancetx.externalstore.connect import connect

    conn = connect(uri, storage_options or {})
    store, base = open_object_store(conn.data_uri, storage_options or {}, legacy=True)
    prefix = f"{base}/data/"
    return {meta.key[len(prefix) :] for meta in store.list(prefix)}


def referenced_files(uri: str, storage_options: dict[str, str] | None = None) -> set[str]:
    """Data files referenced by any version of the table."""
    import lance

    ds = lance.dataset(uri, storage_options=storage_options or None)
    out: set[str] = set()
    for v in ds.versions():
        old = lance.dataset(uri, version=v["version"], storage_options=storage_options or None)
        out |= {f.path for frag in old.get_fragments() for f in frag.metadata.files}
    return out
