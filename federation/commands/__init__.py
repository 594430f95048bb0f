"""CLI command groups, each registered by federation.cli."""
