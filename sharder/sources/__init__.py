"""Discovery sources: one adapter module per registry, each pushing full target sets.

    base.py        DiscoverySink (what a source pushes into), Backoff, Source protocol
    file           an inventory file, followed by polling mtime + content hash
    consul         Consul health API with blocking queries (the only module importing consul)
    kubernetes     Kubernetes EndpointSlices/Pods + Nodes (the only module importing kubernetes)

A source knows nothing of hashing: it turns registry data into ``Target``s through the
inventory validation in ``sharder.model.loading`` and calls ``sink.on_change(name, targets)``
with its whole current set, or ``sink.on_error(name, reason)`` when a poll fails (the
sink keeps the last set). ``sharder.live.reconcile.Reconciler`` is the sink.
"""
