"""The chart's rendered workloads as pods the runner can start (pure: objects in, plans out).

A pod is what the kubelet would make of one replica of a Deployment or StatefulSet, or of a
DaemonSet on one Node: its name (``<sts>-<ordinal>``, ``<deploy>-<i>``, ``<ds>-<node>``),
its volumes as files (ConfigMaps and Secrets, written at their mount paths), emptyDirs
shared by its containers, hostPaths, and each container as a compose-runner ``Service``
with the kubelet's semantics applied: ``command``/``args`` over the image's entrypoint,
``env``/``envFrom`` with Secret, ConfigMap and downward-API references resolved from the
rendered objects, and ``$(VAR)`` expanded as the kubelet does.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from federation.testing.harnesses.composerun import images
from federation.testing.harnesses.composerun.model import Healthcheck, Service

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class PodError(ValueError):
    """A rendered object the runner cannot turn into a pod (names the object and field)."""


@dataclass
class VolumeFiles:
    """One pod volume: ``files`` (ConfigMap, Secret: relative path -> text), an emptyDir
    (``empty``), or a host path."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    empty: bool = False
    host_path: str = ""


@dataclass
class Pod:
    name: str
    workload: str  # "StatefulSet/gpufed-master"
    template_labels: dict[str, str]
    node: str
    host_network: bool
    hostname: str
    subdomain: str
    service_account: bool  # the token is mounted (automountServiceAccountToken not false)
    volumes: dict[str, VolumeFiles]
    init: list[Service]
    containers: list[Service]
    mounts: dict[str, list[tuple[str, str, bool]]]  # container -> (volume, mountPath, read_only)
    ports: dict[str, int]  # port name -> containerPort, over every container
    ignored: tuple[str, ...] = ()
    grace_s: float = 30.0  # terminationGracePeriodSeconds (SIGKILL after it, as the kubelet does)


