"""The `gpufed-exporter` command line: the edge that wires settings, the app and the benches."""
