"""Every container image gpufed deploys: one table that compose rendering reads and the
chart's ``values.yaml``, ``compose/node.yml`` and the Dockerfile are checked against
(tests/deploy/test_images.py).

The tags are the releases when this table was last updated (2026-11-27), each looked up
where ``source`` says; Prometheus pins the 3.13 LTS line (supported until July 2027).
The tests run the nearest releases Debian's archive carries (3.5.3, 0.33.1, 1.11.1, and the
2.x line 2.53.3/0.28.1: requirements/stack.lock): the images are newer than what is tested.

Tags, not digests: a tag is what a reader can check against a release page. The release
workflow (.github/workflows/release.yml) resolves every ref here to its digest with
``docker buildx imagetools inspect`` and publishes the list beside the gpufed image, so an
operator who wants ``image@sha256:...`` copies it from there.

The object store: Docker Hub's ``minio/minio`` and ``minio/mc`` were withdrawn in 2026 and
the upstream repository is archived (last release RELEASE.2025-10-15T17-29-55Z, the one
with the CVE-2025-62506 fix). ``pgsty/minio`` is the community fork (github.com/pgsty/minio)
that keeps building releases from that tree; it ships ``mc`` in the server image since its
2026-03-25 release (pgsty/silo issue #9), which the bucket service uses.
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


#: The project's own image as the release workflow publishes it; compose and the chart
#: default to it (``GPUFED_IMAGE`` / ``image.repository`` point elsewhere).
GPUFED_REPOSITORY = "ghcr.io/gpufed/gpufed"
GPUFED_TAG = "0.1.0"

IMAGES: dict[str, Image] = {
    "gpufed": Image(
        GPUFED_REPOSITORY, GPUFED_TAG,
        source=".github/workflows/release.yml (tag v0.1.0 -> ghcr.io/<owner>/gpufed:0.1.0; owner gpufed)",
    ),
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
    "thanos": Image(
        "quay.io/thanos/thanos", "v0.36.1",
        source="thanos-io/thanos release v0.36.1 (kept; a newer line is the current-stack issue's)",
    ),
    "loki": Image(
        "grafana/loki", "3.5.1",
        source="grafana/loki release v3.5.1 (3.4+: storage_config.use_thanos_objstore)",
    ),
    "grafana": Image("grafana/grafana", "11.3.0", source="grafana/grafana release v11.3.0"),
    "alloy": Image(
        "grafana/alloy", "v1.19.1",
        source="grafana/alloy release v1.19.1 (2026-08-26, Renovate PR shaman007/home-k3s#658); "
        "`alloy run --config.format=promtail`: Alloy docs 'Migrate from Promtail'",
    ),
    "promtail": Image(
        "grafana/promtail", "3.5.1",
        source="end of life 2026-03-02 (Loki docs 'Configure Promtail'); opt-in only",
    ),
    "consul": Image("hashicorp/consul", "1.19.2", source="hashicorp/consul release v1.19.2"),
    "postgres": Image("postgres", "16.4", source="Docker official image postgres:16.4"),
    "busybox": Image("busybox", "1.36.1", source="Docker official image busybox:1.36.1"),
    "object-store": Image(
        "pgsty/minio", "RELEASE.2026-08-04T00-00-00Z",
        source="community MinIO fork github.com/pgsty/minio (Docker Hub pgsty/minio); built from "
        "upstream after RELEASE.2025-10-15T17-29-55Z, the CVE-2025-62506 fix (minio/minio#21675)",
    ),
}
#: Back-compat name: the Prometheus stack's part of the table.
STACK_IMAGES = IMAGES
#: The Prometheus line the pinned image runs: the spec's default prometheus.version must match.
PROMETHEUS_IMAGE_LINE = 3


def ref(component: str) -> str:
    return IMAGES[component].ref


if __name__ == "__main__":
    # The release workflow lists the third-party refs to resolve their digests; this file
    # imports nothing outside the standard library, so it runs without the package installed.
    for name, pinned in IMAGES.items():
        if name != "gpufed":
            print(pinned.ref)
