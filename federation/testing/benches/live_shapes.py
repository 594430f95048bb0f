"""The shapes ``gpufed bench live`` runs in: which spec, which store, which discovery mode.

* spec: a spec file as an operator ships it (default ``examples/federation.yaml``), or
  ``builtin``: the bench's own (fixed shards of about 1,000 targets, HTTP SD);
* discovery: ``file_sd`` or ``http_sd`` (None: what the spec says), written into a copy;
* store: ``sqlite`` (the data dir), ``consul`` (the project's Consul stand-in) or
  ``kubernetes`` (the project's Kubernetes API stand-in, reached through a kubeconfig), each
  stand-in in its own process, as a deployed store is.

The inventory follows the spec's regions, so a shipped spec's region names place every node.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from federation.testing.harnesses.replicas import Standin, write_fleet

STORES = ("sqlite", "consul", "kubernetes")
DISCOVERY = ("file_sd", "http_sd")
BUILTIN = "builtin"
NAMESPACE = "gpufed-bench"
EXAMPLE_SPEC = Path(__file__).resolve().parents[3] / "examples" / "federation.yaml"
NEEDED_JOBS = ("gpu", "node")


class ShapeError(ValueError):
    """A spec, store or discovery mode the bench cannot run; the message names the option."""


@dataclass(frozen=True)
class Shape:
    spec: Path
    regions: tuple[str, ...]
    discovery: str
    targets_per_shard: int = 1
    """Nodes a sized region's shard holds (``sharding.targets_per_shard``)."""


def shape_spec(
    workdir: Path, *, spec: Path | str | None, discovery: str | None, targets_per_shard: int | None,
    builtin_regions: dict[str, int],
) -> Shape:  # fmt: skip
    """Write the spec the bench serves into ``workdir`` (a copy; the operator's file is never touched)."""
    if discovery is not None and discovery not in DISCOVERY:
        raise ShapeError(f"--discovery: expected one of {', '.join(DISCOVERY)}, got {discovery!r}")
    if spec == BUILTIN:
        (workdir / BUILTIN).mkdir(exist_ok=True)
        written, _ = write_fleet(workdir / BUILTIN, nodes=1, regions=builtin_regions)
        document = yaml.safe_load(written.read_text())
    else:
        path = Path(spec) if spec is not None else EXAMPLE_SPEC
        try:
            document = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ShapeError(f"--spec: cannot read {str(path)!r}: {exc}") from exc
        if not isinstance(document, dict):
            raise ShapeError(f"--spec: {str(path)!r} is not a YAML mapping")
    jobs = {job.get("name") for job in document.get("jobs") or [] if isinstance(job, dict)}
    missing = [job for job in NEEDED_JOBS if job not in jobs]
    if missing:
        raise ShapeError(f"--spec: the bench's inventory needs jobs gpu and node; missing {missing}")
    children = document.setdefault("children", {})
    if discovery is not None:
        children["target_discovery"] = discovery
    mode = children.get("target_discovery", "file_sd")
    if mode == "http_sd":
        children.setdefault("http_sd_url", "http://gpufed:8080")
    if targets_per_shard is not None:
        document.setdefault("sharding", {})["targets_per_shard"] = targets_per_shard
    regions = tuple(str(region["name"]) for region in document.get("regions") or [])
    if not regions:
        raise ShapeError("--spec: the spec names no regions")
    out = workdir / "served-spec.yaml"
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    per_shard = int((document.get("sharding") or {}).get("targets_per_shard") or 12)
    return Shape(spec=out, regions=regions, discovery=mode, targets_per_shard=per_shard)


@dataclass
class StoreStandin:
    """What ``gpufed serve`` needs for ``--store``: its flags and environment, and the
    stand-in process behind it (none for SQLite)."""

    kind: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    consul: Standin | None = None
    kube: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.consul is not None:
            self.consul.stop()
        if self.kube is not None:
            if self.kube.poll() is None:
                self.kube.terminate()
                try:
                    self.kube.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.kube.kill()
                    self.kube.wait(timeout=10)
            if self.kube.stdout is not None:
                self.kube.stdout.close()

    @property
    def pid(self) -> int | None:
        if self.consul is not None:
            return self.consul.proc.pid
        return self.kube.pid if self.kube is not None else None


def start_store(kind: str, workdir: Path) -> StoreStandin:
    if kind not in STORES:
        raise ShapeError(f"--store: expected one of {', '.join(STORES)}, got {kind!r}")
    if kind == "sqlite":
        return StoreStandin(kind=kind)
    if kind == "consul":
        standin = Standin.start()
        return StoreStandin(kind=kind, args=("--store", f"consul://{standin.address}/gpufed-bench"),
                            consul=standin)  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "federation.testing.standins.kube"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.isdigit():
        proc.kill()
        raise ShapeError(f"--store kubernetes: the Kubernetes API stand-in did not start (printed {line!r})")
    config = workdir / "kubeconfig"
    config.write_text(yaml.safe_dump(kubeconfig(f"http://127.0.0.1:{line}")))
    env = {"POD_NAMESPACE": NAMESPACE, "POD_NAME": "gpufed-bench-0"}
    return StoreStandin(kind=kind, args=("--store", "kubernetes", "--kubeconfig", str(config)), env=env,
                        kube=proc)  # fmt: skip


def kubeconfig(server: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "bench"}}],
    }  # fmt: skip
