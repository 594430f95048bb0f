"""free_port: numbers outside the kernel's ephemeral range, never handed to two gpufed processes
at once (the port race that stopped the demo when a parallel test's outgoing connection or
another worker's demo took an Alertmanager's port between pick and bind)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from federation.localrun import loopback
from federation.localrun.loopback import free_port

# Each picker keeps its reservations until told to stop, as a demo holds them while it runs.
_PICK = ("import sys\nfrom federation.localrun.loopback import free_port\n"
         "print(*[free_port() for _ in range(300)], flush=True)\nsys.stdin.read()")


def test_free_port_is_below_the_ephemeral_range_where_outgoing_connections_take_ports() -> None:
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= port < floor for port in ports), ports


def test_parallel_processes_never_get_the_same_port_while_it_is_reserved() -> None:
    root = Path(__file__).resolve().parents[2]
    pickers = [subprocess.Popen([sys.executable, "-c", _PICK], cwd=root, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for _ in range(4)]
    mine = [str(free_port()) for _ in range(300)]
    picked = [picker.stdout.readline().split() for picker in pickers]  # type: ignore[union-attr]
    for picker in pickers:
        picker.communicate(timeout=60)
    everyone = [port for ports in [*picked, mine] for port in ports]
    assert len(everyone) == 1500
    assert len(set(everyone)) == len(everyone), "a port was handed out twice within its reservation"


def test_a_port_someone_listens_on_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    taken = [sock.getsockname()[1] for sock in listeners]
    spare = free_port()
    candidates = iter([*taken, spare])
    monkeypatch.setattr(loopback.random, "randrange", lambda lo, hi: next(candidates))
    monkeypatch.setattr(loopback, "_reserve", lambda port: True)
    try:
        assert free_port() == spare
    finally:
        for sock in listeners:
            sock.close()
