"""The logs tier: Promtail on every GPU node, Loki beside Thanos, and links from metrics to logs.

``logs.models`` holds the ``logs:`` section of federation.yaml; ``logs.promtail``,
``logs.loki`` and ``logs.rules`` are pure renderers (spec in, dicts out);
``logs.formats`` parses what they render against models of Promtail's and Loki's own
config structs; ``logs.explore`` builds Grafana Explore links with the LogQL for one node.
"""
