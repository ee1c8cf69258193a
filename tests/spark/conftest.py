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
from pathlib import Path
from typing import Any

import boto3
import pytest
from spark_helpers import build_session

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"


def _claim_the_run_s_session(config: pytest.Config, run_dir: Path) -> None:
    """Under pytest-xdist, fail if another worker of this run started a Spark session:
    every Spark test is scheduled onto one worker (``tests/support/worker_scopes.py``), and a
    second session would double the run's memory and CPU on a small machine."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return  # one process: one session
    # The workers' temporary directories share one parent per run (pytest keeps the
    # last few runs' and removes older ones).
    marker = run_dir / "spark-session"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        owner = marker.read_text()
        pytest.fail(
            f"worker {worker['workerid']} is starting a second Spark session in this run "
            f"(worker {owner} has one): every test under tests/spark/ belongs on one "
            "worker (tests/support/worker_scopes.py)"
        )
    with os.fdopen(fd, "w") as out:
        out.write(worker["workerid"])


@pytest.fixture(scope="session")
def spark(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session shared by every Spark test."""
    _claim_the_run_s_session(pytestconfig, tmp_path_factory.getbasetemp().parent)
    session = build_session()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def storage(aws: EmbeddedAws) -> dict[str, str]:
    """pylance storage options for the embedded server."""
    return aws.pylance_storage_options()


@pytest.fixture
def ddb_uri(aws: EmbeddedAws, bucket: str) -> str:
    """An ``s3+ddb://`` URI on a fresh bucket and a fresh DynamoDB table."""
    table = f"lancetx_{uuid.uuid4().hex[:10]}"
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), table)
    return f"s3+ddb://{bucket}/t.lance?ddbTableName={table}"
