"""``gpufed demo``: the live federation on one machine (no Consul, Docker or GPU needed).

``plan`` (pure: layout, ports, the spec from ``default-spec.yaml``, registry entries),
``components`` (pure: each process's command line), ``supervisor`` (processes), ``router``
(children by name), ``report`` (figures read back from the master) and ``stack`` (the order
it all starts and stops in). The DingTalk group at the end is ``federation.localrun.dingtalk``,
the same local DingTalk the tests and benches use.
"""
