"""What gpufed renders differently per Prometheus and Alertmanager release: the one table.

The spec names the lines a deployment runs (``prometheus.version``, ``alertmanager.version``);
every renderer that writes a flag or a field that changed between releases asks
:func:`prometheus_rendering` here instead of carrying its own ``if``. Each row of
:data:`DIFFERENCES` names the release that changed the behaviour and the release note it is
taken from, so a reader can check the table without reading the renderers.

A version in the spec is ``MAJOR[.MINOR[.PATCH]]`` and means "this line, this release or a
later one of it": ``3`` is any 3.x, ``3.13`` is 3.13.0 or later 3.x, ``2.53`` is 2.53.x.
Supported: Prometheus 2.53 (the last 2.x LTS) and every 3.x; Alertmanager 0.27 or later
(the first release without the v1 API, which gpufed never calls).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VERSION_RE = re.compile(r"^v?(0|[1-9][0-9]{0,3})(?:\.(0|[1-9][0-9]{0,3}))?(?:\.(0|[1-9][0-9]{0,3}))?\Z")
# `prometheus --version` / `alertmanager --version`: "prometheus, version 3.5.3+ds1 (branch: ...".
BINARY_VERSION_RE = re.compile(r"version (\d+)\.(\d+)\.(\d+)")

MIGRATION_3_0 = "https://prometheus.io/docs/prometheus/3.0/migration/"
"""Prometheus 3.0 migration guide: the flags, fields and defaults 3.0 changed."""


@dataclass(frozen=True, order=True)
class Release:
    """A release or the oldest release of a line a spec accepts (missing parts are 0)."""

    major: int
    minor: int = 0
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True)
class Difference:
    """One row: what ``before`` releases older than ``since`` need, and what ``after`` the rest."""

    name: str
    component: str
    since: Release
    before: str
    after: str
    source: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "agent mode", "prometheus", Release(3, 0),
        before="--enable-feature=agent", after="--agent",
        source=f"{MIGRATION_3_0} (Flags: the agent feature flag is removed, use --agent; 3.5.3 exits"
               " with status 3 on the old flag)",
    ),
    Difference(
        "${VAR} in external_labels", "prometheus", Release(3, 0),
        before="--enable-feature=expand-external-labels", after="(default; no flag)",
        source=f"{MIGRATION_3_0} (Flags: expand-external-labels is removed and is the default;"
               " 3.5.3 logs 'Unknown option' and goes on)",
    ),
    Difference(
        "scrape of a wrong or missing Content-Type", "prometheus", Release(3, 0),
        before="(parsed as text 0.0.4)", after="fallback_scrape_protocol: PrometheusText0.0.4 on fleet jobs",
        source=f"{MIGRATION_3_0} (Scrape protocols: 3.x fails such a scrape unless"
               " fallback_scrape_protocol is set; 2.53's promtool refuses the field)",
    ),
    Difference(
        "classic histograms beside native ones", "prometheus", Release(3, 0),
        before="scrape_classic_histograms", after="always_scrape_classic_histograms",
        source=f"{MIGRATION_3_0} (Configuration: scrape_classic_histograms renamed); gpufed sets neither",
    ),
    Difference(
        "remote-write 2.0 (opt-in: remote_write[].protocol 2.0)", "prometheus", Release(3, 0),
        before="(refused: 1.0 only)",
        after="protobuf_message: io.prometheus.write.v2.Request; the master accepts it with"
              " --web.remote-write-receiver.accepted-protobuf-messages",
        source="https://prometheus.io/docs/specs/remote_write_spec_2_0 (experimental);"
               " 3.8.0 changed its wire format (rc.3 to rc.4), so both ends must be on the same"
               " side of 3.8: gpufed's children and master run one prometheus.version",
    ),
    Difference(
        "Alertmanager API", "alertmanager", Release(0, 27),
        before="(v1 and v2)", after="v2 only (api_version: v2 rendered for every line)",
        source="https://github.com/prometheus/alertmanager/blob/v0.27.0/CHANGELOG.md"
               " (0.27.0: API v1 removed); Prometheus 3.0 sends v2 only",
    ),
    Difference(
        "WeCom secret from a file (wechat_configs[].api_secret_file)", "alertmanager", Release(0, 31),
        before="(refused: gpufed writes no inline secret, so no WeCom receiver)",
        after="api_secret_file",
        source="https://github.com/prometheus/alertmanager/blob/v0.31.0/CHANGELOG.md"
               " (0.31.0: wechat api secret via file, #4734); amtool 0.28.1 refuses the field",
    ),
)

PROMETHEUS_OLDEST = {2: Release(2, 53), 3: Release(3, 0)}
"""Oldest supported release per Prometheus line: 2.53 is the last 2.x LTS."""
ALERTMANAGER_OLDEST = Release(0, 27)
DEFAULT_PROMETHEUS = "3"
DEFAULT_ALERTMANAGER = "0.27"


def _release(text: str, *, what: str) -> Release:
    match = VERSION_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{what} is MAJOR[.MINOR[.PATCH]] (examples: 3, 3.13, 2.53.3), got {text!r}")
    major, minor, patch = (int(part) if part is not None else None for part in match.groups())
    assert major is not None
    return Release(major, minor or 0, patch or 0)


def parse_prometheus(text: str) -> Release:
    """The oldest release ``prometheus.version`` accepts; ValueError naming what is supported."""
    release = _release(text, what="prometheus.version")
    oldest = PROMETHEUS_OLDEST.get(release.major)
    if oldest is None:
        raise ValueError(f"prometheus.version {text!r}: gpufed renders for Prometheus 2.53 and 3.x")
    if release.major == 2 and release.minor == 0 and "." not in text.lstrip("v"):
        return oldest  # "2" names the supported 2.x line: 2.53
    if release < oldest:
        raise ValueError(
            f"prometheus.version {text!r}: the 2.x line is supported from {oldest.major}.{oldest.minor}"
            " (the last 2.x LTS); use 2.53 or 3"
        )
    return release


def parse_alertmanager(text: str) -> Release:
    release = _release(text, what="alertmanager.version")
    if release.major != 0 or release < ALERTMANAGER_OLDEST:
        raise ValueError(
            f"alertmanager.version {text!r}: gpufed supports Alertmanager 0.27 or later 0.x"
            " (0.27 removed the v1 API)"
        )
    return release


def binary_release(version_output: str) -> Release | None:
    """The release a ``--version`` banner names, or None when it names none."""
    match = BINARY_VERSION_RE.search(version_output)
    return Release(*(int(part) for part in match.groups())) if match else None


def check_binary(*, component: str, wanted: Release, found: Release, path: str) -> None:
    """ValueError unless ``found`` (a binary's release) is of ``wanted``'s line and not older."""
    if found.major != wanted.major or found < wanted:
        raise ValueError(
            f"{component}.version in the spec names {wanted.major}.x from {wanted}, but {path} is"
            f" {found}: set {component}.version to {found.major}.{found.minor} or give the"
            f" {component} binary of that line (gpufed demo --{component} PATH)"
        )


@dataclass(frozen=True)
class PrometheusRendering:
    """The per-release values the renderers write (see :data:`DIFFERENCES` for why)."""

    release: Release
    agent_flag: str
    external_label_env_flags: tuple[str, ...]
    fallback_scrape_protocol: str | None
    remote_write_v2: bool


def prometheus_rendering(release: Release) -> PrometheusRendering:
    three = release >= Release(3, 0)
    return PrometheusRendering(
        release=release,
        agent_flag="--agent" if three else "--enable-feature=agent",
        external_label_env_flags=() if three else ("--enable-feature=expand-external-labels",),
        fallback_scrape_protocol="PrometheusText0.0.4" if three else None,
        remote_write_v2=three,
    )


REMOTE_WRITE_V2_MESSAGE = "io.prometheus.write.v2.Request"
REMOTE_WRITE_V1_MESSAGE = "prometheus.WriteRequest"
