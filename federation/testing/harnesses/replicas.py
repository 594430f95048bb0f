"""Several ``gpufed serve`` processes sharing the Consul stand-in: what the failover tests
and ``gpufed bench failover`` start, kill and poll.

Everything runs as real processes on 127.0.0.1 (the stand-in too, so a replica's
``kill -9`` or ``SIGSTOP`` cannot stall it). Each replica follows the same inventory file,
stores state under one Consul prefix and campaigns for ``<prefix>/leader``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from federation.localrun.waiting import wait_until
from federation.testing.harnesses.polling import serve_port

TOKEN = "failover-bench-token-0123456789abcdef"
T = TypeVar("T")


def write_fleet(
    directory: Path, *, nodes: int, regions: dict[str, int], inventory_format: str = "yaml"
) -> tuple[Path, Path]:
    """A spec (fixed shard counts, HTTP SD) and an inventory of ``nodes`` GPU nodes, in YAML
    or in JSON (``inventory.json``; the loaders read JSON by that suffix)."""
    spec = directory / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "cluster": "failover",
                "regions": [{"name": name, "shards": count} for name, count in regions.items()],
                "jobs": [
                    {"name": "gpu", "scrape_interval": "15s"},
                    {"name": "node", "scrape_interval": "30s"},
                ],
                "children": {
                    "target_discovery": "http_sd",
                    "http_sd_url": "http://gpufed:8080",
                    "http_sd_refresh_interval": "5s",
                },
            }
        )
    )
    names = list(regions)
    entries = [
        {
            "name": f"gpu-{i:05d}",
            "address": f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}",
            "region": names[i % len(names)],
            "rack": f"rack-{i // 16 % 64:02d}",
            "team": ("llm", "vision", "speech")[i % 3],
            "gpus": 8 if i % 4 else 4,
        }
        for i in range(nodes)
    ]
    document = {"defaults": {"exporters": {"gpu": 9400, "node": 9100}}, "nodes": entries}
    if inventory_format not in ("yaml", "json"):
        raise ValueError(f"inventory_format: expected 'yaml' or 'json', got {inventory_format!r}")
    inventory = directory / f"inventory.{inventory_format}"
    inventory.write_text(json.dumps(document) if inventory_format == "json" else yaml.safe_dump(document))
    return spec, inventory


@dataclass
class Standin:
    """The Consul stand-in in its own process."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, *, ttl_multiplier: float = 2.0) -> Standin:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "federation.testing.standins.consul.agent",
                "--ttl-multiplier",
                str(ttl_multiplier),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.isdigit():
            proc.kill()
            raise RuntimeError(f"the Consul stand-in did not start (printed {line!r})")
        return cls(proc=proc, port=int(line))

    def stop(self) -> None:
        _end(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Replica:
    """One ``gpufed serve --listen 127.0.0.1:0``: its port is read from its log when first asked
    for, so no other process can take it between choosing and binding."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    bound: int | None = None

    @property
    def port(self) -> int:
        if self.bound is None:
            self.bound = serve_port(self.log, self.proc)
        return self.bound

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class ReplicaSet:
    workdir: Path
    spec: Path
    inventory: Path
    consul: str
    prefix: str = "gpufed"
    ttl_s: int = 15
    lock_delay_s: int = 1
    election: str = "consul"
    store: str | None = None
    """``--store``; None: ``consul://<consul>/<prefix>``."""
    extra_args: tuple[str, ...] = ()
    replicas: list[Replica] = field(default_factory=list)
    http: httpx.Client = field(
        # The operator's token on reads too: a tokenless client paging 100,000 targets spends
        # the read budget (--read-rate) and gets 429s, which is the guard working, not the bench.
        default_factory=lambda: httpx.Client(timeout=2.0, headers={"Authorization": f"Bearer {TOKEN}"})
    )

    def start(self, count: int) -> list[Replica]:
        for _ in range(count):
            self.add()
        return self.replicas

    def add(self) -> Replica:
        name = f"replica-{len(self.replicas)}"
        log = self.workdir / f"{name}.log"
        args = [
            sys.executable, "-m", "federation.commands.cli", "serve",
            "--spec", str(self.spec), "--inventory", str(self.inventory),
            "--data-dir", str(self.workdir / name), "--listen", "127.0.0.1:0",
            "--store", self.store or f"consul://{self.consul}/{self.prefix}",
            "--leader-election", self.election,
            "--lock-ttl", str(self.ttl_s), "--lock-delay", str(self.lock_delay_s),
            "--no-check", "--debounce", "0.2", "--log-level", "warning", *self.extra_args,
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "GPUFED_TOKEN": TOKEN, "POD_NAME": name},  # a Lease holder's identity
            )
        replica = Replica(name=name, proc=proc, log=log)
        self.replicas.append(replica)
        return replica

    def close(self) -> None:
        for replica in self.replicas:
            with contextlib.suppress(ProcessLookupError):
                os.kill(replica.proc.pid, signal.SIGCONT)  # a stopped process cannot terminate
            _end(replica.proc)
        self.http.close()

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reads ------------------------------------------------------------------------------
    def status(self, replica: Replica) -> dict[str, Any]:
        response = self.http.get(f"{replica.url}/v1/status")
        response.raise_for_status()
        return dict(response.json())

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        out: dict[str, dict[str, Any] | None] = {}
        for replica in self.replicas:
            try:
                out[replica.name] = self.status(replica) if replica.alive else None
            except httpx.HTTPError:
                out[replica.name] = None
        return out

    def leaders(self) -> list[Replica]:
        found = self.statuses()
        return [r for r in self.replicas if (found[r.name] or {}).get("role") == "leader"]

    def none_died(self) -> None:
        """Raise, with its log's tail, when a replica failed on its own (a signal's end is a test's)."""
        for replica in self.replicas:
            code = replica.proc.poll()
            if code is not None and code > 0:
                raise RuntimeError(f"{replica.name} exited with {code}:\n{self.tail(replica)}")

    def one_leader(self, *, timeout: float) -> Replica:
        def single() -> Replica | None:
            found = self.leaders()
            return found[0] if len(found) == 1 else None

        return wait_until(single, timeout=timeout, what="exactly one leader")

    def settled(self, *, timeout: float) -> int:
        """Wait until every live replica is ready and serves the same assignment version."""

        def same() -> int | None:
            self.none_died()
            found = [s for r, s in zip(self.replicas, self.statuses().values(), strict=True) if r.alive]
            if not found or any(s is None or not s.get("ready") for s in found):
                return None
            versions = {s["assignment_version"] for s in found if s is not None}
            return versions.pop() if len(versions) == 1 else None

        return wait_until(same, timeout=timeout, what="every replica serving one assignment version")

    def placement(self, replica: Replica) -> dict[str, str]:
        """identity -> shard as ``replica`` serves it."""
        out: dict[str, str] = {}
        offset = 0
        while True:
            response = self.http.get(f"{replica.url}/v1/targets", params={"limit": 1000, "offset": offset})
            response.raise_for_status()
            page = response.json()
            out.update({row["identity"]: row["shard"] for row in page["targets"]})
            offset += len(page["targets"])
            if offset >= page["total"] or not page["targets"]:
                return out

    def children(self, replica: Replica) -> list[str]:
        rows = self.http.get(f"{replica.url}/v1/shards").json()["shards"]
        return [c["child"] for row in rows for c in row["children"]]

    def sd(self, replica: Replica, child: str) -> bytes:
        response = self.http.get(f"{replica.url}/v1/sd/{child}")
        response.raise_for_status()
        return response.content

    def write(self, replica: Replica, path: str, body: dict[str, Any]) -> httpx.Response:
        return self.http.post(f"{replica.url}{path}", json=body)

    def tail(self, replica: Replica, lines: int = 30) -> str:
        return "\n".join(replica.log.read_text(errors="replace").splitlines()[-lines:])


def _end(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def kv_json(consul: str, key: str) -> Any:
    """A JSON value from the stand-in's KV (for checks: the state head, the lock)."""
    response = httpx.get(f"http://{consul}/v1/kv/{key}", timeout=2.0)
    if response.status_code == 404:
        return None
    import base64

    entry = response.json()[0]
    value = base64.b64decode(entry["Value"] or "")
    try:
        return {**entry, "Value": json.loads(value)}
    except ValueError:
        return {**entry, "Value": value.decode(errors="replace")}


@contextlib.contextmanager
def stopped(replica: Replica) -> Iterator[None]:
    """SIGSTOP the replica for the block, SIGCONT after (a frozen process, not a dead one)."""
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
