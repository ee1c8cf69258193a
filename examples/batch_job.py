"""Batch job: append (or overwrite) a DataFrame to a Lance table, one version per job.

    python examples/batch_job.py /tmp/events.lance --rows 1000 --tag nightly
    python examples/batch_job.py 's3+ddb://bucket/events.lance?ddbTableName=T' \\
        --storage aws_region=eu-west-1 --job-id nightly-2026-01-31

Tasks write Lance data files; the driver side commits them as ONE transaction
(through DynamoDB for ``s3+ddb://``), recording the job id. Re-running with the
same ``--job-id`` does not commit twice. Prints the version the job committed.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from pyspark_lancetx import last_commit


def run(
    spark: Any,
    uri: str,
    *,
    rows: int,
    tag: str,
    storage_options: dict[str, str] | None = None,
    job_id: str | None = None,
    mode: str = "append",
    first_id: int = 0,
) -> int:
    """Write ``rows`` rows (ids from ``first_id``, tagged ``tag``); return the committed version."""
    job_id = job_id or f"{tag}-{uuid.uuid4().hex[:8]}"
    df = spark.range(first_id, first_id + rows, 1, 2).selectExpr(
        "id", f"'{tag}' AS tag", "rand(7) AS score"
    )
    (
        df.write.format("lancetx")
        .mode(mode)
        .options(**{f"storage.{k}": v for k, v in (storage_options or {}).items()})
        .option("job_id", job_id)
        .option("commit_message", f"{mode} {rows} rows ({tag})")
        .save(uri)
    )
    version = last_commit(uri, job_id, storage_options)
    assert version is not None, f"job {job_id} committed no version"
    return version


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    from _session import local_session, storage_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("uri")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--first-id", type=int, default=0)
    parser.add_argument("--tag", default="batch")
    parser.add_argument("--mode", choices=["append", "overwrite"], default="append")
    parser.add_argument("--job-id")
    parser.add_argument("--storage", action="append", default=[], help="pylance option name=value")
    args = parser.parse_args(argv)
    spark = local_session("lancetx-batch-example")
    try:
        version = run(
            spark,
            args.uri,
            rows=args.rows,
            tag=args.tag,
            storage_options=storage_arguments(args.storage),
            job_id=args.job_id,
            mode=args.mode,
            first_id=args.first_id,
        )
    finally:
        spark.stop()
    print(f"committed version {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
