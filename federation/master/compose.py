"""``gpufed render --target compose``: the monitoring tier as a Docker Compose file.

A pure renderer over the other parts' output: the children (``manifest.json``), the master
flags, the Alertmanager HA flags and the Thanos component arguments become one service
each, named after the host the rendered configs already use, so no address is invented
here. Writes ``compose/monitoring.yml``, ``compose/.env.example`` and Grafana's
provisioning files beside them.

Every container mounts the *parent* of the rendered tree at ``/gpufed``: ``write_tree``
swaps the tree by rename, which a bind mount of the tree itself would not follow. That
parent is a render root holding only rendered trees (``render_root`` refuses any other).
Secrets stay in the operator's env file (``${VAR:?message}`` when required), or, for the
files Alertmanager reads, in a folder mounted read-only (``federation.master.compose_secrets``).
State lives in named volumes: the children's WAL, the masters' and Alertmanagers' data, the
controller's store and the relay's ordering/dedup memory (``--data-dir``), so a restarted
relay neither sends an episode twice nor a FIRING after its RESOLVED.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import yaml

from federation.master import (
    compose_grafana,
    compose_logs,
    compose_objstore,
    compose_secrets,
    compose_tls,
    images,
)
from sharder.kernel.errors import OutputError
from sharder.kernel.output import Bundle, dump_yaml
from sharder.kernel.tls import HTTP_CLIENT_FILE, WEB_CONFIG_FILE, TlsSpec

MONITORING_FILE = "compose/monitoring.yml"
ENV_EXAMPLE_FILE = "compose/.env.example"
GRAFANA_DIR = "compose/grafana"
MOUNT = "/gpufed"
CONTROLLER_URL = "http://gpufed-controller:8080"
CHILD_HOST = "child-{child}"
CHILD_URL_TEMPLATE = f"http://{CHILD_HOST}:9090"
#: The gpufed image creates it owned by its user, so a fresh named volume there is writable.
RELAY_DATA = "/var/lib/gpufed"
#: Relative to ``compose/`` (the project directory): the directory holding the tree.
PARENT = "${GPUFED_RENDER_PARENT:-../..}"

#: Every image comes from federation/master/images.py; only gpufed's can be overridden
#: (a private registry's copy: README "Build and push the image").
IMAGES = {
    "gpufed": f"${{GPUFED_IMAGE:-{images.ref('gpufed')}}}",
    "prometheus": images.ref("prometheus"),
    "alertmanager": images.ref("alertmanager"),
    "thanos": images.ref("thanos"),
    "grafana": images.ref("grafana"),
    "consul": images.ref("consul"),
}
REQUIRED_ENV = {
    "GPUFED_SPEC": "path of federation.yaml on this host (the controller reads it)",
    "GPUFED_TOKEN": "the controller's write token (16+ characters, no placeholder)",
    "GRAFANA_ADMIN_PASSWORD": "Grafana's admin password",
    "GPUFED_TLS_DIR": compose_tls.TLS_DIR_HELP,
    compose_secrets.SECRETS_ENV: compose_secrets.SECRETS_HELP,
}
OPTIONAL_HELP = {
    "GPUFED_DISCOVERY_FLAGS": "--consul HOST:PORT: the Consul the nodes register in (node.yml's "
    "GPUFED_REGISTRY; `--profile consul` runs one as consul:8500). Empty: the built-in registry only",
    "GPUFED_CONTROLLER_FLAGS": "more `gpufed serve` flags, e.g. --auto-rebalance-imbalance 1.3 or "
    "--no-handover",
    "GPUFED_RENDER_PARENT": "the render root holding only rendered trees (default: the parent of "
    "the tree monitoring.yml is in), relative to monitoring.yml",
    "GPUFED_IMAGE": "the gpufed image: the release's, or your registry's copy (README: build and push)",
}
HOST_PORTS = {"controller": 8080, "grafana": 3000, "query": 10904, "minio": 9001, "loki": 3100}
ENV_NAME = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _required(name: str) -> str:
    return f"${{{name}:?set {name}: {REQUIRED_ENV[name]}}}"


def _wget(url: str) -> dict[str, Any]:
    return {
        "test": ["CMD", "wget", "-qO-", url],
        "interval": "30s",
        "timeout": "5s",
        "retries": 3,
        "start_period": "30s",
    }


def _python_get(url: str) -> dict[str, Any]:
    code = f"import urllib.request; urllib.request.urlopen('{url}', timeout=3)"
    return {**_wget(url), "test": ["CMD", "python", "-c", code]}


def _service(image: str, *, host: str, command: list[str], health: dict[str, Any]) -> dict[str, Any]:
    return {
        "image": image,
        "hostname": host,
        "command": command,
        "restart": "unless-stopped",
        "volumes": [{"type": "bind", "source": PARENT, "target": MOUNT, "read_only": True}],
        "healthcheck": health,
    }


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0]


def _flag(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")), None)


def render_compose_bundle(
    *,
    out_name: str,
    files: Bundle,
    dashboards: Mapping[str, bytes],
    router_hosts: Mapping[str, str] | None = None,
    http_sd_url: str = CONTROLLER_URL,
    consul: bool = True,
    resources: Mapping[str, Mapping[str, Any]] | None = None,
    tls: TlsSpec | None = None,
    alertmanager_secrets: Mapping[str, str] | None = None,
) -> Bundle:
    """``files``: the other parts' bundle (children, master, alerting, Thanos).

    ``tls``: the spec's ``tls`` section; the TLS services mount ``GPUFED_TLS_DIR`` and serve
    ``tls/web-config.yml`` (``federation.master.compose_tls``).
    ``router_hosts``: Thanos router instance -> the host the master's remote_write names.
    ``resources``: kind of service (child, master, alertmanager, relay, controller, grafana)
    -> its ``deploy.resources`` (``federation.sizing.compose_resources``, from ``--fleet-nodes``).
    ``alertmanager_secrets``: the alerting spec's secret files, field -> path
    (``compose_secrets.secret_files``); with any, the Alertmanagers mount
    ``GPUFED_ALERTMANAGER_SECRETS_DIR`` where those paths point.
    """
    manifest = json.loads(files["manifest.json"])
    if manifest["target_discovery"] != "http_sd" or not manifest["agent_mode"]:
        raise OutputError(
            "--target compose runs children in agent mode pulling HTTP SD from the controller: "
            "set children.target_discovery: http_sd and children.agent_mode: true in the spec"
        )
    if urlsplit(http_sd_url).netloc != urlsplit(CONTROLLER_URL).netloc:
        raise OutputError(
            f"children.http_sd_url is {http_sd_url!r}; in compose the children reach the controller "
            f"service as {CONTROLLER_URL}"
        )
    if tls is not None:
        compose_tls.check_paths(tls)
    if alertmanager_secrets:
        compose_secrets.check_paths(dict(alertmanager_secrets))
    tree = f"{MOUNT}/{out_name}"
    services: dict[str, dict[str, Any]] = {}
    # Service -> its kind, for `resources` (--fleet-nodes).
    kinds: dict[str, str] = {"gpufed-controller": "controller", "gpufed-dingtalk": "relay",
                             "grafana": "grafana"}
    volumes: dict[str, dict[str, Any]] = {}

    services["gpufed-controller"] = {
        **_service(
            IMAGES["gpufed"],
            host="gpufed-controller",
            command=["sh", "-c", " ".join(["exec", *_controller_args(files, tls=tls, tree=tree)])],
            # /healthz, not /readyz: the controller is ready only once it holds an
            # assignment, i.e. after the first node registers; an empty fleet is healthy.
            health=_python_get("http://127.0.0.1:8080/healthz"),
        ),
        "environment": {"GPUFED_TOKEN": _required("GPUFED_TOKEN")},
        "ports": [f"${{GPUFED_CONTROLLER_PORT:-{HOST_PORTS['controller']}}}:8080"],
    }
    services["gpufed-controller"]["volumes"] = [
        {"type": "bind", "source": _required("GPUFED_SPEC"), "target": "/etc/gpufed/federation.yaml",
         "read_only": True},
        {"type": "volume", "source": "controller-data", "target": "/var/lib/gpufed"},
    ]
    if tls is not None:  # its --web.config.file and --http.config.file are files of the tree
        services["gpufed-controller"]["volumes"].insert(
            0, {"type": "bind", "source": PARENT, "target": MOUNT, "read_only": True})
    volumes["controller-data"] = {}

    for child in manifest["children"]:
        name = child["child"]
        # child["flags"] holds the agent flag as the spec's Prometheus release spells it.
        flags = [f"--config.file={tree}/{child['config']}", *child["flags"],
                 "--storage.agent.path=/prometheus", "--web.enable-lifecycle"]
        host = CHILD_HOST.format(child=name)
        service = _service(IMAGES["prometheus"], host=host, command=flags,
                           health=_wget("http://127.0.0.1:9090/-/ready"))
        service["volumes"].append({"type": "volume", "source": host, "target": "/prometheus"})
        service["depends_on"] = {"gpufed-controller": {"condition": "service_started"}}
        services[host] = service
        volumes[host] = {}
        kinds[host] = "child"

    if "master/flags.json" in files:
        master = json.loads(files["master/flags.json"])
        for i, (name, replica) in enumerate(sorted(master["replicas"].items())):
            flags = [f"--config.file={tree}/master/{master['config']}",
                     *(f for f in master["flags"] if not f.startswith("--storage.tsdb.path=")),
                     "--storage.tsdb.path=/prometheus"]
            service = _service(IMAGES["prometheus"], host=replica["host"], command=flags,
                               health=_wget("http://127.0.0.1:9090/-/ready"))
            service["environment"] = dict(replica["env"])
            service["volumes"].append({"type": "volume", "source": name, "target": "/prometheus"})
            service["ports"] = [f"${{GPUFED_MASTER_PORT_{i}:-{19090 + i}}}:9090"]
            services[replica["host"]] = service
            volumes[name] = {}
            kinds[replica["host"]] = "master"

    env_vars: dict[str, str] = {}
    if "alertmanager/ha.json" in files:
        ha = json.loads(files["alertmanager/ha.json"])
        for i, (name, replica) in enumerate(sorted(ha["replicas"].items())):
            host = _host(replica["address"])
            flags = [f"--config.file={tree}/alertmanager/alertmanager.yml",
                     "--storage.path=/alertmanager", *replica["flags"]]
            service = _service(IMAGES["alertmanager"], host=host, command=flags,
                               health=_wget("http://127.0.0.1:9093/-/ready"))
            service["volumes"].append({"type": "volume", "source": name, "target": "/alertmanager"})
            service["ports"] = [f"${{GPUFED_ALERTMANAGER_PORT_{i}:-{19093 + i}}}:9093"]
            services[host] = service
            volumes[name] = {}
            kinds[host] = "alertmanager"
        relay = files["alertmanager/dingtalk.yml"].decode()
        for var in sorted(set(ENV_NAME.findall(relay))):
            env_vars[var] = (f"${{{var}:?set {var}: a secret the relay expands"
                             " (a robot token or secret, the SMTP password)}")
        services["gpufed-dingtalk"] = {
            **_service(IMAGES["gpufed"], host="gpufed-dingtalk",
                       command=["gpufed-dingtalk", "--config", f"{tree}/alertmanager/dingtalk.yml",
                                "--listen", "0.0.0.0:8060", "--data-dir", RELAY_DATA],
                       health=_python_get("http://127.0.0.1:8060/healthz")),
            "environment": dict(env_vars),
        }
        # The ordering/dedup memory (and the info digest's batches) outlive a restart.
        services["gpufed-dingtalk"]["volumes"].append(
            {"type": "volume", "source": "relay-data", "target": RELAY_DATA})
        volumes["relay-data"] = {}
        if alertmanager_secrets:
            compose_secrets.mount_into(services, kinds,
                                       secrets_dir=_required(compose_secrets.SECRETS_ENV))

    query_host = _thanos_services(services, volumes, files=files, tree=tree, aliases=router_hosts or {})
    datasource = f"http://{query_host}:10904" if query_host else (
        f"http://{_first_master(files)}:9090" if "master/flags.json" in files else None
    )
    grafana_files = _grafana(services, volumes, tree=tree, datasource=datasource, dashboards=dashboards)
    compose_grafana.grafana_services(services, volumes, files=files, tree=tree)
    logs_files = compose_logs.loki_service(services, volumes, files=files, tree=tree,
                                           mount=_service("", host="", command=[], health={})["volumes"][0],
                                           secrets_env=_objstore_env)

    if consul:
        services["consul"] = {
            "image": IMAGES["consul"],
            "hostname": "consul",
            "profiles": ["consul"],
            "command": ["agent", "-server", "-bootstrap-expect=1", "-client=0.0.0.0", "-ui"],
            "restart": "unless-stopped",
            "ports": ["${GPUFED_CONSUL_PORT:-8500}:8500"],
            "volumes": [{"type": "volume", "source": "consul-data", "target": "/consul/data"}],
            "healthcheck": {**_wget("http://127.0.0.1:8500/v1/status/leader"),
                            "test": ["CMD", "consul", "members"]},
        }
        volumes["consul-data"] = {}

    if tls is not None:
        compose_tls.secure(services, kinds, tls=tls, tree=tree, tls_dir=_required("GPUFED_TLS_DIR"))

    for host, kind in kinds.items():
        if resources and kind in resources and host in services:
            services[host]["deploy"] = {"resources": dict(resources[kind])}

    document = {"name": "gpufed-monitoring", "services": services, "volumes": volumes}
    env_example = _env_example(document, out_name=out_name)
    return {
        MONITORING_FILE: dump_yaml(document),
        ENV_EXAMPLE_FILE: env_example.encode(),
        **grafana_files,
        **logs_files,
    }


def _controller_args(files: Bundle, *, tls: TlsSpec | None = None, tree: str = "") -> list[str]:
    """``gpufed serve`` as the controller service runs it; the env file adds flags last.

    Children are ``child-<child>`` services: ``--child-url-template`` lets the controller
    confirm hand-overs by asking the new child whether it scraped the target (agent mode
    keeps ``/api/v1/targets``) and reload children. The master replicas get every
    child's ``scrape_*`` series by remote_write, so they are the ``--load-url`` sources.
    With ``tls.serve`` the children and masters take only TLS clients with a certificate: the
    controller calls them over https with ``tls/http-client.yml`` (``--http.config.file``: the
    spec's CA, client certificate and ``server_name``).
    """
    args = ["gpufed", "serve", "--spec", "/etc/gpufed/federation.yaml", "--data-dir", "/var/lib/gpufed",
            "--listen", "0.0.0.0:8080"]
    if tls is not None and tls.hops.http_sd:
        args += ["--web.config.file", f"{tree}/{WEB_CONFIG_FILE}"]
    scheme = "http"
    if tls is not None and tls.serve is not None:
        args += ["--http.config.file", f"{tree}/{HTTP_CLIENT_FILE}"]
        scheme = "https"
    args += ["--child-url-template", CHILD_URL_TEMPLATE.replace("http://", f"{scheme}://", 1)]
    if "master/flags.json" in files:
        master = json.loads(files["master/flags.json"])
        for replica in sorted(master["replicas"].values(), key=lambda r: r["host"]):
            args += ["--load-url", f"{scheme}://{replica['host']}:9090"]
    return [*args, "${GPUFED_DISCOVERY_FLAGS:-}", "${GPUFED_CONTROLLER_FLAGS:-}"]


def _first_master(files: Bundle) -> str:
    master = json.loads(files["master/flags.json"])
    return str(sorted(master["replicas"].values(), key=lambda r: r["host"])[0]["host"])


def _thanos_services(
    services: dict[str, dict[str, Any]],
    volumes: dict[str, dict[str, Any]],
    *,
    files: Bundle,
    tree: str,
    aliases: Mapping[str, str],
) -> str | None:
    """One service per Thanos instance; ``config_dir`` paths point into the mounted tree."""
    if "thanos/receive.json" not in files and "thanos/query.json" not in files:
        return None
    objstore = yaml.safe_load(files["thanos/objstore.yml"])
    store_type, store_config = objstore["type"], objstore.get("config", {})
    query_host = None
    bucket_users: list[str] = []
    for component in ("receive", "query", "store", "compact"):
        path = f"thanos/{component}.json"
        if path not in files:
            continue
        instances = json.loads(files[path])["instances"]
        for name, instance in sorted(instances.items()):
            args = [_retarget(a, tree=tree) for a in instance["args"]]
            endpoint = _flag(args, "--receive.local-endpoint")
            if component == "receive":
                host = _host(endpoint) if endpoint else name
            else:
                host = f"thanos-{component}"
            http = _flag(args, "--http-address") or "0.0.0.0:10902"
            service = _service(IMAGES["thanos"], host=host, command=args,
                               health=_wget(f"http://127.0.0.1:{http.rsplit(':', 1)[1]}/-/ready"))
            for flag in ("--tsdb.path", "--data-dir"):
                data = _flag(args, flag)
                if data:
                    service["volumes"].append({"type": "volume", "source": host, "target": data})
                    volumes[host] = {}
            if store_type == "FILESYSTEM":  # one machine: every component shares the bucket volume
                service["volumes"].append(
                    {"type": "volume", "source": "thanos-bucket", "target": store_config["directory"]}
                )
                volumes["thanos-bucket"] = {}
            if _objstore_env(files):
                service["environment"] = _objstore_env(files)
            if name in aliases and aliases[name] != host:
                service["networks"] = {"default": {"aliases": [aliases[name]]}}
            if component != "query":
                bucket_users.append(host)
            if component == "query":
                query_host = host
                service["ports"] = [f"${{GPUFED_QUERY_PORT:-{HOST_PORTS['query']}}}:10904"]
            services[host] = service
    if store_type == "S3" and str(store_config.get("endpoint", "")).startswith(f"{compose_objstore.HOST}:"):
        prefixes = [str(objstore["prefix"])] if objstore.get("prefix") else []
        if "logs/loki.yml" in files:
            loki = yaml.safe_load(files["logs/loki.yml"])
            prefixes.append(str(loki["storage_config"]["object_store"]["storage_prefix"]))
        compose_objstore.object_store_services(
            services, volumes, bucket=str(store_config["bucket"]),
            access_key=_thanos_var(store_config.get("access_key")),
            secret_key=_thanos_var(store_config.get("secret_key")),
            prefixes=prefixes, console_port=f"${{GPUFED_MINIO_CONSOLE_PORT:-{HOST_PORTS['minio']}}}",
        )
        for host in bucket_users:  # a fresh store has no bucket until bucket-init made it
            services[host]["depends_on"] = dict(compose_objstore.INIT_DONE)
    return query_host


def _objstore_env(files: Bundle) -> dict[str, str]:
    """The object store's secrets, by the names ``thanos/secrets.json`` gives the launcher."""
    names = sorted(json.loads(files["thanos/secrets.json"])) if "thanos/secrets.json" in files else []
    return {n: f"${{{n}:?set {n}: an object store secret the spec names}}" for n in names}


def _thanos_var(value: Any) -> str:
    """``$(NAME)`` in the objstore file -> ``${NAME}`` for compose."""
    match = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(value))
    if match is None:
        raise OutputError(f"the minio service needs S3 keys from the environment, got {value!r}")
    return f"${{{match[1]}}}"


