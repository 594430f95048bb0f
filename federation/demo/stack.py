"""The whole federation on one machine: start it, follow the shard map, report, stop it.

Start order (each waits for what it needs; independent processes start together)::

    data dir   clean it (or --keep), stop what a killed run left (pids.json)
    files      spec.yaml from the embedded default; config/ rendered and checked by
               ``federation.master.pipeline.render`` (gpufed render's pipeline: what compose
               runs), the master, Alertmanagers and relay started on those files and
               their rendered flags; a random token
    in-process DingTalk sink (federation.localrun.dingtalk), child router
    processes  controller, relay, alertmanager-0/-1 (HA pair), master; the fleet once the
               controller answers
    fleet      registers itself with the controller's built-in registry (or Consul)
    children   one agent-mode Prometheus per child of the assignment, each running the
               prometheus.yml the controller publishes (GET /v1/configs/children/...
               answers), read in place from its rendered tree so its reloads apply
    follower   every 2 s: /v1/shards -> start children of new shards; stop children whose
               /v1/sd answers 404 (shard removed and its hand-overs done)

The master finds the children as in production: its ``gpufed-child`` job reads the
controller's ``/v1/sd-children``, whose child URL template points at the router.

``stop`` undoes all of it; ``finish`` reads the figures first (master, sink, /proc),
stops, then counts what is left alive. Tests drive a running stack through
``supervisor`` (``stop``/``kill``/``restart`` one component by name), ``sink``, ``http``
and ``token``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import secrets
import shutil
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import webconfig.client
import webconfig.model
import webconfig.serving
from alertmanager.amtool import Amtool
from alertmanager.errors import AmtoolError
from alertmanager.render import ALERTMANAGER_FILE, HA_FILE, RELAY_FILE
from federation.demo import binaries, components, plan, report
from federation.demo.components import Launch
from federation.demo.router import ChildRouter
from federation.demo.supervisor import ComponentFailed, ProcessSpec, Supervisor, reap_previous
from federation.localrun import procstat
from federation.localrun.dingtalk import LocalDingTalk, Message, as_group_sees_it
from federation.localrun.loopback import free_port
from federation.localrun.waiting import wait_until
from federation.master import pipeline
from federation.master.render import FLAGS_FILE, MASTER_FILE
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.kernel.errors import SharderError
from sharder.kernel.output import dump_yaml
from sharder.kernel.prometheus_versions import check_binary
from sharder.kernel.promtool import Promtool
from sharder.kernel.tls import CLUSTER_TLS_FILE, HTTP_CLIENT_FILE, WEB_CONFIG_FILE
from sharder.model.loading import parse_model, parse_target
from webconfig.certs import CertsError, make_certs

log = logging.getLogger(__name__)
MARKER = ".gpufed-demo"
RESTART_BACKOFF_S = 5.0
Say = Callable[[str], None]


class DemoError(RuntimeError):
    """The demo cannot start or run; the message says what to do."""


@dataclass(frozen=True)
class DemoOptions:
    layout: plan.Layout = field(default_factory=plan.Layout)
    data_dir: Path = Path(".gpufed-demo")
    keep: bool = False
    consul: str | None = None
    register_interval: float = 30.0
    follow_interval: float = 2.0
    first_samples_timeout: float = 180.0
    restart: bool = False
    """``gpufed demo --restart``: start a component that exited again (same command line)."""
    prometheus: str | None = None
    """``gpufed demo --prometheus PATH``: the Prometheus binary (default: ``prometheus`` on PATH)."""
    alertmanager: str | None = None
    """``gpufed demo --alertmanager PATH`` (default: ``prometheus-alertmanager`` on PATH)."""
    # For the end-to-end proofs and benchmarks (tests/e2e/test_live_*.py, `gpufed bench gap`):
    controller_args: tuple[str, ...] = ()
    """Extra ``gpufed serve`` flags, e.g. ``--no-handover``."""
    edit_spec: Callable[[dict[str, Any]], None] | None = None
    """Edits the spec document (after the run's ports and paths are filled in, before it is
    validated and written): an extra job, a rule file with shorter ``for`` clauses."""
    tls: bool = False
    """``gpufed demo --tls``: a private CA and certificates in the data dir (``gpufed certs``),
    the spec's ``tls`` section, and every hop over TLS with client certificates required."""


