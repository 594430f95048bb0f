"""Registering with a controller that serves TLS and requires client certificates
(``--register-http-config-file``), against the controller's own app served over mutual TLS."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml
from conftest import wait_for as shared_wait_for

from exporter import logs
from exporter.app import ExporterApp
from exporter.commands.cli import main
from exporter.controller_registry import ControllerRegistry, controller_client
from exporter.errors import ConfigError, RegistryError
from exporter.settings import ExporterSettings
from exporter.target_entry import target_entry
from tests.exporter.registry_server import TOKEN, RegistryServer
from tests.webconfig.pki import Pki
from webconfig.client import client_context

wait_for = partial(shared_wait_for, timeout=10.0, interval=0.02)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def controller(tmp_path: Path, pki: Pki) -> Iterator[RegistryServer]:
    web = pki.web_config(tmp_path / "web.yml", server=pki.server())
    with RegistryServer(tmp_path, web_config=web) as server:
        yield server


def _http_config(tmp_path: Path, pki: Pki, *, certificate: bool = True, name: str = "http.yml") -> Path:
    tls: dict[str, str] = {"ca_file": str(pki.ca_file)}
    if certificate:
        leaf = pki.client()
        tls |= {"cert_file": str(leaf.cert), "key_file": str(leaf.key)}
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"tls_config": tls}))
    return path


def _settings(url: str, **overrides: object) -> ExporterSettings:
    values: dict[str, object] = dict(
        backend="simulated", gpus=2, listen="127.0.0.1:0", node_name="node-a", register_url=url,
        register_token=TOKEN, region="eu-1", register_interval=0.05, collect_interval=0.05,
    )
    return ExporterSettings(**(values | overrides))  # type: ignore[arg-type]


def test_the_exporter_registers_with_its_client_certificate(
        controller: RegistryServer, pki: Pki, tmp_path: Path) -> None:
    assert controller.url.startswith("https://")
    app = ExporterApp(_settings(controller.url, register_http_config_file=_http_config(tmp_path, pki)))
    app.start()
    try:
        identity = f"127.0.0.1:{app.http.port}"
        wait_for(lambda: identity in controller.targets, what="the exporter registered over mutual TLS")
    finally:
        app.stop()
    assert controller.targets == {}  # deregistered on the way out, over the same client


def test_without_a_client_certificate_the_controller_refuses_the_handshake(
        controller: RegistryServer, pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    entry = target_entry(address="10.0.0.7", port=9400, job="gpu", node="node-a", region="eu-1")
    context = client_context(_http_config(tmp_path, pki, certificate=False))
    registry = ControllerRegistry(controller_client(controller.url, tls=context), token=TOKEN)
    try:
        with pytest.raises(RegistryError, match=r"PUT https://127\.0\.0\.1:\d+/v1/registry/targets/"):
            registry.register(entry)
    finally:
        registry.close()
    # The exporter itself keeps serving and retries; nothing reaches the registry.
    app = ExporterApp(_settings(controller.url,
                                register_http_config_file=_http_config(tmp_path, pki, certificate=False)))
    with caplog.at_level(logging.WARNING, logger="exporter.registration"):
        app.start()
        try:
            assert app.registrar is not None
            wait_for(lambda: app.registrar.failures >= 1)  # type: ignore[union-attr]
        finally:
            app.stop()
    assert controller.targets == {}


def test_a_bad_http_config_stops_the_exporter_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "http.yml"
    bad.write_text("tls_config:\n  ca_file: ca.crt\n  insecure: true\n")
    with pytest.raises(ConfigError, match=r"--register-http-config-file: .*http.yml: tls_config.insecure: "
                                          r"unknown field"):
        ExporterApp(_settings("https://gpufed:8080", register_http_config_file=bad))


def test_a_tls_config_for_a_plain_http_controller_is_refused(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--register-url http://gpufed:8080 is not https://"):
        ExporterApp(_settings("http://gpufed:8080", register_http_config_file=_http_config(tmp_path, pki)))


def test_the_flag_is_named_in_help_and_read_from_the_environment(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(logs, "configure", lambda **_: None)
    for command in (["serve"], ["fleet"]):
        with contextlib.suppress(SystemExit):
            main([*command, "--help"])
        assert "--register-http-config-file" in capsys.readouterr().out
    monkeypatch.setenv("GPUFED_EXPORTER_REGISTER_HTTP_CONFIG_FILE", str(tmp_path / "http.yml"))
    assert ExporterSettings().register_http_config_file == tmp_path / "http.yml"
    monkeypatch.setenv("GPUFED_EXPORTER_REGISTER_HTTP_CONFIG_FILE", "")  # compose's `${VAR:-}`
    assert ExporterSettings().register_http_config_file is None
