"""The shared kernel: the primitives alerting, Thanos, logs and the master tier build on.

Nothing here knows shards, targets or placement; the ``kernel-only-for-renderers``
contract keeps the other tiers from reaching past it into the sharder.
"""
