"""The relay's memory across a restart, in the compose run (``federation.testing.benches.compose``).

The rendered ``gpufed-dingtalk`` service keeps its ordering/dedup memory under ``--data-dir``
on a named volume. These steps read that memory where the run keeps the volume, ``kill -9``
the relay so its restart policy starts it again, and then post it a late copy of an earlier
episode of an alert it already sent, as an Alertmanager replica that missed the newer state
would: a relay that loaded its memory answers ``stale`` and sends nothing; one that forgot
would send the older state to DingTalk.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from alertmanager.dingtalk import memory
from federation.testing.benches.compose import kill_service, wait
from federation.testing.harnesses.composerun.plan import ComposeRunError
from federation.testing.harnesses.composerun.run import ComposeRun

RELAY = "gpufed-dingtalk"
RELAY_PORT = 8060
LOADED = re.compile(r"relay memory loaded from (\S+): (\d+) alert state\(s\)")


def memory_file(run: ComposeRun) -> Path:
    """``relay-memory.json`` in the host folder of the volume mounted at the relay's ``--data-dir``."""
    service = run.planned[RELAY].service
    command = list(service.command or ())
    data_dir = command[command.index("--data-dir") + 1]
    volume = next((v for v in service.volumes if v.target == data_dir), None)
    if volume is None or volume.kind != "volume":
        raise ComposeRunError(f"{RELAY}: --data-dir {data_dir} is on no named volume")
    return run.volume_folder(service.project, volume.source) / memory.FILE_NAME


def remembered(run: ComposeRun, fingerprint: str) -> list[Any] | None:
    """The memory file's order row of ``fingerprint`` (robot, groupKey, ..., startsAt in us)."""
    path = memory_file(run)
    if not path.is_file():
        return None
    rows = json.loads(path.read_text())["order"]
    return next((row for row in rows if row[2] == fingerprint), None)


def alert_at_alertmanager(run: ComposeRun, alertname: str, node: str) -> dict[str, Any] | None:
    matchers = quote(f'alertname="{alertname}"')
    status, body = run.http_get("alertmanager-0", 9093, f"/api/v2/alerts?filter={matchers}")
    if status != 200:
        return None
    return next((a for a in json.loads(body) if a["labels"].get("node") == node), None)


def loaded_states(run: ComposeRun) -> list[int]:
    """``N alert state(s)`` of each "relay memory loaded" line in the relay's log, oldest first."""
    process = run.planned[RELAY].process
    if process is None:
        raise ComposeRunError(f"{RELAY} is not running here")
    return [int(m[2]) for m in LOADED.finditer(process.log.read_text(errors="replace"))]


def stale_dropped(run: ComposeRun, robot: str) -> float:
    status, body = run.http_get(RELAY, RELAY_PORT, "/metrics")
    if status != 200:
        raise ComposeRunError(f"{RELAY} /metrics answered {status}")
    found = re.search(rf'^gpufed_dingtalk_stale_dropped_total{{robot="{re.escape(robot)}"}} (\S+)$',
                      body.decode(), flags=re.M)
    return float(found[1]) if found else 0.0


def earlier_episode(row: list[Any], alert: dict[str, Any]) -> dict[str, Any]:
    """A FIRING of the same alert in the same group that began a minute before the remembered one."""
    started = datetime.fromtimestamp(row[4] / 1e6, UTC) - timedelta(minutes=1)
    return {
        "version": "4", "groupKey": row[1], "status": "firing", "receiver": row[0],
        "groupLabels": {}, "commonLabels": alert["labels"], "commonAnnotations": alert["annotations"],
        "alerts": [{"status": "firing", "labels": alert["labels"], "annotations": alert["annotations"],
                    "startsAt": started.isoformat(), "endsAt": "0001-01-01T00:00:00Z",
                    "fingerprint": row[2]}],
    }


def restart_and_replay(run: ComposeRun, *, alertname: str, node: str, timeout: float) -> dict[str, Any]:
    """Kill the relay once ``alertname`` on ``node`` is in its memory file, then post the older state."""
    alert = wait(lambda: alert_at_alertmanager(run, alertname, node), timeout=timeout,
                 what=f"{alertname} on {node} at alertmanager-0")
    row = wait(lambda: remembered(run, alert["fingerprint"]), timeout=timeout,
               what=f"{alertname} on {node} in the relay's memory file")
    robot = str(row[0])
    killed = kill_service(run, RELAY, timeout=timeout)
    wait(lambda: run.http_get(RELAY, RELAY_PORT, "/readyz")[0] == 200, timeout=timeout,
         what=f"{RELAY} ready after the restart", interval=0.5)
    before = stale_dropped(run, robot)
    status, body = run.http_request(
        RELAY, RELAY_PORT, f"/dingtalk/{quote(robot)}/send", method="POST",
        body=json.dumps(earlier_episode(row, alert)).encode(), headers={"Content-Type": "application/json"},
    )
    return {
        **killed,
        "robot": robot,
        "memory_file": str(memory_file(run)),
        "memory_file_kept": remembered(run, alert["fingerprint"]) is not None,
        "loaded_states": loaded_states(run),
        "replay_status": status,
        "replay_answer": json.loads(body),
        "stale_dropped_delta": stale_dropped(run, robot) - before,
    }
