"""Interrupting a commit at its claim, on the embedded server, and checking what landed.

The *victim* is told apart by its access key id (moto accepts any): its storage
options carry :data:`VICTIM_KEY` (:func:`victim_options`). :class:`AtTheClaim` lets the
victim's first claim — a DynamoDB write conditioned on ``attribute_not_exists``
(``PutItem``, or ``TransactWriteItems`` for ``commit_many``) — reach DynamoDB (it
lands), then:

* ``unknown``: answers 500 and fails every later DynamoDB request of the victim
  until :meth:`AtTheClaim.heal` (the claim cannot be settled: CommitStateUnknownError);
* ``sigint``: sends SIGINT (Ctrl-C) to the process that sent the claim, and answers
  only once it reacted (in this process: its handler ran, see :func:`acknowledge_sigint`;
  in another: it dropped the connection or died), so the interrupt always arrives
  while the claim's answer is awaited;
* ``kill``: SIGKILLs the process that sent the claim (found from the connection's
  client port in ``/proc``), before it sees any answer.

:func:`check_every_version_opens` then judges with pylance alone.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import lance

from lancetx.demo.embedded import EmbeddedAws, InterceptedRequest, InterceptedResponse

VICTIM_KEY = "victimkey"
EFFECTS = ("unknown", "sigint", "kill")
#: How long the server waits for a victim to react to SIGINT (it reacts at once).
REACTION_TIMEOUT = 60.0
#: What a forked child imports once (see :func:`run_in_child`).
PRELOAD = ["pyarrow", "lance", "boto3", "lancetx", "lancetx.aio"]


def victim_options(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with the victim's access key id (S3 and DynamoDB alike)."""
    return {**options, "aws_access_key_id": VICTIM_KEY}


def access_key(request: InterceptedRequest) -> str | None:
    auth = request.headers.get("authorization", "")
    if "Credential=" not in auth:
        return None
    return auth.split("Credential=", 1)[1].split("/", 1)[0]


def is_claim(request: InterceptedRequest) -> bool:
    return (
        request.service == "dynamodb"
        and request.target in ("PutItem", "TransactWriteItems")
        and b"attribute_not_exists" in request.body
    )


def ddb_error(status: int, code: str) -> InterceptedResponse:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code})
    return InterceptedResponse(
        status, body.encode(), [("Content-Type", "application/x-amz-json-1.0")]
    )


# ---------------------------------------------------------------- who sent it


