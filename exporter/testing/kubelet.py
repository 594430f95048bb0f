"""A kubelet pod-resources stand-in on a unix socket, built on kubelet's own proto (tests and
``gpufed-exporter bench attribution``).

It serves `v1.PodResourcesLister` (`List`, `Get`, `GetAllocatableResources`) with the
message classes `exporter.podresources_messages` builds from the vendored upstream
`api.proto`, so the client and this stand-in cannot drift from kubelet's wire format.
`stop()` and `start()` take the socket away and bring it back, as a kubelet restart does;
`fail` answers every call with a gRPC status instead.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc

from exporter.podresources_messages import RPCS, message


class FakeKubelet:
    def __init__(self, socket_path: str) -> None:
        self.path = socket_path
        self.answer = message("ListPodResourcesResponse")()
        self.allocatable = message("AllocatableResourcesResponse")()
        self.fail: grpc.StatusCode | None = None
        self.calls: list[str] = []
        self._server: Any = None

    def _handlers(self) -> Any:
        def call(name: str, body: Any) -> Any:
            def handler(request: Any, context: Any) -> Any:
                self.calls.append(name)
                if self.fail is not None:
                    context.abort(self.fail, "injected")
                return body(request, context)
            return handler

        def get(request: Any, context: Any) -> Any:
            for pod in self.answer.pod_resources:
                if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                    return message("GetPodResourcesResponse")(pod_resources=pod)
            context.abort(grpc.StatusCode.NOT_FOUND, "no such pod")

        bodies = {"List": lambda request, context: self.answer,
                  "GetAllocatableResources": lambda request, context: self.allocatable, "Get": get}
        return grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            name: grpc.unary_unary_rpc_method_handler(
                call(name, bodies[name]), request_deserializer=message(req).FromString,
                response_serializer=lambda m: m.SerializeToString())
            for name, (req, _) in RPCS.items()
        })

    def start(self) -> FakeKubelet:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((self._handlers(),))
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
