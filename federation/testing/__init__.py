"""Benchmarks and harnesses for the application layer: the ``gpufed bench`` harnesses
(controller SD and rebalance, balance, demo gap/first-sample, failover, live) and the
replica-set harness they start. Shipped so the benches run from an install; only the
``federation.commands.bench*`` modules import it (``.importlinter``: testing-is-edge-only).
Stand-ins for external services live in :mod:`sharder.testing` (the Consul stand-in)."""
