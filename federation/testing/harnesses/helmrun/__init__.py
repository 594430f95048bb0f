"""Run the chart's rendered workloads as processes, on the compose runner's machinery.

- ``pods``: rendered workloads -> pods (containers as compose-runner services, volumes as
  files, env with Secret/ConfigMap/downward-API references resolved; pure);
- ``cluster``: the API objects the Kubernetes stand-in serves and the Service names (pure);
- ``run``: the façade (``HelmRun``): namespaces, the API stand-in on TLS, pods up, down.

Needs root, as the compose runner does.
"""
