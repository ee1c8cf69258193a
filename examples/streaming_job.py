"""Streaming job: JSON files landing in a directory → a Lance table, exactly once.

    python examples/streaming_job.py /tmp/incoming /tmp/events.lance /tmp/checkpoint

Each micro-batch commits ONE version carrying the query id and batch id. A
query restarted from its checkpoint replays the batch it had not marked done;
the sink finds that batch in the table's history and does not commit it twice.
Runs until the directory has no new files (``availableNow``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def run(
    spark: Any,
    source_dir: str,
    uri: str,
    checkpoint: str,
    *,
    storage_options: dict[str, str] | None = None,
    files_per_batch: int = 1,
) -> None:
    """Process every file now in ``source_dir`` (one micro-batch per ``files_per_batch``)."""
    stream = (
        spark.readStream.schema("id LONG, name STRING")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(source_dir)
    )
    query = (
        stream.writeStream.format("lancetx")
        .options(**{f"storage.{k}": v for k, v in (storage_options or {}).items()})
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(uri)
    )
    query.awaitTermination()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    from _session import local_session, storage_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("source_dir")
    parser.add_argument("uri")
    parser.add_argument("checkpoint")
    parser.add_argument("--storage", action="append", default=[], help="pylance option name=value")
    args = parser.parse_args(argv)
    spark = local_session("lancetx-streaming-example")
    try:
        run(
            spark,
            args.source_dir,
            args.uri,
            args.checkpoint,
            storage_options=storage_arguments(args.storage),
        )
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
