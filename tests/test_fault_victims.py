"""The fault helpers find the process that sent a request by its connection, and only
that one: a wrong guess would interrupt or kill another process of the test run
(pytest-xdist's other worker, or a process one of its tests started)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from claim_faults import pid_of_client

#: A child that connects from ``argv[1]``'s port to ``argv[2]``'s, says so, then waits.
CHILD = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.connect(("127.0.0.1", int(sys.argv[2])))
print("connected", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    made = []
    for _ in range(2):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        made.append(server)
    yield made
    for server in made:
        server.close()


def test_two_connections_from_one_client_port_are_told_apart(
    listeners: list[socket.socket],
) -> None:
    # Linux gives one local port to connections whose other ends differ: two
    # processes, each connected from the same port, to two servers.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    client_port = probe.getsockname()[1]
    probe.close()
    children = []
    try:
        for server in listeners:
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(client_port), str(server.getsockname()[1])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            children.append(child)
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "connected"
        for child, server in zip(children, listeners, strict=True):
            assert pid_of_client(client_port, server.getsockname()[1]) == child.pid
    finally:
        for child in children:
            child.kill()
            child.wait()
