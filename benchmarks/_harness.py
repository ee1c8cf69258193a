"""Shared pieces of the benchmarks: request counting, table setup, statistics, output.

Not a benchmark itself (the leading underscore keeps it out of ``python
benchmarks/*.py`` loops and out of pytest collection).

Requests are counted in two places:

* **server side** — an :class:`EmbeddedAws` interceptor sees every HTTP request
  that reaches the moto server, whoever sent it (pylance's Rust ``object_store``
  and ``aws-sdk-rust`` clients, or boto3). Each request is classified into an
  AWS operation name (``PutObject``, ``Query``, …), the part of the table it
  touches (data file, transaction file, manifest, …) and the client that sent
  it (from its ``User-Agent``);
* **client side** — a botocore ``before-send`` handler on lancetx's own boto3
  clients (the S3 store's and the DynamoDB store's). This sees only lancetx's
  requests, with botocore's operation names; the benchmarks check that it
  agrees with what the server saw from boto3.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

# Fake credentials before boto3 or pylance look at the environment: nothing here
# may ever reach real AWS.
for _key, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ[_key] = _value
for _key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(_key, None)

import boto3  # noqa: E402
import lance  # noqa: E402

from lancetx.commit.handlers.interface import CommitHandler  # noqa: E402
from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse  # noqa: E402
from lancetx.externalstore.commit_handler import ExternalStoreCommitHandler  # noqa: E402
from lancetx.externalstore.dynamodb.store import create_table  # noqa: E402

#: The operations every request table shows, in this order (others are appended).
OPERATIONS: tuple[str, ...] = (
    "PutObject",
    "GetObject",
    "HeadObject",
    "ListObjectsV2",
    "CopyObject",
    "DeleteObject",
    "DeleteObjects",
    "PutItem",
    "Query",
    "GetItem",
    "DescribeTable",
)

#: Where in a table a request goes.
AREAS: tuple[str, ...] = ("data", "transaction", "manifest", "staged", "listing", "dynamodb")


# ------------------------------------------------------------------ classification


@dataclass(frozen=True)
class Request:
    """One request as the server saw it."""

    operation: str
    area: str
    #: ``"boto3"`` (lancetx) or ``"pylance"`` (object_store / aws-sdk-rust), from the User-Agent.
    client: str
    #: A DynamoDB PutItem with ``attribute_not_exists``: an attempt to claim a version.
    claim: bool = False
    #: An S3 write carrying ``If-None-Match``/``If-Match`` (invisible when the
    #: server runs with ``legacy_s3=True``: it strips them before the interceptor).
    conditional: bool = False
    #: For a claim: the table (``base_uri``) and version it tried to claim.
    claim_of: tuple[str, int] | None = None


def client_of(user_agent: str) -> str:
    """``boto3`` for botocore's User-Agent, ``pylance`` for object_store / aws-sdk-rust / pylance."""
    agent = user_agent.lower()
    if "botocore" in agent or "boto3" in agent:
        return "boto3"
    if "object_store" in agent or "aws-sdk-rust" in agent or "pylance" in agent or "lance" in agent:
        return "pylance"
    return "other"


def _area_of(key: str, query: Mapping[str, list[str]]) -> str:
    if not key:
        prefix = (query.get("prefix") or [""])[0]
        return "listing" if "_versions" in prefix else "other"
    if "/_versions/" in f"/{key}":
        return "staged" if ".manifest-" in key else "manifest"
    if "/_transactions/" in f"/{key}":
        return "transaction"
    if "/data/" in f"/{key}":
        return "data"
    return "other"


