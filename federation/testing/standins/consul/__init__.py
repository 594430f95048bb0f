"""The Consul stand-in: ``agent`` (services, checks, catalog and health, the HTTP server)
and ``kv`` (the KV store and sessions it serves). The real Consul adapters are
``sharder.sources.consul`` (discovery) and ``federation.controller.stores.consul_*``."""
