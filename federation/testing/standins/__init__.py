"""Stand-ins of other systems, one module or folder per system: ``consul`` (agent, catalog,
health, and KV/sessions), ``kube`` (the API server's list/watch and ConfigMaps),
``dingtalk`` (the robot webhook API), ``wecom`` (WeCom's gettoken and application
messages, as Alertmanager's ``wechat_configs`` call them), ``sms`` (a webhook receiver
standing in for an SMS gateway adapter) and ``loki`` (the push endpoint, snappy, Promtail's
relabelling). Each follows the upstream API it names in its docstring."""