def _socket_inode(client_port: int, server_port: int) -> str | None:
    """The inode of the TCP socket from 127.0.0.1:``client_port`` to ``server_port``.

    Both ends: Linux gives one local port to several connections whose other ends
    differ, so two test processes (pytest-xdist's workers, each with its own server)
    may each hold a connection from the same client port."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local = int(fields[1].rsplit(":", 1)[1], 16)
                remote = int(fields[2].rsplit(":", 1)[1], 16)
                if local == client_port and remote == server_port and fields[9] != "0":
                    return fields[9]
    return None


def _holds(pid: int, needle: str) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == needle:
                    return True
    return False


def pid_of_client(client_port: int, server_port: int) -> int | None:
    """The process holding the client end of the connection from ``client_port`` to
    the server on ``server_port`` (Linux)."""
    inode = _socket_inode(client_port, server_port)
    if inode is None:
        return None
    needle = f"socket:[{inode}]"
    if _holds(os.getpid(), needle):
        return os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _holds(int(entry), needle):
            return int(entry)
    return None


# ---------------------------------------------------------------- the fault


class AtTheClaim:
    """The server's interceptor: the victim's ``nth`` claim lands, then ``effect``."""

    def __init__(self, aws: EmbeddedAws, effect: str, *, nth: int = 1) -> None:
        assert effect in EFFECTS, effect
        self.aws = aws
        self.effect = effect
        self.nth = nth
        self.claims = 0
        self.dark = False
        self.fired = threading.Event()
        #: Set by this process's SIGINT handler (see :func:`acknowledge_sigint`).
        self.interrupted = threading.Event()
        self.victim_pid: int | None = None
        #: Whether the victim reacted to SIGINT before the server answered (set
        #: before ``fired``: wait for that first).
        self.reacted = False
        self._lock = threading.Lock()

    def __enter__(self) -> AtTheClaim:
        self.aws.set_interceptor(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.aws.set_interceptor(None)

    def heal(self) -> None:
        """Let the victim's requests through again."""
        self.dark = False

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if access_key(request) != VICTIM_KEY:
            return None
        if self.dark and request.service == "dynamodb":
            return ddb_error(500, "InternalServerError")
        if not is_claim(request):
            return None
        with self._lock:
            self.claims += 1
            if self.claims != self.nth:
                return None
        response = ddb_error(500, "InternalServerError")
        response.after_forwarding = True  # the claim lands
        port = (request.client_port, request.server_port)
        if self.effect == "unknown":
            self.dark = True
            self.fired.set()
        elif self.effect == "sigint":
            response.then = lambda: self._interrupt(port)
        else:
            response.then = lambda: self._kill(port)
        return response

    def _interrupt(self, port: tuple[int, int]) -> None:
        pid = pid_of_client(*port)
        self.victim_pid = pid
        assert pid is not None, f"no process holds the client port {port}"
        if pid == os.getpid():
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            reacted = self.interrupted.wait(REACTION_TIMEOUT)
        else:
            inode = _socket_inode(*port)
            assert inode is not None, f"the connection from port {port} is gone"
            os.kill(pid, signal.SIGINT)
            # It reacted once it dropped the connection (or died).
            deadline = time.monotonic() + REACTION_TIMEOUT
            while _holds(pid, f"socket:[{inode}]"):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            reacted = not _holds(pid, f"socket:[{inode}]")
        self.reacted = reacted
        self.fired.set()

    def _kill(self, port: tuple[int, int]) -> None:
        pid = pid_of_client(*port)
        self.victim_pid = pid
        if pid is not None and pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.fired.set()


@contextlib.contextmanager
def acknowledge_sigint(fault: AtTheClaim) -> Iterator[None]:
    """Wrap this process's SIGINT handler so the server knows the interrupt arrived
    (then it answers). Use inside ``asyncio.run`` to wrap asyncio's own handler."""
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        fault.interrupted.set()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------- children


