"""A small local-mode SparkSession for the examples (2 cores, no UI)."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str) -> Any:
    """A local-mode session whose Python workers run this interpreter."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def storage_arguments(pairs: list[str]) -> dict[str, str]:
    """``["aws_region=eu-west-1", …]`` → pylance storage options."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--storage expects name=value, got {pair!r}")
        out[key] = value
    return out
