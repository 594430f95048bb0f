"""The spec's ``tls`` section: what it renders where, checked by the real promtool and amtool
of both lines, and the refusals that name the field.

The example spec (examples/federation.yaml) with TLS on: children scrape over https with the
client certificate, the master's remote_write to Thanos, its Alertmanagers, its
meta-monitoring, and the relay's webhooks carry ``tls_config``; ``tls/web-config.yml`` is
what the children, master and Alertmanagers serve. Without the section nothing changes
(the golden tests in tests/sharder and tests/alertmanager keep their bytes).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, stack_tool

from alertmanager import amtool
from alertmanager.render import ALERTMANAGER_FILE, PROMETHEUS_ALERTING_FILE
from federation.master import pipeline
from federation.master.render import MASTER_FILE
from federation.spec import GpufedSpec
from sharder.kernel.errors import SpecError
from sharder.kernel.promtool import Promtool
from sharder.kernel.tls import CLUSTER_TLS_FILE, HTTP_CLIENT_FILE, WEB_CONFIG_FILE
from sharder.model.loading import parse_model
from webconfig.certs import make_certs

EXAMPLE = ROOT / "examples" / "federation.yaml"
INVENTORY = ROOT / "examples" / "inventory.yaml"


def base_document() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    return document


def tls_document(certs: Path) -> dict[str, Any]:
    """The example with every hop over TLS (https URLs where the example says http)."""
    document = base_document()
    for write in document["remote_write"]:
        write["url"] = write["url"].replace("http://", "https://")
    document["alerting"]["relay_url"] = document["alerting"]["relay_url"].replace("http://", "https://")
    document["master"]["monitoring"] = {"child_url": "https://child-{child}:9090"}
    document["thanos"]["receive"]["url"] = "https://thanos-router:19291/api/v1/receive"
    del document["logs"]  # Loki's ruler has no TLS client settings: refused with tls.serve
    document["tls"] = {
        "ca_file": str(certs / "ca.crt"), "cert_file": str(certs / "client.crt"),
        "key_file": str(certs / "client.key"), "server_name": "localhost",
        "serve": {"cert_file": str(certs / "server.crt"), "key_file": str(certs / "server.key")},
    }
    return document


def load(document: dict[str, Any]) -> GpufedSpec:
    return parse_model(GpufedSpec, copy.deepcopy(document), source="federation.yaml")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder, hosts=["localhost"], client_name="prometheus", days=1, ca_days=1)
    return folder


@pytest.fixture(scope="module", params=[3, 2], ids=["line-3", "line-2"])
def rendered(request: pytest.FixtureRequest, certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TLS example rendered and checked by ``gpufed render``'s own check, with one line's tools."""
    line: int = request.param
    document = tls_document(certs)
    document["prometheus"] = {"version": "3" if line == 3 else "2.53"}
    spec_path = tmp_path_factory.mktemp("spec") / "federation.yaml"
    spec_path.write_text(yaml.safe_dump(document), encoding="utf-8")
    spec, targets = pipeline.load_inputs(spec_path, INVENTORY)
    out = tmp_path_factory.mktemp(f"out-{line}") / "out"
    result = pipeline.render(spec, targets, out=out, checker=Promtool(stack_tool(line, "promtool")),
                             alert_checker=amtool.Amtool(stack_tool(line, "amtool")))
    assert result.checked > 0 and result.master_checked and result.alerting_checked
    return out


