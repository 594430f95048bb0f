"""An ASGI app under uvicorn in a daemon thread, on a loopback socket bound before it starts:
the relay thread, the exporter tests' registry and the controller's HTTP tests use it.

``AppServer(app)`` binds a port the OS picks; ``sock=`` takes one bound earlier (when a
config had to name the port first). Extra keywords go to ``uvicorn.Config``.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn

from federation.localrun.loopback import listening_socket
from federation.localrun.waiting import wait_until


class AppServer:
    def __init__(self, app: Any, *, sock: socket.socket | None = None, name: str = "app-server",
                 **config: Any) -> None:
        self.socket = sock if sock is not None else listening_socket()
        self.port = int(self.socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, **{"log_level": "warning", **config}))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                        daemon=True, name=name)

    def start(self) -> AppServer:
        self._thread.start()

        def alive() -> None:
            if not self._thread.is_alive():
                raise RuntimeError(f"{self._thread.name} did not start")

        wait_until(lambda: self.server.started, timeout=10, what=self._thread.name, interval=0.02,
                   alive=alive, fail=RuntimeError)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self.socket.close()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
