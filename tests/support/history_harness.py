"""Randomized whole-system histories: every door of lancetx at once, faults, kill -9,
Ctrl-C, operators, and a checker that trusts only pylance.

A *history* is one table — or two, when a ``commit_many`` actor publishes to both —
(its own path in a shared bucket, and a DynamoDB table it shares with the few
histories of its batch, on one embedded moto server with legacy S3). Its
*schedule*, drawn from a seed, names actors and the faults their requests meet.
Actors run at once, each in its own worker process (a pre-forked pool, respawned
when a worker is killed):

* writers, each through one door: ``lancetx`` (the commit loop driven directly),
  ``async`` (the asyncio handler driven directly), ``pylance`` (``s3+ddb://``),
  ``table`` (``Table.append``, sync or ``lancetx.aio``), ``stream`` (the streaming
  writer, sync or aio, one batch per row), ``fragments`` (``commit_fragments`` of
  files pylance wrote, sync or aio), ``spark`` (a Spark-shaped job: two "tasks"
  write files as a new dataset, the "driver" commits them once with the job id,
  a failed job runs again with its id) and ``many`` (``commit_many`` appending to
  both tables, all or nothing);
* keyed writers commit with an idempotency key (``label/seq``; the Spark job id
  likewise) and call again with it after an error; a *twin* is a second process
  with the same keys and rows, at the same moment, so one of them must dedupe;
* ``reader`` (lancetx: finalizes what it finds), ``poller`` (pylance opening the
  tables every 50 ms until the writers are done: it finalizes staged versions)
  and ``maint`` (an operator at random moments: pylance tags a version,
  ``cleanup`` keeps the newest few versions, ``gc`` with a zero threshold).

Faults are injected by the server's interceptor, which tells actors apart by
their access key ids:

* ``lost``: the request is applied, the client sees a 500;
* ``5xx``: a 500 without applying it; ``throttle``: DynamoDB's
  ProvisionedThroughputExceeded / S3's SlowDown;
* ``reset`` / ``reset-landed``: the connection drops, before / after applying it;
* ``kill`` / ``kill-landed``: SIGKILL of the actor's process, before / after
  its request is applied;
* ``sigint`` / ``sigint-landed``: SIGINT (Ctrl-C) of the actor's process while it
  waits for the answer, before / after its request is applied.

They hit the n-th request of one kind: ``claim`` (a conditional PutItem, or a
``TransactWriteItems``: ``commit_many``, a keyed commit's version + key items) and
``flip`` (PutItem on an existing item), ``copy`` (CopyObject), ``stage`` (PUT of
a staged manifest), ``txn``/``data`` (PUT of a transaction / data file),
``query``/``getitem``, ``delete`` (DeleteObject(s), DeleteItem) and ``list``.
A keyed writer killed or interrupted is run again afterwards (a retried job,
a restarted program), with its keys.

Afterwards a pylance-only checker appends one row per table ("a fresh writer
commits next": no table is left wedged), lists the versions, opens every one and
reads the keys each one carries, and counts rows per (writer, seq, row). The
judge: versions 1..latest all there except those ``cleanup`` reported removing;
every version opens, and every version a reader opened still opens, with the
rows it had, unless cleanup removed it; tagged versions stay; every acknowledged
commit's rows exactly once (in both tables for ``commit_many``), any other at
most once and whole (all its rows, in both tables or neither); no idempotency
key or job id in two versions; every caller of one key told the same version,
and at most one of them that it committed anew; after maintenance, ``verify``
finds nothing. Errors an actor may meet under faults (unknown outcome, service
errors; Ctrl-C when it was sent one) are expected; others are anomalies.

pylance under a landed-but-lost claim: pylance 14 re-reads the item, sees its own
staged path and keeps the staged manifest (older releases deleted it, wedging the
version; :mod:`lancetx.externalstore.wedged` reports such a version). So the
fault is injected into pylance writers too, and a wedge would be an anomaly.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import multiprocessing
import os
import random
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse

#: Writers, by the door they commit through, and how often a schedule draws each.
WRITER_ROLES = ("lancetx", "async", "pylance", "table", "stream", "fragments", "spark", "many")
WRITER_WEIGHTS = (2, 1, 2, 2, 3, 2, 2, 1)
ROLES = (*WRITER_ROLES, "reader", "poller", "maint")
#: Doors that always carry a key (the Spark job id is one), and that may.
ALWAYS_KEYED = ("fragments", "spark")
MAYBE_KEYED = ("table", "stream")
#: Doors with a ``lancetx.aio`` variant, and how often it is drawn: an aio actor costs
#: several times a sync one (each ``lancetx.aio`` table opens its own aiobotocore
#: clients: service models parsed, CA bundle loaded, ~0.5 CPU-s).
AIO_ROLES = ("table", "stream", "fragments", "many")
AIO_SHARE = 0.15
#: Rows per commit (one per streamed batch / Spark task): a commit must land whole.
ROWS_PER_COMMIT = {"stream": 2, "spark": 2}
KINDS = ("claim", "flip", "copy", "stage", "txn", "data", "query", "getitem", "delete")
EFFECTS = (
    "lost",
    "5xx",
    "throttle",
    "reset",
    "reset-landed",
    "kill",
    "kill-landed",
    "sigint",
    "sigint-landed",
)
FAULT_EFFECTS = EFFECTS[:5]
#: One history in KILL_ONE_IN kills a writer process (a respawned worker costs
#: seconds of CPU for its first pylance call; the other faults cost nothing);
#: one in SIGINT_ONE_IN interrupts one.
KILL_ONE_IN = 12
SIGINT_ONE_IN = 6
#: pylance retries S3 and DynamoDB requests itself; these still reach it.
PYLANCE_KINDS = ("claim", "flip", "copy", "stage", "data")
READER_KINDS = ("query", "getitem", "copy", "flip")
MAINT_KINDS = ("query", "getitem", "delete", "list")
#: How long the server holds the answer of a request whose client it sent SIGINT,
#: so that the interrupt, not the answer, is what the client meets.
SIGINT_HOLD = 0.3

#: Errors an actor may meet under injected faults; anything else is an anomaly.
EXPECTED_LANCETX = (
    "CommitStateUnknownError",
    "RetriesExhaustedError",
    "AmbiguousWriteError",
    "ServiceUnavailableError",
    "ThrottledError",
    "EndpointUnreachableError",
    "TransientObjectStoreError",
    "ObjectStoreError",
    "ExternalStoreError",
    "JobCommitUnknownError",
    "JobCommitTimeoutError",
    "OSError",  # pylance's write_fragments inside a lancetx writer
    "GcDeleteError",  # a delete gc/cleanup reported failing (a fault): nothing lost
)
EXPECTED_PYLANCE = ("OSError", "RuntimeError", "ValueError")
#: What a lancetx writer says when a cleanup removed a version it must check against.
#: (Matched early in the text: actors' errors are cut at 300 characters.)
CLEANED_UNDER_A_WRITER = "; cleaned up?)"
#: What Ctrl-C looks like to a sync actor and to an asyncio one.
INTERRUPTED = ("KeyboardInterrupt", "CancelledError")

HISTORY_TIMEOUT = 90.0
#: What the fork server imports once, so that a new worker starts in milliseconds.
PRELOAD = [
    "pyarrow",
    "lance",
    "boto3",
    "aioboto3",
    "lancetx",
    "lancetx.aio",
    "lancetx.commit.engine.committer",
    "lancetx.externalstore.connect",
    "lancetx.externalstore.commit_handler",
    "lancetx.externalstore.dynamodb.store_async",
    "lancetx.commit.storage.s3store_async",
    "lancetx.ops.cleanup",
    "lancetx.ops.gc",
    "lancetx.ops.verify",
    "pyspark_lancetx.commit",
    "pyspark_lancetx.write_task",
]


# --------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Fault:
    kind: str
    nth: int
    effect: str


@dataclass(frozen=True)
class Actor:
    name: str
    role: str  # one of ROLES
    appends: tuple[int, ...]
    faults: tuple[Fault, ...]
    #: the rows' writer column and the keys' prefix; twins share it ("" = ``name``)
    label: str = ""
    keyed: bool = False
    aio: bool = False
    #: the table a single-table actor uses (0 or 1)
    table: int = 0
    #: maint: ("sleep", seconds), ("tag", fraction of the versions), ("cleanup", keep), ("gc", 0)
    steps: tuple[tuple[str, float], ...] = ()

    @property
    def rows_label(self) -> str:
        return self.label or self.name

    @property
    def writes(self) -> bool:
        return self.role in WRITER_ROLES

    @property
    def tables(self) -> tuple[int, ...]:
        return (0, 1) if self.role == "many" else (self.table,)

    @property
    def kind(self) -> str:
        """The role with its variant, as the summary counts actors."""
        tags = [self.role] + (["aio"] if self.aio else [])
        if self.keyed and self.role not in ALWAYS_KEYED:
            tags.append("keyed")
        return "/".join(tags)


@dataclass(frozen=True)
class Schedule:
    seed: int
    actors: tuple[Actor, ...]
    tables: int = 1


def make_schedule(seed: int) -> Schedule:
    """The schedule of history ``seed`` (a pure function of the seed)."""
    rng = random.Random(seed)
    actors: list[Actor] = []
    # Writer processes (twins included): as many as the plain writers of old.
    slots = rng.choice((1, 2, 2, 3))
    victim = rng.randrange(slots) if rng.randrange(KILL_ONE_IN) == 0 else None
    interrupted = rng.randrange(slots) if rng.randrange(SIGINT_ONE_IN) == 0 else None

    def faults_of(slot: int, role: str) -> tuple[Fault, ...]:
        faults = _faults(rng, role)
        if slot == victim:
            kinds = PYLANCE_KINDS if role == "pylance" else KINDS[:6]
            kill = rng.choice(("kill", "kill-landed"))
            faults = (*faults, Fault(_kind(rng, kinds), 1, kill))
        if slot == interrupted and slot != victim:
            kinds = PYLANCE_KINDS if role == "pylance" else KINDS[:8]
            effect = rng.choice(("sigint", "sigint-landed"))
            faults = (*faults, Fault(_kind(rng, kinds), 1, effect))
        return faults

    i = 0
    while len(actors) < slots:
        role = rng.choices(WRITER_ROLES, weights=WRITER_WEIGHTS)[0]
        keyed = role in ALWAYS_KEYED or (role in MAYBE_KEYED and rng.random() < 0.4)
        aio = role in AIO_ROLES and rng.random() < AIO_SHARE
        appends = tuple(range(rng.choice((1, 1, 1, 2))))
        table = 1 if rng.random() < 0.3 else 0  # used if the history has two tables
        faults = faults_of(len(actors), role)
        actor = Actor(f"w{i}", role, appends, faults, f"w{i}", keyed, aio, table)
        actors.append(actor)
        # A twin: the same keys and rows from another process at the same moment.
        if keyed and rng.random() < 0.6 and len(actors) < slots:
            twin_aio = role in AIO_ROLES and rng.random() < AIO_SHARE
            faults = faults_of(len(actors), role)
            actors.append(dataclasses.replace(actor, name=f"w{i}t", faults=faults, aio=twin_aio))
        i += 1
    tables = 2 if any(a.role == "many" for a in actors) else 1
    if tables == 1:
        actors = [dataclasses.replace(a, table=0) for a in actors]
    if rng.random() < 0.15:
        actors.append(
            Actor("r0", "reader", (), _faults(rng, "reader"), table=rng.randrange(tables))
        )
    if rng.random() < 0.2:
        faults = _faults(rng, "poller")
        if rng.random() < 0.1:
            faults = (*faults, Fault(rng.choice(("copy", "flip")), 1, "kill-landed"))
        actors.append(Actor("p0", "poller", (), faults))
    if rng.random() < 0.15:
        steps: list[tuple[str, float]] = []
        for _ in range(rng.choice((1, 2, 2))):
            # writers commit from about half a second to a few seconds in
            steps.append(("sleep", rng.choice((0.2, 0.6, 1.2, 2.0))))
            op = rng.choices(("tag", "cleanup", "gc"), weights=(2, 3, 2))[0]
            arg = {"tag": rng.random(), "cleanup": float(rng.choice((1, 1, 2))), "gc": 0.0}[op]
            steps.append((op, arg))
        faults = _faults(rng, "maint")
        if rng.random() < 0.25:  # the operator's process dies, or is interrupted, mid-way
            kill = rng.choice(("kill", "kill-landed", "sigint", "sigint-landed"))
            faults = (*faults, Fault("delete", rng.choice((1, 2)), kill))
        actors.append(
            Actor(
                "m0",
                "maint",
                (),
                faults,
                table=rng.randrange(tables),
                steps=tuple(steps),
            )
        )
    return Schedule(seed, tuple(actors), tables)


def _faults(rng: random.Random, role: str) -> tuple[Fault, ...]:
    if rng.random() < 0.35:
        return ()
    kinds: tuple[str, ...] = KINDS
    if role == "pylance":
        kinds = PYLANCE_KINDS
    elif role in ("reader", "poller"):
        kinds = READER_KINDS
    elif role == "maint":
        kinds = MAINT_KINDS
    count = rng.choice((1, 1, 1, 2))
    return tuple(
        Fault(
            _kind(rng, kinds),
            rng.choice((1, 1, 2)),
            rng.choices(FAULT_EFFECTS, weights=(4, 2, 2, 2, 3))[0],
        )
        for _ in range(count)
    )


def _kind(rng: random.Random, kinds: tuple[str, ...]) -> str:
    """A request kind; the claim, where a commit's outcome is decided, three times as often."""
    return rng.choices(kinds, weights=[3 if k == "claim" else 1 for k in kinds])[0]


