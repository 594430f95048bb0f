"""The whole ``federation.yaml``: the sharder's spec plus the sections other packages own.

The sharder never sees alerting (an import-linter contract keeps it so); this module
composes the sections and is what the CLI and controller load.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from alertmanager.models import AlertingSpec, AlertmanagerReleaseSpec, check_regions, check_release
from federation.grafana.models import GrafanaSpec
from federation.master_spec import MasterSpec, MonitoringSpec
from logs.models import LogsSpec
from sharder.kernel.models import StrictModel
from sharder.model.loading import parse_model, read_document
from sharder.model.spec import FederationSpec, require_https
from thanos.models import ThanosSpec

#: ``master.monitoring`` of a spec without a master section (built once: asked once a child).
DEFAULT_MONITORING = MonitoringSpec()


class FleetSpec(StrictModel):
    """The fleet the spec is for: what ``gpufed size``, ``render --target compose`` and the
    controller's shard cap size from when no flag names it (flags win)."""

    nodes: int = Field(ge=1, le=1_000_000, description="GPU nodes")
    gpus_per_node: int = Field(default=8, ge=0, le=64)
    pods_per_gpu: int = Field(default=0, ge=0, le=64, description="pods sharing each GPU (0: no pod labels)")
    hami: bool = Field(default=True, description="the exporter serves the HAMi families")


class GpufedSpec(FederationSpec):
    fleet: FleetSpec | None = None
    alerting: AlertingSpec | None = None
    alertmanager: AlertmanagerReleaseSpec = Field(default_factory=AlertmanagerReleaseSpec)
    master: MasterSpec | None = None
    thanos: ThanosSpec | None = None
    logs: LogsSpec | None = None
    grafana: GrafanaSpec | None = None

    def child_url(self, *, child: str, region: str, shard: str, replica: int, ordinal: int) -> str:
        """The URL the master's meta-monitoring scrapes the child at (``master.monitoring``,
        its defaults where the spec has no master section)."""
        monitoring = self.master.monitoring if self.master is not None else DEFAULT_MONITORING
        return monitoring.child_url_of(region).format(
            child=child, region=region, shard=shard, replica=replica, ordinal=ordinal)

    @model_validator(mode="after")
    def _alerting_regions(self) -> GpufedSpec:
        if self.alerting is not None:
            check_regions(self.alerting, self.region_names())
            check_release(self.alerting, self.alertmanager.release())
        return self

    @model_validator(mode="after")
    def _monitoring_regions(self) -> GpufedSpec:
        if self.master is not None:
            unknown = sorted(set(self.master.monitoring.child_url_by_region) - set(self.region_names()))
            if unknown:
                raise ValueError(
                    f"master.monitoring.child_url_by_region names regions {unknown} the spec does not have"
                    f" (it has {self.region_names()})"
                )
        return self

    @model_validator(mode="after")
    def _long_term_and_thanos(self) -> GpufedSpec:
        long_term = self.master.long_term if self.master is not None else None
        if long_term is None:
            return self
        receive = self.thanos is not None and self.thanos.mode == "receive"
        if long_term.kind == "thanos" and not receive:
            raise ValueError(
                "master.long_term.kind thanos writes into Thanos Receive: add a thanos section with"
                " mode receive, or name another kind"
            )
        if long_term.kind != "thanos" and receive:
            raise ValueError(
                f"master.long_term.kind {long_term.kind} sends the master's remote_write away from"
                " Thanos Receive, which then gets nothing: use thanos.mode sidecar, drop the thanos"
                " section, or use kind thanos"
            )
        return self

    @model_validator(mode="after")
    def _master_and_thanos(self) -> GpufedSpec:
        if self.thanos is None:
            return self
        if self.thanos.mode == "sidecar" and self.master is None:
            raise ValueError("thanos mode sidecar runs beside the master Prometheus: add a master section")
        if self.master is not None and self.thanos.receive is not None:
            # Exact tenants the master never sends would leave a ring empty and the data elsewhere.
            sent = {self.cluster, *(self.region_names() if self.master.tenants == "per-region" else [])}
            for ring in self.thanos.receive.hashrings:
                unknown = sorted(set(ring.tenants) - sent) if ring.tenant_matcher_type == "exact" else []
                if unknown:
                    raise ValueError(
                        f"hashring {ring.name!r} names tenants {unknown} the master never sends"
                        f" (it sends {sorted(sent)})"
                    )
        return self


    @model_validator(mode="after")
    def _tls_sections(self) -> GpufedSpec:
        # The sections sharder.model.spec does not see: the master's store, the relay, the
        # children the master scrapes once they serve TLS.
        tls = self.tls
        if tls is None:
            return self
        long_term = self.master.long_term if self.master is not None else None
        if tls.hops.long_term and self.master is not None:
            if long_term is not None and long_term.url is not None:
                require_https("master.long_term.url", long_term.url, hop="long_term")
            elif self.thanos is not None and self.thanos.mode == "receive" and self.thanos.receive:
                require_https("thanos.receive.url (default: its first router)", self.thanos.receive_url(),
                              hop="long_term")
        if tls.hops.relay and self.alerting is not None and self.alerting.robots:
            require_https("alerting.relay_url", self.alerting.relay_url, hop="relay")
        if tls.serve is not None:
            # Readers of the master and the Alertmanagers that gpufed renders no TLS client for.
            readers = {
                "thanos.mode sidecar (the sidecar reads the master's HTTP API)":
                    self.thanos is not None and self.thanos.mode == "sidecar",
                "grafana without thanos (its datasource is the master)":
                    self.grafana is not None and self.thanos is None,
                "logs with alerting (Loki's ruler posts to the Alertmanagers)":
                    self.logs is not None and self.alerting is not None,
            }
            for what, present in readers.items():
                if present:
                    raise ValueError(
                        f"tls.serve makes the master and the Alertmanagers serve TLS only, but {what}"
                        " has no TLS client settings yet: leave tls.serve out, or that section"
                    )
        if tls.serve is not None and self.master is not None and self.master.monitoring.enabled:
            monitoring = self.master.monitoring
            for field, url in [("master.monitoring.child_url", monitoring.child_url),
                               *((f"master.monitoring.child_url_by_region.{region}", url)
                                 for region, url in monitoring.child_url_by_region.items())]:
                if not url.startswith("https://"):
                    raise ValueError(
                        f"{field} is {url!r} but tls.serve makes the children serve TLS only:"
                        " use an https:// URL"
                    )
        return self

    @model_validator(mode="after")
    def _logs_bucket(self) -> GpufedSpec:
        # Loki keeps its chunks in the bucket thanos.objstore names, under its own prefix.
        if self.logs is None:
            return self
        if self.thanos is None:
            raise ValueError("logs stores Loki's data in the thanos.objstore bucket: add a thanos section")
        if self.thanos.objstore.prefix.strip("/") == self.logs.storage_prefix:
            raise ValueError(
                f"logs.storage_prefix {self.logs.storage_prefix!r} is thanos.objstore.prefix too:"
                " Loki and Thanos need their own prefixes in the bucket"
            )
        return self


    @model_validator(mode="after")
    def _grafana_sources(self) -> GpufedSpec:
        if self.grafana is None:
            return self
        for team, spec in self.grafana.teams.items():
            unknown = sorted(set(spec.regions) - set(self.region_names()))
            if unknown:
                raise ValueError(
                    f"grafana.teams.{team}.regions names regions {unknown} the spec does not have"
                )
        return self


def load_gpufed_spec(path: str | Path) -> GpufedSpec:
    path = Path(path)
    return parse_model(GpufedSpec, read_document(path), source=str(path))
