"""``gpufed render --target compose`` with secret files for Alertmanager, checked by the real Compose v2.

compose/federation.yaml plus seed 002's channels (tests/golden/alertmanager-channels): a
WeCom receiver (``api_secret_file``), an SMS webhook (``credentials_file``) and e-mail
(``auth_password_file``). Every Alertmanager service mounts ``GPUFED_ALERTMANAGER_SECRETS_DIR``
read-only at /etc/alertmanager/secrets, so each path the rendered alertmanager.yml names is,
through the mount Compose resolved, a file of that folder; the rendered config passes the
pinned amtool 0.33.1. A path outside the folder is refused at render time, naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, stack_tool
from test_compose import compose, filled_env, invoke

from alertmanager.amtool import Amtool

MOUNT = "/etc/alertmanager/secrets"
CHANNELS = ROOT / "tests" / "golden" / "alertmanager-channels" / "spec.yaml"
SECRETS = {"wecom-secret": "wecom-app-secret-7f3a", "sms-token": "sms-bearer-51c9",
           "smtp-password": "smtp-pass-0c2e"}
FILE_FIELDS = ("api_secret_file", "credentials_file", "auth_password_file")


def channels_spec(path: Path) -> Path:
    """The compose example with the golden channels' receivers and severity routes."""
    document: dict[str, Any] = yaml.safe_load((ROOT / "compose" / "federation.yaml").read_text())
    channels = yaml.safe_load(CHANNELS.read_text())
    document["alertmanager"] = {"version": "0.33"}  # WeCom's api_secret_file: 0.31 and later
    alerting = document["alerting"]
    alerting["receivers"] += [r for r in channels["alerting"]["receivers"] if r["name"] != "sre"]
    alerting["severity_routes"] = channels["alerting"]["severity_routes"]
    alerting["info_digest"] = channels["alerting"]["info_digest"]  # e-mailed, ${SMTP_PASSWORD}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def secret_paths(node: Any) -> list[str]:
    """Every secret file path in an Alertmanager config, wherever Alertmanager reads it."""
    if isinstance(node, dict):
        found = [str(v) for k, v in node.items() if k in FILE_FIELDS]
        return found + [p for v in node.values() for p in secret_paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in secret_paths(v)]
    return []


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("secrets-compose")
    out = root / "parent" / "current"
    result = invoke("render", "--spec", channels_spec(root / "federation.yaml"), "--out", out,
                    "--target", "compose", "--json")
    assert result.exit_code == 0, result.output
    folder = root / "am-secrets"
    folder.mkdir()
    for name, value in SECRETS.items():
        (folder / name).write_text(value)
    env = filled_env(out / "compose" / ".env.example", root / "m.env")
    env.write_text(env.read_text() + f"GPUFED_ALERTMANAGER_SECRETS_DIR={folder}\n")
    done = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--format", "json",
                   cwd=out / "compose")
    assert done.returncode == 0, done.stderr
    yield {"out": out, "folder": folder, "config": json.loads(done.stdout), "root": root}


def test_every_alertmanager_mounts_the_folder_read_only_and_nothing_else_does(
    rendered: dict[str, Any],
) -> None:
    services = rendered["config"]["services"]
    alertmanagers = sorted(name for name in services if name.startswith("alertmanager-"))
    assert alertmanagers == ["alertmanager-0", "alertmanager-1", "alertmanager-2"]
    for name, service in services.items():
        mounts = [(v["type"], v["source"], v.get("read_only")) for v in service.get("volumes", [])
                  if v["target"] == MOUNT]
        wanted = [("bind", str(rendered["folder"]), True)] if name in alertmanagers else []
        assert mounts == wanted, name


def test_each_path_in_the_rendered_config_is_a_file_of_the_mounted_folder(rendered: dict[str, Any]) -> None:
    """Through the mounts Compose resolved, as the container sees its file system."""
    out: Path = rendered["out"]
    service = rendered["config"]["services"]["alertmanager-0"]
    config_file = next(a.split("=", 1)[1] for a in service["command"] if a.startswith("--config.file="))
    config_path = out / config_file.removeprefix(f"/gpufed/{out.name}/")
    paths = secret_paths(yaml.safe_load(config_path.read_text()))
    assert sorted(paths) == sorted(f"{MOUNT}/{name}" for name in SECRETS)
    binds = sorted(((v["target"], v["source"]) for v in service["volumes"] if v["type"] == "bind"),
                   key=lambda b: -len(b[0]))
    for path in paths:
        target, source = next(b for b in binds if path.startswith(f"{b[0]}/"))
        host = Path(source) / path.removeprefix(f"{target}/")
        assert host.read_text() == SECRETS[host.name], path
    # the rendered file passes Alertmanager 0.33.1's own check (0.28 refuses api_secret_file)
    Amtool(stack_tool(3, "amtool")).check_config(config_path)


def test_the_relay_reads_the_smtp_password_of_the_email_digest_from_its_environment(
        rendered: dict[str, Any]) -> None:
    relay = rendered["config"]["services"]["gpufed-dingtalk"]
    assert relay["environment"]["SMTP_PASSWORD"]  # compose resolved it from the env file
    assert "SMTP_PASSWORD=" in (rendered["out"] / "compose" / ".env.example").read_text()
    relay_file = yaml.safe_load((rendered["out"] / "alertmanager" / "dingtalk.yml").read_text())
    assert relay_file["digest"]["email"]["auth_password"] == "${SMTP_PASSWORD}"


def test_env_example_asks_for_the_folder_and_compose_refuses_without_it(rendered: dict[str, Any]) -> None:
    compose_dir = rendered["out"] / "compose"
    example = (compose_dir / ".env.example").read_text()
    assert "# set GPUFED_ALERTMANAGER_SECRETS_DIR: the folder of files Alertmanager reads secrets" in example
    assert "\nGPUFED_ALERTMANAGER_SECRETS_DIR=\n" in example.split("# Optional")[0]
    env = filled_env(compose_dir / ".env.example", rendered["root"] / "without.env")
    env.write_text(env.read_text().replace("GPUFED_ALERTMANAGER_SECRETS_DIR=x-0123456789abcdef\n", ""))
    missing = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--quiet", cwd=compose_dir)
    assert missing.returncode != 0
    assert "GPUFED_ALERTMANAGER_SECRETS_DIR" in missing.stderr


@pytest.mark.parametrize(
    ("receiver", "channel", "field", "path"),
    [
        ("wecom-oncall", "wecom", "api_secret_file", "/run/secrets/wecom"),
        ("sms", "webhooks", "credentials_file", "/etc/alertmanager/sms-token"),
        ("ops-mail", "emails", "auth_password_file", "/etc/alertmanager/secrets/../smtp"),
    ],
)
def test_a_path_outside_the_folder_is_refused_naming_the_field(
    tmp_path: Path, receiver: str, channel: str, field: str, path: str
) -> None:
    spec = channels_spec(tmp_path / "federation.yaml")
    document = yaml.safe_load(spec.read_text())
    index = next(i for i, r in enumerate(document["alerting"]["receivers"]) if r["name"] == receiver)
    document["alerting"]["receivers"][index][channel][0][field] = path
    spec.write_text(yaml.safe_dump(document))
    result = invoke("render", "--spec", spec, "--out", tmp_path / "parent" / "current",
                    "--target", "compose", "--no-check")
    assert result.exit_code != 0
    assert f"alerting.receivers[{index}].{channel}[0].{field} is {path!r}" in result.output
    assert f"compose mounts GPUFED_ALERTMANAGER_SECRETS_DIR at {MOUNT}" in result.output