# ------------------------------------------------------------------ the server side


def request_kind(request: InterceptedRequest) -> str | None:
    """What a request is, in the terms of a schedule's faults."""
    if request.service == "dynamodb":
        if request.target in ("PutItem", "TransactWriteItems"):
            if b"attribute_not_exists" in request.body:
                return "claim"
            if b"attribute_exists(" in request.body:
                return "flip"
            return None
        return {"Query": "query", "GetItem": "getitem", "DeleteItem": "delete"}.get(request.target)
    if request.method == "DELETE" or (request.method == "POST" and "delete" in request.query):
        return "delete"
    if request.method == "GET" and "list-type" in request.query:
        return "list"
    if request.method != "PUT":
        return None
    if "x-amz-copy-source" in request.headers:
        return "copy"
    if "/_versions/" in request.path:
        return "stage"
    if "/_transactions/" in request.path:
        return "txn"
    if "/data/" in request.path:
        return "data"
    return None


def access_key(request: InterceptedRequest) -> str | None:
    auth = request.headers.get("authorization", "")
    marker = "Credential="
    if marker not in auth:
        return None
    return auth.split(marker, 1)[1].split("/", 1)[0]


def _error(request: InterceptedRequest, status: int, code: str) -> InterceptedResponse:
    if request.service == "dynamodb":
        body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code})
        return InterceptedResponse(
            status, body.encode(), [("Content-Type", "application/x-amz-json-1.0")]
        )
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code></Error>"
    return InterceptedResponse(status, body.encode(), [("Content-Type", "application/xml")])


