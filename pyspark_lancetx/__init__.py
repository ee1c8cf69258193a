"""``pyspark_lancetx``: the ``lancetx`` data source for PySpark (4.x).

Spark finds a top-level module named ``pyspark_<name>`` exposing
``DefaultSource`` on its own, so with this package installed on the driver and
the workers::

    df.write.format("lancetx").mode("append").option("storage.aws_region", "eu-west-1") \\
        .save("s3+ddb://bucket/events.lance?ddbTableName=lance_manifests")
    spark.read.format("lancetx").option("version", 3).load(uri)
    df.writeStream.format("lancetx").option("checkpointLocation", ckpt).start(uri)

(``spark.dataSource.register(pyspark_lancetx.DefaultSource)`` works too.)
Each write job commits ONE version; :func:`last_commit` finds it afterwards
(Spark gives the job no return value). Options: :mod:`pyspark_lancetx.options`.

Importing this package imports neither pyspark nor pylance: ``DefaultSource``
is loaded on first access, and pylance only inside the tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark_lancetx.commit import VersionRecord, last_commit, table_history

if TYPE_CHECKING:
    from pyspark_lancetx.datasource import LanceTxDataSource as DefaultSource

__all__ = ["DefaultSource", "VersionRecord", "last_commit", "table_history"]


def __getattr__(name: str) -> Any:
    if name in ("DefaultSource", "LanceTxDataSource"):
        from pyspark_lancetx import datasource

        return datasource.LanceTxDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
