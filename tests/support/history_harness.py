"""Randomized whole-system histories: writer processes, faults, kill -9, and a
checker that trusts only pylance.

A *history* is one table (its own path in a shared bucket, and a DynamoDB table it
shares with the few histories of its batch, on one embedded moto server). Its *schedule*, drawn from a seed, names actors —
writers (lancetx sync, lancetx async, pylance ``s3+ddb://``) and
readers/finalizers — how many appends each makes, and the faults its requests
meet. Actors run at once, each in its own worker process (a pre-forked pool,
respawned when a worker is killed). Faults are injected by the server's
interceptor, which tells actors apart by their access key ids:

* ``lost``: the request is applied, the client sees a 500;
* ``5xx``: a 500 without applying it; ``throttle``: DynamoDB's
  ProvisionedThroughputExceeded / S3's SlowDown;
* ``reset`` / ``reset-landed``: the connection drops, before / after applying it;
* ``kill`` / ``kill-landed``: SIGKILL of the actor's process, before / after
  its request is applied.

They hit the n-th request of one kind: ``claim`` and ``flip`` (conditional
PutItems), ``copy`` (CopyObject), ``stage`` (PUT of a staged manifest),
``txn``/``data`` (PUT of a transaction / data file), ``query``/``getitem``.

Afterwards a pylance-only checker appends one row ("a fresh writer commits
next": no table is left wedged), lists the versions (contiguous from 1), opens
every one, and counts rows per (writer, seq): every acknowledged append exactly
once, any other at most once, nothing unknown. Errors an actor may meet under
faults (unknown outcome, service errors) are expected; others are anomalies.

pylance under a landed-but-lost claim: pylance 14 re-reads the item, sees its own
staged path and keeps the staged manifest (older releases deleted it, wedging the
version; :mod:`lancetx.externalstore.wedged` reports such a version). So the
fault is injected into pylance writers too, and a wedge would be an anomaly.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from lancetx.externalstore.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse

ROLES = ("lancetx", "async", "pylance")
KINDS = ("claim", "flip", "copy", "stage", "txn", "data", "query", "getitem")
EFFECTS = ("lost", "5xx", "throttle", "reset", "reset-landed", "kill", "kill-landed")
FAULT_EFFECTS = EFFECTS[:5]
KILL_ONE_IN = 12
#: pylance retries S3 and DynamoDB requests itself; these still reach it.
PYLANCE_KINDS = ("claim", "flip", "copy", "stage", "data")

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
    "OSError",  # pylance's write_fragments inside a lancetx writer
)
EXPECTED_PYLANCE = ("OSError", "RuntimeError", "ValueError")

HISTORY_TIMEOUT = 90.0
#: What the fork server imports once, so that a new worker starts in milliseconds.
PRELOAD = [
    "pyarrow",
    "lance",
    "boto3",
    "aioboto3",
    "lancetx.commit.engine.committer",
    "lancetx.externalstore.connect",
    "lancetx.externalstore.commit_handler",
    "lancetx.externalstore.dynamodb_async",
    "lancetx.commit.storage.s3store_async",
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
    role: str  # lancetx | async | pylance | reader
    appends: tuple[int, ...]
    faults: tuple[Fault, ...]


@dataclass(frozen=True)
class Schedule:
    seed: int
    actors: tuple[Actor, ...]


def make_schedule(seed: int) -> Schedule:
    """The schedule of history ``seed`` (a pure function of the seed)."""
    rng = random.Random(seed)
    actors: list[Actor] = []
    writers = rng.choice((1, 2, 2, 3))
    # One history in KILL_ONE_IN kills a writer process (a respawned worker costs
    # seconds of CPU for its first pylance call; the other faults cost nothing).
    victim = rng.randrange(writers) if rng.randrange(KILL_ONE_IN) == 0 else None
    for i in range(writers):
        role = rng.choices(ROLES, weights=(4, 2, 2))[0]
        appends = tuple(range(rng.choice((1, 1, 2))))
        faults = _faults(rng, role)
        if i == victim:
            kinds = PYLANCE_KINDS if role == "pylance" else KINDS[:6]
            kill = Fault(rng.choice(kinds), 1, rng.choice(("kill", "kill-landed")))
            faults = (*faults, kill)
        actors.append(Actor(f"w{i}", role, appends, faults))
    if rng.random() < 0.3:
        actors.append(Actor("r0", "reader", (), _faults(rng, "reader")))
    return Schedule(seed, tuple(actors))


def _faults(rng: random.Random, role: str) -> tuple[Fault, ...]:
    if rng.random() < 0.35:
        return ()
    kinds = PYLANCE_KINDS if role == "pylance" else KINDS
    if role == "reader":
        kinds = ("query", "getitem", "copy", "flip")
    count = rng.choice((1, 1, 1, 2))
    return tuple(
        Fault(
            rng.choice(kinds),
            rng.choice((1, 1, 2)),
            rng.choices(FAULT_EFFECTS, weights=(4, 2, 2, 2, 3))[0],
        )
        for _ in range(count)
    )


# ------------------------------------------------------------------ the server side


def request_kind(request: InterceptedRequest) -> str | None:
    """What a request is, in the terms of a schedule's faults."""
    if request.service == "dynamodb":
        if request.target == "PutItem":
            if b"attribute_not_exists" in request.body:
                return "claim"
            if b"attribute_exists(" in request.body:
                return "flip"
            return None
        return {"Query": "query", "GetItem": "getitem"}.get(request.target)
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


