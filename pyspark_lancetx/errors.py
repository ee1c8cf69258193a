"""Errors of the Spark data source; all are :class:`~lancetx.commit.errors.LancetxError`.

Spark shows an error raised in a Python worker as a ``PythonException`` whose
text carries the class name and message, so each message stands on its own:
it names the option, column or table and says what to do.
"""

from __future__ import annotations

from lancetx.commit.errors import CommitError, CommitStateUnknownError, LancetxError


class SparkOptionError(LancetxError, ValueError):
    """A data-source option has a value that cannot be used."""

    def __init__(self, option: str, value: str | None, expected: str) -> None:
        self.option = option
        self.value = value
        super().__init__(f"option {option!r}={value!r} is invalid: expected {expected}")


class UnknownSparkOptionError(SparkOptionError):
    """An option name the data source does not know (a typo would otherwise be ignored)."""

    def __init__(self, option: str, where: str, suggestion: str) -> None:
        self.option = option
        self.value = None
        LancetxError.__init__(self, f"unknown option {option!r} {where}: {suggestion}")


class SparkSetupError(LancetxError):
    """Spark cannot be made to find the data source from here; the message says what to set."""


class SparkSchemaError(LancetxError):
    """The DataFrame's columns do not fit the table (or cannot be stored at all).

    ``column`` is the dotted path of the first offending column.
    """

    def __init__(self, uri: str, column: str, problem: str) -> None:
        self.uri = uri
        self.column = column
        self.problem = problem
        super().__init__(f"column {column!r} cannot be written to {uri!r}: {problem}")


class UnsupportedSparkTypeError(SparkSchemaError):
    """A Spark type with no faithful Lance/Arrow representation (intervals, void, variant)."""


class JobCommitUnknownError(CommitStateUnknownError):
    """The job's commit may or may not have landed, and it could not be settled in time.

    The job's data files are kept. Look the job up with
    ``pyspark_lancetx.last_commit(uri, job_id)`` once the store answers again:
    a version there means the job committed; none means it did not, and the job
    can be re-run with the same ``job_id`` (it will not commit twice).
    """

    def __init__(self, uri: str, job_id: str, version: int, detail: str) -> None:
        self.job_id = job_id
        super().__init__(uri, version, None, detail)
        self.args = (
            f"outcome of Spark job {job_id!r} committing to {uri!r} is unknown ({detail}); its "
            f"data files are kept. Call pyspark_lancetx.last_commit({uri!r}, {job_id!r}) when the "
            "store answers: a version means it committed; None means re-run the job with the "
            "same job_id option (it will not commit twice)",
        )

    def __str__(self) -> str:
        return str(self.args[0])


class JobCommitTimeoutError(CommitError):
    """The job lost the race for a version for longer than its commit budget.

    Nothing was committed for the job and its data files were removed.
    """

    def __init__(self, uri: str, job_id: str, seconds: float, attempts: int) -> None:
        self.uri = uri
        self.job_id = job_id
        super().__init__(
            f"Spark job {job_id!r} could not commit to {uri!r} within {seconds:.0f}s "
            f"({attempts} attempts lost to concurrent writers); nothing was committed. Re-run the "
            "job, or raise the commit_timeout option"
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