@dataclass
class _Running:
    faults: list[Fault]
    pid: int | None = None
    seen: collections.Counter[str] = field(default_factory=collections.Counter)
    fired: list[str] = field(default_factory=list)
    #: every request the actor made (what it cost the server)
    requests: int = 0


class FaultInjector:
    """The server's interceptor: applies each running actor's faults to its requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._actors: dict[str, _Running] = {}
        #: requests of keys no actor holds (the harness, the checker)
        self.unregistered = 0

    def register(self, key: str, faults: tuple[Fault, ...], pid: int | None) -> None:
        with self._lock:
            self._actors[key] = _Running(list(faults), pid)

    def unregister(self, key: str) -> tuple[list[str], int]:
        """The faults that fired for ``key`` and how many requests it made."""
        with self._lock:
            running = self._actors.pop(key, None)
        return (running.fired, running.requests) if running else ([], 0)

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        key = access_key(request)
        if key is None:
            return None
        kind = request_kind(request)
        with self._lock:
            running = self._actors.get(key)
            if running is None:
                self.unregistered += 1
                return None
            running.requests += 1
            if kind is None:
                return None
            running.seen[kind] += 1
            nth = running.seen[kind]
            fault = next((f for f in running.faults if f.kind == kind and f.nth == nth), None)
            if fault is None:
                return None
            running.faults.remove(fault)
            running.fired.append(fault.effect)
            pid = running.pid
        return self._response(request, fault.effect, pid)

    @staticmethod
    def _response(request: InterceptedRequest, effect: str, pid: int | None) -> InterceptedResponse:
        def kill() -> None:
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        ddb = request.service == "dynamodb"
        if effect == "lost":
            response = _error(request, 500, "InternalServerError" if ddb else "InternalError")
            response.after_forwarding = True
        elif effect == "5xx":
            response = _error(request, 500, "InternalServerError" if ddb else "InternalError")
        elif effect == "throttle":
            response = (
                _error(request, 400, "ProvisionedThroughputExceededException")
                if ddb
                else _error(request, 503, "SlowDown")
            )
        elif effect in ("reset", "reset-landed"):
            response = InterceptedResponse(0, reset=True, after_forwarding=effect == "reset-landed")
        elif effect in ("sigint", "sigint-landed"):

            def interrupt() -> None:
                if pid is not None:
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGINT)
                    time.sleep(SIGINT_HOLD)  # the interrupt, not this answer, meets it

            response = _error(request, 500, "InternalServerError" if ddb else "InternalError")
            response.after_forwarding = effect == "sigint-landed"
            response.then = interrupt
        else:  # kill, kill-landed
            response = _error(request, 500, "InternalServerError" if ddb else "InternalError")
            response.after_forwarding = effect == "kill-landed"
            response.then = kill
        return response


# -------------------------------------------------------------------- the workers


class Worker:
    def __init__(self, ctx: Any) -> None:
        import history_worker

        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=history_worker.serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.conn: Connection = parent
        #: set when the worker died, timed out or may still be answering an old job:
        #: it is replaced, never handed out again
        self.spent = False

    @property
    def pid(self) -> int | None:
        return self.process.pid  # type: ignore[no-any-return]

    def alive(self) -> bool:
        return not self.spent and bool(self.process.is_alive())

    def stop(self) -> None:
        self.conn.close()
        self.process.kill()
        self.process.join(5)


class Pool:
    """Pre-forked, warmed-up workers (through a fork server that imported lance and
    lancetx once); a killed worker is replaced in the background."""

    def __init__(self, size: int, warm_job: dict[str, Any]) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        # Installed packages only: the fork server may not see the tests' sys.path,
        # and it skips a preload it cannot import without a word.
        self._ctx.set_forkserver_preload(PRELOAD)
        self.failure: str | None = None
        self._warm_job = warm_job
        self._cond = threading.Condition()
        self._free: list[Worker] = []
        self.respawned = 0
        starting = [threading.Thread(target=self._spawn) for _ in range(size)]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()

    def _spawn(self) -> None:
        worker = Worker(self._ctx)
        warmed = call(worker, self._warm_job)
        with self._cond:
            if not warmed.get("done") or warmed.get("error"):
                # A worker that cannot even start would be respawned forever.
                self.failure = f"a new worker failed to start: {warmed}"
                self._cond.notify_all()
                worker.stop()
                return
            self._free.append(worker)
            self._cond.notify_all()

    def acquire(self, count: int) -> list[Worker]:
        with self._cond:
            self._cond.wait_for(lambda: len(self._free) >= count or self.failure is not None)
            if self.failure is not None:
                raise RuntimeError(self.failure)
            taken, self._free = self._free[:count], self._free[count:]
        return taken

    def release(self, workers: list[Worker]) -> None:
        alive: list[Worker] = []
        for worker in workers:
            if worker.alive():
                alive.append(worker)
            else:
                worker.stop()
                self.respawned += 1
                threading.Thread(target=self._spawn, daemon=True).start()
        with self._cond:
            self._free.extend(alive)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            for worker in self._free:
                worker.stop()
            self._free = []


def call(worker: Worker, job: dict[str, Any], timeout: float = HISTORY_TIMEOUT) -> dict[str, Any]:
    """Run one job to its end on ``worker``; a dead worker answers ``{"killed": True}``."""
    try:
        worker.conn.send(job)
    except OSError:
        worker.spent = True
        return {"killed": True, "events": []}
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
            worker.spent = True
            worker.process.kill()
            return {"timeout": True, "events": events}
        try:
            message: dict[str, Any] = worker.conn.recv()
        except (EOFError, OSError):
            worker.spent = True
            return {"killed": True, "events": events}
        if message.get("done"):
            return {**message, "events": events}
        events.append(message)


# ------------------------------------------------------------------- one history


# ------------------------------------------------------------------- one history


@dataclass
class Outcome:
    seed: int
    schedule: Schedule
    anomalies: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    acknowledged: int = 0
    unacknowledged_present: int = 0
    deduplicated: int = 0
    killed: int = 0
    interrupted: int = 0
    reruns: int = 0
    removed_versions: int = 0
    opened_versions: int = 0
    seconds: float = 0.0
    #: CPU seconds of the worker processes, by actor kind (and "init", "check")
    cpu: collections.Counter[str] = field(default_factory=collections.Counter)
    #: requests to the server, by actor kind
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    #: each actor's run: seconds, faults fired, errors, what it reported (for replays)
    details: list[str] = field(default_factory=list)


#: Histories (consecutive seeds) that share one DynamoDB table. moto answers a Query by
#: scanning every item of the table, not one partition key's: with one table for all
#: histories every Query got slower as the run went on, which DynamoDB's do not.
HISTORIES_PER_TABLE = 10


class HistoryTables:
    """The DynamoDB table of each history: one per :data:`HISTORIES_PER_TABLE`
    consecutive seeds, created on first use."""

    def __init__(self, aws: EmbeddedAws, prefix: str) -> None:
        self._aws = aws
        self._prefix = prefix
        self._made: set[str] = set()
        self._lock = threading.Lock()

    def for_seed(self, seed: int) -> str:
        from protocol_helpers import ensure_ddb_table

        name = f"{self._prefix}-{seed // HISTORIES_PER_TABLE}"
        with self._lock:
            if name not in self._made:
                ensure_ddb_table(self._aws.pylance_storage_options(), name)
                self._made.add(name)
        return name


@dataclass(frozen=True)
class World:
    aws: EmbeddedAws
    bucket: str
    #: the template's table (each history runs in its batch's: ``tables``)
    ddb_table: str
    injector: FaultInjector
    #: version 1 every history starts from: its base, object keys and item
    template: dict[str, Any]
    tables: HistoryTables


def make_template(aws: EmbeddedAws, bucket: str, ddb_table: str) -> dict[str, Any]:
    """A table with one row ("init", 0) written by pylance; histories start from copies."""
    import boto3
    import lance
    from protocol_helpers import batch

    base = "template/t.lance"
    uri = f"s3+ddb://{bucket}/{base}?ddbTableName={ddb_table}"
    lance.write_dataset(batch("init", 0, 1), uri, storage_options=aws.pylance_storage_options())
    s3 = boto3.client("s3", **aws.client_kwargs())
    objects = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=base + "/")["Contents"]]
    ddb = boto3.client("dynamodb", **aws.client_kwargs())
    key = {"base_uri": {"S": base}, "version": {"N": "1"}}
    item = ddb.get_item(TableName=ddb_table, Key=key, ConsistentRead=True)["Item"]
    return {"base": base, "objects": objects, "item": item}


def _options(world: World, key: str) -> dict[str, str]:
    options = world.aws.pylance_storage_options()
    options["aws_access_key_id"] = key
    options["dynamodb_read_timeout"] = "5"
    return options


#: ``LANCETX_HISTORY_VERBOSE=2``: actors return lancetx's log too (for a replay).
LOG_ACTORS = os.environ.get("LANCETX_HISTORY_VERBOSE") == "2"


def _job(actor: Actor, uris: list[str], options: dict[str, str]) -> dict[str, Any]:
    """What a worker is told to do as ``actor``."""
    job: dict[str, Any] = {
        "log": LOG_ACTORS,
        "role": actor.role,
        "actor": actor.name,
        "label": actor.rows_label,
        "keyed": actor.keyed,
        "aio": actor.aio,
        "appends": list(actor.appends),
        "options": options,
        "uri": uris[actor.table],
        "uris": uris,
        "table": actor.table,
        "steps": [list(s) for s in actor.steps],
    }
    job["job"] = {"reader": "read", "poller": "poll", "maint": "maint"}.get(actor.role, "write")
    return job


@dataclass
class _Ran:
    """One actor's run as the harness saw it."""

    actor: Actor
    result: dict[str, Any]
    fired: list[str]
    requests: int = 0


