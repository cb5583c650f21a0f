"""The multi-host tests' coordinator port (`reserve_port`, tests/conftest.py): held from the
moment it is chosen, yet open to the coordinator, as JAX's coordination service binds it."""

from __future__ import annotations

import errno
import socket

import pytest


def test_a_reserved_port_refuses_other_binders_and_takes_the_coordinator(reserve_port):
    port = reserve_port()
    with socket.socket() as other, pytest.raises(OSError) as refused:
        other.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    # What the coordinator's gRPC server does: bind with SO_REUSEPORT and listen.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            conn, _ = server.accept()
            client.sendall(b"ok")
            assert conn.recv(2) == b"ok"
            conn.close()
    assert reserve_port() != port  # each call its own port, all held until the test ends
