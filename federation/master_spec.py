"""The ``master:`` section of federation.yaml: the Prometheus the children remote-write into.

    master:
      replicas: 2              # an HA pair; Thanos Query deduplicates on their replica label
      retention: 15d
      rule_pack: true          # federation/rules/*.yml, copied into master/rules/
      tenants: per-region      # Thanos Receive tenant per region, or one (the cluster)

Checks that need the rest of the spec (Thanos mode, hashring tenants) live in
``federation.spec.GpufedSpec``; this module only types the section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from sharder.spec import LABEL_NAME_RE, StrictModel, parse_duration

#: Env var a replica's launcher sets; Prometheus expands it in external_labels when
#: started with --enable-feature=expand-external-labels (one config for both replicas).
REPLICA_ENV = "GPUFED_MASTER_REPLICA"


class MasterSpec(StrictModel):
    replicas: int = Field(default=1, ge=1, le=2, description="1: single; 2: HA pair")
    host: str = Field(default="master-prometheus", description="replica i is <host>-<i> with 2 replicas")
    port: int = Field(default=9090, ge=1, le=65535)
    retention: str = "15d"
    data_dir: str = "/var/lib/prometheus/master"
    rule_pack: bool = True
    extra_rule_files: list[str] = Field(default_factory=list, description="absolute paths, loaded as well")
    tenants: Literal["single", "per-region"] = "single"
    scrape_interval: str = "30s"
    evaluation_interval: str = "30s"
    external_labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("retention", "scrape_interval", "evaluation_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"duration must be above zero: {value!r}")
        return value

    @field_validator("extra_rule_files")
    @classmethod
    def _absolute(cls, values: list[str]) -> list[str]:
        for value in values:
            if not value.startswith("/"):
                raise ValueError(f"extra rule files are absolute paths, got {value!r}")
        return values

    @field_validator("external_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        reserved = {"cluster", "replica"} & labels.keys()
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set by gpufed itself")
        for name in labels:
            if not LABEL_NAME_RE.match(name):
                raise ValueError(f"not a valid label name: {name!r}")
        return labels

    def replica_names(self) -> list[str]:
        return [f"master-{i}" for i in range(self.replicas)]

    def replica_host(self, index: int) -> str:
        return self.host if self.replicas == 1 else f"{self.host}-{index}"