def run_history(world: World, pool: Pool, seed: int) -> Outcome:
    """Run and check history ``seed``."""
    started = time.monotonic()
    schedule = make_schedule(seed)
    outcome = Outcome(seed, schedule)
    stamp = f"h{seed}-{os.getpid()}-{time.monotonic_ns()}"
    bases = [f"{stamp}/t{t}.lance" for t in range(schedule.tables)]
    ddb_table = world.tables.for_seed(seed)
    uris = [f"s3+ddb://{world.bucket}/{base}?ddbTableName={ddb_table}" for base in bases]

    created = _call_one(
        pool,
        {
            "job": "init",
            "template": world.template,
            "bases": bases,
            "bucket": world.bucket,
            "ddb_table": ddb_table,
            "endpoint": world.aws.endpoint,
        },
    )
    outcome.cpu["init"] += created.get("cpu", 0.0)
    if "version" not in created:
        outcome.anomalies.append(f"creating the tables failed: {created}")
        return outcome

    ran = _run_actors(world, pool, seed, list(schedule.actors), uris, "")
    # A keyed writer killed or interrupted runs again (a retried job, a restarted
    # program): with its keys, it must find what landed and commit the rest once.
    again = [
        r.actor
        for r in ran
        if r.actor.writes
        and (r.actor.keyed or r.actor.role in ALWAYS_KEYED)
        and (r.result.get("killed") or _was_interrupted(r.result))
    ]
    if again:
        clean = [dataclasses.replace(a, faults=()) for a in again]
        ran += _run_actors(world, pool, seed, clean, uris, "rerun")
        outcome.reruns += len(again)
    for r in ran:
        _account(outcome, r)

    checker = f"H{seed}XcheckX{os.getpid()}"
    world.injector.register(checker, (), None)  # no faults: counted only
    checked = _call_one(
        pool,
        {
            "job": "check",
            "uris": uris,
            "options": _options(world, checker),
            "verify": any(a.role == "maint" for a in schedule.actors),
            "keys": any(a.keyed or a.role in ALWAYS_KEYED for a in schedule.actors),
        },
    )
    outcome.requests["check"] += world.injector.unregister(checker)[1]
    outcome.cpu["check"] += checked.get("cpu", 0.0)
    outcome.details.append(f"check {checked.get('wall', 0.0):.1f} s: {checked}")
    _judge(outcome, checked, [(r.actor, r.result.get("events", [])) for r in ran])
    outcome.seconds = time.monotonic() - started
    return outcome


