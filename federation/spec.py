"""The whole ``federation.yaml``: the sharder's spec plus the sections other packages own.

The sharder never sees alerting (an import-linter contract keeps it so); this module
composes the sections and is what the CLI and controller load.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from alertmanager.models import AlertingSpec, check_regions
from sharder.loading import parse_model, read_document
from sharder.spec import FederationSpec


class GpufedSpec(FederationSpec):
    alerting: AlertingSpec | None = None

    @model_validator(mode="after")
    def _alerting_regions(self) -> GpufedSpec:
        if self.alerting is not None:
            check_regions(self.alerting, self.region_names())
        return self


def load_gpufed_spec(path: str | Path) -> GpufedSpec:
    path = Path(path)
    return parse_model(GpufedSpec, read_document(path), source=str(path))
