"""``HelmRun``: the chart's rendered workloads started as pods, on the compose runner's machinery.

    with HelmRun(objects=rendered, namespace="monitoring", nodes=["gpu-node-000", ...],
                 workdir=tmp, max_replicas={"gpufed-master": 1}) as run:
        run.http_get("gpufed-master-0", 9090, "/api/v1/query?query=up")

Each pod gets a network namespace on the run's bridge (``composerun.sandbox``; its address
is the pod IP), each Node one more (its InternalIP, where ``hostNetwork`` pods run), and
each container a mount namespace with the pod's ConfigMaps and Secrets written as files at
their mount paths, emptyDirs shared by the pod's containers, hostPaths bound
(``composerun.run.sandboxed_process``); processes are ``composerun.supervise``'s (restart
policy, readiness probe as the healthcheck). Init containers run one after the other, then
the pod's containers, as the kubelet does; pods start together, in no order.

The Kubernetes API is ``federation.testing.standins.kube`` in its own namespace, on TLS at
``https://kubernetes.default.svc`` (in-cluster clients insist on it), serving the rendered
ConfigMaps, the run's Nodes (no region label), Pods and an EndpointSlice per rendered
Service. Service names resolve through the hosts files. Every change to what the chart
rendered is one row of ``OVERRIDES``, printed before anything starts. ``down()`` stops
every process and removes every namespace, also after a failure.
"""

from __future__ import annotations

import http.client
import secrets
import shutil
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from federation.localrun.waiting import wait_until
from federation.testing.harnesses.composerun import dingtalk, images, sandbox
from federation.testing.harnesses.composerun.plan import Planned, Tools, plan_service, versions_run
from federation.testing.harnesses.composerun.run import sandboxed_process
from federation.testing.harnesses.helmrun import cluster
from federation.testing.harnesses.helmrun.pods import TOKEN_DIR, WORKLOAD_KINDS, Pod, make_pod
from federation.testing.standins.kube import FakeKubeAPI

KUBE_MEMBER = "kube-apiserver"
KUBE_NAMES = (
    "kubernetes.default.svc",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc.cluster.local",
)
INIT_TIMEOUT_S = 400.0

EVERY = "*"  # an override row for every container

#: The only changes to what the chart rendered, and what the run provides in the kubelet's and
#: the cluster's place; one table, printed by ``describe`` before anything starts. Environment
#: rows are applied from here (``EVERY``: to every container).
OVERRIDES: tuple[images.Override, ...] = (
    images.Override(
        "gpufed/gpufed",
        "gpufed-exporter",
        {"GPUFED_EXPORTER_BACKEND": "simulated"},
        "no GPUs here: the exporter's simulated backend (the DaemonSet's NVIDIA_* variables stay, unused)",
    ),
    images.Override(
        EVERY,
        EVERY,
        {"KUBERNETES_SERVICE_HOST": KUBE_NAMES[0], "KUBERNETES_SERVICE_PORT": "443"},
        "the kubelet's variables, pointing at the Kubernetes API stand-in (that name is its address in "
        "every hosts file; TLS with the run's certificate, as in-cluster clients require)",
    ),
)
#: Files and names the cluster would provide, and how the run provides them.
PROVIDED: tuple[tuple[str, str], ...] = (
    (
        f"{TOKEN_DIR}/{{token,ca.crt,namespace}}",
        "pods without automountServiceAccountToken: false: a random token (the stand-in checks none) "
        "and the run's certificate as ca.crt",
    ),
    (
        "Service DNS",
        "<svc>, <svc>.<ns>, <svc>.<ns>.svc[.cluster.local] in every hosts file -> the first running pod "
        "its selector matches (no kube-proxy); StatefulSet pods also as <pod>.<serviceName>.<ns>.svc",
    ),
    (
        "not applied",
        "securityContext (processes run as root), resources, liveness probes, scheduling (every "
        "DaemonSet pod runs on every Node), enableServiceLinks variables; a Deployment's pods are "
        "<name>-<i> (no ReplicaSet hash), a StatefulSet's volumeClaimTemplates a run directory per pod",
    ),
)


class HelmRunError(RuntimeError):
    """A pod could not be planned or started (names which, and why)."""


