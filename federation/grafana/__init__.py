"""Grafana as gpufed provisions it: datasources that link metrics and logs both ways, one
folder of pinned dashboards per team, and an HA pair sharing PostgreSQL.

``models`` holds the ``grafana:`` section; ``datasources``, ``teams`` and ``ha`` are pure
renderers; ``formats`` parses what they render against models of Grafana's provisioning
structs; ``render`` puts the files together for ``federation.master.pipeline.grafana_part``.
"""
