"""The benchmarks behind ``gpufed bench ...`` (their command table is
``federation.commands.bench``): each prints one JSON object with ``--json``."""
