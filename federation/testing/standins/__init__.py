"""Stand-ins of other systems, one module or folder per system: ``consul`` (agent, catalog,
health, and KV/sessions), ``kube`` (the API server's list/watch and ConfigMaps),
``dingtalk`` (the robot webhook API) and ``loki`` (the push endpoint, snappy, Promtail's
relabelling). Each follows the upstream API it names in its docstring."""
