"""An in-process stand-in for the gpufed controller's built-in registry (`gpufed serve`).

It implements the registry's HTTP contract exactly, so the exporter's adapter is tested
against a real server rather than patched calls:

    PUT    /v1/registry/targets/{identity}   write token; body: one inventory target entry
           200 (refreshed) / 201 (new) {"identity": ..., "expires_in_s": ttl}
           422 application/problem+json naming the field; the path's identity (URL-decoded)
           must be the entry's: its explicit `identity`, else host:port (IPv6 bracketed)
    DELETE /v1/registry/targets/{identity}   write token; 204, or 404 when unknown
    GET    /v1/registry/targets              read or write token;
           {"targets": [{identity, ...entry fields..., expires_in_s}, ...]} by identity
    POST   /v1/registry/batch                write token; {"put": [{identity, ...entry}], "delete":
           [identity]}: every entry checked first, then all applied; 200 {"put", "created",
           "deleted", "expires_in_s"}, or 422 with `errors` [{index, identity, field, value,
           message}] and nothing applied. `batch = False` answers 404 (an older controller).

Without `Authorization: Bearer <token>` (or with a wrong one) every call answers 401; the
read-only token answers 403 on writes. An entry expires `ttl` seconds after its last PUT
(the clock is injectable, `time.monotonic` by default). Switches for failure tests:
`mode = "follower"` answers 503 with the leader's URL; `mode = "drop"` closes every
connection without an answer. `latency` delays every answer (a network round trip plus
the controller's own work, for benchmarks). `FakeControllerRegistry(port=N)` listens on a port chosen
beforehand (a controller that comes up late). `requests` records (method, raw path).

Run as a process (`python tests/fakes/controller_registry.py --port 0`) it prints its port
and serves until killed, so benchmarks time the exporter, not a shared GIL.
"""

from __future__ import annotations

import ipaddress
import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

PREFIX = "/v1/registry/targets"
BATCH = "/v1/registry/batch"
REQUIRED = {"address": str, "port": int, "job": str, "node": str, "region": str}
OPTIONAL = {"rack": str, "team": str, "gpus": int, "metrics_path": str, "labels": dict, "identity": str,
            "weight": int}
RESERVED_LABELS = {"cluster", "region", "shard", "replica", "job", "instance"}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?$")


