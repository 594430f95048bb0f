"""Stand-ins of other systems, one module or folder per system: ``consul`` (agent, catalog,
health, and KV/sessions), ``kube`` (the API server's list/watch and ConfigMaps), ``wecom``
(WeCom's gettoken and application messages, as Alertmanager's ``wechat_configs`` call them),
``sms`` (a webhook receiver standing in for an SMS gateway adapter) and ``loki`` (the push
endpoint, snappy, Promtail's relabelling). Each follows the upstream API it names in its
docstring. DingTalk's robot API is ``federation.localrun.dingtalk``: the demo's DingTalk
group is the same server, and the demo may not import this package."""
