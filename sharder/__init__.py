"""gpufed sharder, cut by role (``.importlinter``'s ``sharder-roles`` holds the order, top down).

    sources/   discovery: file, Consul, Kubernetes and the built-in registry push target sets
    live/      the reconcile loop: merge the sets, debounce, grace, hysteresis, place
    children/  the child Prometheus configs, the manifest and the sharder's part of a bundle
    engine/    pure placement: assignment, hashing, incremental moves, plans, sizing, ``Step``
    model/     the federation spec and the target inventory, and their loading
    kernel/    what every renderer may import: strict models, durations, names, bundles and
               the atomic tree write, secrets, bounded documents, errors, the promtool client,
               and what differs per Prometheus/Alertmanager release (``prometheus_versions``)
"""
