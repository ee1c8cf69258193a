"""A Spark application of its own that copies one lancetx table into another with a
stream (``readStream.format("lancetx")`` into ``writeStream.format("lancetx")``), for
the tests that kill it: ``python stream_copy_child.py '<json>'``.

The JSON names ``source``, ``target``, ``checkpoint``, ``storage`` (storage options
of both tables), ``source_options`` (streaming read options) and ``available_now``
(stop once everything there was at the start is copied; else run until killed).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from spark_helpers import build_session, run_stream, spark_options

    spark = build_session("lancetx-stream-copy")
    spark.sparkContext.setLogLevel("ERROR")
    opts = spark_options(args["storage"])
    frame = (
        spark.readStream.format("lancetx")
        .options(**opts)
        .options(**args["source_options"])
        .load(args["source"])
    )
    writer = (
        frame.writeStream.format("lancetx")
        .options(**opts)
        .option("checkpointLocation", args["checkpoint"])
    )
    if args["available_now"]:
        writer = writer.trigger(availableNow=True)
    run_stream(lambda: writer.start(args["target"]))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
