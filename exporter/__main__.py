"""`python -m exporter`: the same entry point as the `gpufed-exporter` script."""

from exporter.commands.cli import main

main()
