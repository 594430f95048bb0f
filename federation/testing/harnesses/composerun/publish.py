"""``ports:`` as Docker publishes them, but on 127.0.0.1: a forwarder in this process accepts on
the host's loopback and connects inside the service's network namespace (the socket is made
there, then used from here), as ``docker-proxy`` does for a published port."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

from federation.testing.harnesses.composerun.sandbox import connect_in

LOOPBACK = "127.0.0.1"


class Forwarder:
    def __init__(self, *, published: int, netns: Path, address: str, port: int, name: str) -> None:
        self.published, self.netns, self.address, self.port, self.name = published, netns, address, port, name
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((LOOPBACK, published))
        except OSError as exc:
            self._listener.close()
            raise OSError(f"{name}: cannot publish {LOOPBACK}:{published} ({exc.strerror})") from exc
        self._listener.listen(64)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"publish-{name}-{published}", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = connect_in(self.netns, self.address, self.port, timeout=5.0)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True, name=f"pipe-{self.name}").start()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)
