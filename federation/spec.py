"""The whole ``federation.yaml``: the sharder's spec plus the sections other packages own.

The sharder never sees alerting (an import-linter contract keeps it so); this module
composes the sections and is what the CLI and controller load.
"""

from __future__ import annotations

from pathlib import Path

from alertmanager.models import AlertingSpec
from sharder.loading import parse_model, read_document
from sharder.spec import FederationSpec


class GpufedSpec(FederationSpec):
    alerting: AlertingSpec | None = None


def load_gpufed_spec(path: str | Path) -> GpufedSpec:
    path = Path(path)
    return parse_model(GpufedSpec, read_document(path), source=str(path))
