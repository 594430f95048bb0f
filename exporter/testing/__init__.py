"""Benchmarks for the exporter (``gpufed-exporter bench`` and ``bench fleet``). Shipped so they
run from an install; only ``exporter.commands.cli``'s bench commands import this package
(``.importlinter``: testing-is-edge-only)."""
