"""Errors of the Spark data source; all are :class:`~lancetx.commit.errors.LancetxError`.

They are defined in :mod:`lancetx.errors` (the one catch list of every lancetx error,
also exported by ``lancetx``) and re-exported here. Spark shows an error raised in a
Python worker as a ``PythonException`` whose text carries the class name and message,
so each message stands on its own: it names the option, column or table and says what
to do.
"""

from __future__ import annotations

from lancetx.errors import (
    JobCommitTimeoutError,
    JobCommitUnknownError,
    SparkOptionError,
    SparkSchemaError,
    SparkSetupError,
    UnknownSparkOptionError,
    UnsupportedSparkTypeError,
)

__all__ = [
    "JobCommitTimeoutError",
    "JobCommitUnknownError",
    "SparkOptionError",
    "SparkSchemaError",
    "SparkSetupError",
    "UnknownSparkOptionError",
    "UnsupportedSparkTypeError",
]
