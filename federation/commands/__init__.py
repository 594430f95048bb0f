"""CLI command groups, each registered by federation.commands.cli."""
