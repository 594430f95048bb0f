"""Everything gpufed runs to test or measure itself, one folder per kind, shipped so the
benches run from an install (as kopf ships ``kopf.testing``):

- ``standins/``: in-process servers that stand in for other systems, each following the
  system it stands in for (Consul agent + KV/sessions, the Kubernetes API, DingTalk, Loki);
- ``harnesses/``: real processes on loopback (a ``gpufed serve`` replica set, an
  Alertmanager HA set with the relay) and polling until they answer;
- ``benches/``: the ``gpufed bench ...`` measurements (``federation.commands.bench`` is
  their command table).

Service code never imports this package (``.importlinter``: testing-is-edge-only). The
exporter keeps its own ``exporter.testing`` because it stands alone (exporter-independent).
"""
