"""DingTalk's API for the run: the local DingTalk (``federation.localrun.dingtalk``) serving
``https://oapi.dingtalk.com`` inside its own namespace, with a certificate made for the run.

The robots it accepts are read from the relay's rendered config, expanded with the
environment Compose gave the relay, so the tokens and secrets in the robot URLs are the
env file's and a wrongly signed or unkeyworded message is refused as DingTalk would.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

NAME = "oapi.dingtalk.com"
PORT = 443


def make_certificate(*, cert: Path, key: Path, names: tuple[str, ...] = (NAME,)) -> None:
    """A self-signed certificate for ``names`` (``oapi.dingtalk.com``: the relay trusts it via
    SSL_CERT_FILE; the Helm run's Kubernetes API stand-in uses it too)."""
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            f"/CN={names[0]}",
            "-addext",
            "subjectAltName=" + ",".join(f"DNS:{n}" for n in names),
        ],
        capture_output=True,
        check=True,
        timeout=30,
    )


def robots(relay_config: Path, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each robot of the relay's config as the stand-in registers it: name, token, secret, keywords."""
    from alertmanager.dingtalk.config import expand_env

    expanded = expand_env(yaml.safe_load(relay_config.read_text()), env)
    found = []
    for name, robot in expanded.get("robots", {}).items():
        token = robot["url"].partition("access_token=")[2].split("&")[0]
        found.append({"name": name, "token": token, "secret": robot.get("secret"),
                      "keywords": robot.get("keywords")})
    return found


def argv(*, python: str, folder: Path, found: list[dict[str, Any]], cert: Path, key: Path) -> list[str]:
    """The stand-in's command line (``robots.json`` written into ``folder``)."""
    robots_file = folder / "robots.json"
    robots_file.write_text(json.dumps(found))
    return [
        python,
        "-m",
        "federation.localrun.dingtalk",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        "--robots",
        str(robots_file),
        "--cert",
        str(cert),
        "--key",
        str(key),
    ]
