"""What runs for each image, and the few declared changes a machine without GPUs or internet needs.

``IMAGES``: an image's repository -> a real binary here (its ENTRYPOINT replaced by that
binary, the service's ``command`` as its arguments), one of the project's stand-ins, or
nothing (the service is left out). ``OVERRIDES``: the only changes to what Compose
resolved, each with its reason; the runner prints both tables. Pure data and lookups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["real", "standin", "left_out"]


@dataclass(frozen=True)
class ImageRule:
    repository: str  # matched against the image's repository, registry host optional
    kind: Kind
    entrypoint: tuple[str, ...]  # "{stack}/x": the pinned stack's binary; () the command runs as is
    version: tuple[str, ...] = ()  # argv that prints the version run (with --version)
    note: str = ""
    health: tuple[str, ...] = ()  # a stand-in's probe in place of the image's healthcheck test


IMAGES: tuple[ImageRule, ...] = (
    ImageRule("gpufed/gpufed", "real", (), note="gpufed's commands from the virtualenv (first on PATH)"),
    ImageRule("prometheus/prometheus", "real", ("{stack}/prometheus",), ("{stack}/prometheus", "--version")),
    ImageRule(
        "prometheus/alertmanager",
        "real",
        ("{stack}/prometheus-alertmanager",),
        ("{stack}/prometheus-alertmanager", "--version"),
    ),
    ImageRule(
        "prometheus/node-exporter",
        "real",
        ("{stack}/prometheus-node-exporter",),
        ("{stack}/prometheus-node-exporter", "--version"),
    ),
    ImageRule(
        "hashicorp/consul",
        "standin",
        ("{python}", "-m", "federation.testing.standins.consul.agent", "--host", "0.0.0.0", "--port", "8500"),
        note="federation.testing.standins.consul (agent HTTP API, catalog, KV and sessions on 8500)",
        health=("wget", "-qO-", "http://127.0.0.1:8500/v1/agent/services"),
    ),
    ImageRule(
        "grafana/loki",
        "standin",
        ("{python}", "-m", "federation.testing.standins.loki.push", "--host", "0.0.0.0", "--port", "3100"),
        note="federation.testing.standins.loki (the push API on 3100, labels checked as Loki does; no query)",
        health=("wget", "-qO-", "http://127.0.0.1:3100/ready"),
    ),
    ImageRule(
        "library/busybox",
        "real",
        (),
        note="the host's sh, wget and cmp (the chart's init and sync scripts use nothing else)",
    ),
    ImageRule("thanos/thanos", "left_out", (), note="no Thanos binary here"),
    ImageRule("grafana/grafana", "left_out", (), note="no Grafana binary here"),
    ImageRule("grafana/alloy", "left_out", (), note="no Alloy binary here"),
    ImageRule("grafana/promtail", "left_out", (), note="no Promtail binary here"),
    ImageRule("postgres", "left_out", (), note="its only client (Grafana) is left out"),
    ImageRule("pgsty/minio", "left_out", (), note="no object store binary here (bucket-init runs its mc)"),
    ImageRule("minio/minio", "left_out", (), note="no object store binary here"),
    ImageRule("minio/mc", "left_out", (), note="no object store binary here"),
)


def repository(image: str) -> str:
    """``quay.io/prometheus/prometheus:v3.13.3@sha256:..`` -> ``quay.io/prometheus/prometheus``."""
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition("/")
    return f"{head}/{tail.split(':', 1)[0]}" if head else tail.split(":", 1)[0]


def tag(image: str) -> str:
    name = image.split("@", 1)[0].rpartition("/")[2]
    return name.partition(":")[2] or "latest"


def rule_for(image: str) -> ImageRule:
    """The rule whose repository ends the image's (``gpufed/gpufed`` matches a private registry's copy)."""
    repo = repository(image)
    for rule in IMAGES:
        if repo == rule.repository or repo.endswith("/" + rule.repository):
            return rule
    return ImageRule(repo, "left_out", (), note="no rule for this image")


def expand(argv: tuple[str, ...], *, stack: Path, python: str) -> list[str]:
    return [a.replace("{stack}", str(stack)).replace("{python}", python) for a in argv]


VERSION = re.compile(r"version (\S+)")


# --- the declared overrides ---------------------------------------------------------------------


@dataclass(frozen=True)
class Override:
    image: str  # repository, as in IMAGES
    command: str  # the service's first command word it applies to
    environment: dict[str, str]  # set on top of what Compose resolved; "{...}" filled by the run
    why: str


OVERRIDES: tuple[Override, ...] = (
    Override(
        "gpufed/gpufed",
        "gpufed-exporter",
        {"GPUFED_EXPORTER_BACKEND": "simulated"},
        "no GPUs here: the exporter's simulated backend (node.yml's NVIDIA runtime and device "
        "reservation are not applied)",
    ),
    Override(
        "gpufed/gpufed",
        "gpufed-exporter",
        {"GPUFED_EXPORTER_SEED": "{xid_seed}"},
        "`gpufed-exporter` (one node) has no scheduled XID (exporter.simulated.first_xid is the "
        "fleet's): the seed is the first one whose seeded XIDs put one (of the caller's codes: the "
        "bench and test ask for the rule pack's critical ones) on some node 12-25 s after the plan, "
        "read from the simulated backend itself",
    ),
    Override(
        "gpufed/gpufed",
        "gpufed-dingtalk",
        {"SSL_CERT_FILE": "{ca_file}"},
        "no internet: the robot URLs (https://oapi.dingtalk.com/...) stay as rendered; that name "
        "resolves to the DingTalk stand-in in every hosts file, and the relay trusts the run's "
        "certificate for it",
    ),
)

#: Names outside the files that resolve to a stand-in the run starts (with the override above).
EXTERNAL = {"oapi.dingtalk.com": "dingtalk"}


def overrides_for(
    image: str, command: tuple[str, ...] | None, table: tuple[Override, ...] = OVERRIDES
) -> list[Override]:
    """The overrides of ``table`` (the compose run's by default) for this image and first word."""
    repo, first = repository(image), (command or ("",))[0]
    return [o for o in table if (repo == o.image or repo.endswith("/" + o.image)) and first == o.command]