def expand_vars(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` replaced by ``env[VAR]`` (unknown names kept, ``$$`` -> ``$``), as the kubelet does."""

    def one(found: re.Match[str]) -> str:
        if found[0] == "$$":
            return "$"
        return env.get(found[1], found[0])

    return _VAR.sub(one, text)


def _index(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o.get("kind") == kind}


def object_data(obj: dict[str, Any]) -> dict[str, str]:
    """A ConfigMap's or Secret's keys as text (Secret ``data`` decoded, ``stringData`` on top)."""
    if obj["kind"] == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        data.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
        return data
    return {k: str(v) for k, v in (obj.get("data") or {}).items()}


def _field_ref(path: str, pod: dict[str, str], where: str) -> str:
    known = {
        "metadata.name": pod["name"],
        "metadata.namespace": pod["namespace"],
        "status.podIP": pod["ip"],
        "spec.nodeName": pod["node"],
        "status.hostIP": pod["host_ip"],
        "spec.serviceAccountName": pod["service_account"],
    }
    if path not in known:
        raise PodError(f"{where}: fieldRef {path!r} is not resolved by the runner")
    return known[path]


def container_env(
    container: dict[str, Any], *, refs: dict[str, dict[str, dict[str, Any]]], pod: dict[str, str], where: str
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: ``envFrom`` first, then ``env`` in
    order (a later ``$(VAR)`` sees the earlier ones)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
            if key in source:
                name = source[key]["name"]
                obj = refs[kind].get(name)
                if obj is None:
                    if source[key].get("optional"):
                        continue
                    raise PodError(f"{where}.envFrom: no {kind} {name!r} rendered")
                prefix = str(source.get("prefix") or "")
                env.update({prefix + k: v for k, v in object_data(obj).items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand_vars(str(item["value"]), env)
            continue
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = _field_ref(source["fieldRef"]["fieldPath"], pod, f"{where}.env.{name}")
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            key, kind = (
                ("secretKeyRef", "Secret") if "secretKeyRef" in source else ("configMapKeyRef", "ConfigMap")
            )
            ref = source[key]
            data = object_data(refs[kind][ref["name"]]) if ref["name"] in refs[kind] else None
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise PodError(f"{where}.env.{name}: {kind} {ref['name']!r} has no key {ref['key']!r}")
            env[name] = data[ref["key"]]
        else:
            raise PodError(f"{where}.env.{name}: valueFrom {sorted(source)} is not resolved by the runner")
    return env


def _probe(container: dict[str, Any], ports: dict[str, int]) -> Healthcheck | None:
    """The readiness probe as a healthcheck (the kubelet's defaults: 10 s period, 1 s timeout, 3 failures)."""
    probe = container.get("readinessProbe")
    if not probe or "httpGet" not in probe:
        return None
    get = probe["httpGet"]
    port = get["port"] if isinstance(get["port"], int) else ports[get["port"]]
    return Healthcheck(
        test=(
            "wget",
            "-q",
            "-T",
            str(probe.get("timeoutSeconds", 1)),
            "-O",
            "/dev/null",
            f"http://127.0.0.1:{port}{get.get('path', '/')}",
        ),
        interval=float(probe.get("periodSeconds", 10)),
        timeout=float(probe.get("timeoutSeconds", 1)) + 1.0,
        retries=int(probe.get("failureThreshold", 3)),
        start_period=float(probe.get("initialDelaySeconds", 0)),
        start_interval=max(1.0, float(probe.get("initialDelaySeconds", 0))),
    )


def _service(
    container: dict[str, Any], *, pod: Pod, env: dict[str, str], init: bool, project: str
) -> Service:
    command = [expand_vars(str(a), env) for a in container.get("command") or []]
    args = [expand_vars(str(a), env) for a in container.get("args") or []]
    rule = images.rule_for(str(container.get("image") or ""))
    if command and rule.entrypoint:  # the image's entrypoint replaced, as `command` does
        entrypoint: tuple[str, ...] | None = tuple(command)
        argv: tuple[str, ...] | None = tuple(args)
    else:
        entrypoint, argv = None, tuple(command + args) or None
    return Service(
        project=project,
        name=f"{pod.name}/{container['name']}",
        image=str(container.get("image") or ""),
        command=argv,
        entrypoint=entrypoint,
        environment=dict(env),
        volumes=(),  # the runner binds the pod's volume files (``Pod.mounts``)
        ports=(),
        healthcheck=None if init else _probe(container, pod.ports),
        depends_on=(),
        # restartPolicy Always: a container restarts after any exit, an init container until it succeeds
        restart="on-failure" if init else "always",
        network_mode=None,
        hostname=pod.hostname,
        aliases=(),
        ignored=tuple(sorted(k for k in container if k in _NOT_APPLIED)),
        stop_grace_period=pod.grace_s,
    )


#: Container keys the runner reads but does not enforce (reported, as the compose runner does).
_NOT_APPLIED = frozenset({"resources", "securityContext", "livenessProbe", "startupProbe", "imagePullPolicy"})


def _volumes(
    spec: dict[str, Any], refs: dict[str, dict[str, dict[str, Any]]], where: str
) -> dict[str, VolumeFiles]:
    out: dict[str, VolumeFiles] = {}
    for volume in spec.get("volumes") or []:
        name = volume["name"]
        for key, kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
            if key in volume:
                ref = volume[key].get("name") or volume[key].get("secretName")
                if ref not in refs[kind]:
                    raise PodError(f"{where}.volumes.{name}: no {kind} {ref!r} rendered")
                data = object_data(refs[kind][ref])
                items = volume[key].get("items")
                files = {i["path"]: data[i["key"]] for i in items} if items else data
                out[name] = VolumeFiles(name, files=files)
        if "emptyDir" in volume:
            out[name] = VolumeFiles(name, empty=True)
        elif "hostPath" in volume:
            out[name] = VolumeFiles(name, host_path=str(volume["hostPath"]["path"]))
        elif name not in out:
            raise PodError(f"{where}.volumes.{name}: {sorted(set(volume) - {'name'})} is not run here")
    return out


def make_pod(
    workload: dict[str, Any],
    *,
    name: str,
    node: str,
    ip: str,
    host_ip: str,
    namespace: str,
    objects: list[dict[str, Any]],
) -> Pod:
    """One pod of ``workload`` on ``node`` with pod IP ``ip`` (the node's own for hostNetwork)."""
    refs = {"Secret": _index(objects, "Secret"), "ConfigMap": _index(objects, "ConfigMap")}
    template = workload["spec"]["template"]
    spec = template["spec"]
    where = f"{workload['kind']} {workload['metadata']['name']}"
    is_sts = workload["kind"] == "StatefulSet"
    pod = Pod(
        name=name,
        workload=f"{workload['kind']}/{workload['metadata']['name']}",
        template_labels=dict(template.get("metadata", {}).get("labels") or {}),
        node=node,
        host_network=bool(spec.get("hostNetwork")),
        hostname=name,
        subdomain=str(workload["spec"].get("serviceName") or "") if is_sts else "",
        service_account=spec.get("automountServiceAccountToken", True) is not False,
        volumes=_volumes(spec, refs, where),
        init=[],
        containers=[],
        mounts={},
        ports={
            str(p["name"]): int(p["containerPort"])
            for c in spec["containers"]
            for p in c.get("ports") or []
            if p.get("name")
        },
        ignored=tuple(sorted(k for k in spec if k in _POD_NOT_APPLIED)),
        grace_s=float(spec.get("terminationGracePeriodSeconds", 30)),
    )
    for claim in workload["spec"].get("volumeClaimTemplates") or [] if is_sts else []:
        # a PersistentVolumeClaim per pod: a directory of the run's stands in
        pod.volumes[claim["metadata"]["name"]] = VolumeFiles(claim["metadata"]["name"], empty=True)
    facts = {
        "name": name,
        "namespace": namespace,
        "ip": ip,
        "node": node,
        "host_ip": host_ip,
        "service_account": str(spec.get("serviceAccountName") or "default"),
    }
    for init, key in ((True, "initContainers"), (False, "containers")):
        for container in spec.get(key) or []:
            at = f"{where}.{key}.{container['name']}"
            env = container_env(container, refs=refs, pod=facts, where=at)
            service = _service(container, pod=pod, env=env, init=init, project=namespace)
            (pod.init if init else pod.containers).append(service)
            mounts = []
            for mount in container.get("volumeMounts") or []:
                if mount["name"] not in pod.volumes:
                    raise PodError(f"{at}.volumeMounts: no volume {mount['name']!r}")
                if mount.get("subPath"):
                    raise PodError(f"{at}.volumeMounts.{mount['name']}: subPath is not run here")
                mounts.append((mount["name"], mount["mountPath"], bool(mount.get("readOnly"))))
            pod.mounts[service.name] = mounts
    return pod


_POD_NOT_APPLIED = frozenset(
    {
        "securityContext",
        "affinity",
        "nodeSelector",
        "tolerations",
        "priorityClassName",
        "hostPID",
        "dnsPolicy",
    }
)