class DemoStack:
    def __init__(self, options: DemoOptions, *, say: Say = print, show_messages: bool = True) -> None:
        self.options = options
        self.layout = options.layout
        self.say = say
        self.show_messages = show_messages
        self.data = options.data_dir.resolve()
        self.token = secrets.token_hex(24)
        # the demo's own reads of the controller carry its token (the read budget is for strangers);
        # nothing else it asks (Prometheus, Alertmanager, the relay) is sent the token
        self.http = httpx.Client(timeout=httpx.Timeout(10.0), event_hooks={"request": [self._authorize]})
        self.supervisor = Supervisor(log_dir=self.data / "logs", pid_file=self.data / "pids.json")
        self.ports = plan.Ports.allocate(free_port)
        self.sink: LocalDingTalk | None = None
        self.router: ChildRouter | None = None
        self.spec: GpufedSpec | None = None
        self.binaries: binaries.StackBinaries | None = None
        # The follower thread starts children while callers (the run loop, tests) read them:
        # both only under _children_lock, and readers get copies.
        self._children_lock = threading.Lock()
        self.child_ports: dict[str, int] = {}
        self.started_children: set[str] = set()
        self.restarts: dict[str, int] = {}
        self._restarted_at: dict[str, float] = {}
        self.ready_at: float | None = None
        self.started_at = time.monotonic()
        self.startup_s = 0.0
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self._stopped = False
        self._binaries: dict[str, str] = {}
        self._log_handler: logging.Handler | None = None
        self.tls: plan.TlsFiles | None = None
        """``--tls``: the certificates and the rendered web and client files (set by ``start``)."""

    # ---- URLs -----------------------------------------------------------------------------
    def url(self, port: int, path: str = "") -> str:
        """A loopback URL of one of the demo's servers: https with ``--tls``."""
        return plan.url(port, path, tls=self.options.tls)

    @property
    def controller_url(self) -> str:
        return self.url(self.ports.controller)

    def _authorize(self, request: httpx.Request) -> None:
        if str(request.url).startswith(self.controller_url + "/") and "authorization" not in request.headers:
            request.headers["Authorization"] = f"Bearer {self.token}"

    @property
    def master_url(self) -> str:
        return self.url(self.ports.master)

    def urls(self) -> dict[str, Any]:
        ams = [self.url(web) for web, _ in self.ports.alertmanagers]
        return {
            "web": self.controller_url + "/",
            "api_docs": self.controller_url + "/docs",
            "controller": self.controller_url,
            "master": self.master_url,
            "alertmanager": ams[0],
            "alertmanagers": ams,
            "relay": self.url(self.ports.relay),
            "dingtalk_sink": plan.url(self.ports.sink, "/v1/messages"),  # the stand-in: plain HTTP
        }

    # ---- start -------------------------------------------------------------------------------
    def start(self) -> None:
        """Bring everything up; raises DemoError/ComponentFailed (stop() still cleans up)."""
        self.started_at = time.monotonic()
        self._prepare_dir()
        self._log_to_file()
        try:
            found = binaries.find_binaries(
                prometheus=self.options.prometheus, alertmanager=self.options.alertmanager
            )
        except binaries.BinaryError as exc:
            raise DemoError(str(exc)) from exc
        self.binaries = found
        self._binaries = {"prometheus": found.prometheus, "prometheus-alertmanager": found.alertmanager}
        if self.options.tls:
            self._make_certs()
        token_file = self.data / "token"
        token_file.write_text(self.token + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        credentials = {robot: (secrets.token_hex(16), "SEC" + secrets.token_hex(24)) for robot in plan.robots(
            self.layout)}
        spec = self._write_spec(found)
        self.spec = spec
        assert spec.alerting is not None and spec.master is not None
        entries = plan.fleet_entries(self.layout, port=self.ports.fleet)
        rendered = self._render(spec, entries, found)
        self.child_ports = {child: free_port() for child in _children(rendered.assignment)}

        self.sink = LocalDingTalk(port=self.ports.sink, on_message=self._show)
        for robot, (token, secret) in credentials.items():
            self.sink.add_robot(token, secret=secret, name=robot)
        self.sink.__enter__()
        self.router = self._router().__enter__()
        self.say(f"gpufed demo: {self.layout.nodes} nodes x {self.layout.gpus} GPUs over "
                 f"{self.layout.regions} regions; data in {self.data}")
        self.say("  left out (what compose or Helm would also run): "
                 + "; ".join(plan.left_out(spec, consul=self.options.consul is not None)))

        env: dict[str, str] = {}
        for robot, (token, secret) in credentials.items():
            token_var, secret_var = plan.credential_env(robot)
            env |= {token_var: token, secret_var: secret}
        config = self.data / "config"
        flags = {name: r["flags"] for name, r in _json(config / HA_FILE)["replicas"].items()}
        services = [
            components.relay(config=config / RELAY_FILE, port=self.ports.relay, credentials=env,
                             data_dir=self.data / "relay", tls=self.tls),
            *(
                components.alertmanager(
                    binary=self._binaries["prometheus-alertmanager"], name=replica.name,
                    flags=flags[replica.name], config=config / ALERTMANAGER_FILE,
                    storage=self.data / "alertmanager" / replica.name, port=replica.port, tls=self.tls,
                )
                for replica in spec.alerting.replicas
            ),
            components.master(
                binary=self._binaries["prometheus"], config=config / MASTER_FILE,
                flags=_json(config / FLAGS_FILE)["flags"], port=spec.master.port, tls=self.tls,
            ),
        ]
        controller = components.controller(
            tool_path=found.tool_path(),
            spec=self.data / "spec.yaml", data_dir=self.data / "controller", port=self.ports.controller,
            token=self.token, child_urls={c: self.url(p) for c, p in self.child_ports.items()},
            child_url_template=self.router.template(), consul=self.options.consul,
            extra_args=self.options.controller_args, tls=self.tls,
        )
        fleet = components.fleet(
            layout=self.layout, port=self.ports.fleet, consul=self.options.consul,
            register_url=self.controller_url, token=self.token, tls=self.tls,
        )
        for launch in (controller, *services):
            self._launch(launch)
        # The fleet registers as soon as it serves; with the controller up, the first try lands.
        self._wait(controller)
        self._launch(fleet)
        for launch in (*services, fleet):
            self._wait(launch)
        self._wait_assignment()
        children = sorted(self._wanted_children())
        for child in children:
            self._launch_child(child)
        for child in children:
            self._wait_child(child)
        self._follower = threading.Thread(target=self._follow, daemon=True, name="follower")
        self._follower.start()
        self._wait_clustered()  # a replica retries joining its peer every 10 s: overlap that wait
        self._wait_first_samples()
        self.ready_at = time.monotonic()
        self.startup_s = round(self.ready_at - self.started_at, 1)
        self.say(f"ready in {self.startup_s:.0f} s")
        self._print_urls()

    # ---- the data directory, the spec and rendered files -----------------------------------------
    def _prepare_dir(self) -> None:
        data = self.data
        if data.exists():
            if not data.is_dir():
                raise DemoError(f"--data-dir {data} is a file; name a directory")
            if any(data.iterdir()) and not (data / MARKER).exists():
                raise DemoError(
                    f"--data-dir {data} holds files gpufed demo did not write; name another directory"
                    " or empty this one"
                )
            reaped = reap_previous(data / "pids.json")
            if reaped:
                self.say(f"stopped what a previous run left running: {', '.join(reaped)}")
            if not self.options.keep:
                for entry in data.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
        data.mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)
        (data / MARKER).write_text("written by gpufed demo; the next run empties this directory\n")

    def _make_certs(self) -> None:
        """``--tls``: ``gpufed certs``' CA and leaves for loopback in ``tls/``, and a client for them."""
        certs = self.data / plan.TLS_DIR
        try:
            make_certs(certs, hosts=["localhost", "127.0.0.1"], client_name=plan.TLS_CLIENT_NAME, days=30,
                       ca_days=30)
        except CertsError as exc:
            raise DemoError(f"--tls: {exc}") from exc
        config = self.data / "config"
        self.tls = plan.TlsFiles(certs=certs, web_config=config / WEB_CONFIG_FILE,
                                 http_config=config / HTTP_CLIENT_FILE,
                                 cluster_config=config / CLUSTER_TLS_FILE)
        # The demo's own calls (readiness, figures, the shard map) present the client certificate.
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        context.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
        self.http.close()
        self.http = httpx.Client(timeout=httpx.Timeout(10.0), verify=context,
                                 event_hooks={"request": [self._authorize]})
        self.say(f"  TLS on every hop: private CA and certificates in {certs}; client certificates required")

    def _router(self) -> ChildRouter:
        if self.tls is None:
            return ChildRouter(port=self.ports.router)
        try:  # the files the render wrote: served as the children serve them
            server = webconfig.serving.load_web_config(self.tls.web_config).ssl_context
            client = webconfig.client.client_context(self.tls.http_config)
        except webconfig.model.WebConfigError as exc:
            raise DemoError(f"--tls: {exc.detail}") from exc
        return ChildRouter(port=self.ports.router, server_tls=server, client_tls=client)

    def _log_to_file(self) -> None:
        (self.data / "logs").mkdir(exist_ok=True)
        handler = logging.FileHandler(self.data / "logs" / "demo.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        package = logging.getLogger("federation.demo")
        package.setLevel(logging.INFO)
        package.addHandler(handler)
        self._log_handler = handler

    def _write_spec(self, found: binaries.StackBinaries) -> GpufedSpec:
        doc = plan.demo_spec(
            plan.load_default_spec(), layout=self.layout, ports=self.ports,
            prometheus=found.prometheus_release, alertmanager=found.alertmanager_release,
            master_data=str(self.data / "master-data"), tls=self.tls.certs if self.tls else None,
        )
        if self.options.edit_spec is not None:
            self.options.edit_spec(doc)
        spec = parse_model(GpufedSpec, doc, source="demo spec")
        try:
            check_binary(component="prometheus", wanted=spec.prometheus.release(),
                         found=found.prometheus_release, path=found.prometheus)
            check_binary(component="alertmanager", wanted=spec.alertmanager.release(),
                         found=found.alertmanager_release, path=found.alertmanager)
        except ValueError as exc:
            raise DemoError(str(exc)) from exc
        (self.data / "spec.yaml").write_bytes(dump_yaml(doc))
        return spec

    def _render(
        self, spec: GpufedSpec, entries: list[dict[str, Any]], found: binaries.StackBinaries
    ) -> pipeline.RenderResult:
        """``gpufed render``'s own pipeline and checks into ``config/``: what compose runs.

        The children run the controller's published configs (as in compose and Helm); the
        master, Alertmanagers and relay run these files and the flags rendered beside them.
        """
        jobs = {job.name: job for job in spec.jobs}
        targets = [parse_target(e, source="demo", jobs=jobs) for e in entries]
        try:
            return pipeline.render(
                spec, targets, out=self.data / "config", checker=Promtool(found.promtool),
                alert_checker=Amtool(found.amtool),
            )
        except (SharderError, AmtoolError) as exc:
            raise DemoError(f"a rendered config was refused: {exc}") from exc

    # ---- processes -----------------------------------------------------------------------------------
    def _launch(self, launch: Launch) -> None:
        check = None
        if launch.ready_url is not None:
            check = _http_ok(self.http, launch.ready_url)
        self.supervisor.start(
            ProcessSpec(
                name=launch.name, argv=launch.argv, env=launch.env, ready=check,
                ready_timeout=launch.ready_timeout,
            )
        )

    def _step(self, text: str) -> None:
        self.say(f"  [{time.monotonic() - self.started_at:5.1f} s] {text}")

    def _wait(self, launch: Launch) -> None:
        self.supervisor.wait_ready(launch.name)
        where = launch.ready_url or ""
        for suffix in ("/-/ready", "/readyz", "/healthz"):
            where = where.removesuffix(suffix)
        self._step(f"✓ {launch.name:<20} ready  {where}")

    def _wait_clustered(self) -> None:
        urls = [self.url(web, "/api/v2/status") for web, _ in self.ports.alertmanagers]

        def clustered() -> bool:
            states = [self.http.get(u).json()["cluster"] for u in urls]
            return all(s["status"] == "ready" and len(s.get("peers") or []) == len(urls) for s in states)

        _poll(clustered, timeout=60, what="the Alertmanager pair to form a cluster",
              alive=lambda: self._check_alive("alertmanager-0", "alertmanager-1"))
        self._step(f"✓ alertmanager pair    gossiping ({len(urls)} peers)")

    def _wait_assignment(self) -> None:
        expected = self.layout.nodes

        def assigned() -> bool:
            status = self.http.get(self.controller_url + "/v1/status").json()
            return bool(status["ready"]) and int(status["targets"]) >= expected

        how = "Consul" if self.options.consul else "the built-in registry"
        _poll(assigned, timeout=180, what=f"{expected} targets registered with {how}",
              alive=lambda: self._check_alive("controller", "fleet"))
        status = self.http.get(self.controller_url + "/v1/status").json()
        self._step(f"✓ fleet registered     {status['targets']} targets via {how}; assignment version "
                 f"{status['assignment_version']}, {status['shards']} shards")

    def _wanted_children(self) -> dict[str, str]:
        """child -> shard, from /v1/shards."""
        rows = self.http.get(self.controller_url + "/v1/shards").json()["shards"]
        return {c["child"]: row["shard"] for row in rows for c in row["children"]}

    def _launch_child(self, child: str) -> None:
        with self._children_lock:
            port = self.child_ports.get(child) or free_port()
            self.child_ports[child] = port
        directory = self.data / "children" / child
        directory.mkdir(parents=True, exist_ok=True)
        relative = f"children/{child}/prometheus.yml"
        # The file the controller validated and published, read in place (as a shared volume
        # would be): when it publishes a changed config it POSTs /-/reload to the child.
        config = self.data / "controller" / "rendered" / relative

        def published() -> bool:
            return self.http.get(f"{self.controller_url}/v1/configs/{relative}").status_code == 200

        _poll(published, timeout=60, what=f"the controller to publish {child}'s config")
        assert self.spec is not None  # start() loads it before any child
        launch = components.child(
            binary=self._binaries["prometheus"], name=child, config=config, wal=directory / "wal", port=port,
            agent_flag=self.spec.prometheus.rendering().agent_flag, tls=self.tls,
        )
        self._launch(launch)
        with self._children_lock:
            self.started_children.add(child)
        assert self.router is not None
        self.router.set(child, port)

    def _wait_child(self, child: str) -> None:
        name = f"child/{child}"
        try:
            self.supervisor.wait_ready(name)
        except ComponentFailed as exc:
            # Ports are picked free up front; on a busy machine another process may bind
            # one first. The master reaches children through the router, so a child can
            # move: once, on another port.
            if "address already in use" not in str(exc):
                raise
            self._step(f"! {name:<20} port {self.child_port(child)} taken meanwhile; starting it on another")
            self.supervisor.stop(name)
            with self._children_lock:
                self.child_ports[child] = free_port()
            self._launch_child(child)
            self.supervisor.wait_ready(name)
        self._step(f"✓ {name:<20} ready  {self.url(self.child_port(child))}")

    def child_port(self, child: str) -> int:
        with self._children_lock:
            return self.child_ports[child]

    def started(self) -> set[str]:
        """A copy of the children started so far (the follower adds to it meanwhile)."""
        with self._children_lock:
            return set(self.started_children)

    def _wait_first_samples(self) -> None:
        expected = self.layout.nodes

        def arrived() -> bool:
            figures = report.master_figures(self.http, self.master_url)
            return figures.targets_up >= expected

        try:
            _poll(arrived, timeout=self.options.first_samples_timeout,
                  what="every target's first samples at the master")
        except DemoError as exc:  # the stack runs; the summary will show how many arrived
            self._step(f"! {exc}")
            return
        self._step(f"✓ master               samples of all {expected} targets arrived")

    def _check_alive(self, *names: str) -> None:
        for name in names:
            self.supervisor.is_ready(name)  # raises ComponentFailed with the log tail if it died

    # ---- following the shard map ---------------------------------------------------------------------
    def _follow(self) -> None:
        while not self._stop.wait(self.options.follow_interval):
            try:
                self.follow_once()
            except Exception as exc:  # a controller restart or a slow answer: try again next time
                log.info("follower: %s", exc)

    def follow_once(self) -> None:
        """Start children of new shards; stop those the controller no longer serves."""
        wanted = self._wanted_children()
        for child in sorted(set(wanted) - self.started()):
            if self._stop.is_set():
                return
            self._launch_child(child)
            self._wait_child(child)
            self.say(f"  + child/{child} started for shard {wanted[child]}")
        for child in sorted(self.started() - set(wanted)):
            if not self.supervisor.alive(f"child/{child}"):
                continue
            response = self.http.get(f"{self.controller_url}/v1/sd/{child}")
            if response.status_code == 404:
                self.supervisor.stop(f"child/{child}")
                assert self.router is not None
                self.router.remove(child)
                self.say(f"  - child/{child} stopped: its shard is gone and handed over")

    def running_children(self) -> list[str]:
        return sorted(c for c in self.started() if self.supervisor.alive(f"child/{c}"))

    # ---- running -------------------------------------------------------------------------------------
    def run(self, duration: float | None, *, status_every: float = 15.0) -> None:
        """Until ``duration`` passes (None: until interrupted), with a status line now and then."""
        deadline = None if duration is None else time.monotonic() + duration
        next_status = time.monotonic() + status_every
        reported: set[str] = set()
        while deadline is None or time.monotonic() < deadline:
            wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            time.sleep(wait)
            for name, code in self.supervisor.exited().items():
                if self.options.restart and not self._stop.is_set():
                    self._restart(name, code)
                elif name not in reported:
                    reported.add(name)
                    self.say(f"  ! {name} exited with status {code}; see {self.supervisor.log_tail(name, 5)}")
            if time.monotonic() >= next_status:
                next_status += status_every
                self.say("  " + self.status_line())

    def _restart(self, name: str, code: int) -> None:
        """``--restart``: the same command line again (the same ports); counted per component.

        At most one restart per component every ``RESTART_BACKOFF_S``: a component that dies
        at once is not restarted in a tight loop.
        """
        now = time.monotonic()
        if now - self._restarted_at.get(name, -RESTART_BACKOFF_S) < RESTART_BACKOFF_S:
            return
        self._restarted_at[name] = now
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.say(f"  ! {name} exited with status {code}; restarting it (restart {self.restarts[name]})")
        try:
            self.supervisor.restart(name, wait=False)
        except (ComponentFailed, KeyError) as exc:
            self.say(f"  ! {name} could not be restarted: {exc}")

    def status_line(self) -> str:
        figures = report.master_figures(self.http, self.master_url)
        inbox = self.sink.snapshot() if self.sink is not None else None
        return report.status_line(
            figures,
            expected=self.layout.nodes,
            children=len(self.running_children()),
            messages=len(inbox.messages) if inbox else 0,
            beats=inbox.heartbeats if inbox else 0,
        )

    # ---- stop and report --------------------------------------------------------------------------------
    def finish(self, *, duration: float | None, error: str = "") -> dict[str, Any]:
        """Read every figure, stop everything, count leftovers: the summary document."""
        figures = report.master_figures(self.http, self.master_url) if self.spec is not None else None
        stats: dict[str, dict[str, float]] = {
            name: {"cpu_s": s.cpu_s, "cpu_pct": s.cpu_pct, "rss_mib": s.rss_mib, "pid": s.pid}
            for name, s in self.supervisor.stats().items()
        }
        stats["demo"] = _self_stats()
        children = len(self.running_children())
        shards = 0
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            shards = len(self.http.get(self.controller_url + "/v1/shards").json()["shards"])
        stopping = time.monotonic()
        exits = [e.document() for e in self.supervisor.exits()]
        self.stop()
        shutdown_s = round(time.monotonic() - stopping, 1)
        inbox = self.sink.snapshot() if self.sink is not None else None
        summary: dict[str, Any] = {
            "nodes": self.layout.nodes,
            "gpus": self.layout.nodes * self.layout.gpus,
            "regions": self.layout.regions,
            "replication_factor": self.layout.replication_factor,
            "shards": shards,
            "children": children,
            "targets_expected": self.layout.nodes,
            # The releases the binaries named (--version), which the spec's versions were checked against.
            "prometheus_version": str(self.binaries.prometheus_release) if self.binaries else None,
            "alertmanager_version": str(self.binaries.alertmanager_release) if self.binaries else None,
            "targets_up_at_master": figures.targets_up if figures else 0,
            "targets_up_by_region": figures.up_by_region if figures else {},
            "up_count_by_job_at_master": figures.count_by_job if figures else {},
            "up_by_job_at_master": figures.up_by_job if figures else {},
            "series_at_master": figures.series if figures else 0,
            "samples_per_s_at_master": figures.samples_per_s if figures else 0.0,
            "alerts_firing_at_master": figures.firing if figures else {},
            "alerts_delivered": len(inbox.messages) if inbox else 0,
            "alerts_by_robot": _count_by_robot(inbox.messages) if inbox else {},
            "alerts_refused": len(inbox.rejected) if inbox else 0,
            "heartbeats": inbox.heartbeats if inbox else 0,
            "startup_s": self.startup_s,
            # As run: from ready to the stop (None when it never got ready); asked: --duration.
            "duration_s": None if self.ready_at is None else round(stopping - self.ready_at, 1),
            "duration_requested_s": duration,
            "exited": exits,
            "restarts": dict(sorted(self.restarts.items())),
            "restart_enabled": self.options.restart,
            "shutdown_s": shutdown_s,
            "processes": dict(sorted(stats.items())),
            "leftover_processes": len(self.supervisor.leftovers()),
            "urls": self.urls(),
            "tls": self.options.tls,
            "data_dir": str(self.data),
        }
        if figures is not None and figures.error:
            summary["master_error"] = figures.error
        if error:
            summary["error"] = error
        return summary

    def stop(self) -> None:
        """Stop every process and thread the demo started; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=30)
        children = [n for n in self.supervisor.names() if n.startswith("child/")]
        # Children and the fleet together, then the control plane; the Alertmanagers one
        # at a time (a replica leaving waits for a live peer's ack, 10 s when none is left).
        # The fleet deregisters its nodes on the way out: while the controller still answers.
        self.supervisor.stop_all(
            [[*children, "fleet"], ["controller", "master", "relay"], ["alertmanager-1"], ["alertmanager-0"]]
        )
        for server in (self.router, self.sink):
            if server is not None:
                server.__exit__(None, None, None)
        self.http.close()
        if self._log_handler is not None:
            logging.getLogger("federation.demo").removeHandler(self._log_handler)
            self._log_handler.close()

    def __enter__(self) -> DemoStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- output -----------------------------------------------------------------------------------------
    def _show(self, message: Message) -> None:
        if self.show_messages:
            self.say(as_group_sees_it(message))

    def _print_urls(self) -> None:
        urls = self.urls()
        self.say("")
        self.say(f"  web page (shard map)  {urls['web']}")
        self.say(f"  API docs              {urls['api_docs']}")
        self.say(f"  master Prometheus     {urls['master']}")
        self.say(f"  Alertmanager          {'  '.join(urls['alertmanagers'])}")
        self.say(f"  DingTalk messages     {urls['dingtalk_sink']}")
        self.say(f"  write token           {self.data / 'token'}  (Authorization: Bearer ...)")
        self.say(f"  logs                  {self.data / 'logs'}")
        self.say("")


def _children(assignment: Assignment) -> list[str]:
    """The children of the first assignment (the controller's is the same: shard counts are fixed)."""
    return [child for shard in assignment.shards for child, _ in assignment.children(shard)]


def _json(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def _http_ok(client: httpx.Client, address: str) -> Callable[[], bool]:
    def check() -> bool:
        return client.get(address).status_code == 200

    return check


def _poll(check: Callable[[], bool], *, timeout: float, what: str,
          alive: Callable[[], None] | None = None, interval: float = 0.5) -> None:
    """Until ``check`` is true; HTTP errors and half-written answers count as "not yet";
    ``alive`` raises when a process died."""
    wait_until(check, timeout=timeout, what=what, interval=interval, alive=alive,
               retry_on=(httpx.HTTPError, ValueError, KeyError), fail=DemoError)


def _self_stats() -> dict[str, float]:
    """The demo process itself (sink, router, follower), not the children it reaped."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stat = procstat.read(os.getpid())
    cpu_s = round(usage.ru_utime + usage.ru_stime, 2)
    return {
        "cpu_s": cpu_s,
        "cpu_pct": round(100 * cpu_s / stat.age_s, 1) if stat and stat.age_s else 0.0,
        "rss_mib": stat.rss_mib if stat else 0.0,
        "pid": os.getpid(),
    }


def _count_by_robot(messages: list[Message]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in messages:
        counts[message.robot] = counts.get(message.robot, 0) + 1
    return dict(sorted(counts.items()))


def dump_summary(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2, sort_keys=True)


__all__ = ["ComponentFailed", "DemoError", "DemoOptions", "DemoStack", "dump_summary", "free_port"]
