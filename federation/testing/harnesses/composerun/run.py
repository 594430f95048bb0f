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
import secrets
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from federation.testing.harnesses.composerun import dingtalk, images, sandbox
from federation.testing.harnesses.composerun.model import Project, parse_project, start_order
from federation.testing.harnesses.composerun.plan import (
    ComposeRunError,
    Planned,
    Tools,
    describe,
    env_lines,
    plan_service,
    resolve,
    summary,
    versions_run,
    xid_plan,
)
from federation.testing.harnesses.composerun.publish import Forwarder
from federation.testing.harnesses.composerun.supervise import ServiceProcess, State

DEPENDENCY_TIMEOUT_S = 120.0


class ComposeRun:
    def __init__(
        self,
        *,
        monitoring: Path,
        monitoring_env: Path,
        node_file: Path | tuple[Path, ...],
        node_env_example: Path,
        nodes: list[dict[str, str]],
        workdir: Path,
        tools: Tools | None = None,
        profiles: tuple[str, ...] = (),
        xid_codes: frozenset[int] | None = None,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        """``profiles``: ``--profile`` for the monitoring file (``consul``); the node copies run
        node.yml's default services (``node_file`` several: node.yml and its overlays, in
        order). ``xid_codes``: the planned XID is one of these codes."""
        self.monitoring, self.monitoring_env = monitoring, monitoring_env
        self.node_file, self.node_env_example, self.node_values = node_file, node_env_example, nodes
        self.workdir, self.say = workdir, say
        self.tools = tools or Tools.from_env()
        self.profiles, self.xid_codes = profiles, xid_codes
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
            (
                parse_project(resolve(self.monitoring, env_file=self.monitoring_env, profiles=self.profiles)),
                None,
            )
        ]
        names = [f"node-{i:03d}" for i in range(len(self.node_values))]
        node_names = [v["NODE_NAME"] for v in self.node_values]
        monitoring = projects[0][0]
        runs_here = [
            s
            for s in monitoring.services.values()
            if images.rule_for(s.image).kind != "left_out" and not str(s.network_mode).startswith("service:")
        ]
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
        self.xid = xid_plan(node_names, codes=self.xid_codes)
        fill = {"{xid_seed}": str(self.xid.get("seed", 0)), "{ca_file}": str(self.ca_file)}
        for project, node in projects:
            for name in start_order(project.services):
                service = project.services[name]
                display = f"{node_names[names.index(node)]}/{name}" if node else name
                shared = str(service.network_mode).removeprefix("service:")  # network_mode: service:NAME
                member = node or (shared if shared != str(service.network_mode) else name)
                self.planned[display] = plan_service(service, display, member, tools=self.tools, fill=fill)

    # --- up --------------------------------------------------------------------------------------

    def up(self) -> None:
        try:
            self._plan()
            self.network.create()
            self._write_hosts()
            self.versions = versions_run(self.planned, self.tools)
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

    def _start_external(self) -> None:
        """The DingTalk stand-in as oapi.dingtalk.com:443, robots from the relay's rendered config."""
        relay = next(
            (p for p in self.planned.values() if (p.service.command or ("",))[0] == "gpufed-dingtalk"), None
        )
        folder = self.workdir / "standins"
        folder.mkdir(parents=True, exist_ok=True)
        key = folder / "dingtalk.key"
        dingtalk.make_certificate(cert=self.ca_file, key=key)
        found = []
        if relay is not None:
            command = list(relay.service.command or ())
            found = dingtalk.robots(self._host_path(relay, command[command.index("--config") + 1]), relay.env)
        argv = dingtalk.argv(python=self.tools.python, folder=folder, found=found, cert=self.ca_file, key=key)
        member = images.EXTERNAL[dingtalk.NAME]
        self._logs()
        with (self.workdir / "logs" / "dingtalk-standin.log").open("ab") as out:
            self._standins[member] = subprocess.Popen(
                ["nsenter", f"--net={self.network.path(member)}", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_port(member, dingtalk.PORT, "the DingTalk stand-in")

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

    def volume_folder(self, project: str, volume: str) -> Path:
        """The host folder standing in for a named volume; it outlives the service's restarts."""
        return self.workdir / "volumes" / f"{project}_{volume}"

    def _binds(self, planned: Planned) -> list[sandbox.Bind]:
        binds = []
        for v in planned.service.volumes:
            if v.kind == "bind":
                if not Path(v.source).exists():
                    raise ComposeRunError(f"{planned.display}: bind source {v.source} does not exist")
                binds.append(sandbox.Bind(Path(v.source), v.target, v.read_only))
            elif v.kind == "volume":
                folder = self.volume_folder(planned.service.project, v.source)
                folder.mkdir(parents=True, exist_ok=True)
                binds.append(sandbox.Bind(folder, v.target, v.read_only))
            else:  # tmpfs: a fresh directory of the run's per start stands in
                folder = self.workdir / "tmpfs" / planned.display.replace("/", "_") / v.target.strip("/")
                folder.mkdir(parents=True, exist_ok=True)
                binds.append(sandbox.Bind(folder, v.target, False))
        return binds

    def _process(self, planned: Planned) -> ServiceProcess:
        return sandboxed_process(
            planned,
            binds=self._binds(planned),
            netns=self.network.path(planned.member),
            workdir=self.workdir,
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
        return self.http_request(display, port, path, timeout=timeout, tls=tls, hostname=hostname)

    def http_request(
        self,
        display: str,
        port: int,
        path: str,
        *,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 5.0,
        tls: ssl.SSLContext | None = None,
        hostname: str | None = None,
    ) -> tuple[int, bytes]:
        """One HTTP request inside the namespace of ``display``, as a peer service would send it."""
        member = self.planned[display].member if display in self.planned else display
        address = self.network.members[member].address
        sock = sandbox.connect_in(self.network.path(member), address, port, timeout=timeout)
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
        conn.sock = tls.wrap_socket(sock, server_hostname=hostname or display) if tls else sock
        try:
            conn.request(method, path, body=body, headers=headers or {})
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
        return summary(self.planned, nodes=len(self.node_values), versions=self.versions, xid=self.xid)

    def describe(self) -> list[str]:
        return describe(self.run_id, len(self.node_values), self.summary())

    # --- down ------------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every process, remove every namespace and the run's roots; returns what failed."""
        for forwarder in self.forwarders:
            forwarder.stop()
        # the node copies first (their exporters deregister from a controller still there), then
        # the monitoring services that depend on others, then the rest (Compose stops dependents first)
        running = [p for p in self.planned.values() if p.process is not None]
        waves = [
            [p for p in running if "/" in p.display],
            [p for p in running if "/" not in p.display and p.service.depends_on],
            [p for p in running if "/" not in p.display and not p.service.depends_on],
        ]
        for wave in waves:
            stoppers = [
                threading.Thread(
                    target=p.process.stop,
                    args=(p.service.stop_grace_period, p.service.stop_signal),
                    daemon=True,
                )
                for p in wave
                if p.process is not None
            ]
            for t in stoppers:
                t.start()
            for t in stoppers:
                t.join(timeout=_longest_grace(wave) + 20)
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


def sandboxed_process(
    planned: Planned,
    *,
    binds: list[sandbox.Bind],
    netns: Path,
    workdir: Path,
    say: Callable[[str], None],
) -> ServiceProcess:
    """``planned``'s process in ``netns`` and its own mount namespace with ``binds`` at their
    container paths (root, overlay layers and log under ``workdir``); not started yet."""
    slug = planned.display.replace("/", "_")
    root, layers = workdir / "root" / slug, workdir / "layers" / slug
    root.mkdir(parents=True, exist_ok=True)
    layers.mkdir(parents=True, exist_ok=True)
    script = sandbox.wrapper_script(
        root=root, layers=layers, binds=binds, hosts=workdir / "hosts" / netns.name,
        keep=sandbox.kept_host_paths(),
    )
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    return ServiceProcess(
        name=planned.display,
        argv=sandbox.wrapped(netns, script, planned.argv),
        env=planned.env,
        log=workdir / "logs" / f"{slug}.log",
        restart=planned.service.restart,
        healthcheck=planned.healthcheck,
        say=say,
    )


def _longest_grace(wave: list[Planned]) -> float:
    return max((p.service.stop_grace_period for p in wave), default=0.0)


_CONDITIONS: dict[str, Callable[[State], bool]] = {
    "service_started": lambda s: bool(s.pids),
    "service_healthy": lambda s: s.health == "healthy",
    "service_completed_successfully": lambda s: s.done and bool(s.exits) and s.exits[-1].code == 0,
}
