"""``gpufed render --target compose`` with the spec's ``tls`` section, checked by the real Compose v2.

compose/federation.yaml with every hop of docs/tls-install.md on TLS: the certificate
folder (``GPUFED_TLS_DIR``, required) mounted read-only at /etc/gpufed/tls in every TLS
service, ``--web.config.file`` on the children, masters, Alertmanagers, the controller and
the relay, and health checks that speak TLS. promtool is not run here (--no-check): the
spec's paths are the containers' (/etc/gpufed/tls), which this machine does not have; the
rendered configs are checked by promtool in tests/federation/test_tls_render.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from test_compose import compose, filled_env, invoke

import webconfig.client
import webconfig.model
from webconfig.certs import make_certs

TREE = "/gpufed/current"
TLS_SERVICES = ("child-", "master-prometheus-", "alertmanager-", "gpufed-controller", "gpufed-dingtalk")


def tls_spec(path: Path) -> Path:
    document: dict[str, Any] = yaml.safe_load((ROOT / "compose" / "federation.yaml").read_text())
    for write in document["remote_write"]:
        write["url"] = write["url"].replace("http://", "https://")
    document["children"]["http_sd_url"] = "https://gpufed-controller:8080"
    document["alerting"]["relay_url"] = "https://gpufed-dingtalk:8060"
    document["master"]["monitoring"] = {"child_url": "https://child-{child}:9090"}
    del document["logs"]  # Loki's ruler has no TLS client settings yet (refused with tls.serve)
    document["tls"] = {
        "ca_file": "/etc/gpufed/tls/ca.crt", "cert_file": "/etc/gpufed/tls/client.crt",
        "key_file": "/etc/gpufed/tls/client.key",
        "hops": {"long_term": False},  # Thanos Receive's remote-write TLS is not rendered
        "serve": {"cert_file": "/etc/gpufed/tls/server.crt", "key_file": "/etc/gpufed/tls/server.key"},
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tls-compose")
    spec = tls_spec(root / "federation.yaml")
    out = root / "parent" / "current"
    result = invoke("render", "--spec", spec, "--out", out, "--target", "compose", "--no-check", "--json")
    assert result.exit_code == 0, result.output
    certs = root / "certs"
    make_certs(certs, hosts=["gpufed-controller"], client_name="prometheus", days=1, ca_days=1)
    env = filled_env(out / "compose" / ".env.example", root / "m.env")
    env.write_text(env.read_text() + f"GPUFED_TLS_DIR={certs}\n")
    assert "GPUFED_TLS_DIR=" in (out / "compose" / ".env.example").read_text()
    quiet = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--quiet", cwd=out / "compose")
    assert quiet.returncode == 0, quiet.stderr
    done = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--format", "json",
                   cwd=out / "compose")
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    document["certs"], document["tree"] = str(certs), str(out)
    return document


def command_text(service: dict[str, Any]) -> str:
    return " ".join(service["command"])


def test_every_tls_service_mounts_the_certificate_folder(config: dict[str, Any]) -> None:
    services = config["services"]
    secured = [name for name in services if name.startswith(TLS_SERVICES)]
    assert len(secured) >= 8
    for name in secured:
        mounts = [v for v in services[name]["volumes"] if v["target"] == "/etc/gpufed/tls"]
        assert [(m["source"], m.get("read_only")) for m in mounts] == [(config["certs"], True)], name
    assert all(v["target"] != "/etc/gpufed/tls" for name, s in services.items() if name not in secured
               for v in s.get("volumes", []))


def test_servers_run_the_rendered_web_config_and_tls_health_checks(config: dict[str, Any]) -> None:
    services = config["services"]
    web = f"--web.config.file={TREE}/tls/web-config.yml"
    for name, service in services.items():
        if name.startswith(("child-", "master-prometheus-")):
            assert web in service["command"], name
            assert service["healthcheck"]["test"][1:4] == ["promtool", "check", "ready"], name
            assert f"--http.config.file={TREE}/tls/http-client.yml" in service["healthcheck"]["test"]
        elif name.startswith("alertmanager-"):
            assert web in service["command"], name
            assert f"--cluster.tls-config={TREE}/tls/cluster-tls.yml" in service["command"], name
            assert service["healthcheck"]["test"][1] == "amtool"
    controller = command_text(services["gpufed-controller"])
    assert f"--web.config.file {TREE}/tls/web-config.yml" in controller
    # Its calls to the children (hand-over checks, reloads) and the masters (--load-url) go over
    # https with the rendered client file, which it reads from the mounted tree.
    assert f"--http.config.file {TREE}/tls/http-client.yml" in controller
    assert "--child-url-template https://child-{child}:9090" in controller
    masters = [name for name in services if name.startswith("master-prometheus-")]
    assert masters and all(f"--load-url https://{name}:9090" in controller for name in masters)
    assert "http://" not in controller
    assert any(v["target"] == TREE.rsplit("/", 1)[0] and v.get("read_only")
               for v in services["gpufed-controller"]["volumes"])
    relay = services["gpufed-dingtalk"]
    assert f"--web.config.file {TREE}/tls/web-config.yml" in command_text(relay)
    for service in (services["gpufed-controller"], relay):
        assert "https://127.0.0.1:" in service["healthcheck"]["test"][-1]
        assert "load_cert_chain('/etc/gpufed/tls/client.crt', '/etc/gpufed/tls/client.key')" in \
            service["healthcheck"]["test"][-1]


def test_paths_outside_the_mounted_folder_are_refused(tmp_path: Path) -> None:
    spec = tls_spec(tmp_path / "federation.yaml")
    document = yaml.safe_load(spec.read_text())
    document["tls"]["ca_file"] = "/etc/ssl/gpufed-ca.crt"
    spec.write_text(yaml.safe_dump(document))
    result = invoke("render", "--spec", spec, "--out", tmp_path / "parent" / "current", "--target", "compose",
                    "--no-check")
    assert result.exit_code != 0
    expected = ("tls.ca_file is '/etc/ssl/gpufed-ca.crt'; compose mounts the certificate folder at"
                " /etc/gpufed/tls")
    assert expected in result.output


def test_a_node_serves_and_registers_with_the_rendered_files(config: dict[str, Any], tmp_path: Path) -> None:
    """compose/node-tls.yml over node.yml: the exporter runs the tree's web config and client file."""
    tree = Path(config["tree"])
    # What the node's folder holds beside the certificates: the rendered files, as they are.
    web = webconfig.model.parse((tree / "tls" / "web-config.yml").read_text())
    client = webconfig.client.parse((tree / "tls" / "http-client.yml").read_text())
    assert web.tls_server_config is not None
    assert web.tls_server_config.client_auth_type == "RequireAndVerifyClientCert"
    assert client.tls_config is not None and client.tls_config.cert_file == "/etc/gpufed/tls/client.crt"
    env = tmp_path / "node.env"
    env.write_text((ROOT / "compose" / "node.env.example").read_text()
                   .replace("GPUFED_CONTROLLER_URL=http://", "GPUFED_CONTROLLER_URL=https://")
                   .replace("GPUFED_TLS_DIR=/etc/gpufed/tls", f"GPUFED_TLS_DIR={config['certs']}"))
    done = compose("--env-file", str(env), "-f", "node.yml", "-f", "node-tls.yml", "config",
                   "--format", "json", cwd=ROOT / "compose")
    assert done.returncode == 0, done.stderr
    exporter = json.loads(done.stdout)["services"]["gpufed-exporter"]
    environment = exporter["environment"]
    assert environment["GPUFED_EXPORTER_WEB_CONFIG_FILE"] == "/etc/gpufed/tls/web-config.yml"
    assert environment["GPUFED_EXPORTER_REGISTER_HTTP_CONFIG_FILE"] == "/etc/gpufed/tls/http-client.yml"
    assert environment["GPUFED_EXPORTER_REGISTER_URL"].startswith("https://")
    assert [(v["source"], v["target"], v.get("read_only")) for v in exporter["volumes"]] == \
        [(config["certs"], "/etc/gpufed/tls", True)]
    assert "create_connection(('127.0.0.1', 9400)" in exporter["healthcheck"]["test"][-1]
    # Without the folder named, Compose refuses to start it, saying which variable.
    env.write_text(env.read_text().replace(f"GPUFED_TLS_DIR={config['certs']}", "GPUFED_TLS_DIR="))
    missing = compose("--env-file", str(env), "-f", "node.yml", "-f", "node-tls.yml", "config", "--quiet",
                      cwd=ROOT / "compose")
    assert missing.returncode != 0 and "GPUFED_TLS_DIR" in missing.stderr


def test_the_alertmanagers_gossip_over_mtls_checking_a_replica_name_of_the_certificate(
        config: dict[str, Any]) -> None:
    """Gossip dials peers by IP: the rendered client side names a replica's host (one of
    ``gpufed certs --host``'s names), since the spec's tls section sets no server_name."""
    tree = Path(config["tree"])
    gossip = yaml.safe_load((tree / "tls" / "cluster-tls.yml").read_text())
    web = yaml.safe_load((tree / "tls" / "web-config.yml").read_text())
    assert gossip["tls_server_config"] == web["tls_server_config"]
    assert gossip["tls_client_config"] == {
        "ca_file": "/etc/gpufed/tls/ca.crt", "cert_file": "/etc/gpufed/tls/client.crt",
        "key_file": "/etc/gpufed/tls/client.key", "server_name": "alertmanager-0"}
