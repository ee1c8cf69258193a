"""Time travel: read a Lance table as of a version (or a time) with Spark.

    python examples/time_travel.py /tmp/events.lance --version 1
    python examples/time_travel.py /tmp/events.lance --timestamp 2026-01-31T12:00:00Z

The version is resolved once, when the DataFrame is planned: later commits do
not change what it reads. Prints the table's history and the rows per tag at
the chosen version.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pyspark_lancetx import table_history


def run(
    spark: Any,
    uri: str,
    *,
    version: int | None = None,
    timestamp: str | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, int]:
    """Rows per ``tag`` at ``version`` (or ``timestamp``; the latest when neither)."""
    reader = spark.read.format("lancetx").options(
        **{f"storage.{k}": v for k, v in (storage_options or {}).items()}
    )
    if version is not None:
        reader = reader.option("version", version)
    if timestamp is not None:
        reader = reader.option("timestamp", timestamp)
    df = reader.load(uri)
    return {row["tag"]: row["count"] for row in df.groupBy("tag").count().collect()}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    from _session import local_session, storage_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("uri")
    parser.add_argument("--version", type=int)
    parser.add_argument("--timestamp")
    parser.add_argument("--storage", action="append", default=[], help="pylance option name=value")
    args = parser.parse_args(argv)
    storage = storage_arguments(args.storage)
    for record in table_history(args.uri, storage):
        print(f"v{record.version:<4} {record.operation:<10} job={record.job_id} rows={record.rows}")
    spark = local_session("lancetx-time-travel-example")
    try:
        counts = run(
            spark, args.uri, version=args.version, timestamp=args.timestamp, storage_options=storage
        )
    finally:
        spark.stop()
    for tag, count in sorted(counts.items()):
        print(f"{tag}: {count} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
