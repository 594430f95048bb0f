"""An in-process Consul agent speaking enough of the HTTP API for gpufed's tests.

Endpoints (shapes follow Consul's documented JSON; keys in request bodies are matched
case-insensitively, as Consul does):

    PUT /v1/agent/service/register[?replace-existing-checks=true]
    PUT /v1/agent/service/deregister/{id}
    PUT /v1/agent/check/{pass,warn,fail}/{id}[?note=], PUT /v1/agent/check/update/{id}
    GET /v1/agent/services
    GET /v1/catalog/service/{name}[?tag=T]           blocking: ?index=N&wait=5s
    GET /v1/health/service/{name}[?passing][&tag=T]  blocking: ?index=N&wait=5s

A check with a ``TTL`` turns critical ("TTL expired") unless updated within it.
Blocking queries return as soon as the raft index moves past N, or when `wait` elapses,
with `X-Consul-Index`. Registration validates Meta limits and the check's
DeregisterCriticalServiceAfter the way Consul does (HTTP 400 with a plain-text reason).
`restart()` forgets every service (an agent rebuilt without its data dir);
`run_checks()` runs the HTTP checks once; `set_status()` forces a check status.

For discovery tests: `node_meta` is the agent node's Meta; `acl_token` makes reads
answer 403 "Permission denied" without that token (X-Consul-Token header or ?token=);
`?dc=` other than dc1 answers 500 "No path to datacenter"; `set_index()` moves the raft
index (backwards too, as after a snapshot restore); `inject()` queues canned answers
(status, body, headers) for the next health reads, to serve garbage exactly as given;
`kill()` closes the listener (connection refused) and `revive()` opens it again on the
same port, keeping the state; `register_local()` registers without HTTP (bulk set-up).

KV and sessions (``/v1/kv/...``, ``/v1/session/...``) live in
:mod:`federation.testing.standins.consul.kv` (``agent.kv``); `advance(seconds)` moves their clock.
Run ``python -m federation.testing.standins.consul.agent --port N`` for a stand-in in its own process.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer
from federation.testing.standins.consul.kv import KvError, KvSessions

NODE = "fake-node"
NODE_ADDRESS = "127.0.0.1"
DATACENTER = "dc1"
_META_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go duration ("5s", "1m30s", "100ms") in seconds; a bare number means seconds."""
    if re.fullmatch(r"\d+", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _lower(obj: Any) -> Any:
    """Lower-case dict keys one level deep (Meta keys must keep their case)."""
    return {str(k).lower(): v for k, v in obj.items()} if isinstance(obj, dict) else obj


class BadRequest(Exception):
    """Maps to HTTP 400 with Consul's plain-text body."""


class NotFoundError(Exception):
    """Maps to HTTP 404 with Consul's plain-text body."""


@dataclass
class Check:
    check_id: str
    name: str
    service_id: str
    service_name: str
    http: str = ""
    tcp: str = ""
    """A TCP check's ``host:port`` (the stand-in records it; ``run_checks`` runs HTTP checks)."""
    interval: str = ""
    timeout: str = ""
    deregister_after: str = ""
    status: str = "critical"
    output: str = ""
    ttl: str = ""
    expires_at: float | None = None
    """A TTL check turns critical ("TTL expired") unless updated before this (stand-in clock)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "Node": NODE, "CheckID": self.check_id, "Name": self.name, "Status": self.status,
            "Notes": "", "Output": self.output, "ServiceID": self.service_id,
            "ServiceName": self.service_name, "ServiceTags": [],
            "Type": "ttl" if self.ttl else ("http" if self.http else ("tcp" if self.tcp else "")),
            "Definition": {"HTTP": self.http, "TCP": self.tcp, "Interval": self.interval,
                           "Timeout": self.timeout, "TTL": self.ttl,
                           "DeregisterCriticalServiceAfter": self.deregister_after},
        }


@dataclass
class Service:
    service_id: str
    name: str
    address: str
    port: int
    tags: list[str]
    meta: dict[str, str]
    create_index: int
    modify_index: int
    checks: dict[str, Check] = field(default_factory=dict)

    def agent_json(self) -> dict[str, Any]:
        return {
            "Kind": "", "ID": self.service_id, "Service": self.name, "Tags": self.tags, "Meta": self.meta,
            "Port": self.port, "Address": self.address, "TaggedAddresses": {},
            "Weights": {"Passing": 1, "Warning": 1}, "EnableTagOverride": False, "Datacenter": DATACENTER,
        }


class FakeConsulAgent:
    """Thread-safe fake agent + catalog for one node; use as a context manager."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        acl_token: str | None = None,
        ttl_multiplier: float = 2.0,
        session_ttl_min_s: float = 10.0,
    ) -> None:
        self.services: dict[str, Service] = {}
        self.index = 1
        self.node_meta: dict[str, str] = {}
        self.node_index = 1
        self.acl_token = acl_token
        self.injected: list[tuple[int, str | bytes, dict[str, str]]] = []
        self._connections: set[socket.socket] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path?query), for assertions
        self._cond = threading.Condition()
        self.kv = KvSessions(self, ttl_multiplier=ttl_multiplier, session_ttl_min_s=session_ttl_min_s)
        self._host = host
        self._server = LoopbackHTTPServer(self._handler_class(), host=host, port=port, name="consul-standin")

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeConsulAgent:
        self._server.start()
        self.kv.start()
        return self

    def stop(self) -> None:
        self.kv.stop()
        self._close()

    def _close(self) -> None:
        with self._cond:
            self._cond.notify_all()
        self._server.stop()

    def __enter__(self) -> FakeConsulAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        """Close the listener: clients now get "connection refused"; state is kept."""
        port = self.port
        self._close()  # the servers keep their sessions' clocks running meanwhile
        for conn in list(self._connections):  # a dead agent drops kept-alive connections too
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._killed_port = port

    def revive(self) -> None:
        """Listen again on the same port with the same state."""
        self._server = LoopbackHTTPServer(self._handler_class(), host=self._host, port=self._killed_port,
                                          name="consul-standin").start()

    def advance(self, seconds: float) -> None:
        """Move the KV/session clock forward: TTLs and lock-delays run out without sleeping."""
        self.kv.advance(seconds)

    @staticmethod
    def parse_duration(text: str) -> float:
        return parse_duration(text)

    @staticmethod
    def wait_seconds(query: dict[str, list[str]]) -> float:
        return parse_duration(query.get("wait", ["5m"])[0])

    def known_checks(self) -> dict[str, str]:
        """Check id -> status, what a session's NodeChecks may name (serfHealth always passes)."""
        with self._cond:
            checks = {c.check_id: c.status for s in self.services.values() for c in s.checks.values()}
        return {"serfHealth": "passing", **checks}

    def set_index(self, index: int) -> None:
        """Move the raft index to ``index`` (backwards too) and wake blocked queries."""
        with self._cond:
            self.index = index
            self._cond.notify_all()

    def set_node_meta(self, meta: dict[str, str]) -> None:
        with self._cond:
            self.node_meta = dict(meta)
            self.node_index = self.index + 1
            self._bump()

    def inject(self, status: int, body: str | bytes, headers: dict[str, str] | None = None) -> None:
        """Answer the next health read with exactly this (after any blocking wait)."""
        with self._cond:
            self.injected.append((status, body, dict(headers or {})))

    def register_local(self, body: dict[str, Any]) -> None:
        """What PUT /v1/agent/service/register does, without the HTTP round trip."""
        self.register(body, replace_checks=True)

    def restart(self) -> None:
        """Forget everything, as an agent rebuilt without its data directory does."""
        with self._cond:
            self.services.clear()
            self._bump()

    # ---- state changes -----------------------------------------------------------------
    def _bump(self) -> None:
        self.index += 1
        self._cond.notify_all()

    def register(self, body: dict[str, Any], *, replace_checks: bool) -> None:
        spec = _lower(body)
        name = spec.get("name")
        if not name:
            raise BadRequest("Missing service name")
        service_id = spec.get("id") or name
        meta = spec.get("meta") or {}
        if len(meta) > 64:
            raise BadRequest("Invalid Service Meta: Node metadata cannot contain more than 64 "
                             "key/value pairs")
        for key, value in meta.items():
            if not _META_KEY.match(key) or len(key) > 128:
                raise BadRequest("Invalid Service Meta: Key contains invalid characters or is too "
                                 f"long: {key}")
            if key.startswith("consul-"):
                raise BadRequest(f"Invalid Service Meta: Key prefix 'consul-' is reserved: {key}")
            if len(str(value)) > 512:
                raise BadRequest(f"Invalid Service Meta: Value is too long (limit: 512 characters): {key}")
        raw_checks = list(spec.get("checks") or [])
        if spec.get("check"):
            raw_checks.insert(0, spec["check"])
        checks: dict[str, Check] = {}
        for n, raw in enumerate(raw_checks, start=1):
            c = _lower(raw)
            check_id = c.get("checkid") or c.get("id") or (
                f"service:{service_id}" if len(raw_checks) == 1 else f"service:{service_id}:{n}")
            after = c.get("deregistercriticalserviceafter") or ""
            try:
                for text in (c.get("interval") or "", c.get("timeout") or "", after, c.get("ttl") or ""):
                    if text:
                        parse_duration(text)
            except ValueError as exc:
                raise BadRequest(f"Invalid check: {exc}") from exc
            checks[check_id] = Check(
                check_id=check_id, name=c.get("name") or f"Service '{name}' check", service_id=service_id,
                service_name=name, http=c.get("http") or "", tcp=c.get("tcp") or "",
                interval=c.get("interval") or "",
                timeout=c.get("timeout") or "", deregister_after=after, status=c.get("status") or "critical",
                ttl=c.get("ttl") or "",
            )
            if c.get("ttl"):
                checks[check_id].expires_at = self.kv.now() + parse_duration(c["ttl"])
        with self._cond:
            old = self.services.get(service_id)
            if old is not None:
                for check_id, check in checks.items():  # Consul keeps the status of a known check
                    if check_id in old.checks:
                        check.status, check.output = old.checks[check_id].status, old.checks[check_id].output
                if not replace_checks:
                    checks = {**old.checks, **checks}
            self.services[service_id] = Service(
                service_id=service_id, name=name, address=spec.get("address") or "",
                port=int(spec.get("port") or 0),
                tags=list(spec.get("tags") or []), meta={k: str(v) for k, v in meta.items()},
                create_index=old.create_index if old else self.index + 1, modify_index=self.index + 1,
                checks=checks,
            )
            self._bump()

    def deregister(self, service_id: str) -> bool:
        with self._cond:
            if self.services.pop(service_id, None) is None:
                return False
            self._bump()  # wakes the reaper: sessions naming its checks end
            return True

    def update_ttl_check(self, check_id: str, status: str, output: str) -> None:
        """``PUT /v1/agent/check/{pass,warn,fail}/{id}`` and ``.../update/{id}``: a TTL check's
        new status; its TTL starts again (any update counts, as in Consul)."""
        with self._cond:
            check = next((c for s in self.services.values() for c in s.checks.values()
                          if c.check_id == check_id), None)
            if check is None:
                raise NotFoundError(f'Unknown check ID "{check_id}". Ensure that the check ID is passed, '
                                    "not the check name.")
            if not check.ttl:
                raise BadRequest(f"CheckID {check_id!r} does not have associated TTL")
            check.expires_at = self.kv.now() + parse_duration(check.ttl)
            if (check.status, check.output) != (status, output):
                check.status, check.output = status, output
                self._bump()

    def expire_ttl_checks(self, now: float) -> float | None:
        """Turn TTL checks past their TTL critical; when the next one is due (stand-in clock)."""
        due = None
        for check in (c for s in self.services.values() for c in s.checks.values()):
            if check.expires_at is not None and check.expires_at <= now:
                check.expires_at = None
                if check.status != "critical":
                    check.status, check.output = "critical", "TTL expired"
                    self._bump()
            elif check.expires_at is not None:
                due = check.expires_at if due is None else min(due, check.expires_at)
        return due

    def set_status(self, service_id: str, status: str) -> None:
        with self._cond:
            for check in self.services[service_id].checks.values():
                check.status = status
            self._bump()

    def run_checks(self) -> None:
        """Run every HTTP check once, like the agent's check runner would."""
        with self._cond:
            checks = [c for s in self.services.values() for c in s.checks.values() if c.http]
        for check in checks:
            timeout = parse_duration(check.timeout) if check.timeout else 10.0
            try:
                with urllib.request.urlopen(check.http, timeout=timeout) as response:
                    status, output = ("passing" if 200 <= response.status < 300 else "critical"), ""
            except (urllib.error.URLError, OSError) as exc:
                status, output = "critical", str(exc)
            with self._cond:
                if check.status != status:
                    check.status, check.output = status, output
                    self._bump()

    # ---- reads -------------------------------------------------------------------------
    def _wait(self, query: dict[str, list[str]]) -> int:
        """Block while the index has not moved past ?index=, up to ?wait= (default 5m)."""
        want = int(query.get("index", ["0"])[0] or 0)
        wait = min(parse_duration(query.get("wait", ["5m"])[0]), 600.0)
        with self._cond:
            self._cond.wait_for(lambda: self.index > want, timeout=wait if want > 0 else 0)
            return self.index

    def _matching(self, name: str, query: dict[str, list[str]]) -> list[Service]:
        tags = query.get("tag", [])
        return sorted((s for s in self.services.values()
                       if s.name == name and all(t in s.tags for t in tags)), key=lambda s: s.service_id)

    def catalog_service(self, name: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        with self._cond:
            return [{
                "ID": "00000000-0000-0000-0000-000000000001", "Node": NODE, "Address": NODE_ADDRESS,
                "Datacenter": DATACENTER, "TaggedAddresses": {"lan": NODE_ADDRESS}, "NodeMeta": {},
                "ServiceKind": "", "ServiceID": s.service_id, "ServiceName": s.name, "ServiceTags": s.tags,
                "ServiceAddress": s.address, "ServiceMeta": s.meta, "ServicePort": s.port,
                "ServiceWeights": {"Passing": 1, "Warning": 1}, "ServiceEnableTagOverride": False,
                "CreateIndex": s.create_index, "ModifyIndex": s.modify_index,
            } for s in self._matching(name, query)]

    def health_service_body(self, name: str, query: dict[str, list[str]]) -> bytes:
        """The JSON body of health_service, built from per-entry fragments cached by what
        can change them, so a 10,000-service answer costs the stand-in milliseconds (real
        Consul encodes it in Go) and benchmarks time gpufed rather than this fake."""
        passing = "passing" in query and query["passing"][0].lower() not in ("0", "false")
        cache: dict[tuple[Any, ...], bytes] = getattr(self, "_fragments", {})
        fresh: dict[tuple[Any, ...], bytes] = {}
        parts = []
        with self._cond:
            for s in self._matching(name, query):
                statuses = tuple((c.status, c.output) for c in s.checks.values())
                if passing and any(status != "passing" for status, _ in statuses):
                    continue
                key = (s.service_id, s.modify_index, self.node_index, statuses)
                fragment = cache.get(key)
                if fragment is None:
                    fragment = json.dumps(self._health_entry(s)).encode()
                fresh[key] = fragment
                parts.append(fragment)
        self._fragments = fresh
        return b"[" + b",".join(parts) + b"]"

    def health_service(self, name: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        passing = "passing" in query and query["passing"][0].lower() not in ("0", "false")
        with self._cond:
            return [self._health_entry(s) for s in self._matching(name, query)
                    if not (passing and any(c.status != "passing" for c in s.checks.values()))]

    def _health_entry(self, s: Service) -> dict[str, Any]:
        checks = [{"Node": NODE, "CheckID": "serfHealth", "Name": "Serf Health Status",
                   "Status": "passing", "ServiceID": "", "ServiceName": ""}]
        checks += [c.as_json() for c in s.checks.values()]
        return {
            "Node": {"ID": "00000000-0000-0000-0000-000000000001", "Node": NODE,
                     "Address": NODE_ADDRESS, "Datacenter": DATACENTER,
                     "TaggedAddresses": {"lan": NODE_ADDRESS, "wan": NODE_ADDRESS},
                     "Meta": dict(self.node_meta), "CreateIndex": 1, "ModifyIndex": self.node_index},
            "Service": {**s.agent_json(), "CreateIndex": s.create_index, "ModifyIndex": s.modify_index},
            "Checks": checks,
        }

    # ---- HTTP --------------------------------------------------------------------------
    def _handler_class(self) -> type[LoopbackHandler]:
        agent = self

        class Handler(LoopbackHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def setup(self) -> None:
                super().setup()
                agent._connections.add(self.connection)

            def finish(self) -> None:
                agent._connections.discard(self.connection)
                super().finish()

            def _reply(self, status: int, body: Any, *, index: int | None = None) -> None:
                kind = "text/plain" if isinstance(body, (str, bytes)) else "application/json"
                consul = None if index is None else {
                    "X-Consul-Index": str(index), "X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0"}
                self.reply(status, body, content_type=kind, headers=consul)

            def _raw(self, status: int, body: str | bytes, headers: dict[str, str]) -> None:
                self.reply(status, body, content_type="application/json", headers=headers)

            def _route(self, method: str) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query, keep_blank_values=True)
                agent.requests.append((method, self.path))
                raw = self.body()
                try:
                    self._dispatch(method, url.path, query, raw)
                except BadRequest as exc:
                    self._reply(400, str(exc))
                except NotFoundError as exc:
                    self._reply(404, str(exc))
                except (ValueError, json.JSONDecodeError) as exc:
                    self._reply(400, f"Request decode failed: {exc}")

            def _dispatch(self, method: str, path: str, query: dict[str, list[str]], raw: bytes) -> None:
                if method == "PUT" and path == "/v1/agent/service/register":
                    replace = query.get("replace-existing-checks", ["false"])[0].lower() in ("true", "1", "")
                    agent.register(json.loads(raw or b"{}"), replace_checks=replace)
                    return self._reply(200, "")
                if method == "PUT" and path.startswith("/v1/agent/service/deregister/"):
                    service_id = path.rsplit("/", 1)[1]
                    if agent.deregister(service_id):
                        return self._reply(200, "")
                    return self._reply(404, f'Unknown service ID "{service_id}". Ensure that the service ID '
                                            "is passed, not the service name.")
                for verb, new_status in (("pass", "passing"), ("warn", "warning"), ("fail", "critical")):
                    if method == "PUT" and path.startswith(f"/v1/agent/check/{verb}/"):
                        agent.update_ttl_check(path.rsplit("/", 1)[1], new_status, query.get("note", [""])[0])
                        return self._reply(200, "")
                if method == "PUT" and path.startswith("/v1/agent/check/update/"):
                    body = _lower(json.loads(raw or b"{}"))
                    if body.get("status") not in ("passing", "warning", "critical"):
                        raise BadRequest(f"Invalid Status: {body.get('status')!r}")
                    output = str(body.get("output") or "")
                    agent.update_ttl_check(path.rsplit("/", 1)[1], body["status"], output)
                    return self._reply(200, "")
                if method == "GET" and path == "/v1/agent/services":
                    with agent._cond:
                        listing = {i: s.agent_json() for i, s in sorted(agent.services.items())}
                    return self._reply(200, listing)
                if path.startswith(("/v1/kv", "/v1/session/")):
                    token = self.headers.get("X-Consul-Token") or query.get("token", [""])[0]
                    if agent.acl_token is not None and token != agent.acl_token:
                        return self._reply(403, "Permission denied")
                    try:
                        reply = agent.kv.dispatch(
                            method, unquote(path), query, raw, node=NODE, checks=agent.known_checks()
                        )
                    except KvError as exc:
                        return self._reply(exc.status, exc.text)
                    if reply is not None:
                        code, payload, kv_index = reply
                        return self._reply(code, payload, index=kv_index)
                for prefix, reader in (("/v1/catalog/service/", agent.catalog_service),
                                       ("/v1/health/service/", agent.health_service)):
                    if method == "GET" and path.startswith(prefix):
                        token = self.headers.get("X-Consul-Token") or query.get("token", [""])[0]
                        if agent.acl_token is not None and token != agent.acl_token:
                            return self._reply(403, "Permission denied")
                        if query.get("dc", [DATACENTER])[0] != DATACENTER:
                            return self._reply(500, "No path to datacenter")
                        index = agent._wait(query)
                        if prefix == "/v1/health/service/" and agent.injected:
                            with agent._cond:
                                status, body, headers = agent.injected.pop(0)
                            return self._raw(status, body, headers)
                        if prefix == "/v1/health/service/":
                            body = agent.health_service_body(path[len(prefix):], query)
                            return self._raw(200, body, {"X-Consul-Index": str(index),
                                                         "X-Consul-KnownLeader": "true",
                                                         "X-Consul-LastContact": "0"})
                        return self._reply(200, reader(path[len(prefix):], query), index=index)
                return self._reply(404, f"Invalid URL path: not a recognized HTTP API endpoint: {path}")

            def do_GET(self) -> None:
                self._route("GET")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        return Handler


def exporter_service(i: int, *, regions: int = 2) -> dict[str, Any]:
    """A registration like gpufed-exporter's (Meta region/rack/team/gpu_count/node), passing."""
    return {
        "Name": "gpufed-exporter", "ID": f"gpufed-exporter-node-{i}-9400",
        "Address": f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}", "Port": 9400,
        "Tags": ["gpu", "prometheus"],
        "Meta": {"region": f"region-{i % regions}", "rack": f"rack-{i % 16:02d}", "team": "llm",
                 "gpu_count": "8", "metrics_path": "/metrics", "node": f"node-{i}"},
        "Check": {"TTL": "1h", "Status": "passing"},
    }


def main(argv: list[str] | None = None) -> None:
    """Run the agent as its own process (benchmarks): prints its port, serves until killed."""
    import argparse

    parser = argparse.ArgumentParser(description="fake Consul agent (a test stand-in)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (the compose runner: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--services", type=int, default=0, help="exporter services registered at start")
    parser.add_argument("--regions", type=int, default=2)
    parser.add_argument("--ttl-multiplier", type=float, default=2.0,
                        help="a TTL session is reaped this many TTLs after its last renewal (Consul: 2)")
    args = parser.parse_args(argv)
    agent = FakeConsulAgent(host=args.host, port=args.port, ttl_multiplier=args.ttl_multiplier)
    for i in range(args.services):
        agent.register_local(exporter_service(i, regions=args.regions))
    agent.start()
    print(agent.port, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
