"""The master's meta-monitoring of the demo's children: a file SD list the stack keeps current.

The rule pack's ``PrometheusChildDown`` and the health dashboard read ``up`` of a job
named ``gpufed-child*`` that the master scrapes, one target per child Prometheus with its
``region``, ``shard`` and ``replica`` (the contract in ``federation/rules/federation.yml``).
In production that job is the operator's (a Kubernetes ServiceMonitor, a static list); in
the demo the children start and stop while it runs, on ports chosen then, so the stack
writes this list whenever it starts or retires a child and Prometheus' file SD picks it up.
A killed child stays listed (its ``up`` goes to 0: that is what the alert is for); a
child retired with its shard leaves the list.

Pure but for :func:`write`, which replaces the file atomically (Prometheus must never
read half a list).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOB = "gpufed-child"
REFRESH = "5s"


@dataclass(frozen=True)
class ChildPlace:
    """Where a child sits in the assignment: the labels its meta-monitoring target carries."""

    shard: str
    region: str
    replica: int


def scrape_job(sd_file: Path) -> dict[str, Any]:
    """The master's scrape job over ``sd_file``."""
    return {"job_name": JOB, "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": REFRESH}]}


def target_groups(places: Mapping[str, ChildPlace], ports: Mapping[str, int]) -> list[dict[str, Any]]:
    """One file SD group per child that has a port, by child name (deterministic bytes)."""
    return [
        {
            "targets": [f"127.0.0.1:{ports[child]}"],
            "labels": {
                "child": child,
                "region": place.region,
                "shard": place.shard,
                "replica": str(place.replica),
            },
        }
        for child, place in sorted(places.items())
        if child in ports
    ]


def write(path: Path, groups: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
