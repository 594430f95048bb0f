"""The run's namespaces: networks (``ip netns``, a bridge, veth pairs) and the mount wrapper.

Network: a hub namespace holds the bridge; every member (a service, or a node copy whose
services use ``network_mode: host``) gets its own namespace with ``eth0`` on the bridge and
an address in 10.213.0.0/16. No namespace has a route beyond that subnet, and the host's
own namespace gets no address or link: nothing leaves the run. ``ip netns del`` of every
namespace removes the veths and the bridge with them.

Mounts: a service runs under ``unshare --mount --propagation private`` in a root made of the
host's top-level directories (``mount --rbind``), with its volumes bound at their container
paths. A target whose parent the host lacks is created without touching the host: a new
top-level directory lives in the run's own root, and a missing directory under an existing
one (``/etc/gpufed``) is made in an overlay whose upper layer is the run's. The hosts file
is bound over ``/etc/hosts``; then ``chroot`` execs the service's argv.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SUBNET = ipaddress.IPv4Network("10.213.0.0/16")
FIRST_HOST = 10
#: A container has a default route (Alertmanager's gossip advertises the private address of its
#: interface); this one points at an address in the subnet that nobody holds, so nothing leaves.
GATEWAY = "10.213.0.1"
CLONE_NEWNET = 0x40000000
#: Host directories a service may write: kernel file systems, /run, and /tmp (where the run
#: keeps its own files). Every other host directory is bound read-only; a service writes only
#: to its volumes and to the overlays made for paths the host lacks.
WRITABLE_HOST_DIRS = frozenset({"dev", "proc", "sys", "run", "tmp"})
NETNS_DIR = Path("/run/netns")


class SandboxError(RuntimeError):
    """A namespace, link or mount could not be made (the ``ip``/``mount`` error is in the message)."""


def _ip(args: list[str], batch: list[str]) -> None:
    done = subprocess.run(
        ["ip", *args, "-batch", "-"],
        input="\n".join(batch) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise SandboxError(f"ip {' '.join(args)} -batch failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Member:
    name: str  # what the run calls it (a service or a node copy)
    netns: str
    address: str
    veth: str


class Network:
    """The run's namespaces; ``create`` makes them all, ``destroy`` removes every one."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.hub = f"gfr{run_id}-hub"
        self.members: dict[str, Member] = {}

    def plan(self, names: list[str]) -> dict[str, Member]:
        hosts = SUBNET.hosts()
        for _ in range(FIRST_HOST - 1):
            next(hosts)
        for i, name in enumerate(names):
            self.members[name] = Member(
                name, f"gfr{self.run_id}-{i}", str(next(hosts)), f"gfr{self.run_id}v{i}"
            )
        return self.members

    def create(self) -> None:
        batch = [f"netns add {self.hub}"]
        for m in self.members.values():
            batch += [
                f"netns add {m.netns}",
                f"link add {m.veth} netns {self.hub} type veth peer name eth0 netns {m.netns}",
            ]
        _ip([], batch)
        _ip(
            ["-n", self.hub],
            [
                "link add br0 type bridge",
                "link set br0 up",
                "link set lo up",
                *(f"link set {m.veth} master br0 up" for m in self.members.values()),
            ],
        )
        for m in self.members.values():
            _ip(
                ["-n", m.netns],
                [
                    "link set lo up",
                    f"addr add {m.address}/{SUBNET.prefixlen} dev eth0",
                    "link set eth0 up",
                    f"route add default via {GATEWAY}",
                ],
            )

    def destroy(self) -> list[str]:
        """Delete every namespace of this run (also ones a failed ``create`` left); returns errors."""
        errors = []
        for name in self.existing():
            done = subprocess.run(
                ["ip", "netns", "del", name], capture_output=True, text=True, timeout=30, check=False
            )
            if done.returncode != 0:
                errors.append(f"{name}: {done.stderr.strip()}")
        return errors

    def existing(self) -> list[str]:
        prefix = f"gfr{self.run_id}-"
        return sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.exists() else []

    def path(self, member: str) -> Path:
        return NETNS_DIR / self.members[member].netns


def hosts_file(names: dict[str, str]) -> str:
    """``/etc/hosts`` text: localhost, then each address with every name that resolves to it."""
    by_address: dict[str, list[str]] = {}
    for name, address in sorted(names.items()):
        by_address.setdefault(address, []).append(name)
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{' '.join(sorted(n))}" for address, n in sorted(by_address.items())]
    return "\n".join(lines) + "\n"


# --- entering a network namespace from this process (one thread at a time) ------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"setns: {os.strerror(err)}")


@contextmanager
def in_netns(path: Path) -> Iterator[None]:
    """The calling thread in ``path``'s network namespace for the block (setns is per thread)."""
    with open("/proc/thread-self/ns/net") as own, open(path) as target:
        _setns(target.fileno())
        try:
            yield
        finally:
            _setns(own.fileno())


def connect_in(path: Path, address: str, port: int, *, timeout: float) -> socket.socket:
    """A TCP connection made inside a namespace (a socket keeps the namespace it was made in)."""
    with in_netns(path):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((address, port))
    except OSError:
        sock.close()
        raise
    return sock


