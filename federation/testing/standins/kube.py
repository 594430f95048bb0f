"""A small Kubernetes API stand-in for list + watch, where kmock cannot serve a case.

kmock (the first choice, used in tests/sharder/sources/test_kubernetes_kmock.py) lists and
watches objects, but answers every list with resourceVersion "...", ignores label
selectors, never closes a watch (no timeoutSeconds), sends no bookmarks and never
answers 410 Gone. This fake does exactly those, the way the API server documents them:

    GET /api/v1/nodes
    GET /api/v1/namespaces/{ns}/pods
    GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices
    GET /apis/resource.k8s.io/v1/resourceslices   (cluster-scoped)
        ?labelSelector=k=v,k2=v2   equality selectors only
        ?fieldSelector=spec.nodeName=N   (resourceslices: the one field the API server indexes)
        ?watch=1&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=S
    GET|PUT|DELETE /api/v1/namespaces/{ns}/configmaps/{name}, POST .../configmaps
    GET|PUT|DELETE /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}, POST .../leases

ConfigMaps and Leases are also written through the API, for the Kubernetes state store
and the Lease elector (so real ``gpufed serve`` replicas can run on this fake alone): POST
answers 409 ``AlreadyExists`` for an existing name, PUT answers 409 ``Conflict`` when the
body's ``metadata.resourceVersion`` is not the stored one (none: unconditional) and 404
for a missing object, and a ConfigMap over 1 MiB of data is refused with 422, as the API
server's validation does (``binaryData`` counted decoded).

Every write bumps one cluster-wide resourceVersion (as etcd's revision does) and is
kept in an event log. A list answers ``metadata.resourceVersion`` = the current one.
A watch from N replays the events after N, then streams new ones, sends a BOOKMARK
when ``bookmark()`` is called (if the client allowed them) and ends after
``timeoutSeconds``. ``compact()`` forgets the history: a watch from an older version
then gets one ERROR event carrying a 410 ``Expired`` Status and ends, and ``fail_next``
queues plain HTTP errors (e.g. 500) for the next requests.
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer

KINDS = {
    "configmaps": ("ConfigMap", "v1"),
    "leases": ("Lease", "coordination.k8s.io/v1"),
    "nodes": ("Node", "v1"),
    "pods": ("Pod", "v1"),
    "endpointslices": ("EndpointSlice", "discovery.k8s.io/v1"),
    "resourceslices": ("ResourceSlice", "resource.k8s.io/v1"),
}


class FakeKubeAPI:
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: serve HTTPS with this server context (in-cluster clients accept nothing else)."""
        self.revision = 100
        self.compacted = 0
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name) -> obj
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, plural, type, obj)
        self.requests: list[str] = []
        self.fail_next: list[int] = []
        self._bookmarks = 0
        self._thawed = threading.Event()
        self._thawed.set()
        self._cond = threading.Condition()
        self._server = LoopbackHTTPServer(self._handler_class(), host=host, port=port, name="kube-standin")
        self.scheme = "https" if tls is not None else "http"
        if tls is not None:  # the handshake on the handler's thread (its first read), not in accept()
            httpd = self._server.httpd
            httpd.socket = tls.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self._server.port}"

    def __enter__(self) -> FakeKubeAPI:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thawed.set()
        with self._cond:
            self.revision += 1  # wake streams so they notice the shutdown
            self._closed = True
            self._cond.notify_all()
        self._server.stop()

    def freeze(self) -> None:
        """Hold every request unanswered (an API server that stopped responding) until ``thaw``."""
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    # ---- writes ------------------------------------------------------------------------
    def apply(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object; returns it with its new resourceVersion."""
        kind, api_version = KINDS[plural]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = (plural, meta.get("namespace", ""), meta["name"])
        with self._cond:
            self.revision += 1
            meta["resourceVersion"] = str(self.revision)
            obj.update(kind=kind, apiVersion=api_version)
            kind_of_event = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = obj
            self.events.append((self.revision, plural, kind_of_event, copy.deepcopy(obj)))
            self._cond.notify_all()
        return obj

    def delete(self, plural: str, name: str, namespace: str = "") -> None:
        with self._cond:
            obj = self.objects.pop((plural, namespace, name))
            self.revision += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.revision)}}
            self.events.append((self.revision, plural, "DELETED", obj))
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does."""
        with self._cond:
            self.compacted = self.revision
            self.events.clear()

    def bookmark(self) -> None:
        with self._cond:
            self._bookmarks += 1
            self._cond.notify_all()

    # ---- reads -------------------------------------------------------------------------
    @staticmethod
    def _selected(obj: dict[str, Any], selector: str) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        for term in filter(None, selector.split(",")):
            key, _, value = term.partition("=")
            if labels.get(key.strip()) != value.strip().lstrip("="):
                return False
        return True

    def _matches(self, plural: str, namespace: str, obj: dict[str, Any], selector: str) -> bool:
        ns = obj.get("metadata", {}).get("namespace", "")
        labels, _, fields = selector.partition("|")
        if fields:
            key, _, value = fields.partition("=")
            if key == "spec.nodeName" and (obj.get("spec") or {}).get("nodeName") != value.lstrip("="):
                return False
        return (not namespace or ns == namespace) and self._selected(obj, labels)

    def list(self, plural: str, namespace: str, selector: str) -> dict[str, Any]:
        kind, api_version = KINDS[plural]
        with self._cond:
            items = [copy.deepcopy(o) for (p, _, _), o in sorted(self.objects.items())
                     if p == plural and self._matches(plural, namespace, o, selector)]
            return {"kind": f"{kind}List", "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(self.revision)}, "items": items}

    def _handler_class(self) -> type[LoopbackHandler]:
        api = self

        class Handler(LoopbackHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def _json(self, status: int, body: dict[str, Any]) -> None:
                self.reply(status, body, content_type="application/json")

            def _body(self) -> dict[str, Any]:
                return dict(json.loads(self.body() or b"{}"))

            def _object(self) -> tuple[str, str, str] | None:
                """(plural, namespace, name or "") of a writable object path, else None."""
                parts = urlsplit(self.path).path.strip("/").split("/")
                core = parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (5, 6)
                if core and parts[4] == "configmaps":
                    return "configmaps", parts[3], parts[5] if len(parts) == 6 else ""
                lease_path = ["apis", "coordination.k8s.io", "v1", "namespaces"]
                if parts[:4] == lease_path and len(parts) in (6, 7) and parts[5] == "leases":
                    return "leases", parts[4], parts[6] if len(parts) == 7 else ""
                return None

            def _write_object(self, *, create: bool) -> None:
                api.requests.append(f"{self.command} {self.path}")
                where = self._object()
                if where is None:
                    return self._json(405, status(405, "MethodNotAllowed", "only configmaps and leases"))
                if api.fail_next:
                    code = api.fail_next.pop(0)
                    return self._json(code, status(code, "Failure", "injected failure"))
                plural, namespace, name = where
                body = self._body()
                body.setdefault("metadata", {})["namespace"] = namespace
                name = name or body["metadata"].get("name", "")
                if configmap_bytes(body) > 1024 * 1024:
                    message = f'{KINDS[plural][0]} "{name}" is invalid: []: Too long: at most 1048576 bytes'
                    return self._json(422, status(422, "Invalid", message))
                with api._cond:
                    stored = api.objects.get((plural, namespace, name))
                    if create and stored is not None:
                        exists = f'{plural} "{name}" already exists'
                        return self._json(409, status(409, "AlreadyExists", exists))
                    if not create and stored is None:
                        return self._json(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                    sent = body["metadata"].get("resourceVersion")
                    if not create and sent and stored and sent != stored["metadata"]["resourceVersion"]:
                        message = (f'Operation cannot be fulfilled on {plural} "{name}": the object '
                                   "has been modified; please apply your changes to the latest version")
                        return self._json(409, status(409, "Conflict", message))
                    written = api.apply(plural, body)
                return self._json(201 if create else 200, written)

            def do_POST(self) -> None:
                api._thawed.wait(300)
                self._write_object(create=True)

            def do_PUT(self) -> None:
                api._thawed.wait(300)
                self._write_object(create=False)

            def do_DELETE(self) -> None:
                api._thawed.wait(300)
                api.requests.append(f"DELETE {self.path}")
                where = self._object()
                if where is None or not where[2]:
                    return self._json(405, status(405, "MethodNotAllowed", "only configmaps and leases"))
                plural, namespace, name = where
                if (plural, namespace, name) not in api.objects:
                    return self._json(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                api.delete(plural, name, namespace)
                return self._json(200, status(200, "Success", "deleted") | {"status": "Success"})

            def do_GET(self) -> None:
                api._thawed.wait(300)
                api.requests.append(self.path)
                where = self._object()
                if where is not None and where[2]:
                    found = api.objects.get(where)
                    if found is None:
                        return self._json(404, status(404, "NotFound", f'{where[0]} "{where[2]}" not found'))
                    return self._json(200, copy.deepcopy(found))
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                parts = url.path.strip("/").split("/")
                if api.fail_next:
                    code = api.fail_next.pop(0)
                    return self._json(code, status(code, "Failure", "injected failure"))
                if parts[:2] == ["api", "v1"] and len(parts) == 3:
                    plural, namespace = parts[2], ""
                elif parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5:
                    plural, namespace = parts[4], parts[3]
                elif parts[:4] == ["apis", "discovery.k8s.io", "v1", "namespaces"] and len(parts) == 6:
                    plural, namespace = parts[5], parts[4]
                elif parts[:3] == ["apis", "resource.k8s.io", "v1"] and len(parts) == 4:
                    plural, namespace = parts[3], ""
                else:
                    missing = "the server could not find the requested resource"
                    return self._json(404, status(404, "NotFound", missing))
                if plural not in KINDS:
                    return self._json(404, status(404, "NotFound", f"unknown resource {plural}"))
                selector = query.get("labelSelector", "")
                if query.get("fieldSelector"):
                    selector += "|" + query["fieldSelector"]
                if query.get("watch") in ("1", "true", "True"):
                    return self._watch(plural, namespace, selector, query)
                return self._json(200, api.list(plural, namespace, selector))

            def _send_event(self, event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            def _watch(self, plural: str, namespace: str, selector: str, query: dict[str, str]) -> None:
                since = int(query.get("resourceVersion") or 0)
                bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
                deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    if since and since < api.compacted:
                        message = f"too old resource version: {since} ({api.compacted})"
                        self._send_event({"type": "ERROR", "object": status(410, "Expired", message)})
                        return
                    seen_bookmarks = api._bookmarks
                    while not getattr(api, "_closed", False):
                        with api._cond:
                            batch = [(rv, t, o) for rv, p, t, o in api.events if rv > since
                                     and p == plural and api._matches(p, namespace, o, selector)]
                            if batch:
                                since = batch[-1][0]
                            bookmark = api._bookmarks != seen_bookmarks and bookmarks
                            seen_bookmarks = api._bookmarks
                            current = api.revision
                            if not batch and not bookmark:
                                remaining = deadline - time.monotonic()
                                if remaining <= 0:
                                    break
                                api._cond.wait(timeout=min(remaining, 0.5))
                                continue
                        for _, kind_of_event, obj in batch:
                            self._send_event({"type": kind_of_event, "object": copy.deepcopy(obj)})
                        if bookmark:
                            kind, api_version = KINDS[plural]
                            since = max(since, current)
                            self._send_event({"type": "BOOKMARK", "object": {
                                "kind": kind, "apiVersion": api_version,
                                "metadata": {"resourceVersion": str(current)}}})
                finally:
                    try:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                    except OSError:
                        pass
                    self.close_connection = True

        return Handler


def configmap_bytes(body: dict[str, Any]) -> int:
    """The size the API server's validation counts: data values plus decoded binaryData."""
    data = sum(len(str(v).encode()) for v in (body.get("data") or {}).values())
    return data + sum(len(base64.b64decode(v)) for v in (body.get("binaryData") or {}).values())


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def main(argv: list[str] | None = None) -> None:
    """Run the API as its own process (benchmarks): prints its port, serves until killed.

    Its event history is forgotten every ``--compact-every`` seconds (as etcd compacts), so
    a long run of state writes does not keep a copy of every ConfigMap version."""
    import argparse

    parser = argparse.ArgumentParser(description="in-process Kubernetes API (a test stand-in)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--compact-every", type=float, default=10.0)
    args = parser.parse_args(argv)
    api = FakeKubeAPI(port=args.port)
    api.__enter__()
    print(api.url.rsplit(":", 1)[1], flush=True)
    stop = threading.Event()
    while not stop.wait(args.compact_every):
        api.compact()
        api.requests.clear()


if __name__ == "__main__":
    main()
