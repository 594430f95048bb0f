"""Benchmarks and stand-ins for the sharder: ``gpufed bench sharding|inventory|render|discovery``
and the Consul stand-in they (and the tests) start. Shipped so the benches run from an
install; no service module imports this package (``.importlinter``: testing-is-edge-only)."""
