"""``pyspark_lancetx``: the ``lancetx`` data source for PySpark (4.x).

Spark finds a top-level module named ``pyspark_<name>`` exposing
``DefaultSource`` on its own, in its Python workers (``PYSPARK_PYTHON``, else
``python3`` on ``PATH``), so with this package installed there::

    df.write.format("lancetx").mode("append").option("storage.aws_region", "eu-west-1") \\
        .save("s3+ddb://bucket/events.lance?ddbTableName=lance_manifests")
    spark.read.format("lancetx").option("version", 3).load(uri)
    df.writeStream.format("lancetx").option("checkpointLocation", ckpt).start(uri)
    spark.readStream.format("lancetx").option("startingVersion", 1).load(uri)  # appended rows

Importing this package on the driver makes sure a local session's workers find
it (:mod:`pyspark_lancetx.workers`): before the session starts it sets
``PYSPARK_PYTHON`` to this interpreter when unset and ``python3`` lacks the
package; after, it registers the source with the session explicitly and logs a
warning. :func:`register` does that on demand.
Each write job commits ONE version; :func:`last_commit` finds it afterwards
(Spark gives the job no return value). Options: :mod:`pyspark_lancetx.options`; the
streaming source: :mod:`pyspark_lancetx.stream_source`.

Importing this package imports neither pyspark nor pylance: ``DefaultSource``
is loaded on first access, and pylance only inside the tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark_lancetx.commit import VersionRecord, last_commit, table_history
from pyspark_lancetx.workers import prepare_workers, register

if TYPE_CHECKING:
    from pyspark_lancetx.datasource import LanceTxDataSource as DefaultSource

__all__ = ["DefaultSource", "VersionRecord", "last_commit", "register", "table_history"]

prepare_workers()


def __getattr__(name: str) -> Any:
    if name in ("DefaultSource", "LanceTxDataSource"):
        from pyspark_lancetx import datasource

        return datasource.LanceTxDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