def _call_one(pool: Pool, job: dict[str, Any]) -> dict[str, Any]:
    (worker,) = pool.acquire(1)
    try:
        return call(worker, job)
    finally:
        pool.release([worker])


def _run_actors(
    world: World, pool: Pool, seed: int, actors: list[Actor], uris: list[str], phase: str
) -> list[_Ran]:
    """Run ``actors`` at once, each in its own worker; pollers run until the others end."""
    workers = pool.acquire(len(actors))
    ran: list[_Ran] = []
    try:
        keys = [f"H{seed}X{a.name}{phase}X{os.getpid()}" for a in actors]
        for actor, worker, key in zip(actors, workers, keys, strict=True):
            world.injector.register(key, actor.faults, worker.pid)
            try:
                worker.conn.send(_job(actor, uris, _options(world, key)))
            except OSError:
                worker.spent = True  # died before its job; the collection sees EOF
        try:
            results = _collect(workers, [a.role == "poller" for a in actors])
        except BaseException:
            for worker in workers:
                worker.spent = True  # may still be running its job
            raise
        for actor, key, worker, result in zip(actors, keys, workers, results, strict=True):
            if result.get("dirty"):
                worker.spent = True
            ran.append(_Ran(actor, result, *world.injector.unregister(key)))
    finally:
        pool.release(workers)
    return ran


