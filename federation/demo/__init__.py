"""``gpufed demo``: the live federation on one machine (no Consul, Docker or GPU needed).

``plan`` (pure: layout, ports, the spec from ``default-spec.yaml``, registry entries),
``components`` (pure: each process's command line), ``supervisor`` and ``procstat``
(processes), ``sink`` (a local DingTalk), ``router`` (children by name), ``report``
(figures read back from the master) and ``stack`` (the order it all starts and stops in).
"""
