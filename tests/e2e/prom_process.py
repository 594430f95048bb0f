"""A real Prometheus process on a loopback port, for end-to-end tests.

``PrometheusProcess`` starts ``prometheus`` with its own data dir and log file, waits for
``/-/ready``, reloads on SIGHUP (sent to the PID it started, never by name) and always
terminates, then kills, what it started. Queries go through an injected ``httpx.Client``.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from conftest import stop_process, wait_for

from federation.localrun.loopback import free_port

T = TypeVar("T")


class PrometheusProcess:
    """One ``prometheus`` process; use as a context manager so it is always stopped."""

    def __init__(
        self,
        binary: str,
        *,
        config: Path,
        data: Path,
        log: Path,
        client: httpx.Client,
        extra_args: tuple[str, ...] = (),
        cwd: Path | None = None,
    ) -> None:
        self.binary = binary
        self.config = config
        self.data = data
        self.log_path = log
        self.client = client
        self.extra_args = extra_args
        self.cwd = cwd
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusProcess:
        args = [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.data}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            *self.extra_args,
        ]
        with self.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd)
        return self

    def wait_ready(self, *, timeout: float = 15.0) -> None:
        def ready() -> bool:
            self._check_alive()
            return self.client.get(f"{self.url}/-/ready").status_code == 200

        wait_for(ready, timeout=timeout, interval=0.1, what=f"prometheus on {self.url} ready")

    def runtime_info(self) -> dict[str, Any]:
        response = self.client.get(f"{self.url}/api/v1/status/runtimeinfo")
        response.raise_for_status()
        info: dict[str, Any] = response.json()["data"]
        return info

    def reload(self, *, timeout: float = 10.0) -> None:
        """SIGHUP, then wait until Prometheus reports a newer, successful config load.

        A reload that fails leaves Prometheus on its old config while still serving, so
        success is read back from ``/api/v1/status/runtimeinfo`` instead of assumed.
        """
        self._check_alive()
        assert self.proc is not None
        before = self.runtime_info()["lastConfigTime"]
        self.proc.send_signal(signal.SIGHUP)

        def reloaded() -> bool:
            self._check_alive()
            info = self.runtime_info()
            if info["lastConfigTime"] == before:
                return False
            if not info["reloadConfigSuccess"]:
                raise AssertionError(f"prometheus on {self.url} rejected its config:\n{self.log_tail()}")
            return True

        wait_for(reloaded, timeout=timeout, interval=0.1, what=f"prometheus on {self.url} to reload")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            stop_process(self.proc)
        self.proc = None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query result; raises on HTTP or PromQL errors."""
        response = self.client.get(f"{self.url}/api/v1/query", params={"query": promql})
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        response = self.client.get(f"{self.url}/api/v1/targets", params={"state": "active"})
        response.raise_for_status()
        targets: list[dict[str, Any]] = response.json()["data"]["activeTargets"]
        return targets

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"prometheus on port {self.port} is not running:\n{self.log_tail()}")

    def __enter__(self) -> PrometheusProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
