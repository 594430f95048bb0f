"""A real ``gpufed-dingtalk --data-dir`` process killed (SIGKILL) and started again remembers.

The relay answers a notification only after its memory file is written, so even a crash
right after the answer keeps it: the restarted process drops an HA copy it answered before
the crash and a late FIRING of an episode it already showed resolved, and still sends the
next episode.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import stop_process, wait_for

from alertmanager.dingtalk import memory
from federation.localrun.dingtalk import LocalDingTalk
from federation.localrun.loopback import free_port

from .payloads import alert, webhook
from .test_dingtalk_sighup import relay_script

TOKEN, SECRET = "tok-restart-1", "SECrestart-secret-0123"
CONFIG = ("robots:\n  bj:\n    url: {base}/robot/send?access_token=${{RESTART_TOKEN}}\n"
          "    secret: ${{RESTART_SECRET}}\n")


def state(status: str, starts: str, ends: str = "0001-01-01T00:00:00Z") -> dict[str, Any]:
    return webhook([{**alert(1, status=status), "startsAt": starts, "endsAt": ends}])


@pytest.fixture
def api() -> Iterator[LocalDingTalk]:
    with LocalDingTalk() as server:
        server.add_robot(TOKEN, secret=SECRET)
        yield server


def run_relay(config: Path, data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [relay_script(), "--config", str(config), "--listen", f"127.0.0.1:{port}",
               "--data-dir", str(data_dir)]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "RESTART_TOKEN": TOKEN, "RESTART_SECRET": SECRET})
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(log.read_text(errors="replace"))
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout=20, what="relay /readyz")
    return proc, url


def post(url: str, body: dict[str, Any]) -> str:
    response = httpx.post(f"{url}/dingtalk/bj/send", json=body, timeout=15)
    assert response.status_code == 200, response.text
    return str(response.json()["status"])


def test_a_killed_relay_remembers_copies_and_order(api: LocalDingTalk, tmp_path: Path) -> None:
    config, data_dir, log = tmp_path / "dingtalk.yml", tmp_path / "data", tmp_path / "relay.log"
    config.write_text(CONFIG.format(base=api.base_url), encoding="utf-8")
    fired = state("firing", "2024-05-01T10:00:00Z")
    proc, url = run_relay(config, data_dir, log)
    try:
        assert post(url, fired) == "sent"
        assert post(url, state("resolved", "2024-05-01T10:00:00Z", "2024-05-01T10:05:00Z")) == "sent"
        proc.kill()  # a crash: no shutdown hook runs
        proc.wait(timeout=10)
        assert memory.memory_path(data_dir).exists()
        proc, url = run_relay(config, data_dir, log)
        assert post(url, fired) == "duplicate"  # the other replica's copy, inside the window
        # The same episode stamped a moment later by a replica (not a copy byte for byte):
        # older than the RESOLVED DingTalk already shows.
        assert post(url, state("firing", "2024-05-01T10:00:00.004Z")) == "stale"
        assert post(url, state("firing", "2024-05-01T10:07:00Z")) == "sent"  # the next episode
    finally:
        stop_process(proc)
    titles = [m.title.split("]")[0] + "]" for m in api.messages(TOKEN)]
    assert titles == ["[FIRING:1]", "[RESOLVED:1]", "[FIRING:1]"]
