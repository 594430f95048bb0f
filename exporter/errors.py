"""The exporter's exception tree; foreign errors are mapped onto it at the adapter boundary.

    ExporterError
    ├── ConfigError       bad settings or CLI values (unknown family, bad address)
    ├── BackendError      the GPU backend could not start or read (NVML missing, GPU lost)
    └── RegistryError     the registry (Consul, the controller) failed or could not be reached
        └── RegistryRefused   it answered and said no (bad token, bad entry): fix, not wait
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


class RegistryRefused(RegistryError):
    """The registry understood and refused (401/403/422): retrying unchanged will not help.

    The registrar still retries (a rotated token or a fixed controller recovers without a
    restart) but logs these as errors, since someone has to act.
    """