# --- the mount wrapper ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bind:
    source: Path
    target: str  # absolute path inside the service
    read_only: bool


def _top(target: str) -> str:
    return Path(target).parts[1] if len(Path(target).parts) > 1 else ""


def _nearest_existing(target: str) -> Path:
    path = Path(target).parent
    while not path.exists():
        path = path.parent
    return path


def kept_host_paths() -> list[Path]:
    """What the real binaries are run from: the virtualenv, the checkout its editable install
    points at, and the pinned stack (``GPUFED_TOOLS``). A volume mounted over a parent of one of
    them (a pod's emptyDir at /tmp, with the venv of a CI run under /tmp) must not hide it."""
    paths = [Path(sys.prefix), Path(__file__).resolve().parents[4]]
    if os.environ.get("GPUFED_TOOLS"):
        paths.append(Path(os.environ["GPUFED_TOOLS"]))
    return sorted({p.resolve() for p in paths if p.is_dir()})


def wrapper_script(
    *, root: Path, layers: Path, binds: list[Bind], hosts: Path, keep: Sequence[Path] = ()
) -> str:
    """The ``sh -c`` script that builds the service's root and execs ``chroot ROOT "$@"``.

    Pure apart from reading which host paths exist; ``root`` and ``layers`` are the run's
    (empty) directories for this service. ``keep``: host directories bound again, read-only,
    where a volume was mounted over a parent of theirs (``kept_host_paths``).
    """
    q = shlex.quote
    lines = ["set -e"]
    host_top = sorted(p.name for p in Path("/").iterdir())
    new_top = [b for b in binds if _top(b.target) not in host_top]
    later = [b for b in binds if _top(b.target) in host_top]

    def bind(b: Bind) -> list[str]:
        dest = f"{root}{b.target}"
        make = (
            f"mkdir -p {q(dest)}"
            if b.source.is_dir()
            else f"mkdir -p {q(str(Path(dest).parent))} && touch {q(dest)}"
        )
        out = [make, f"mount --rbind {q(str(b.source))} {q(dest)}"]
        if b.read_only:
            out.append(f"mount -o remount,bind,ro {q(dest)}")
        return out

    # 1. volumes at new top-level paths (/gpufed, /prometheus, /host) while the root is still empty,
    #    so an rbind of / (node-exporter's /host) copies the host's mounts only
    for b in sorted(new_top, key=lambda b: b.target.count("/")):
        lines += bind(b)
    # 2. the host's top-level entries
    for name in host_top:
        src = Path("/") / name
        dest = f"{root}/{name}"
        if src.is_symlink():
            lines.append(f"[ -L {q(dest)} ] || ln -s {q(os.readlink(src))} {q(dest)}")
        elif src.is_dir():
            lines += [f"mkdir -p {q(dest)}", f"mount --rbind {q(str(src))} {q(dest)}"]
            if name not in WRITABLE_HOST_DIRS:  # the host's files are the image's: read, never written
                lines.append(f"mount -o remount,bind,ro {q(dest)}")
        elif src.is_file():
            lines += [
                f"touch {q(dest)}",
                f"mount --bind {q(str(src))} {q(dest)}",
                f"mount -o remount,bind,ro {q(dest)}",
            ]
    # the copy of /run/netns would hold every namespace of the run open after `ip netns del`
    lines.append(f"umount -l {q(str(root))}/run/netns 2>/dev/null || true")
    # 3. overlays where a target's parent is missing under an existing host directory
    overlaid: list[Path] = []
    for b in sorted(later, key=lambda b: b.target.count("/")):
        if Path(b.target).exists():
            continue
        lower = _nearest_existing(b.target)  # at least /<top>: the top-level entry exists
        if any(lower == o or o in lower.parents for o in overlaid):
            continue
        n = len(overlaid)
        upper, work = layers / f"upper{n}", layers / f"work{n}"
        lines += [
            f"mkdir -p {q(str(upper))} {q(str(work))}",
            f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} "
            f"{q(f'{root}{lower}')}",
        ]
        overlaid.append(lower)
    # 4. the other volumes, outer paths first
    for b in sorted(later, key=lambda b: b.target.count("/")):
        lines += bind(b)
    # 4b. what the binaries run from, where a volume hid it
    for path in keep:
        if any(Path(b.target) == path or Path(b.target) in path.parents for b in binds):
            dest = f"{root}{path}"
            lines += [f"mkdir -p {q(dest)}", f"mount --rbind {q(str(path))} {q(dest)}",
                      f"mount -o remount,bind,ro {q(dest)}"]
    # 5. names resolve as the run says
    lines.append(f"mount --bind {q(str(hosts))} {q(str(root))}/etc/hosts")
    lines.append(f'exec chroot {q(str(root))} "$@"')
    return "\n".join(lines)


def wrapped(netns: Path, script: str, argv: list[str]) -> list[str]:
    """argv that runs ``argv`` in the network namespace ``netns`` and a private mount namespace."""
    return [
        "nsenter",
        f"--net={netns}",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        *argv,
    ]


def in_service(pid: int, argv: list[str]) -> list[str]:
    """argv that runs ``argv`` inside a running service's namespaces and root (a healthcheck)."""
    return ["nsenter", f"--target={pid}", "--mount", "--net", "--root", "--wd", "--", *argv]
