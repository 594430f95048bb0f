"""``gpufed serve`` as a real process on a free loopback port, for end-to-end tests.

The first start asks for ``--listen 127.0.0.1:0`` and reads the port the process bound from
its ``listening on`` line, so no other process can take the port in between; a restart
keeps that port (as a restarted pod keeps its address)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from conftest import stop_process, wait_for

from federation.testing.harnesses.polling import serve_port
from tests.controller.harness import TOKEN


class ServeProcess:
    def __init__(
        self,
        *,
        spec: Path,
        data_dir: Path,
        log: Path,
        port: int | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.env = dict(env or {})
        self.spec, self.data_dir, self.log_path = spec, data_dir, log
        self.port = port or 0
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.url, timeout=5.0)
        self.client.close()  # opened in start(), once the port is known

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        args = [
            sys.executable,
            "-m",
            "federation.commands.cli",
            "serve",
            "--spec",
            str(self.spec),
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--log-level",
            "debug",
            *self.extra,
        ]
        env = {**os.environ, "GPUFED_TOKEN": TOKEN, **self.env}
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        if not self.port:
            self.port = serve_port(self.log_path, self.proc, since=start)
        if self.client.is_closed:
            self.client = httpx.Client(base_url=self.url, timeout=5.0)
        wait_for(self._healthy, timeout=60, what=f"gpufed serve on {self.port}")
        return self

    def _healthy(self) -> bool | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"gpufed serve exited: {self.log_path.read_text()[-2000:]}")
        try:
            return self.client.get("/healthz").status_code == 200 or None
        except httpx.HTTPError:
            return None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def rebalance(self, change: dict[str, Any]) -> dict[str, Any]:
        plan = self.client.post("/v1/plan", json=change, headers=self.auth())
        assert plan.status_code == 200, plan.text
        applied = self.client.post(
            "/v1/rebalance", json={"version": plan.json()["version"]}, headers=self.auth()
        )
        assert applied.status_code == 200, applied.text
        return dict(applied.json())

    def placement(self) -> dict[str, str]:
        out: dict[str, str] = {}
        while True:  # pages of at most 1000 (the API's cap)
            page = self.client.get(
                "/v1/targets", params={"limit": 1000, "offset": len(out)}, headers=self.auth()
            ).json()
            out.update({row["identity"]: row["shard"] for row in page["targets"]})
            if not page["targets"] or len(out) >= page["total"]:
                return out

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.client.close()