class HelmRun:
    def __init__(
        self,
        *,
        objects: list[dict[str, Any]],
        namespace: str,
        nodes: list[str],
        workdir: Path,
        max_replicas: dict[str, int] | None = None,
        tools: Tools | None = None,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        """``max_replicas``: a workload name -> how many of its replicas run (default: all)."""
        self.objects, self.namespace, self.node_names = objects, namespace, nodes
        self.workdir, self.say = workdir, say
        self.max_replicas = max_replicas or {}
        self.tools = tools or Tools.from_env()
        self.run_id = secrets.token_hex(2)
        self.network = sandbox.Network(self.run_id)
        self.pods: dict[str, Pod] = {}
        self.planned: dict[str, Planned] = {}  # "<pod>/<container>"
        self.left_out: dict[str, str] = {}  # "<kind>/<workload>/<container>" -> why
        self.versions: dict[str, dict[str, str]] = {}
        self.kube: FakeKubeAPI | None = None
        self.ca_file = workdir / "kube" / "ca.crt"
        self._failures: list[str] = []
        self._starters: list[threading.Thread] = []

    # --- plan ----------------------------------------------------------------------------------

    def _replicas(self) -> list[tuple[dict[str, Any], str, str]]:
        """(workload, pod name, node) of every pod that runs."""
        out = []
        for workload in (o for o in self.objects if o.get("kind") in WORKLOAD_KINDS):
            name = workload["metadata"]["name"]
            containers = workload["spec"]["template"]["spec"]["containers"]
            if all(images.rule_for(str(c.get("image") or "")).kind == "left_out" for c in containers):
                for c in containers:
                    self.left_out[f"{workload['kind']}/{name}/{c['name']}"] = images.rule_for(c["image"]).note
                continue
            if workload["kind"] == "DaemonSet":
                out += [(workload, f"{name}-{node}", node) for node in self.node_names]
                continue
            replicas = int(workload["spec"].get("replicas", 1))
            run = min(replicas, self.max_replicas.get(name, replicas))
            # a Deployment's pods as <name>-<i> (no ReplicaSet hash), scheduled round-robin
            out += [(workload, f"{name}-{i}", self.node_names[i % len(self.node_names)]) for i in range(run)]
            for i in range(run, replicas):
                for c in [*workload["spec"]["template"]["spec"].get("initContainers", []), *containers]:
                    self.left_out[f"{name}-{i}/{c['name']}"] = (
                        f"{workload['kind']} replica {i} of {replicas}: not run here (max_replicas)"
                    )
        for other in (o for o in self.objects if o.get("kind") == "Pod"):
            for c in other["spec"]["containers"]:
                self.left_out[f"Pod/{other['metadata']['name']}/{c['name']}"] = (
                    "a helm test hook, not a workload"
                )
        return out

    def _plan(self) -> None:
        replicas = self._replicas()
        host_network = {pod for w, pod, _ in replicas if w["spec"]["template"]["spec"].get("hostNetwork")}
        members = [KUBE_MEMBER, *(f"node-{n}" for n in self.node_names)]
        members += [pod for _, pod, _ in replicas if pod not in host_network]
        self.network.plan(members)
        for workload, name, node in replicas:
            node_ip = self.network.members[f"node-{node}"].address
            member = f"node-{node}" if name in host_network else name
            pod = make_pod(
                workload,
                name=name,
                node=node,
                ip=self.network.members[member].address,
                host_ip=node_ip,
                namespace=self.namespace,
                objects=self.objects,
            )
            self.pods[name] = pod
            for service in [*pod.init, *pod.containers]:
                planned = plan_service(
                    service, service.name, member, tools=self.tools, fill={}, overrides=OVERRIDES
                )
                for row in (o for o in OVERRIDES if o.image == EVERY):
                    planned.env.update(row.environment)
                    planned.overrides += [f"{k}={v}" for k, v in row.environment.items()]
                self.planned[service.name] = planned

    # --- up --------------------------------------------------------------------------------------

    def up(self) -> None:
        try:
            self._plan()
            self.network.create()
            self._write_hosts()
            self.versions = versions_run(self.planned, self.tools)
            if "library/busybox" in self.versions:  # no binary of its own: the host's tools
                self.versions["library/busybox"]["run"] = "the host's sh, wget, cmp"
            for line in self.describe():
                self.say(line)
            self._start_kube()
            for pod in self.pods.values():
                self._start_pod(pod)
        except BaseException:
            self.down()
            raise

    def pod_address(self, pod: str) -> str:
        return self.network.members[self._member(pod)].address

    def _member(self, pod: str) -> str:
        return f"node-{self.pods[pod].node}" if self.pods[pod].host_network else pod

    def _write_hosts(self) -> None:
        addresses = {pod: self.pod_address(pod) for pod in self.pods}
        names = {name: self.network.members[KUBE_MEMBER].address for name in KUBE_NAMES}
        names.update({n: self.network.members[f"node-{n}"].address for n in self.node_names})
        names.update(cluster.service_names(self.objects, self.pods, addresses, namespace=self.namespace))
        text = sandbox.hosts_file(names)
        (self.workdir / "hosts").mkdir(parents=True, exist_ok=True)
        for member in self.network.members.values():
            (self.workdir / "hosts" / member.netns).write_text(text)

    def _start_kube(self) -> None:
        folder = self.workdir / "kube"
        folder.mkdir(parents=True, exist_ok=True)
        key = folder / "ca.key"
        dingtalk.make_certificate(cert=self.ca_file, key=key, names=KUBE_NAMES)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, key)
        with sandbox.in_netns(self.network.path(KUBE_MEMBER)):  # the listening socket lives there
            self.kube = FakeKubeAPI(host="0.0.0.0", port=443, tls=context)
        self.kube.__enter__()
        kube = self.kube
        addresses = {pod: self.pod_address(pod) for pod in self.pods}
        nodes = {n: self.network.members[f"node-{n}"].address for n in self.node_names}
        for plural, obj in cluster.api_objects(
            self.objects, self.pods, addresses, nodes, namespace=self.namespace
        ):
            kube.apply(plural, obj)

    def _binds(self, pod: Pod, container: str) -> list[sandbox.Bind]:
        base = self.workdir / "pods" / pod.name
        binds = []
        for volume_name, target, read_only in pod.mounts[container]:
            volume = pod.volumes[volume_name]
            if volume.host_path:
                binds.append(sandbox.Bind(Path(volume.host_path), target, read_only))
                continue
            folder = base / "volumes" / volume_name
            folder.mkdir(parents=True, exist_ok=True)
            for relative, text in volume.files.items():
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                (folder / relative).write_text(text)
            binds.append(sandbox.Bind(folder, target, read_only))
        # a mount under another volume (/etc/gpufed/tls under the spec's /etc/gpufed): its mount
        # point is made in that volume first, as the container runtime does, and the outer volume
        # is bound first (a read-only volume takes no new directory once bound)
        folders = {b.target: b.source for b in binds}
        for bind in binds:
            for outer, source in folders.items():
                if bind.target.startswith(outer.rstrip("/") + "/") and source.is_relative_to(base):
                    (source / bind.target[len(outer.rstrip("/")) + 1:]).mkdir(parents=True, exist_ok=True)
        binds.sort(key=lambda b: b.target.rstrip("/").count("/"))
        if pod.service_account:
            folder = base / "serviceaccount"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "token").write_text(secrets.token_urlsafe(32))
            (folder / "ca.crt").write_bytes(self.ca_file.read_bytes())
            (folder / "namespace").write_text(self.namespace)
            # /var/run is a link to /run on the host and in the service's root: bind where it points
            binds.append(sandbox.Bind(folder, str(Path(TOKEN_DIR).resolve()), True))
        return binds

    def _start_pod(self, pod: Pod) -> None:
        netns = self.network.path(self._member(pod.name))
        runs = [s for s in [*pod.init, *pod.containers] if self.planned[s.name].kind != "left_out"]
        for service in runs:
            planned = self.planned[service.name]
            planned.process = sandboxed_process(
                planned, binds=self._binds(pod, service.name), netns=netns, workdir=self.workdir, say=self.say
            )

        def start() -> None:
            for service in (s for s in pod.init if s in runs):  # one after another, each until it exits 0
                process = self.planned[service.name].process
                assert process is not None
                process.start()
                if not process.wait_for(lambda s: s.done and s.exits[-1].code == 0, INIT_TIMEOUT_S):
                    self._failures.append(f"{service.name}: init container did not complete")
                    return
            for service in (s for s in pod.containers if s in runs):
                process = self.planned[service.name].process
                assert process is not None
                process.start()

        thread = threading.Thread(target=start, name=f"pod-{pod.name}", daemon=True)
        self._starters.append(thread)
        thread.start()

    # --- reading -----------------------------------------------------------------------------------

    def http_get(
        self, pod: str, port: int, path: str, *, timeout: float = 5.0,
        tls: tuple[ssl.SSLContext, str] | None = None,
    ) -> tuple[int, bytes]:
        """GET ``path`` from ``pod``'s address, inside its network namespace; over TLS with
        ``tls`` (a client context and the name checked in the server's certificate)."""
        member = self._member(pod)
        address = self.network.members[member].address
        sock = sandbox.connect_in(self.network.path(member), address, port, timeout=timeout)
        if tls is not None:
            sock = tls[0].wrap_socket(sock, server_hostname=tls[1])
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
        conn.sock = sock
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def lease_holder(self, name: str) -> str:
        assert self.kube is not None
        lease = self.kube.objects.get(("leases", self.namespace, name)) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def failures(self) -> list[str]:
        return list(self._failures)

    def log_tails(self, pod_prefix: str, *, lines: int = 15) -> str:
        """The last ``lines`` of each started container's log in pods named ``pod_prefix*``:
        what a failed wait shows, so a run that did not come up says why."""
        parts = []
        for name, planned in sorted(self.planned.items()):
            process = planned.process
            if not name.startswith(pod_prefix) or process is None or not process.log.exists():
                continue
            tail = process.log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {name} (exits {[e.code for e in process.state.exits]})\n" + "\n".join(tail))
        return "\n".join(parts)

    def summary(self) -> dict[str, Any]:
        lists: dict[str, list[str]] = {"real": [], "standin": [], "left_out": []}
        for p in self.planned.values():
            lists[p.kind].append(p.display)
        lists["standin"].append(f"{KUBE_NAMES[0]} (federation.testing.standins.kube; not a workload)")
        lists["left_out"] += sorted(self.left_out)
        return {
            "services_real": sorted(lists["real"]),
            "services_standin": sorted(lists["standin"]),
            "services_left_out": lists["left_out"],
            "notes": dict(sorted(self.left_out.items())),
            "overrides": [
                {"image": o.image, "command": o.command, "environment": o.environment, "why": o.why}
                for o in OVERRIDES
            ]
            + [{"provided": what, "why": why} for what, why in PROVIDED],
            "versions": self.versions,
        }

    def describe(self) -> list[str]:
        s = self.summary()
        lines = [f"helm run {self.run_id}: {len(self.pods)} pods on {len(self.node_names)} Nodes"]
        for key, title in (
            ("services_real", "real"),
            ("services_standin", "stand-in"),
            ("services_left_out", "left out"),
        ):
            lines.append(f"  {title}: {', '.join(s[key]) or '-'}")
        lines += [f"    {name}: {note}" for name, note in s["notes"].items()]
        lines.append("  overrides (the only changes to what the chart rendered; * = every container):")
        lines += [
            f"    {o['image']} {o['command']}: {o['environment']}: {o['why']}"
            if "image" in o
            else f"    {o['provided']}: {o['why']}"
            for o in s["overrides"]
        ]
        lines.append("  versions (pinned image -> run here):")
        lines += [f"    {repo}: {v['pinned']} -> {v['run']}" for repo, v in sorted(s["versions"].items())]
        return lines

    # --- down ------------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every process, the API stand-in, and remove every namespace; returns what failed."""
        stoppers = [
            threading.Thread(target=p.process.stop, args=(p.service.stop_grace_period,), daemon=True)
            for p in self.planned.values()
            if p.process is not None
        ]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(timeout=60)
        if self.kube is not None:
            self.kube.__exit__(None, None, None)
            self.kube = None
        errors = self.network.destroy()
        for folder in ("root", "layers"):
            shutil.rmtree(self.workdir / folder, ignore_errors=True)
        return errors

    def __enter__(self) -> HelmRun:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def wait(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 2.0) -> Any:
    """``check()``'s first truthy answer (the run's errors while pods start count as "not
    yet"); after ``timeout``, HelmRunError naming ``what`` and the last answer."""
    return wait_until(lambda: check() or None, timeout=timeout, what=what, interval=interval,
                      retry_on=(OSError, ValueError, KeyError, HelmRunError), fail=HelmRunError)
