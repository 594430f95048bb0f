"""The Consul stand-in lives in ``sharder.testing.consul_standin`` (benchmarks start it
from an installed package); tests keep importing it from here."""

from sharder.testing.consul_standin import (
    DATACENTER,
    NODE,
    NODE_ADDRESS,
    BadRequest,
    Check,
    FakeConsulAgent,
    Service,
    exporter_service,
    main,
    parse_duration,
)

__all__ = [
    "DATACENTER",
    "NODE",
    "NODE_ADDRESS",
    "BadRequest",
    "Check",
    "FakeConsulAgent",
    "Service",
    "exporter_service",
    "main",
    "parse_duration",
]

if __name__ == "__main__":
    main()
