"""The data source's options, parsed once on the planning side into plain dataclasses.

Spark hands a Python data source its options as strings and lower-cases their
keys, so every option name here is lower-case (``mergeSchema`` arrives as
``mergeschema``; both spellings below are accepted). What the parsed objects
hold is plain data (strings, ints, dicts): they travel pickled from the
planning worker to the executors and to the committing worker.

Common
    ``storage.<name>``
        pylance's storage option ``<name>`` (``storage.aws_endpoint``,
        ``storage.aws_region``, ``storage.dynamodb_endpoint`` …). The same dict
        serves pylance on the executors and lancetx on the driver.

Write (``df.write.format("lancetx")``)
    ``commit_message``; ``properties.<key>`` (transaction properties);
    ``job_id`` (the job's idempotency key; default a fresh UUID per write);
    ``vector_columns`` (``emb:128,img:512`` → ``fixed_size_list<float32>[d]``);
    ``nullable`` (``all``: new columns are created nullable, the default;
    ``spark``: keep Spark's flags); ``merge_schema`` (add new columns, nullable);
    ``max_rows_per_file``, ``max_rows_per_group``, ``max_bytes_per_file``
    (target data-file size); ``data_storage_version`` (new tables only);
    ``commit_timeout`` (seconds the job keeps retrying a lost commit, default 300);
    ``stream_id`` (streaming only: replaces the query id as the stream's identity).

Read (``spark.read.format("lancetx")``)
    ``version`` or ``timestamp`` (time travel; resolved once, at planning);
    ``columns`` (comma-separated projection); ``filter`` (a Lance SQL filter
    applied by the scanner); ``rows_per_partition`` (fragments are grouped up
    to this many rows per Spark partition, default 1,000,000);
    ``batch_size`` (rows per Arrow batch, default 8192).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark_lancetx.errors import SparkOptionError

STORAGE_PREFIX = "storage."
PROPERTIES_PREFIX = "properties."
DEFAULT_COMMIT_TIMEOUT = 300.0
DEFAULT_ROWS_PER_PARTITION = 1_000_000
DEFAULT_BATCH_SIZE = 8192

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _flag(options: Mapping[str, str], *names: str) -> bool:
    for name in names:
        if name in options:
            value = options[name].strip().lower()
            if value in _TRUE:
                return True
            if value in _FALSE:
                return False
            raise SparkOptionError(name, options[name], "true or false")
    return False


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    if name not in options:
        return None
    try:
        value = int(options[name])
    except ValueError:
        raise SparkOptionError(name, options[name], "a positive integer") from None
    if value <= 0:
        raise SparkOptionError(name, options[name], "a positive integer")
    return value


def _prefixed(options: Mapping[str, str], prefix: str) -> dict[str, str]:
    return {k[len(prefix) :]: v for k, v in options.items() if k.startswith(prefix)}


def table_uri(options: Mapping[str, str]) -> str:
    """The table URI: ``save(uri)``/``load(uri)`` arrive as the ``path`` option."""
    uri = options.get("path", "").strip()
    if not uri:
        raise SparkOptionError("path", "", "the table URI, given to save(uri) or load(uri)")
    return uri


def parse_vector_columns(text: str) -> dict[str, int]:
    """``"emb:128, img:512"`` → ``{"emb": 128, "img": 512}``."""
    out: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, dim = item.rpartition(":")
        try:
            size = int(dim)
        except ValueError:
            size = 0
        if not sep or not name or size <= 0:
            raise SparkOptionError(
                "vector_columns", text, "comma-separated name:dimension pairs such as emb:128"
            )
        out[name.strip()] = size
    return out


@dataclass(frozen=True)
class WriteOptions:
    """Parsed write options (see the module docstring)."""

    uri: str
    #: Not in the repr (plans and messages carry these objects): it holds credentials.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    commit_message: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    job_id: str = ""
    job_id_given: bool = False
    vector_columns: dict[str, int] = field(default_factory=dict)
    keep_spark_nullability: bool = False
    merge_schema: bool = False
    max_rows_per_file: int | None = None
    max_rows_per_group: int | None = None
    max_bytes_per_file: int | None = None
    data_storage_version: str | None = None
    commit_timeout: float = DEFAULT_COMMIT_TIMEOUT
    stream_id: str | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> WriteOptions:
        """Parse Spark's option map; raises SparkOptionError naming a bad option."""
        options = _lower(raw)
        nullable = options.get("nullable", "all").strip().lower()
        if nullable not in ("all", "spark"):
            raise SparkOptionError("nullable", options["nullable"], "'all' or 'spark'")
        timeout = DEFAULT_COMMIT_TIMEOUT
        if "commit_timeout" in options:
            try:
                timeout = float(options["commit_timeout"])
            except ValueError:
                timeout = -1.0
            if timeout <= 0:
                raise SparkOptionError(
                    "commit_timeout", options["commit_timeout"], "a positive number of seconds"
                )
        job_id = options.get("job_id", "").strip()
        return cls(
            uri=table_uri(options),
            storage_options=_prefixed(options, STORAGE_PREFIX),
            commit_message=options.get("commit_message"),
            properties=_prefixed(options, PROPERTIES_PREFIX),
            job_id=job_id or str(uuid.uuid4()),
            job_id_given=bool(job_id),
            vector_columns=parse_vector_columns(options.get("vector_columns", "")),
            keep_spark_nullability=nullable == "spark",
            merge_schema=_flag(options, "merge_schema", "mergeschema"),
            max_rows_per_file=_positive_int(options, "max_rows_per_file"),
            max_rows_per_group=_positive_int(options, "max_rows_per_group"),
            max_bytes_per_file=_positive_int(options, "max_bytes_per_file"),
            data_storage_version=options.get("data_storage_version") or None,
            commit_timeout=timeout,
            stream_id=options.get("stream_id") or None,
        )


@dataclass(frozen=True)
class ReadOptions:
    """Parsed read options (see the module docstring)."""

    uri: str
    #: Not in the repr (plans and messages carry these objects): it holds credentials.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    version: int | None = None
    timestamp: str | None = None
    columns: tuple[str, ...] | None = None
    filter: str | None = None
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION
    batch_size: int = DEFAULT_BATCH_SIZE

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> ReadOptions:
        """Parse Spark's option map; raises SparkOptionError naming a bad option."""
        options = _lower(raw)
        version = _positive_int(options, "version")
        timestamp = options.get("timestamp") or None
        if version is not None and timestamp is not None:
            raise SparkOptionError("timestamp", timestamp, "either version or timestamp, not both")
        columns = None
        if options.get("columns", "").strip():
            columns = tuple(c.strip() for c in options["columns"].split(",") if c.strip())
        return cls(
            uri=table_uri(options),
            storage_options=_prefixed(options, STORAGE_PREFIX),
            version=version,
            timestamp=timestamp,
            columns=columns,
            filter=options.get("filter") or None,
            rows_per_partition=_positive_int(options, "rows_per_partition")
            or DEFAULT_ROWS_PER_PARTITION,
            batch_size=_positive_int(options, "batch_size") or DEFAULT_BATCH_SIZE,
        )
