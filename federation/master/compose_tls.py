"""TLS for ``--target compose``: the certificate folder, ``--web.config.file`` and health checks.

Called by ``federation.master.compose.render_compose_bundle`` when the spec has a ``tls``
section. Every service that serves or calls over TLS (the controller, the children, the
masters, the Alertmanagers, the relay) mounts the operator's certificate folder
(``GPUFED_TLS_DIR``, made with ``gpufed certs``) read-only at ``/etc/gpufed/tls``, where the
spec's ``tls`` paths must point. Prometheus and Alertmanager serve ``tls/web-config.yml``
from the rendered tree; the controller serves it when the ``http_sd`` hop is on, the relay
when the ``relay`` hop is on. Health checks speak TLS with ``tls/http-client.yml``:
``promtool check ready`` in the Prometheus image, ``amtool`` in Alertmanager's, Python's
``ssl`` in gpufed's. Pure: services in, services changed in place.
"""

from __future__ import annotations

from typing import Any

from sharder.kernel.errors import OutputError
from sharder.kernel.tls import CLUSTER_TLS_FILE, HTTP_CLIENT_FILE, WEB_CONFIG_FILE, TlsSpec

TLS_MOUNT = "/etc/gpufed/tls"
TLS_DIR_HELP = "the certificate folder (gpufed certs) mounted at /etc/gpufed/tls"
#: Kinds of service (``render_compose_bundle``'s ``kinds``) that serve the web config.
PROMETHEUS_KINDS = ("child", "master")


def check_paths(tls: TlsSpec) -> None:
    """Compose mounts one folder: every path of the ``tls`` section must be inside it."""
    if tls.serve is None:
        raise OutputError(
            "--target compose with a tls section needs tls.serve: the children, masters, Alertmanagers,"
            " the controller and the relay serve TLS with its certificate"
        )
    files = {"tls.ca_file": tls.ca_file, "tls.cert_file": tls.cert_file, "tls.key_file": tls.key_file,
             "tls.serve.cert_file": tls.serve.cert_file, "tls.serve.key_file": tls.serve.key_file,
             "tls.serve.client_ca_file": tls.serve.client_ca_file}
    for field, path in files.items():
        if path is not None and not path.startswith(f"{TLS_MOUNT}/"):
            raise OutputError(
                f"{field} is {path!r}; compose mounts the certificate folder at {TLS_MOUNT}:"
                f" write {TLS_MOUNT}/{path.rsplit('/', 1)[-1]}"
            )


def mount(tls_dir: str) -> dict[str, Any]:
    return {"type": "bind", "source": tls_dir, "target": TLS_MOUNT, "read_only": True}


def _health(test: list[str]) -> dict[str, Any]:
    return {"test": test, "interval": "30s", "timeout": "5s", "retries": 3, "start_period": "30s"}


def python_health(url: str, tls: TlsSpec) -> dict[str, Any]:
    """gpufed's image: urllib with the client certificate (the servers may require one)."""
    chain = f" c.load_cert_chain('{tls.cert_file}', '{tls.key_file}');" if tls.cert_file else ""
    code = (f"import ssl, urllib.request; c = ssl.create_default_context(cafile='{tls.ca_file}');{chain}"
            f" urllib.request.urlopen('{url}', timeout=3, context=c)")
    return _health(["CMD", "python", "-c", code])


def secure(services: dict[str, dict[str, Any]], kinds: dict[str, str], *, tls: TlsSpec, tree: str,
           tls_dir: str) -> None:
    """Mount the folder and serve TLS in every service of a TLS kind (``kinds``: host -> kind)."""
    web = f"--web.config.file={tree}/{WEB_CONFIG_FILE}"
    client = f"--http.config.file={tree}/{HTTP_CLIENT_FILE}"
    for host, kind in kinds.items():
        service = services.get(host)
        if service is None or kind == "grafana":
            continue
        service["volumes"].append(mount(tls_dir))
        if kind in PROMETHEUS_KINDS:
            service["command"].append(web)
            service["healthcheck"] = _health(["CMD", "promtool", "check", "ready",
                                              "--url=https://127.0.0.1:9090", client])
        elif kind == "alertmanager":
            service["command"].append(web)
            if tls.cluster_tls_config() is not None:  # the replicas' gossip over mutual TLS
                service["command"].append(f"--cluster.tls-config={tree}/{CLUSTER_TLS_FILE}")
            service["healthcheck"] = _health(["CMD", "amtool", "--alertmanager.url=https://127.0.0.1:9093",
                                              client, "config", "show"])
        elif kind == "relay" and tls.hops.relay:
            service["command"] += ["--web.config.file", f"{tree}/{WEB_CONFIG_FILE}"]
            service["healthcheck"] = python_health("https://127.0.0.1:8060/healthz", tls)
        elif kind == "controller" and tls.hops.http_sd:
            service["healthcheck"] = python_health("https://127.0.0.1:8080/healthz", tls)