def run_in_child(target: Callable[..., Any], *args: Any) -> multiprocessing.Process:
    """Start ``target(*args)`` in a child forked from a fork server that preloaded
    pylance and lancetx (a child starts in milliseconds); ``target`` must be a
    module-level function of an importable module."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    child = ctx.Process(target=target, args=args, daemon=True)
    child.start()
    return child


# ---------------------------------------------------------------- the judge


def check_every_version_opens(uri: str, options: Mapping[str, str]) -> dict[int, int]:
    """Open every version with pylance alone and read all of it; rows per version.
    (The latest version is resolved through DynamoDB, so a staged claim is finalized.)"""
    latest = lance.dataset(uri, storage_options=dict(options))
    rows: dict[int, int] = {}
    for info in latest.versions():
        version = int(info["version"])
        ds = lance.dataset(uri, version=version, storage_options=dict(options))
        table = ds.to_table()
        assert ds.count_rows() == table.num_rows
        rows[version] = table.num_rows
    assert sorted(rows) == list(range(1, latest.version + 1)), sorted(rows)
    return rows


# ---------------------------------------------------------------- the doors

#: Rows each interrupted commit adds (ids from :data:`FIRST_ID`).
ROWS = 5
FIRST_ID = 100

Ack = Callable[[], contextlib.AbstractContextManager[Any]]


def rows(n: int = ROWS, start: int = FIRST_ID) -> Any:
    import pyarrow as pa

    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "name": [f"n{i}" for i in range(start, start + n)],
        }
    )


def _no_ack() -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


def door_writer(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    import lancetx

    table = lancetx.open(uris[0], options)
    with table.writer(max_rows_per_file=2) as w, ack():
        w.write(rows())
        w.commit()


def door_async_writer(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    import asyncio

    import lancetx.aio

    async def run() -> None:
        with ack():  # inside asyncio.run: wraps asyncio's own SIGINT handler
            table = await lancetx.aio.open(uris[0], options)
            async with table, table.writer(max_rows_per_file=2) as w:
                await w.write(rows())
                await w.commit()

    asyncio.run(run())


def door_append(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    import lancetx

    table = lancetx.open(uris[0], options)
    with ack():
        table.append(rows(), max_rows_per_file=2)


def door_async_append(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    import asyncio

    import lancetx.aio

    async def run() -> None:
        with ack():
            async with await lancetx.aio.open(uris[0], options) as table:
                await table.append(rows(), max_rows_per_file=2)

    asyncio.run(run())


def _pylance_fragments(uri: str, options: dict[str, str]) -> list[Any]:
    from lancetx.externalstore.connect import connect

    data_uri = connect(uri, options).data_uri
    return list(
        lance.fragment.write_fragments(
            rows(), data_uri, mode="overwrite", storage_options=options, max_rows_per_file=2
        )
    )


def door_commit_fragments(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    import lancetx

    fragments = _pylance_fragments(uris[0], options)
    with ack():
        lancetx.commit_fragments(
            uris[0],
            fragments,
            schema=rows().schema,
            fresh_field_ids=True,
            storage_options=options,
            idempotency_key="interrupted-fragments",
        )


def door_commit_many(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    import lancetx
    from lancetx.commit.engine.operations import Append, Transaction
    from lancetx.commit.format.fragments import fragment_from_pylance

    transactions = {}
    for uri in uris:
        read = lancetx.open(uri, options)
        fragments = lance.fragment.write_fragments(
            rows(), read.dataset, mode="append", storage_options=options, max_rows_per_file=2
        )
        transactions[uri] = Transaction(
            read_version=read.version,
            operation=Append(fragments=tuple(fragment_from_pylance(f) for f in fragments)),
        )
    with ack():
        lancetx.commit_many(transactions, storage_options=options)


def door_merge_insert(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    """An upsert recording its inserted keys: updates the setup rows (deletion
    vectors), inserts ``ROWS`` new ones (data files); a re-plannable verb."""
    import lancetx

    table = lancetx.open(uris[0], options)
    with ack():
        (
            table.merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .conflict_on_inserted_keys()
            .execute(_upsert_rows(), idempotency_key="interrupted-merge")
        )


def door_async_merge_insert(uris: list[str], options: dict[str, str], ack: Ack = _no_ack) -> None:
    import asyncio

    import lancetx.aio

    async def run() -> None:
        with ack():
            async with await lancetx.aio.open(uris[0], options) as table:
                await (
                    table.merge_insert("id")
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .conflict_on_inserted_keys()
                    .execute(_upsert_rows(), idempotency_key="interrupted-merge")
                )

    asyncio.run(run())


def _upsert_rows() -> Any:
    """The tables' setup rows (ids from 0, fewer than :data:`FIRST_ID`) updated, and
    :data:`ROWS` new ones: the table grows by ``ROWS`` as for an append."""
    import pyarrow as pa

    ids = [0, 1, *range(FIRST_ID, FIRST_ID + ROWS)]
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"u{i}" for i in ids]})


DOORS: dict[str, Callable[[list[str], dict[str, str], Ack], None]] = {
    "writer": door_writer,
    "async-writer": door_async_writer,
    "append": door_append,
    "async-append": door_async_append,
    "commit_fragments": door_commit_fragments,
    "commit_many": door_commit_many,
    "merge_insert": door_merge_insert,
    "async-merge_insert": door_async_merge_insert,
}


def run_door(name: str, uris: list[str], options: dict[str, str]) -> None:
    """A child's body: one commit through door ``name`` (killed at its claim)."""
    DOORS[name](uris, options, _no_ack)