def _was_interrupted(result: dict[str, Any]) -> bool:
    return str(result.get("error", "")).startswith(INTERRUPTED)


def _account(outcome: Outcome, r: _Ran) -> None:
    actor, result = r.actor, r.result
    outcome.fired += r.fired
    ended = [k for k in ("killed", "timeout", "dirty") if result.get(k)]
    outcome.details.append(
        f"{actor.name} ({actor.kind}) {result.get('wall', 0.0):.1f} s {' '.join(ended)} "
        f"fired {r.fired} errors {result.get('errors', [])} {result.get('error', '')} "
        f"reported {result.get('events', [])}"
        + "".join(f"\n      {line}" for line in result.get("log", []))
    )
    outcome.cpu[actor.kind] += result.get("cpu", 0.0)
    outcome.requests[actor.kind] += r.requests
    if result.get("killed"):
        outcome.killed += 1
    if _was_interrupted(result):
        outcome.interrupted += 1
    if result.get("timeout"):
        outcome.anomalies.append(f"{actor.name} ({actor.kind}) did not finish in time")
    sigint = any(f.startswith("sigint") for f in r.fired)
    for error in result.get("errors", []) + ([result["error"]] if result.get("error") else []):
        # A reader or an operator meets no error unless a fault hit its own requests:
        # another actor's fault (a writer killed after staging, say) is for it to survive.
        if not _expected(actor.role, error, sigint) or (not actor.writes and not r.fired):
            outcome.anomalies.append(f"{actor.name} ({actor.kind}): {error}")


def _collect(workers: list[Worker], pollers: list[bool]) -> list[dict[str, Any]]:
    results: list[dict[str, Any] | None] = [None] * len(workers)
    events: list[list[dict[str, Any]]] = [[] for _ in workers]
    pending = {w.conn: i for i, w in enumerate(workers)}
    stopped = False
    deadline = time.monotonic() + HISTORY_TIMEOUT
    while pending:
        if not stopped and all(pollers[i] for i in pending.values()):
            stopped = True
            for i in pending.values():
                with suppress(OSError):
                    workers[i].conn.send({"stop": True})
        ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            for i in pending.values():
                workers[i].spent = True
                workers[i].process.kill()
                results[i] = {"timeout": True, "events": events[i]}
            break
        for conn in ready:
            i = pending[conn]  # type: ignore[index]
            try:
                message = conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):
                workers[i].spent = True
                results[i] = {"killed": True, "events": events[i]}
                del pending[conn]  # type: ignore[arg-type]
                continue
            if message.get("done"):
                results[i] = {**message, "events": events[i]}
                del pending[conn]  # type: ignore[arg-type]
            else:
                events[i].append(message)
    return [r if r is not None else {"events": []} for r in results]


def _expected(role: str, error: str, sigint: bool = False) -> bool:
    name = error.split(":", 1)[0]
    if name in INTERRUPTED:
        return sigint
    if name == "InvalidCommitError" and CLEANED_UNDER_A_WRITER in error:
        # An operator's cleanup (keep-versions, no age floor) removed versions a
        # writer in flight had to check its commit against: it stops, nothing lost.
        return role != "reader"
    allowed = EXPECTED_PYLANCE if role in ("pylance", "poller") else EXPECTED_LANCETX
    return name in allowed


#: The transaction property that carries each keyed door's key, and the key's form.
def _key_of(actor: Actor, seq: int) -> str:
    if actor.role == "spark":
        return f"lancetx.spark.job_id={actor.rows_label}/{seq}"
    return f"lancetx.idempotency_key={actor.rows_label}/{seq}"