def _s3_operation(
    method: str, key: str, query: Mapping[str, list[str]], headers: Mapping[str, str]
) -> str:
    if method == "HEAD":
        return "HeadObject" if key else "HeadBucket"
    if method == "GET":
        if key:
            return "GetObject"
        if query.get("list-type") == ["2"]:
            return "ListObjectsV2"
        if "uploads" in query:
            return "ListMultipartUploads"
        return "ListObjects"
    if method == "PUT":
        if not key:
            return "CreateBucket"
        if "partNumber" in query:
            return "UploadPartCopy" if "x-amz-copy-source" in headers else "UploadPart"
        return "CopyObject" if "x-amz-copy-source" in headers else "PutObject"
    if method == "POST":
        if "delete" in query:
            return "DeleteObjects"
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        return "PostObject?"
    if method == "DELETE":
        if "uploadId" in query:
            return "AbortMultipartUpload"
        return "DeleteObject" if key else "DeleteBucket"
    return f"{method}?"


def classify(req: InterceptedRequest) -> Request:
    """The operation, area and client of one intercepted request."""
    client = client_of(req.headers.get("user-agent", ""))
    if req.service == "dynamodb":
        claim = req.target == "PutItem" and b"attribute_not_exists" in req.body
        return Request(
            req.target or "DynamoDB?",
            "dynamodb",
            client,
            claim=claim,
            claim_of=_claimed(req.body) if claim else None,
        )
    query = parse_qs(req.query, keep_blank_values=True)
    # Path-style addressing: /bucket/key (the embedded server is addressed by IP).
    _, _, key = unquote(req.path).lstrip("/").partition("/")
    operation = _s3_operation(req.method, key, query, req.headers)
    conditional = any(h in req.headers for h in ("if-none-match", "if-match"))
    area = "listing" if operation == "ListObjectsV2" else _area_of(key, query)
    if operation == "DeleteObjects":
        area = "staged"  # Lance's DeleteObjects after a commit removes the staged manifest
    return Request(operation, area, client, conditional=conditional)


def _claimed(body: bytes) -> tuple[str, int] | None:
    """(base_uri, version) of a conditional PutItem's item, if it parses."""
    try:
        item = json.loads(body)["Item"]
        return str(item["base_uri"]["S"]), int(item["version"]["N"])
    except (ValueError, KeyError, TypeError):
        return None


class ServerCounter:
    """An interceptor that records every request and lets it through."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[Request] = []

    def __call__(self, req: InterceptedRequest) -> InterceptedResponse | None:
        request = classify(req)
        with self._lock:
            self._requests.append(request)
        return None  # let moto answer

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()

    def take(self) -> list[Request]:
        """The requests recorded since the last reset/take, and reset."""
        with self._lock:
            taken, self._requests = self._requests, []
        return taken


@contextmanager
def counting(aws: EmbeddedAws) -> Iterator[ServerCounter]:
    """Install a :class:`ServerCounter` on ``aws`` for the duration of the block."""
    counter = ServerCounter()
    aws.set_interceptor(counter)
    try:
        yield counter
    finally:
        aws.set_interceptor(None)


class BotocoreCounter:
    """Counts lancetx's own requests with botocore ``before-send`` events (one per
    attempt, so botocore's own retries are counted too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def _on_send(self, event_name: str = "", **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self.counts[operation] += 1

    def attach(self, handler: CommitHandler) -> None:
        """Register on the S3 store's client and, for s3+ddb, the DynamoDB store's client."""
        clients: list[Any] = [getattr(handler.store, "client", None)]
        if isinstance(handler, ExternalStoreCommitHandler):
            clients.append(getattr(handler.entries, "client", None))
        for client in clients:
            if client is None:
                raise TypeError(f"{handler!r} has no boto3 client to count requests on")
            client.meta.events.register("before-send", self._on_send, unique_id=f"bench-{id(self)}")

    def take(self) -> Counter[str]:
        with self._lock:
            taken, self.counts = self.counts, Counter()
        return taken


def area_is(area: str) -> Callable[[Request], bool]:
    """A predicate for :meth:`mean`-style selectors."""
    return lambda r: r.area == area


def client_is(client: str) -> Callable[[Request], bool]:
    return lambda r: r.client == client


def by_operation(requests: Sequence[Request]) -> Counter[str]:
    return Counter(r.operation for r in requests)


def operations_in(*counters: Mapping[str, float]) -> list[str]:
    """:data:`OPERATIONS` followed by any other operation that occurs."""
    extra = sorted({op for c in counters for op, n in c.items() if n and op not in OPERATIONS})
    return [*OPERATIONS, *extra]


