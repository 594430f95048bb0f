"""The rendered compose files, run for real: ``monitoring.yml`` and 20 copies of ``compose/node.yml``.

No container runtime works here, so ``federation.testing.harnesses.composerun`` starts what
Compose v2 itself resolved (``docker-compose config --format json``) as processes, each in
its own network namespace on one bridge and its own mount namespace with the volumes at
their container paths. One shared run (module fixture): every node's ``gpu`` and ``node``
target up at the master, the rendered rule pack loaded, the simulated fleet's XID through
the rendered Alertmanagers and relay to the DingTalk stand-in, the relay killed with SIGKILL
and started again on its memory volume (a late older state of that XID then answered
``stale``, nothing sent), a child killed likewise and started again by its restart policy,
and nothing of the run left afterwards.

Needs root (``ip netns``, ``unshare``), as CI runs; skipped otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from deploy_tools import runner_marks

from federation.testing.benches import compose as bench
from federation.testing.benches import compose_relay
from federation.testing.harnesses.composerun import images
from federation.testing.harnesses.composerun.plan import BASE_PATH
from federation.testing.harnesses.composerun.run import ComposeRun

NODES = 20
STEP_TIMEOUT_S = 240.0

pytestmark = runner_marks("compose")


@dataclass
class Stack:
    run: ComposeRun
    out: Path
    said: list[str]
    killed: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    where = tmp_path_factory.mktemp("compose-run")
    out = bench.render(ROOT / "compose" / "federation.yaml", where / "render")
    env, nodes = bench.env_files(out, ROOT / "compose" / "federation.yaml", nodes=NODES, where=where)
    said: list[str] = []
    run = ComposeRun(
        monitoring=out / "compose" / "monitoring.yml",
        monitoring_env=env,
        node_file=ROOT / "compose" / "node.yml",
        node_env_example=ROOT / "compose" / "node.env.example",
        nodes=nodes,
        workdir=where / "run",
        say=said.append,
        xid_codes=bench.critical_xid_codes(out),
    )
    with run:
        yield Stack(run, out, said)


def test_every_node_has_its_gpu_and_node_target_up_at_the_master(stack: Stack) -> None:
    got = bench.wait(
        lambda: (lambda t: t if not t["missing"] else None)(bench.targets_up(stack.run)),
        timeout=STEP_TIMEOUT_S,
        what="every node's targets up at the master",
    )
    assert got["targets_expected"] == 2 * NODES == got["targets_up_at_master"]
    # the second master gets the same from every child's remote_write
    other = bench.targets_up(stack.run, "master-prometheus-1")
    assert other["missing"] == [], other


def test_every_healthcheck_passes_as_compose_runs_it_inside_the_service(stack: Stack) -> None:
    health = bench.wait(
        lambda: (lambda h: h if set(h.values()) == {"healthy"} else None)(stack.run.health()),
        timeout=STEP_TIMEOUT_S,
        what="every healthcheck healthy",
    )
    # the controller's and the relay's (python), Prometheus' and node-exporter's (wget), per node too
    assert set(health) == {p.display for p in stack.run.planned.values() if p.process and p.healthcheck}
    assert len(health) >= len([p for p in stack.run.planned.values() if p.kind == "real"])


def test_a_killed_child_is_started_again_by_its_restart_policy(stack: Stack) -> None:
    child = bench.quiet_child(stack.run)
    assert stack.run.planned[child].service.restart == "unless-stopped"
    stack.killed = bench.kill_child(stack.run, child, timeout=STEP_TIMEOUT_S)
    assert stack.killed["exit_code"] == -9
    assert stack.killed["new_pid"] != stack.killed["old_pid"]
    assert stack.killed["child_targets"], "the killed child scraped nothing"


def test_the_rendered_rule_pack_is_loaded_by_the_master(stack: Stack) -> None:
    rules = bench.rules_loaded(stack.run, stack.out)
    assert rules["rule_groups_rendered"] > 0 and rules["missing_groups"] == [], rules


def test_the_simulated_xid_reaches_dingtalk_through_the_rendered_alertmanagers_and_relay(
    stack: Stack,
) -> None:
    node = stack.run.xid["node"]
    delivered = bench.wait(
        lambda: [
            m
            for m in bench.alerts_delivered(stack.run)
            if "GPUXidError" in json.dumps(m, ensure_ascii=False)
            and node in json.dumps(m, ensure_ascii=False)
        ],
        timeout=STEP_TIMEOUT_S,
        what="GPUXidError at the DingTalk stand-in",
    )
    assert delivered
    # the alert went through the Alertmanager set as rendered (alertmanager-1:9093 as written)
    status, body = stack.run.http_get(
        "alertmanager-1", 9093, "/api/v2/alerts?filter=alertname%3D%22GPUXidError%22"
    )
    assert status == 200 and any(a["labels"].get("node") == node for a in json.loads(body))


def test_a_restarted_relay_loads_its_memory_and_sends_no_older_state(stack: Stack) -> None:
    """The memory survives a restart on the rendered volume, so a late FIRING of an earlier
    episode (an Alertmanager replica that missed the newer state) is not sent again."""
    replayed = compose_relay.restart_and_replay(
        stack.run, alertname="GPUXidError", node=stack.run.xid["node"], timeout=STEP_TIMEOUT_S)
    assert replayed["exit_code"] == -9 and replayed["new_pid"] != replayed["old_pid"]
    assert replayed["memory_file"].endswith("_relay-data/relay-memory.json")
    assert replayed["memory_file_kept"]
    # the first start found no file; the restart loaded the states the relay had sent
    assert replayed["loaded_states"][0] == 0 and replayed["loaded_states"][-1] >= 1, replayed
    assert replayed["replay_status"] == 200
    assert replayed["replay_answer"]["status"] == "stale", replayed["replay_answer"]
    assert replayed["stale_dropped_delta"] == 1


def test_the_restarted_child_scrapes_its_targets_again(stack: Stack) -> None:
    if not stack.killed:
        pytest.skip("the kill test did not run")
    again = bench.scraped_again(stack.run, stack.killed, timeout=STEP_TIMEOUT_S)
    assert again["child_targets_up_again"] == len(stack.killed["child_targets"])


def test_services_run_as_compose_resolved_them_but_for_the_declared_overrides(stack: Stack) -> None:
    summary = stack.run.summary()
    real = set(summary["services_real"])
    assert {"gpufed-controller", "gpufed-dingtalk", "master-prometheus-0", "alertmanager-0"} <= real
    assert f"node.yml/gpufed-exporter x{NODES}" in real and f"node.yml/node-exporter x{NODES}" in real
    assert any(name.startswith("thanos-") for name in summary["services_left_out"])
    assert "loki" in summary["services_standin"]  # the push stand-in at loki:3100
    print("\n".join(stack.run.describe()))  # the closing note's list (pytest -s)
    for planned in stack.run.planned.values():
        if planned.kind != "real":
            continue
        service = planned.service
        assert planned.argv[len(planned.argv) - len(service.command or ()) :] == list(service.command or ())
        declared = {k for o in images.overrides_for(service.image, service.command) for k in o.environment}
        resolved = {k: v for k, v in service.environment.items() if v is not None}
        env = {k: v for k, v in planned.env.items() if k not in declared | {"PATH", "HOME", "HOSTNAME"}}
        assert env == resolved, planned.display
        assert planned.env["PATH"].endswith(BASE_PATH)
    exporter = next(p for p in stack.run.planned.values() if p.display.endswith("/gpufed-exporter"))
    assert exporter.env["GPUFED_EXPORTER_BACKEND"] == "simulated"


def test_down_leaves_no_namespace_bridge_or_process(stack: Stack) -> None:
    pids = [pid for p in stack.run.planned.values() if p.process for pid in p.process.state.pids]
    assert pids
    errors = stack.run.down()
    assert errors == []
    assert stack.run.network.existing() == []
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert alive == []
    # the veths were made inside the run's namespaces and die with them; the host never had one
    assert not [link.name for link in Path("/sys/class/net").iterdir() if link.name.startswith("gfr")]
