"""The data source's options, parsed once on the planning side into plain dataclasses.

Spark hands a Python data source its options as strings and lower-cases their
keys, so every option name here is lower-case. Every option is checked: an
unknown name is refused with the closest valid one (``did you mean job_id?``),
a value that is empty (or None) is refused, and the camelCase spellings Spark
and Delta users type are accepted for the same options: any name without its
underscores (``jobId``, ``commitMessage``, ``mergeSchema``, ``maxRowsPerFile``
…) and Delta's ``versionAsOf`` / ``timestampAsOf`` for ``version`` /
``timestamp``. (Spark itself drops an option whose value is None before the data
source sees it: check a value that may be None, such as what
:func:`pyspark_lancetx.last_commit` returns, before passing it.) What the parsed
objects hold is plain data (strings, ints, dicts): they travel pickled from the
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
    applied by the scanner); ``batch_size`` (rows per Arrow batch, default 8192).
    Partitions (Spark's file-source rules, as ``spark.sql.files.*``): small
    fragments are packed together and a large fragment is split by row ranges,
    so that each partition holds about ``max_partition_bytes`` of the columns
    read (default 128 MiB, Spark's ``maxPartitionBytes``), or less when that
    leaves fewer than ``min_partitions`` partitions (default: the cores of the
    machine planning the read — set it to the cluster's cores);
    ``rows_per_partition`` caps the rows of a partition (no cap by default).

Streaming read (``spark.readStream.format("lancetx")``; Delta's names, which
Spark users already type, also as ``startingVersion`` …)
    ``starting_version`` (a version: its rows and every later version's; or
    ``latest``: only versions after the latest) or ``starting_timestamp`` (from
    the first version committed at or after it); without either, the table as it
    is when the query starts, then every later version.
    ``skip_change_commits`` (skip versions that delete or change rows instead of
    failing the stream), ``ignore_deletes`` (skip versions that only delete rows);
    ``max_versions_per_trigger``, ``max_rows_per_trigger`` (rate limits);
    ``columns``, ``filter``, ``batch_size`` as for reads; ``rows_per_partition``
    (whole fragments are grouped up to this many rows, default 1,000,000).
"""

from __future__ import annotations

import datetime
import difflib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from lancetx import check_idempotency_key
from lancetx.errors import InvalidIdempotencyKeyError
from pyspark_lancetx.errors import SparkOptionError, UnknownSparkOptionError

STORAGE_PREFIX = "storage."
PROPERTIES_PREFIX = "properties."
DEFAULT_COMMIT_TIMEOUT = 300.0
DEFAULT_ROWS_PER_PARTITION = 1_000_000
#: Spark's ``spark.sql.files.maxPartitionBytes`` default.
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
DEFAULT_BATCH_SIZE = 8192

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


#: Options Spark itself adds or consumes (``save(path)``, a stream's checkpoint).
SPARK_KEYS = frozenset({"path", "paths", "checkpointlocation"})
#: Every write option (besides ``storage.<name>`` and ``properties.<key>``).
WRITE_KEYS = frozenset(
    {
        "commit_message",
        "job_id",
        "vector_columns",
        "nullable",
        "merge_schema",
        "max_rows_per_file",
        "max_rows_per_group",
        "max_bytes_per_file",
        "data_storage_version",
        "commit_timeout",
        "stream_id",
    }
)
#: Every read option (besides ``storage.<name>``).
READ_KEYS = frozenset(
    {
        "version",
        "timestamp",
        "columns",
        "filter",
        "rows_per_partition",
        "max_partition_bytes",
        "min_partitions",
        "batch_size",
    }
)
#: Every streaming read option (besides ``storage.<name>``).
STREAM_READ_KEYS = frozenset(
    {
        "starting_version",
        "starting_timestamp",
        "skip_change_commits",
        "ignore_deletes",
        "max_versions_per_trigger",
        "max_rows_per_trigger",
        "columns",
        "filter",
        "rows_per_partition",
        "batch_size",
    }
)
#: Names Delta users know for the same read options (lower-cased, as Spark hands them).
DELTA_ALIASES = {"versionasof": "version", "timestampasof": "timestamp"}
#: What each kind of option is called in messages.
KINDS = {"write": WRITE_KEYS, "read": READ_KEYS, "streaming read": STREAM_READ_KEYS}
#: A batch read's time travel, given to a streaming read (or the other way round).
_COUNTERPARTS = {
    "version": "starting_version",
    "timestamp": "starting_timestamp",
    "starting_version": "version",
    "starting_timestamp": "timestamp",
}