# ------------------------------------------------------------------------- setup


@dataclass
class Bench:
    """A running embedded server with one bucket and one Lance-layout DynamoDB table."""

    aws: EmbeddedAws
    bucket: str
    ddb_table: str
    options: dict[str, str] = field(default_factory=dict)

    def ddb_uri(self, name: str, ddb_table: str | None = None) -> str:
        return f"s3+ddb://{self.bucket}/{name}.lance?ddbTableName={ddb_table or self.ddb_table}"

    def fresh_ddb_table(self) -> str:
        """A new, empty manifest table on the same server.

        moto answers a Query by scanning every item of the DynamoDB table (all
        tables' entries, not just the queried ``base_uri``): on a shared table a
        Query gets slower with every earlier scenario's history, which DynamoDB's
        does not (it reads one partition key's items, in order). A table per
        scenario keeps each scenario's Queries at the cost of its own history.
        """
        name = f"bench_manifests_{uuid.uuid4().hex[:10]}"
        create_table(boto3.client("dynamodb", **self.aws.client_kwargs("dynamodb")), name)
        return name

    def s3_uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}.lance"


def start_bench(aws: EmbeddedAws) -> Bench:
    """Create a bucket and a manifest table on a started server."""
    suffix = uuid.uuid4().hex[:10]
    bucket, table = f"bench-{suffix}", f"bench_manifests_{suffix}"
    boto3.client("s3", **aws.client_kwargs()).create_bucket(Bucket=bucket)
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), table)
    return Bench(aws, bucket, table, aws.pylance_storage_options())


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Stopwatch:
    """``with Stopwatch() as sw: ...; sw.seconds``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


_DATA_PHASE = threading.local()
_DATA_PHASE_LOCK = threading.Lock()
_DATA_PHASE_INSTALLED = False


def install_data_phase_timer() -> None:
    """Time ``lance.fragment.write_fragments`` per thread (idempotent, for the whole process).

    ``lancetx_append`` (reused from the demo) writes data files with pylance and
    then commits with lancetx; wrapping the pylance call splits an append's
    latency into "data files" and "commit" without duplicating the demo's code.
    Read the last duration with :func:`last_data_seconds` on the same thread.
    """
    global _DATA_PHASE_INSTALLED
    with _DATA_PHASE_LOCK:
        if _DATA_PHASE_INSTALLED:
            return
        original = lance.fragment.write_fragments

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                _DATA_PHASE.seconds = time.perf_counter() - started

        lance.fragment.write_fragments = timed
        _DATA_PHASE_INSTALLED = True


def last_data_seconds() -> float:
    """Duration of this thread's last ``write_fragments`` call (0 if none)."""
    return float(getattr(_DATA_PHASE, "seconds", 0.0))


# ------------------------------------------------------------------------ output


def fmt(value: float | int | str | None, digits: int = 1) -> str:
    """A table cell: integers as is, floats rounded (``.0`` dropped), NaN/None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "-"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table (numbers right-aligned)."""

    def numeric(text: str) -> bool:
        return text.replace(".", "", 1).replace("-", "", 1).replace("%", "").isdigit()

    align = [
        "---:" if rows and all(numeric(row[i]) or row[i] == "-" for row in rows) else "---"
        for i in range(len(headers))
    ]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    return "\n".join(lines)


def write_json(path: str, payload: Any) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump(payload, out, indent=2, sort_keys=True, default=str)
        out.write("\n")


def environment() -> dict[str, str]:
    """Versions and machine facts to store next to results."""
    import platform

    import botocore
    import moto
    import pyarrow

    return {
        "python": platform.python_version(),
        "pylance": str(lance.__version__),
        "pyarrow": str(pyarrow.__version__),
        "boto3": str(boto3.__version__),
        "botocore": str(botocore.__version__),
        "moto": str(moto.__version__),
        "cpus": str(os.cpu_count()),
        "platform": platform.platform(),
    }