class FaultInjector:
    """The server's interceptor: applies each running actor's faults to its requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._actors: dict[str, _Running] = {}

    def register(self, key: str, faults: tuple[Fault, ...], pid: int | None) -> None:
        with self._lock:
            self._actors[key] = _Running(list(faults), pid)

    def unregister(self, key: str) -> list[str]:
        with self._lock:
            running = self._actors.pop(key, None)
        return running.fired if running else []

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        key = access_key(request)
        if key is None:
            return None
        kind = request_kind(request)
        if kind is None:
            return None
        with self._lock:
            running = self._actors.get(key)
            if running is None:
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


@dataclass
class Outcome:
    seed: int
    schedule: Schedule
    anomalies: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    acknowledged: int = 0
    unacknowledged_present: int = 0
    killed: int = 0


#: Histories (consecutive seeds) that share one DynamoDB table. moto answers a Query by
#: scanning every item of the table, not one partition key's: with one table for all
#: histories every Query got slower as the run went on, which DynamoDB's do not.
HISTORIES_PER_TABLE = 25


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


def run_history(world: World, pool: Pool, seed: int) -> Outcome:
    """Run and check history ``seed``."""
    schedule = make_schedule(seed)
    outcome = Outcome(seed, schedule)
    base = f"h{seed}-{os.getpid()}-{time.monotonic_ns()}/t.lance"
    table = world.tables.for_seed(seed)
    uri = f"s3+ddb://{world.bucket}/{base}?ddbTableName={table}"
    plain = _options(world, "testing")

    (worker,) = pool.acquire(1)
    try:
        created = call(
            worker,
            {
                "job": "init",
                "template": world.template,
                "base": base,
                "bucket": world.bucket,
                "ddb_table": table,
                "endpoint": world.aws.endpoint,
            },
        )
    finally:
        pool.release([worker])
    if "version" not in created:
        outcome.anomalies.append(f"creating the table failed: {created}")
        return outcome

    actors = schedule.actors
    workers = pool.acquire(len(actors))
    acked: dict[str, set[int]] = {}
    try:
        keys = [f"H{seed}X{a.name}X{os.getpid()}" for a in actors]
        for actor, worker, key in zip(actors, workers, keys, strict=True):
            world.injector.register(key, actor.faults, worker.pid)
            job = {
                "job": "read" if actor.role == "reader" else "write",
                "uri": uri,
                "options": _options(world, key),
                "role": actor.role,
                "actor": actor.name,
                "appends": list(actor.appends),
            }
            try:
                worker.conn.send(job)
            except OSError:
                worker.spent = True  # died before its job; the collection sees EOF
        try:
            results = _collect(workers)
        except BaseException:
            for worker in workers:
                worker.spent = True  # may still be running its job
            raise
        for actor, key, result in zip(actors, keys, results, strict=True):
            outcome.fired += world.injector.unregister(key)
            acked[actor.name] = {e["ack"] for e in result["events"] if "ack" in e}
            if result.get("killed"):
                outcome.killed += 1
            if result.get("timeout"):
                outcome.anomalies.append(f"{actor.name} ({actor.role}) did not finish in time")
            for error in result.get("errors", []) + (
                [result["error"]] if result.get("error") else []
            ):
                if not _expected(actor.role, error):
                    outcome.anomalies.append(f"{actor.name} ({actor.role}): {error}")
    finally:
        pool.release(workers)

    (worker,) = pool.acquire(1)
    try:
        checked = call(worker, {"job": "check", "uri": uri, "options": plain})
    finally:
        pool.release([worker])
    _judge(outcome, checked, acked)
    return outcome


def _collect(workers: list[Worker]) -> list[dict[str, Any]]:
    results: list[dict[str, Any] | None] = [None] * len(workers)
    events: list[list[dict[str, Any]]] = [[] for _ in workers]
    pending = {w.conn: i for i, w in enumerate(workers)}
    deadline = time.monotonic() + HISTORY_TIMEOUT
    while pending:
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


def _expected(role: str, error: str) -> bool:
    name = error.split(":", 1)[0]
    allowed = EXPECTED_PYLANCE if role == "pylance" else EXPECTED_LANCETX
    return name in allowed


def _judge(outcome: Outcome, checked: dict[str, Any], acked: dict[str, set[int]]) -> None:
    if "wedged" in checked:
        outcome.anomalies.append(f"a fresh pylance writer could not commit: {checked['wedged']}")
        return
    if "versions" not in checked:
        outcome.anomalies.append(f"the checker failed: {checked}")
        return
    latest = checked["latest"]
    if checked["versions"] != list(range(1, latest + 1)):
        outcome.anomalies.append(f"versions not contiguous: {checked['versions']}")
    for problem in checked["unopenable"]:
        outcome.anomalies.append(f"version does not open: {problem}")
    rows: dict[str, int] = dict(checked["rows"])
    for special in ("init/0", "fresh/0"):
        if rows.pop(special, 0) != 1:
            outcome.anomalies.append(f"row {special} not present exactly once")
    scheduled = {f"{a.name}/{s}" for a in outcome.schedule.actors for s in a.appends}
    for name, seqs in acked.items():
        for seq in seqs:
            outcome.acknowledged += 1
            count = rows.get(f"{name}/{seq}", 0)
            if count != 1:
                outcome.anomalies.append(f"acknowledged append {name}/{seq} present {count} times")
    for row, count in rows.items():
        name, seq = row.split("/")
        if row not in scheduled:
            outcome.anomalies.append(f"unknown row {row}")
        elif count > 1:
            outcome.anomalies.append(f"append {row} present {count} times")
        elif int(seq) not in acked.get(name, set()):
            outcome.unacknowledged_present += 1


# ------------------------------------------------------------------------ a run


@dataclass
class Summary:
    histories: int = 0
    actors: collections.Counter[str] = field(default_factory=collections.Counter)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    acknowledged: int = 0
    unacknowledged_present: int = 0
    killed: int = 0
    respawned: int = 0
    anomalies: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, outcome: Outcome) -> None:
        self.histories += 1
        self.actors.update(a.role for a in outcome.schedule.actors)
        self.faults.update(outcome.fired)
        self.acknowledged += outcome.acknowledged
        self.unacknowledged_present += outcome.unacknowledged_present
        self.killed += outcome.killed
        self.anomalies += [(outcome.seed, a) for a in outcome.anomalies]

    def line(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        actors = ", ".join(f"{k} {v}" for k, v in sorted(self.actors.items()))
        return (
            f"randomized histories: {self.histories} histories in {self.seconds:.0f} s; "
            f"actors: {actors}; faults fired: {sum(self.faults.values())} ({faults}); "
            f"writer processes killed: {self.killed} (respawned {self.respawned}); "
            f"acknowledged commits: {self.acknowledged}; unacknowledged but committed: "
            f"{self.unacknowledged_present}; anomalies: {len(self.anomalies)}"
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
    summary.respawned = pool.respawned
    return summary