def _aliases(keys: frozenset[str]) -> dict[str, str]:
    """camelCase (lower-cased by Spark, so: without underscores) → the option's name."""
    out = {k.replace("_", ""): k for k in keys if "_" in k}
    out.update({a: k for a, k in DELTA_ALIASES.items() if k in keys})
    return out


def _normalized(
    options: Mapping[str, str | None], keys: frozenset[str], prefixes: tuple[str, ...], side: str
) -> dict[str, str]:
    """Spark's option map with aliases resolved; unknown names and empty values refused."""
    aliases = _aliases(keys)
    out: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for raw_key, raw_value in options.items():
        key = str(raw_key).lower()
        name = aliases.get(key, key)
        if not (name in keys or name in SPARK_KEYS or key.startswith(prefixes)):
            where = f"{side} {options.get('path')!r}" if options.get("path") else side
            raise UnknownSparkOptionError(
                str(raw_key), where, _suggestion(key, keys, aliases, prefixes)
            )
        if raw_value is None or not str(raw_value).strip():
            raise SparkOptionError(
                str(raw_key),
                raw_value,
                "a value (leave the option out to use the default)",
            )
        if name in out and out[name] != str(raw_value):
            # A storage option may be a credential: its values are not repeated.
            secret = name.startswith(STORAGE_PREFIX)
            raise SparkOptionError(
                str(raw_key),
                "<not shown>" if secret else str(raw_value),
                f"one value: it was also given as {given_as[name]!r}"
                + ("" if secret else f"={out[name]!r}"),
            )
        out[name] = str(raw_value)
        given_as[name] = str(raw_key)
    return out


def _suggestion(
    key: str,
    keys: frozenset[str],
    aliases: Mapping[str, str],
    prefixes: tuple[str, ...],
) -> str:
    names = sorted(keys)
    listed = ", ".join([*names, *(p + "<name>" for p in prefixes)])
    here = next(kind for kind, kind_keys in KINDS.items() if kind_keys is keys)
    for kind, kind_keys in KINDS.items():
        if kind_keys is keys:
            continue
        other = kind_keys - keys
        name = _aliases(other).get(key, key)
        if name in other:
            counterpart = _COUNTERPARTS.get(name)
            hint = f"did you mean {counterpart}? " if counterpart in keys else ""
            return f"it is a {kind} option; {hint}{here}s take: {listed}"
    candidates = [*keys, *aliases, *(p.rstrip(".") for p in prefixes)]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = ""
    if close:
        best = aliases.get(close[0], close[0])
        hint = f"did you mean {best + '.<name>' if best + '.' in prefixes else best}? "
    elif "." in key and not key.startswith(prefixes):
        hint = f"did you mean {prefixes[0]}{key.partition('.')[2]}? "
    return hint + "options here: " + ", ".join([*names, *(p + "<name>" for p in prefixes)])


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


