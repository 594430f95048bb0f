"""Exporter settings: environment (`GPUFED_EXPORTER_*`) overridden by CLI flags.

Built in `cli.main()` and passed down; never at import. `NODE_NAME` (downward API) is
read without the prefix, and the controller token falls back to `GPUFED_TOKEN` (the one
the `gpufed` CLI uses). Durations handed to Consul are Go duration strings.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from exporter.catalogue import FAMILIES

_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration_seconds(text: str) -> float:
    """Seconds in a Go duration such as `1m30s`."""
    if not _GO_DURATION.match(text):
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|ms|s|m|h)", text))


_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port`, `:port` or `[v6]:port` into (host, port); ValueError says what is wrong.

    The host is an IP literal or a DNS name (resolved when the server binds); an empty
    host means every IPv4 address. The port is 0 (pick a free one) to 65535.
    """
    host, sep, port = listen.rpartition(":")
    if not sep:
        raise ValueError(f"expected HOST:PORT (e.g. 0.0.0.0:9400), got {listen!r}")
    if not port.isascii() or not port.isdigit():
        raise ValueError(f"port must be a number 0-65535, got {port!r} in {listen!r}")
    number = int(port)
    if number > 65535:
        raise ValueError(f"port {number} is out of range 0-65535 in {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), number
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address in {listen!r}") from None
    if not host:
        return "0.0.0.0", number
    if ":" in host:
        raise ValueError(f"an IPv6 host needs brackets ([{host}]:{port}), got {listen!r}")
    if not _DNS_NAME.match(host):
        raise ValueError(f"{host!r} is neither an IP address nor a host name in {listen!r}")
    return host, number


def _split(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class ExporterSettings(BaseSettings):
    """Everything `serve` and `fleet` need; field docs are the reference."""

    model_config = SettingsConfigDict(env_prefix="GPUFED_EXPORTER_", extra="forbid")

    backend: Literal["nvml", "simulated"] = "nvml"
    gpus: int = Field(default=8, ge=0, le=64, description="simulated GPUs per node")
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    seed: int = 0
    first_xid: bool = Field(default=True, description="fleet: one seeded XID 5-20 s after start on one node, "
                            "so a demo shows an alert within a minute (exporter.simulated.first_xid)")
    listen: str = "0.0.0.0:9400"
    web_config_file: Path | None = Field(default=None, description="exporter-toolkit web config: TLS, "
                                         "basic auth, headers (--web.config.file)")
    listen_backlog: int = Field(default=4096, ge=16, le=65535,
                                description="pending connections; the kernel caps it at somaxconn")
    idle_timeout: float = Field(default=120.0, gt=0, description="seconds a keep-alive connection may idle")
    request_timeout: float = Field(default=10.0, gt=0, description="seconds to send one whole request")
    max_request_body: int = Field(default=65536, ge=0, description="bytes; a larger body gets 413")
    render_cache: bool = Field(default=True, description="render each collection once; off for benchmarks")
    collect_interval: float = Field(default=5.0, gt=0)
    collect_timeout: float = Field(default=3.0, gt=0)
    ready_max_age: float | None = Field(default=None, description="default: 3 x collect_interval")
    health_window: float = Field(default=600.0, gt=0, description="seconds a bad XID marks a GPU down")
    families_include: Annotated[list[str], NoDecode] = Field(default_factory=list)
    families_exclude: Annotated[list[str], NoDecode] = Field(default_factory=list)
    hostname_label: Literal["Hostname", "hostname"] | None = Field(
        default=None, description="default: hostname with --dcgm-names 4 or 4-draft (dcgm-exporter main), "
        "else Hostname")
    dcgm_names: Literal["3", "4", "both", "4-draft"] = Field(
        default="3", description="DCGM metric names: 3 (dcgm-exporter default-counters.csv), 4 (DCGM 4.6.0), "
        "both, or 4-draft (4 plus names no upstream file defines)")
    hami_legacy: bool = False
    nvlink_series: Literal["gpufed", "dcgm"] = Field(
        default="gpufed", description="the opt-in per-link nvlink family: gpufed_nvlink_* (link label) or "
        "DCGM 4.6.0's per-link fields with dcgm-exporter's link labels")
    node_name: str | None = Field(
        default=None, validation_alias=AliasChoices("GPUFED_EXPORTER_NODE_NAME", "NODE_NAME", "node_name")
    )
    region: str = ""
    rack: str = ""
    team: str = ""
    cluster: str = ""
    pod_attribution: Literal["none", "kubelet"] = "none"
    pod_resources_socket: str = Field(default="/var/lib/kubelet/pod-resources/kubelet.sock",
                                      min_length=1, description="kubelet pod-resources unix socket")
    pod_resources_interval: float = Field(default=10.0, gt=0, description="seconds between List calls")
    pod_resources_timeout: float = Field(default=10.0, gt=0, description="seconds one kubelet call may take "
                                         "(10, as dcgm-exporter allows)")
    pod_resources_max_age: float = Field(default=60.0, gt=0, description="seconds after kubelet's last good "
                                         "answer before pod labels are dropped")
    pod_resources_backoff_cap: float = Field(default=5.0, gt=0, description="cap of the gRPC reconnect "
                                             "backoff, seconds")
    dra_resource_slices: bool = Field(default=False, description="resolve DRA devices through the node's "
                                      "ResourceSlices (needs list/watch on resourceslices)")
    kubernetes: bool = Field(default=False, description="running as a DaemonSet: no Consul registration")
    consul: str | None = Field(default=None, description="local agent host:port; unset: no registration")
    consul_token: str | None = None
    service_name: str = "gpufed-exporter"
    advertise_address: str | None = None
    register_url: str | None = Field(default=None, description="gpufed controller base URL; unset: no "
                                     "registration there")
    register_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("GPUFED_EXPORTER_REGISTER_TOKEN", "GPUFED_TOKEN", "register_token"),
    )
    register_http_config_file: Path | None = Field(
        default=None, description="Prometheus http_config file whose tls_config (CA, client certificate, "
        "server_name) the registry calls to the controller use (--register-http-config-file)")
    register_job: str = Field(default="gpu", min_length=1, description="job of the GPU target")
    node_exporter_port: int | None = Field(default=None, ge=1, le=65535,
                                           description="also register node-exporter here as job node")
    register_interval: float = Field(default=30.0, gt=0,
                                     description="seconds between anti-entropy checks (Consul) or "
                                     "refreshes (controller)")
    check_interval: str = "10s"
    check_timeout: str = "2s"
    deregister_critical_after: str = "5m"
    log_format: Literal["logfmt", "json"] = "logfmt"
    log_level: str = "INFO"

    _split_include = field_validator("families_include", "families_exclude", mode="before")(_split)

    @field_validator("consul", "register_url", "web_config_file", "register_http_config_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Compose passes `${VAR-}` through as "": an empty registry address means none, so a
        # node env file can leave the registry it does not use empty.
        return None if value == "" else value

    @field_validator("families_include", "families_exclude")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown families {unknown}; known: {sorted(FAMILIES)}")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("check_interval", "check_timeout")
    @classmethod
    def _duration(cls, value: str) -> str:
        go_duration_seconds(value)
        return value

    @field_validator("deregister_critical_after")
    @classmethod
    def _at_least_a_minute(cls, value: str) -> str:
        # Consul reaps critical services no faster than once a minute.
        if go_duration_seconds(value) < 60:
            raise ValueError("deregister_critical_after must be at least 1m")
        return value

    @field_validator("register_url")
    @classmethod
    def _register_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", value):
            raise ValueError("expected the controller's base URL, e.g. http://gpufed:8080")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_registry(self) -> ExporterSettings:
        if self.consul and self.register_url:
            raise ValueError("--consul and --register-url are mutually exclusive (GPUFED_EXPORTER_CONSUL, "
                             "GPUFED_EXPORTER_REGISTER_URL): register with one registry")
        return self

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @property
    def max_age(self) -> float:
        return self.ready_max_age or 3 * self.collect_interval


def host_label(settings: ExporterSettings) -> str:
    """The host label: the setting, else `hostname` under DCGM 4 names (dcgm-exporter renamed
    `Hostname` to `hostname` after 4.5.3-4.8.2, commit d5e5f510), else `Hostname`."""
    if settings.hostname_label:
        return settings.hostname_label
    return "hostname" if settings.dcgm_names in ("4", "4-draft") else "Hostname"