def _judge(
    outcome: Outcome, checked: dict[str, Any], events: list[tuple[Actor, list[dict[str, Any]]]]
) -> None:
    """The anomalies of a history, from the checker's view and what actors reported."""
    if "tables" not in checked:
        outcome.anomalies.append(f"the checker failed: {checked}")
        return
    tables: list[dict[str, Any]] = checked["tables"]
    removed: dict[int, set[int]] = collections.defaultdict(set)
    removed_upto: dict[int, int] = collections.defaultdict(int)
    unfinished: list[tuple[int, int]] = []  # cleanups that never said what they removed
    tagged: dict[int, set[int]] = collections.defaultdict(set)
    opened: list[tuple[str, int, int, int]] = []
    acks: dict[tuple[str, int], list[tuple[Actor, dict[str, Any]]]] = collections.defaultdict(list)
    for actor, reported in events:
        for event in reported:
            if "ack" in event:
                acks[(actor.rows_label, int(event["ack"]))].append((actor, event))
            elif "opened" in event:
                opened.append((actor.name, event["table"], event["opened"], event["rows"]))
            elif "cleanup" in event:
                unfinished.append((event["table"], int(event["cleanup"])))
            elif "removed" in event:
                removed[event["table"]].update(event["removed"])
                unfinished.pop()
            elif "tagged" in event:
                tagged[event["table"]].add(event["tagged"])
    for t, keep in unfinished:
        # It removed at most the oldest versions below the newest ``keep`` (of those before
        # the checker's own commit).
        if "fresh" in tables[t]:
            removed_upto[t] = max(removed_upto[t], tables[t]["fresh"] - 1 - keep)
    outcome.opened_versions = len(opened)
    outcome.removed_versions = sum(len(v) for v in removed.values())

    for t, table in enumerate(tables):
        name = f"table {t}: " if len(tables) > 1 else ""
        if "wedged" in table:
            outcome.anomalies.append(
                f"{name}a fresh pylance writer could not commit: {table['wedged']}"
            )
            continue
        gone = removed[t]
        listed = set(table["versions"])
        missing = [
            v
            for v in range(1, table["latest"] + 1)
            if v not in listed and v not in gone and v > removed_upto[t]
        ]
        if missing:
            outcome.anomalies.append(f"{name}versions missing (not removed by cleanup): {missing}")
        if listed & gone:
            outcome.anomalies.append(
                f"{name}versions cleanup removed are listed: {sorted(listed & gone)}"
            )
        for problem in table["unopenable"]:
            outcome.anomalies.append(f"{name}version does not open: {problem}")
        for version in sorted(tagged[t] - listed):
            outcome.anomalies.append(f"{name}tagged version {version} is gone")
        counts = {int(v): n for v, n in table["counts"].items()}
        for reader, rt, version, rows in opened:
            if rt != t or version in gone or version <= removed_upto[t]:
                continue
            if version not in counts:
                outcome.anomalies.append(
                    f"{name}version {version} ({reader} opened it) no longer opens"
                )
            elif counts[version] != rows:
                outcome.anomalies.append(
                    f"{name}version {version} had {rows} rows when {reader} opened it, "
                    f"now {counts[version]}"
                )
        for key, versions in table["keys"].items():
            if len(versions) > 1:
                outcome.anomalies.append(f"{name}key {key} in versions {versions}")
    for problem in checked.get("verify", []):
        outcome.anomalies.append(f"verify after the history: {problem}")
    if any("wedged" in table for table in tables):
        return

    # Commits: (table, label, seq) -> how many times each of its rows is present.
    present: dict[tuple[int, str, int], collections.Counter[int]] = collections.defaultdict(
        collections.Counter
    )
    for t, table in enumerate(tables):
        for row, count in table["rows"].items():
            label, seq, i = row.rsplit("/", 2)
            present[(t, label, int(seq))][int(i)] += count
    for t in range(len(tables)):
        for special in ("init", "fresh"):
            if present.pop((t, special, 0), collections.Counter()) != {0: 1}:
                outcome.anomalies.append(f"table {t}: row {special}/0 not present exactly once")
    writers: dict[str, Actor] = {}
    for actor in outcome.schedule.actors:
        if actor.writes:
            writers.setdefault(actor.rows_label, actor)
    for (t, label, seq), rows in present.items():
        actor = writers.get(label)
        if actor is None or seq not in actor.appends or t not in actor.tables:
            outcome.anomalies.append(f"unknown rows {label}/{seq} in table {t}: {dict(rows)}")
    for label, actor in writers.items():
        width = ROWS_PER_COMMIT.get(actor.role, 1)
        for seq in actor.appends:
            times: list[int] = []
            for t in actor.tables:
                rows = present.get((t, label, seq), collections.Counter())
                counts_of_rows = [rows.get(i, 0) for i in range(width)]
                if len(set(counts_of_rows)) > 1:
                    outcome.anomalies.append(
                        f"commit {label}/{seq} torn in table {t}: rows present {counts_of_rows}"
                    )
                times.append(max(counts_of_rows))
            acked = acks.get((label, seq), [])
            if acked:
                outcome.acknowledged += 1
                if any(n != 1 for n in times):
                    outcome.anomalies.append(
                        f"acknowledged commit {label}/{seq} present {times} times"
                    )
            else:
                if any(n > 1 for n in times):
                    outcome.anomalies.append(f"commit {label}/{seq} present {times} times")
                if len(set(times)) > 1:
                    outcome.anomalies.append(
                        f"commit {label}/{seq} landed in some tables only: {times}"
                    )
                outcome.unacknowledged_present += max(times)
            if actor.keyed or actor.role in ALWAYS_KEYED:
                _judge_key(outcome, tables, removed, removed_upto, actor, seq, acked)


def _judge_key(
    outcome: Outcome,
    tables: list[dict[str, Any]],
    removed: dict[int, set[int]],
    removed_upto: dict[int, int],
    actor: Actor,
    seq: int,
    acked: list[tuple[Actor, dict[str, Any]]],
) -> None:
    """Every caller of one key is told the same version, the one holding the key, and
    at most one of them that it committed anew."""
    label = f"{actor.rows_label}/{seq}"
    versions = sorted({int(e["version"]) for _, e in acked})
    fresh = [a.name for a, e in acked if not e.get("dedup")]
    outcome.deduplicated += sum(1 for _, e in acked if e.get("dedup"))
    if len(fresh) > 1:
        outcome.anomalies.append(f"key {label}: {fresh} were each told they committed it")
    if len(versions) > 1:
        outcome.anomalies.append(f"key {label}: callers told different versions {versions}")
    t = actor.table
    holding = tables[t]["keys"].get(_key_of(actor, seq), [])
    for version in versions:
        if version in removed[t] or version <= removed_upto[t]:
            continue
        if holding != [version]:
            outcome.anomalies.append(
                f"key {label}: acknowledged at version {version}, found in {holding}"
            )


