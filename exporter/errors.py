"""The exporter's exception tree; foreign errors are mapped onto it at the adapter boundary.

    ExporterError
    ├── ConfigError       bad settings or CLI values (unknown family, bad address)
    ├── BackendError      the GPU backend could not start or read (NVML missing, GPU lost)
    └── RegistryError     the service registry (Consul) refused or could not be reached
"""

from __future__ import annotations


class ExporterError(Exception):
    """Base of every error the exporter raises on purpose."""


class ConfigError(ExporterError):
    """A setting or CLI value that cannot work; raised before anything starts."""


class BackendError(ExporterError):
    """The GPU backend failed; the loop records it and keeps serving the last snapshot."""


class RegistryError(ExporterError):
    """Registration failed; the registrar retries with backoff instead of exiting."""