def read(out: Path, path: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((out / path).read_text(encoding="utf-8"))
    return document


def client_tls(certs: Path) -> dict[str, str]:
    return {"ca_file": str(certs / "ca.crt"), "cert_file": str(certs / "client.crt"),
            "key_file": str(certs / "client.key"), "server_name": "localhost"}


def test_children_scrape_and_write_over_tls(rendered: Path, certs: Path) -> None:
    children = sorted((rendered / "children").glob("*/prometheus.yml"))
    assert children
    for path in children:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        for job in config["scrape_configs"]:
            assert job["scheme"] == "https" and job["tls_config"] == client_tls(certs), job["job_name"]
        for write in config["remote_write"]:
            assert write["url"].startswith("https://") and write["tls_config"] == client_tls(certs)


def test_master_reaches_store_alertmanagers_and_components_over_tls(rendered: Path, certs: Path) -> None:
    master = read(rendered, MASTER_FILE)
    (managers,) = master["alerting"]["alertmanagers"]
    assert managers["scheme"] == "https" and managers["tls_config"] == client_tls(certs)
    writes = master["remote_write"]
    assert writes and all(write["tls_config"] == client_tls(certs) for write in writes)
    jobs = {job["job_name"]: job for job in master["scrape_configs"]}
    for name in ("gpufed-master", "alertmanager", "gpufed-dingtalk", "gpufed-child"):
        assert jobs[name]["tls_config"] == client_tls(certs), name
    assert jobs["gpufed-child"]["http_sd_configs"][0]["tls_config"] == client_tls(certs)
    # The Thanos components serve no TLS: their jobs stay as they were.
    assert all("tls_config" not in job for name, job in jobs.items() if name.startswith("thanos-"))
    assert read(rendered, PROMETHEUS_ALERTING_FILE)["alerting"]["alertmanagers"] == [managers]


def test_alertmanager_calls_the_relay_over_tls(rendered: Path, certs: Path) -> None:
    config = read(rendered, ALERTMANAGER_FILE)
    hooks = [hook for receiver in config["receivers"] for hook in receiver.get("webhook_configs", [])]
    relay = [hook for hook in hooks if hook["url"].startswith("https://gpufed-dingtalk:8060/")]
    assert relay and all(hook["http_config"] == {"tls_config": client_tls(certs)} for hook in relay)


def test_web_config_is_exporter_toolkits(rendered: Path, certs: Path) -> None:
    assert read(rendered, WEB_CONFIG_FILE) == {"tls_server_config": {
        "cert_file": str(certs / "server.crt"), "key_file": str(certs / "server.key"),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(certs / "ca.crt")}}
    assert read(rendered, HTTP_CLIENT_FILE) == {"tls_config": client_tls(certs)}
    # Our own servers read the same file with the same strict model (webconfig/).
    from webconfig.serving import load_web_config

    assert load_web_config(rendered / WEB_CONFIG_FILE).ssl_context is not None


def test_the_alertmanagers_gossip_file_pairs_the_web_config_with_the_client_settings(
        rendered: Path, certs: Path) -> None:
    assert read(rendered, CLUSTER_TLS_FILE) == {
        "tls_server_config": read(rendered, WEB_CONFIG_FILE)["tls_server_config"],
        "tls_client_config": client_tls(certs)}  # the spec's server_name wins over a replica's


def test_gossip_stays_plain_when_its_hop_is_off_or_nothing_serves_tls(certs: Path) -> None:
    document = tls_document(certs)
    document["tls"]["hops"] = {"gossip": False}
    assert CLUSTER_TLS_FILE not in pipeline.tls_part(load(document), [], None)  # type: ignore[arg-type]
    del document["tls"]["serve"], document["tls"]["hops"]
    assert pipeline.tls_part(load(document), [], None) == {}  # type: ignore[arg-type]


def test_a_web_config_with_a_missing_certificate_is_refused_by_the_check(certs: Path, tmp_path: Path) -> None:
    document = tls_document(certs)
    document["tls"]["serve"]["cert_file"] = str(tmp_path / "absent.crt")
    spec_path = tmp_path / "federation.yaml"
    spec_path.write_text(yaml.safe_dump(document), encoding="utf-8")
    spec, targets = pipeline.load_inputs(spec_path, INVENTORY)
    with pytest.raises(Exception, match="web-config") as caught:
        pipeline.render(spec, targets, out=tmp_path / "out", checker=Promtool(stack_tool(3, "promtool")))
    assert "absent.crt" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_without_tls_nothing_says_tls(tmp_path: Path) -> None:
    spec, targets = pipeline.load_inputs(EXAMPLE, INVENTORY)
    out = tmp_path / "out"
    pipeline.render(spec, targets, out=out, checker=None)
    bundle = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert not any(path.startswith("tls/") for path in bundle)
    assert not any(b"tls_config" in data for data in bundle.values())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["remote_write"][0].update(url="http://master-prometheus-0:9090/api/v1/write"),
         "remote_write 'master-0' url is 'http://master-prometheus-0:9090/api/v1/write' but"
         " tls.hops.remote_write"),
        (lambda d: d["alerting"].update(relay_url="http://gpufed-dingtalk:8060"),
         "alerting.relay_url is 'http://gpufed-dingtalk:8060' but tls.hops.relay is on"),
        (lambda d: d["thanos"]["receive"].pop("url"),
         "thanos.receive.url (default: its first router) is 'http://thanos-router:19291"),
        (lambda d: d["master"]["monitoring"].update(child_url="http://child-{child}:9090"),
         "master.monitoring.child_url is 'http://child-{child}:9090' but tls.serve"),
        (lambda d: d["tls"]["hops"].update(scrape=["gpu", "nvlink"]),
         "tls.hops.scrape names jobs ['nvlink']"),
        (lambda d: d["tls"].pop("key_file"), "cert_file and key_file go together"),
        (lambda d: d["tls"].update(ca_file="certs/ca.crt"), "TLS files are absolute paths"),
        (lambda d: d["tls"].update(crl_file="/x"), "Extra inputs are not permitted"),
        (lambda d: d["tls"]["serve"].update(client_auth_type="RequireClientCert"), "client_auth_type"),
        (lambda d: d.update(logs={"loki": {}}) or d["tls"].update(hops={}), "logs with alerting"),
    ],
)
def test_refusals_name_the_field(certs: Path, change: Any, message: str) -> None:
    document = tls_document(certs)
    document["tls"].setdefault("hops", {})
    change(document)
    with pytest.raises(SpecError) as caught:
        load(document)
    assert message in str(caught.value)


def test_a_hop_turned_off_keeps_its_plain_http(certs: Path) -> None:
    document = tls_document(certs)
    document["alerting"]["relay_url"] = "http://gpufed-dingtalk:8060"
    document["tls"]["hops"] = {"relay": False, "scrape": ["gpu"]}
    spec = load(document)
    from alertmanager.render import render_alertmanager_config
    from sharder.children.render import scrape_config

    config = render_alertmanager_config(spec.alerting, tls=spec.tls) if spec.alerting else {}
    hooks = [h for r in config["receivers"] for h in r.get("webhook_configs", [])]
    assert hooks and all("http_config" not in h for h in hooks if "gpufed-dingtalk" in h["url"])
    jobs = {job.name: scrape_config(spec, job, shard="x") for job in spec.jobs}
    assert jobs["gpu"]["scheme"] == "https" and jobs["node"]["scheme"] == "http"
    assert "tls_config" not in jobs["node"]


def test_the_docs_tls_section_is_a_valid_spec_section() -> None:
    """docs/tls-install.md's first YAML block is what the spec takes."""
    from sharder.kernel.tls import TlsSpec

    text = (ROOT / "docs" / "tls-install.md").read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    section = parse_model(TlsSpec, yaml.safe_load(block)["tls"], source="docs/tls-install.md")
    assert section.serve is not None and section.hops.scrape is True
