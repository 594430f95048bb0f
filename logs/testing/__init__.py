"""Stand-ins for the logs tier's tests (as kopf ships kopf.testing): a Loki push endpoint,
snappy block (de)compression and Prometheus relabelling as Promtail applies it. Service
code never imports this package (an import-linter contract keeps it so)."""
