"""The GPU rule pack for the master tier: Prometheus rule files shipped as package data."""
