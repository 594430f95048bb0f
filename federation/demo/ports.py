"""Loopback ports: the one helper gpufed keeps for them.

``free_port`` is for processes that take a port number on their command line (Prometheus,
Alertmanager, a child of the demo): the OS picks a free port, the socket closes and the
process binds the number soon after (a race the OS rarely loses on loopback). A server we
start in this process takes a listening socket from ``listening_socket`` instead (uvicorn's
``Server.serve(sockets=[...])``), so nothing can take its port in between.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def listening_socket(host: str = LOOPBACK) -> socket.socket:
    """A TCP socket bound to ``host`` on a port the OS picks, listening; the caller owns it."""
    sock = socket.create_server((host, 0))
    sock.set_inheritable(True)
    return sock


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on now, for a process that binds it by number."""
    with socket.create_server((host, 0)) as sock:
        return int(sock.getsockname()[1])