# ------------------------------------------------------------------------ a run


@dataclass
class Summary:
    histories: int = 0
    actors: collections.Counter[str] = field(default_factory=collections.Counter)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    acknowledged: int = 0
    unacknowledged_present: int = 0
    deduplicated: int = 0
    killed: int = 0
    interrupted: int = 0
    reruns: int = 0
    respawned: int = 0
    removed_versions: int = 0
    opened_versions: int = 0
    two_tables: int = 0
    anomalies: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0
    cpu: collections.Counter[str] = field(default_factory=collections.Counter)
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    #: requests of the harness itself (creating tables) and of the checker
    other_requests: int = 0
    #: CPU seconds of this process (the embedded server and the harness)
    server_cpu: float = 0.0
    slowest: list[tuple[float, int, str]] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.histories += 1
        self.actors.update(a.kind for a in outcome.schedule.actors)
        self.actors.update("twin" for a in outcome.schedule.actors if a.name.endswith("t"))
        self.faults.update(outcome.fired)
        self.acknowledged += outcome.acknowledged
        self.unacknowledged_present += outcome.unacknowledged_present
        self.deduplicated += outcome.deduplicated
        self.killed += outcome.killed
        self.interrupted += outcome.interrupted
        self.reruns += outcome.reruns
        self.removed_versions += outcome.removed_versions
        self.opened_versions += outcome.opened_versions
        self.two_tables += outcome.schedule.tables == 2
        self.anomalies += [(outcome.seed, a) for a in outcome.anomalies]
        self.cpu.update(outcome.cpu)
        self.requests.update(outcome.requests)
        roles = "+".join(a.kind for a in outcome.schedule.actors)
        self.slowest = sorted([*self.slowest, (outcome.seconds, outcome.seed, roles)])[-5:]

    def line(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        actors = ", ".join(f"{k} {v}" for k, v in sorted(self.actors.items()))
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in self.cpu.most_common())
        requests = ", ".join(f"{k} {v}" for k, v in self.requests.most_common())
        slowest = "; ".join(f"seed {s} {t:.1f} s ({r})" for t, s, r in reversed(self.slowest))
        return (
            f"randomized histories: {self.histories} histories in {self.seconds:.0f} s "
            f"({self.two_tables} with two tables); actors: {actors}; "
            f"faults fired: {sum(self.faults.values())} ({faults}); "
            f"processes killed: {self.killed} (respawned {self.respawned}); "
            f"interrupted (Ctrl-C): {self.interrupted}; keyed writers run again: {self.reruns}; "
            f"acknowledged commits: {self.acknowledged} ({self.deduplicated} deduplicated "
            f"acknowledgements); unacknowledged but committed: {self.unacknowledged_present}; "
            f"versions opened by readers: {self.opened_versions}; removed by cleanup: "
            f"{self.removed_versions}; CPU s: server+harness {self.server_cpu:.0f}, "
            f"workers {sum(self.cpu.values()):.0f} ({cpu}); requests: actors "
            f"{sum(self.requests.values())} ({requests}), checker and harness "
            f"{self.other_requests}; slowest: {slowest}; "
            f"anomalies: {len(self.anomalies)}"
        )


@contextmanager
def harness(
    aws: EmbeddedAws, bucket: str, ddb_table: str, workers: int
) -> Iterator[tuple[World, Pool]]:
    template = make_template(aws, bucket, ddb_table)
    injector = FaultInjector()
    aws.set_interceptor(injector)
    warm_uri = f"s3+ddb://{bucket}/{template['base']}?ddbTableName={ddb_table}"
    pool = Pool(workers, {"job": "warm", "uri": warm_uri, "options": aws.pylance_storage_options()})
    try:
        yield World(aws, bucket, ddb_table, injector, template, HistoryTables(aws, ddb_table)), pool
    finally:
        aws.set_interceptor(None)
        pool.close()


def run_histories(
    world: World,
    pool: Pool,
    seeds: list[int],
    parallel: int,
    progress: Callable[[Outcome], None] | None = None,
) -> Summary:
    summary = Summary()
    started = time.monotonic()
    own = resource.getrusage(resource.RUSAGE_SELF)
    lock = threading.Lock()
    queue = list(reversed(seeds))

    def runner() -> None:
        while True:
            with lock:
                if not queue:
                    return
                seed = queue.pop()
            try:
                outcome = run_history(world, pool, seed)
            except Exception as exc:  # the harness itself failed on this seed
                outcome = Outcome(seed, make_schedule(seed), anomalies=[f"harness: {exc!r}"])
            with lock:
                summary.add(outcome)
            if progress is not None:
                progress(outcome)

    threads = [threading.Thread(target=runner, daemon=True) for _ in range(parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary.seconds = time.monotonic() - started
    now = resource.getrusage(resource.RUSAGE_SELF)
    summary.server_cpu = now.ru_utime + now.ru_stime - own.ru_utime - own.ru_stime
    summary.respawned = pool.respawned
    summary.other_requests = world.injector.unregistered
    return summary