def _check_key_option(name: str, value: str) -> None:
    """``job_id``/``stream_id`` become the commit's idempotency key: one that cannot be
    a key is refused here, on the driver, before any task writes a file."""
    if not value:
        return
    try:
        check_idempotency_key(value)
    except InvalidIdempotencyKeyError as exc:
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise SparkOptionError(
            name, shown, f"an id of at most {exc.limit} UTF-8 bytes (it {exc.problem})"
        ) from None


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
    def parse(cls, raw: Mapping[str, str | None]) -> WriteOptions:
        """Parse Spark's option map; raises SparkOptionError naming a bad option."""
        options = _normalized(raw, WRITE_KEYS, (STORAGE_PREFIX, PROPERTIES_PREFIX), "writing")
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
        for name in ("job_id", "stream_id"):
            _check_key_option(name, options.get(name, "").strip())
        return cls(
            uri=table_uri(options),
            storage_options=_prefixed(options, STORAGE_PREFIX),
            commit_message=options.get("commit_message"),
            properties=_prefixed(options, PROPERTIES_PREFIX),
            job_id=job_id or str(uuid.uuid4()),
            job_id_given=bool(job_id),
            vector_columns=parse_vector_columns(options.get("vector_columns", "")),
            keep_spark_nullability=nullable == "spark",
            merge_schema=_flag(options, "merge_schema"),
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
    #: At most this many rows per partition (None: no cap, bytes decide).
    rows_per_partition: int | None = None
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    #: None: the cores of the machine that plans the read.
    min_partitions: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE

    @classmethod
    def parse(cls, raw: Mapping[str, str | None]) -> ReadOptions:
        """Parse Spark's option map; raises SparkOptionError naming a bad option."""
        options = _normalized(raw, READ_KEYS, (STORAGE_PREFIX,), "reading")
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
            rows_per_partition=_positive_int(options, "rows_per_partition"),
            max_partition_bytes=_positive_int(options, "max_partition_bytes")
            or DEFAULT_MAX_PARTITION_BYTES,
            min_partitions=_positive_int(options, "min_partitions"),
            batch_size=_positive_int(options, "batch_size") or DEFAULT_BATCH_SIZE,
        )


#: ``starting_version`` value that starts after the latest version.
LATEST = "latest"


def parse_timestamp(option: str, text: str) -> datetime.datetime:
    """An ISO-8601 time (or date); UTC when it names no zone."""
    try:
        value = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise SparkOptionError(
            option, text, "an ISO-8601 time such as 2026-01-31T12:00:00Z (or a date)"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class StreamReadOptions:
    """Parsed streaming read options (see the module docstring)."""

    uri: str
    #: Not in the repr (readers and partitions carry these objects): it holds credentials.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    #: A version number, :data:`LATEST`, or None (start with the table as it is).
    starting_version: int | str | None = None
    #: ISO-8601 text (checked): start with the first version committed at or after it.
    starting_timestamp: str | None = None
    skip_change_commits: bool = False
    ignore_deletes: bool = False
    max_versions_per_trigger: int | None = None
    max_rows_per_trigger: int | None = None
    columns: tuple[str, ...] | None = None
    filter: str | None = None
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION
    batch_size: int = DEFAULT_BATCH_SIZE

    @classmethod
    def parse(cls, raw: Mapping[str, str | None]) -> StreamReadOptions:
        """Parse Spark's option map; raises SparkOptionError naming a bad option."""
        options = _normalized(raw, STREAM_READ_KEYS, (STORAGE_PREFIX,), "reading a stream of")
        starting: int | str | None = None
        text = options.get("starting_version", "").strip()
        if text.lower() == LATEST:
            starting = LATEST
        elif text:
            try:
                starting = int(text)
            except ValueError:
                starting = 0
            if starting <= 0:
                raise SparkOptionError(
                    "starting_version", text, "a version (a positive integer) or latest"
                )
        timestamp = options.get("starting_timestamp") or None
        if timestamp is not None:
            parse_timestamp("starting_timestamp", timestamp)
            if starting is not None:
                raise SparkOptionError(
                    "starting_timestamp",
                    timestamp,
                    "either starting_version or starting_timestamp, not both",
                )
        columns = None
        if options.get("columns", "").strip():
            columns = tuple(c.strip() for c in options["columns"].split(",") if c.strip())
        return cls(
            uri=table_uri(options),
            storage_options=_prefixed(options, STORAGE_PREFIX),
            starting_version=starting,
            starting_timestamp=timestamp,
            skip_change_commits=_flag(options, "skip_change_commits"),
            ignore_deletes=_flag(options, "ignore_deletes"),
            max_versions_per_trigger=_positive_int(options, "max_versions_per_trigger"),
            max_rows_per_trigger=_positive_int(options, "max_rows_per_trigger"),
            columns=columns,
            filter=options.get("filter") or None,
            rows_per_partition=_positive_int(options, "rows_per_partition")
            or DEFAULT_ROWS_PER_PARTITION,
            batch_size=_positive_int(options, "batch_size") or DEFAULT_BATCH_SIZE,
        )