def _retarget(arg: str, *, tree: str) -> str:
    """``/etc/gpufed/thanos/x`` (the spec's ``config_dir``) -> the same file in the mounted tree."""
    name, _, value = arg.partition("=")
    if value.endswith((".yml", ".json")) and "/thanos/" in value and name.endswith("-file"):
        return f"{name}={tree}/thanos/{value.rsplit('/', 1)[1]}"
    return arg


def _grafana(
    services: dict[str, dict[str, Any]],
    volumes: dict[str, dict[str, Any]],
    *,
    tree: str,
    datasource: str | None,
    dashboards: Mapping[str, bytes],
) -> Bundle:
    provisioning = f"{tree}/{GRAFANA_DIR}/provisioning"
    files: Bundle = {
        f"{GRAFANA_DIR}/provisioning/dashboards/gpufed.yml": dump_yaml({
            "apiVersion": 1,
            "providers": [{
                "name": "gpufed",
                "folder": "gpufed",
                "type": "file",
                "disableDeletion": True,
                "options": {"path": f"{tree}/{GRAFANA_DIR}/dashboards"},
            }],
        }),
        # agent-mode children cannot be queried: without a master or Thanos there is none
        f"{GRAFANA_DIR}/provisioning/datasources/gpufed.yml": dump_yaml({
            "apiVersion": 1,
            "datasources": [{
                "name": "gpufed",
                "uid": "gpufed",
                "type": "prometheus",
                "access": "proxy",
                "url": datasource,
                "isDefault": True,
            }] if datasource else [],
        }),
    }
    for name, body in sorted(dashboards.items()):
        files[f"{GRAFANA_DIR}/dashboards/{name}"] = body
    service = _service(IMAGES["grafana"], host="grafana", command=[],
                       health=_wget("http://127.0.0.1:3000/api/health"))
    del service["command"]
    service["environment"] = {
        "GF_PATHS_PROVISIONING": provisioning,
        "GF_SECURITY_ADMIN_PASSWORD": _required("GRAFANA_ADMIN_PASSWORD"),
    }
    service["volumes"].append({"type": "volume", "source": "grafana-data", "target": "/var/lib/grafana"})
    service["ports"] = [f"${{GPUFED_GRAFANA_PORT:-{HOST_PORTS['grafana']}}}:3000"]
    services["grafana"] = service
    volumes["grafana-data"] = {}
    return files


def _env_example(document: dict[str, Any], *, out_name: str) -> str:
    """Every variable the compose file reads, required ones first, each with its default."""
    text = json.dumps(document)
    required, optional = [], []
    seen: dict[str, str] = {}
    for name, rest in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:[-?][^}]*)?\}", text):
        seen.setdefault(name, rest)
    for name, rest in sorted(seen.items()):
        if rest.startswith(":?"):
            required.append(f"# {rest[2:]}\n{name}=\n")
        else:
            note = f"# {OPTIONAL_HELP[name]}\n" if name in OPTIONAL_HELP else ""
            optional.append(f"{note}{name}={rest[2:]}\n")
    return (
        "# docker compose --env-file /etc/gpufed/monitoring.env"
        f" -f <render root>/{out_name}/compose/monitoring.yml up -d\n"
        "# Keep this file outside the render root: a render replaces the tree, and every service\n"
        "# mounts the root.\n\n"
        "# Required\n" + "".join(required) + "\n# Optional (defaults shown)\n" + "".join(optional)
    )
