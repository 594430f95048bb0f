"""The Prometheus stack's container images: one table that compose rendering reads and the
chart's ``values.yaml`` and ``compose/node.yml`` are checked against (tests/deploy/test_images.py).

The tags are the newest releases when this table was last updated (2026-11-27), looked up in
the projects' release records; Prometheus pins the 3.13 LTS line (supported until July 2027).
The tests run the nearest releases Debian's archive carries (3.5.3, 0.33.1, 1.11.1, and the
2.x line 2.53.3/0.28.1: requirements/stack.lock): the images are newer than what is tested.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Image:
    repository: str
    tag: str
    source: str
    """Where the tag was looked up."""

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


STACK_IMAGES: dict[str, Image] = {
    "prometheus": Image(
        "quay.io/prometheus/prometheus", "v3.13.3",
        source="prometheus/prometheus PR #19621 'Release 3.13.3' (2026-09-07); 3.13 is the LTS line",
    ),
    "alertmanager": Image(
        "quay.io/prometheus/alertmanager", "v0.35.1",
        source="pkg.go.dev versions of github.com/prometheus/alertmanager: v0.35.1 (2026-11-24)",
    ),
    "node-exporter": Image(
        "quay.io/prometheus/node-exporter", "v1.11.1",
        source="node_exporter v1.11.1 (Debian sid and Alpine 3.24 package it)",
    ),
}
#: The Prometheus line the pinned image runs: the spec's default prometheus.version must match.
PROMETHEUS_IMAGE_LINE = 3


def ref(component: str) -> str:
    return STACK_IMAGES[component].ref
