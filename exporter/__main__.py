"""`python -m exporter`: the same entry point as the `gpufed-exporter` script."""

from exporter.cli import main

main()
