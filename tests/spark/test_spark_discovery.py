"""Spark finds format("lancetx") however the job is started from an environment that has
the package, even when Spark's default worker interpreter (``python3`` on ``PATH``)
lacks it; and the read errors of a fresh job are lancetx's typed ones.

Each case is a separate driver process (a session cannot be restarted with another
worker interpreter): ``python3`` on its ``PATH`` is the base interpreter of this
virtualenv, which has pyspark (Spark hands its workers its own copy) but not lancetx.
Two child sessions, ~10-30 s each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lancetx.demo.embedded import EmbeddedAws

# Each test starts its own Spark applications (minutes of CPU): CI's long pass runs them.
pytestmark = [pytest.mark.slow, pytest.mark.long_only]

DRIVER = r"""
import json, logging, sys

mode, local_uri, ddb_uri, endpoint = sys.argv[1:5]
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
out = {}
if mode == "import-first":
    import pyspark_lancetx
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
out["worker_python"] = spark.sparkContext.pythonExec


def attempt(fn):
    try:
        return ["ok", fn()]
    except Exception as exc:
        return ["error", str(exc)]


def write_and_read():
    spark.range(3).write.format("lancetx").mode("append").save(local_uri)
    return spark.read.format("lancetx").load(local_uri).count()


if mode == "session-first":
    out["before_import"] = attempt(write_and_read)
    import pyspark_lancetx
out["job"] = attempt(write_and_read)
if mode == "import-first":
    # No credentials and no region anywhere (the environment has none either).
    out["no_credentials"] = attempt(
        lambda: spark.read.format("lancetx")
        .option("storage.aws_endpoint", endpoint)
        .option("storage.dynamodb_endpoint", endpoint)
        .option("storage.allow_http", "true")
        .load(ddb_uri)
        .count()
    )
print("RESULT " + json.dumps(out))
spark.stop()
"""


def _python_without_lancetx(directory: Path) -> Path:
    """A ``python3`` for PATH: this virtualenv's base interpreter (no lancetx)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    shim = directory / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{base}" "$@"\n')
    shim.chmod(0o755)
    lacks = subprocess.run(
        [str(shim), "-c", "import lancetx.commit.errors, pyspark_lancetx"],
        capture_output=True,
        cwd=directory,
        timeout=120,
    )
    if lacks.returncode == 0:
        pytest.skip(f"the base interpreter {base} has lancetx installed")
    return shim


def _run_driver(
    tmp_path: Path, aws: EmbeddedAws, bucket: str, mode: str
) -> tuple[dict[str, Any], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _python_without_lancetx(bin_dir)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "PYSPARK_", "DYNAMODB_")) and k != "PYTHONPATH"
    }
    env.update(
        {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        }
    )
    work = tmp_path / mode
    work.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            mode,
            str(work / "t.lance"),
            f"s3+ddb://{bucket}/t.lance?ddbTableName=lancetx_no_credentials",
            aws.endpoint,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,  # not the checkout: its folders must not stand in for an install
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT ") :]), done.stderr


def test_a_session_whose_workers_lack_the_package_gets_it_registered(
    tmp_path: Path, aws: EmbeddedAws, bucket: str
) -> None:
    """The session starts first, with workers that cannot import lancetx: Spark alone does
    not find the source; importing pyspark_lancetx registers it explicitly and says so."""
    result, stderr = _run_driver(tmp_path, aws, bucket, "session-first")
    assert result["worker_python"] == "python3"
    status, detail = result["before_import"]
    assert status == "error" and "DATA_SOURCE_NOT_FOUND" in detail
    assert result["job"] == ["ok", 3], result["job"]
    assert "WARNING pyspark_lancetx:" in stderr
    assert "PYSPARK_PYTHON" in stderr and "spark.dataSource.register" in stderr


def test_importing_first_gives_the_workers_the_drivers_interpreter(
    tmp_path: Path, aws: EmbeddedAws, bucket: str
) -> None:
    """Imported before the session, with PYSPARK_PYTHON unset: the workers run the
    driver's interpreter; nothing is registered by hand, nothing to warn about. A read
    without credentials or region says which are not configured."""
    result, stderr = _run_driver(tmp_path, aws, bucket, "import-first")
    assert result["worker_python"] == sys.executable
    assert result["job"] == ["ok", 3], result["job"]
    assert "WARNING pyspark_lancetx:" not in stderr
    status, detail = result["no_credentials"]
    assert status == "error"
    assert "AccessDeniedError" in detail and "no AWS credentials are configured" in detail
    assert "region us-west-2 (not configured" in detail
    assert "LanceError" not in detail
