"""Stand-ins for external services, shipped so benchmarks can start them (``gpufed bench
failover``) and tests can import them; nothing in the service imports this package."""
