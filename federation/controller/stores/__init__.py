"""Where the controller's state lives: the ``StateStore`` contract (``store``) and its three
backends (SQLite, Consul KV, Kubernetes ConfigMaps) with their codecs. One fenced
``apply(commit)`` per change; only ``consul_store``/``consul_kv`` import py-consul and only
``kube_objects``/``kube_store`` import kubernetes."""