class Unprocessable(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def normalise_host(address: str) -> str:
    """The inventory's spelling: IPs canonical (IPv6 unbracketed), names lower-case."""
    if address.startswith("[") and address.endswith("]"):
        raise Unprocessable("address", "IPv6 without brackets, please")
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    if ":" in address:
        raise Unprocessable("address", "address includes a port, or is not an IPv6 address")
    if not _HOST_NAME.match(address):
        raise Unprocessable("address", "not a host name or IP address")
    return address.rstrip(".").lower()


def validate(body: Any) -> dict[str, Any]:
    """One target entry, checked as the inventory loader checks a `targets:` entry."""
    if not isinstance(body, dict):
        raise Unprocessable("body", "expected a JSON object")
    for name in body:
        if name not in REQUIRED and name not in OPTIONAL:
            raise Unprocessable(name, "extra fields are not permitted")
    entry: dict[str, Any] = {}
    for name, kind in (*REQUIRED.items(), *OPTIONAL.items()):
        if name not in body:
            if name in REQUIRED:
                raise Unprocessable(name, "field required")
            continue
        value = body[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise Unprocessable(name, f"expected {kind.__name__}")
        if isinstance(value, str) and value != value.strip():
            raise Unprocessable(name, "no leading or trailing whitespace")
        entry[name] = value
    for name in ("job", "node", "region"):
        if not entry[name]:
            raise Unprocessable(name, "must not be empty")
    if not 1 <= entry["port"] <= 65535:
        raise Unprocessable("port", "must be 1-65535")
    if not 0 <= entry.get("gpus", 0) <= 64:
        raise Unprocessable("gpus", "must be 0-64")
    path = entry.get("metrics_path")
    if path is not None and (not path.startswith("/") or " " in path or "?" in path or "#" in path):
        raise Unprocessable("metrics_path", "a URL path starting with '/', no spaces, query or fragment")
    for label, value in entry.get("labels", {}).items():
        if not _LABEL_NAME.match(label) or label.startswith("__") or label in RESERVED_LABELS:
            raise Unprocessable("labels", f"not a usable label name: {label!r}")
        if not isinstance(value, str):
            raise Unprocessable("labels", f"label {label!r} must be a string")
    entry["address"] = normalise_host(entry["address"])
    return entry


def identity_of(entry: dict[str, Any]) -> str:
    if entry.get("identity"):
        return str(entry["identity"])
    host = entry["address"]
    return f"[{host}]:{entry['port']}" if ":" in host else f"{host}:{entry['port']}"


class FakeControllerRegistry:
    """Thread-safe fake of the registry API on 127.0.0.1; use as a context manager."""

    def __init__(
        self,
        *,
        port: int = 0,
        token: str = "write-token",
        read_token: str = "read-token",
        ttl: float = 90.0,
        clock: Callable[[], float] = time.monotonic,
        latency: float = 0.0,
    ) -> None:
        self.token, self.read_token, self.ttl, self.clock = token, read_token, ttl, clock
        self.latency = latency
        self.mode = "ok"  # "follower": 503 naming the leader; "drop": close without answering
        self.leader = "http://gpufed-0.gpufed:8080"
        self.batch = True  # False: no batch route, as before the controller had one
        self._entries: dict[str, tuple[dict[str, Any], float]] = {}  # identity -> (entry, last PUT)
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeControllerRegistry:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> FakeControllerRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- state -----------------------------------------------------------------------
    def _expire(self) -> None:
        now = self.clock()
        for identity in [i for i, (_, seen) in self._entries.items() if now - seen >= self.ttl]:
            del self._entries[identity]

    @property
    def targets(self) -> dict[str, dict[str, Any]]:
        """Live entries by identity (expired ones dropped first)."""
        with self._lock:
            self._expire()
            return {identity: dict(entry) for identity, (entry, _) in sorted(self._entries.items())}

    def put(self, identity: str, body: Any) -> tuple[int, dict[str, Any]]:
        entry = validate(body)
        if identity_of(entry) != identity:
            raise Unprocessable("identity", f"path names {identity!r} but the entry's identity is "
                                            f"{identity_of(entry)!r}")
        with self._lock:
            self._expire()
            status = 200 if identity in self._entries else 201
            self._entries[identity] = (entry, self.clock())
        return status, {"identity": identity, "expires_in_s": float(self.ttl)}

    def apply_batch(self, body: Any) -> tuple[int, dict[str, Any]]:
        """The batch contract: all entries valid, or 422 naming each bad one and nothing applied."""
        if not isinstance(body, dict) or set(body) - {"put", "delete"}:
            return 422, {"detail": "expected {put: [...], delete: [...]}", "errors": []}
        puts, deletes = body.get("put", []), body.get("delete", [])
        errors: list[dict[str, Any]] = []
        valid: list[tuple[str, dict[str, Any]]] = []
        for index, raw in enumerate(puts if isinstance(puts, list) else []):
            identity = raw.get("identity") if isinstance(raw, dict) else None
            try:
                if not isinstance(identity, str) or not identity:
                    raise Unprocessable("identity", "field required")
                entry = validate(raw)
                if identity_of(entry) != identity:
                    raise Unprocessable("identity", f"does not match the entry's {identity_of(entry)!r}")
            except Unprocessable as exc:
                value = raw.get(exc.field) if isinstance(raw, dict) else raw
                errors.append({"index": index, "identity": identity, "field": exc.field, "value": value,
                               "message": exc.message})
                continue
            if identity_of({**entry, "identity": None}) == identity:
                del entry["identity"]  # the default identity (host:port): stored as a PUT without one
            valid.append((identity, entry))
        if not isinstance(deletes, list) or not all(isinstance(d, str) for d in deletes):
            errors.append({"index": None, "identity": None, "field": "delete", "value": deletes,
                           "message": "expected a list of identities"})
        if errors:
            return 422, {"detail": f"{len(errors)} entries refused", "errors": errors}
        with self._lock:
            self._expire()
            created = sum(identity not in self._entries for identity, _ in valid)
            for identity, entry in valid:
                self._entries[identity] = (entry, self.clock())
            deleted = sum(self._entries.pop(identity, None) is not None for identity in deletes)
        answer = {"put": len(valid), "created": created, "deleted": deleted, "expires_in_s": float(self.ttl)}
        return 200, answer

    def delete(self, identity: str) -> bool:
        with self._lock:
            self._expire()
            return self._entries.pop(identity, None) is not None

    def listing(self) -> dict[str, Any]:
        with self._lock:
            self._expire()
            now = self.clock()
            return {"targets": [{"identity": identity, **entry, "expires_in_s": self.ttl - (now - seen)}
                                for identity, (entry, seen) in sorted(self._entries.items())]}

    # ---- HTTP --------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def _reply(self, status: int, body: Any = None, *, kind: str = "application/json") -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                if body is not None:
                    self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _problem(self, status: int, title: str, detail: str, **extra: Any) -> None:
                body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
                self._reply(status, body, kind="application/problem+json")

            def _route(self, method: str) -> None:
                fake.requests.append((method, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if fake.latency:
                    time.sleep(fake.latency)
                if fake.mode == "drop":
                    self.close_connection = True
                    return
                if fake.mode == "follower":
                    return self._problem(503, "Service Unavailable", "this controller is a follower",
                                         leader=fake.leader)
                auth = self.headers.get("Authorization", "")
                token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
                if token not in (fake.token, fake.read_token):
                    return self._problem(401, "Unauthorized", "missing or unknown bearer token")
                path = urlsplit(self.path).path
                if method == "GET" and path == PREFIX:
                    return self._reply(200, fake.listing())
                if method == "POST" and path == BATCH and fake.batch:
                    if token != fake.token:
                        return self._problem(403, "Forbidden", "this token may only read")
                    try:
                        status, answer = fake.apply_batch(json.loads(raw or b"null"))
                    except json.JSONDecodeError as exc:
                        return self._problem(422, "Unprocessable Entity", f"body is not JSON: {exc}")
                    if status != 200:
                        return self._problem(status, "Unprocessable Entity", answer.pop("detail"), **answer)
                    return self._reply(200, answer)
                if method == "POST" or not path.startswith(PREFIX + "/") or "/" in path[len(PREFIX) + 1:]:
                    return self._problem(404, "Not Found", f"no route {method} {path}")
                if token != fake.token:
                    return self._problem(403, "Forbidden", "this token may only read")
                identity = unquote(path[len(PREFIX) + 1:])
                if method == "DELETE":
                    return self._reply(204) if fake.delete(identity) else \
                        self._problem(404, "Not Found", f"no target {identity!r}")
                try:
                    status, body = fake.put(identity, json.loads(raw or b"null"))
                except json.JSONDecodeError as exc:
                    return self._problem(422, "Unprocessable Entity", f"body is not JSON: {exc}")
                except Unprocessable as exc:
                    return self._problem(422, "Unprocessable Entity", str(exc),
                                         errors=[{"field": exc.field, "message": exc.message}])
                return self._reply(status, body)

            def do_GET(self) -> None:
                self._route("GET")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_DELETE(self) -> None:
                self._route("DELETE")

            def do_POST(self) -> None:
                self._route("POST")

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve as its own process (benchmarks): prints its port, serves until killed."""
    import argparse

    parser = argparse.ArgumentParser(description="fake gpufed controller registry (a test stand-in)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="write-token")
    parser.add_argument("--ttl", type=float, default=90.0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    args = parser.parse_args(argv)
    fake = FakeControllerRegistry(port=args.port, token=args.token, ttl=args.ttl, latency=args.latency)
    fake.start()
    print(fake.port, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
