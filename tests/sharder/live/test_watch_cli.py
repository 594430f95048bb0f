"""``gpufed watch`` through typer's runner: a followed file and the Consul stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from typer.testing import CliRunner

from federation.commands import watch
from federation.testing.standins.consul.agent import FakeConsulAgent, exporter_service
from federation.watching import Watcher, render_view
from sharder.model.loading import load_spec
from sharder.sources.build import WatchOptions
from sharder.sources.consul import ConsulConfig

SPEC = """\
cluster: test
regions: [{name: region-0}, {name: region-1}]
sharding: {targets_per_shard: 2}
jobs: [{name: gpu}]
"""
INVENTORY = """\
defaults: {exporters: {gpu: 9400}}
nodes:
  - {name: n1, address: 10.0.0.1, region: region-0, gpus: 8}
  - {name: n2, address: 10.0.0.2, region: region-1, gpus: 4}
"""


def app() -> typer.Typer:
    cli = typer.Typer()
    watch.register(cli)
    cli.command("noop", hidden=True)(lambda: None)  # keeps "watch" a named subcommand
    return cli


def test_watch_file_prints_one_json_line_per_assignment(tmp_path: Path) -> None:
    (tmp_path / "federation.yaml").write_text(SPEC)
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    result = CliRunner().invoke(app(), [
        "watch", "--spec", str(tmp_path / "federation.yaml"), "--file", str(tmp_path / "inventory.yaml"),
        "--state", str(tmp_path / "state.json"), "--debounce", "0.1", "--duration", "1.5", "--json"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.splitlines()
    record = json.loads(line)
    assert record["targets"] == 2 and record["added"] == ["10.0.0.1:9400", "10.0.0.2:9400"]
    assert record["load"] == {"region-0-0": 8, "region-1-0": 4}
    assert json.loads((tmp_path / "state.json").read_text())["sources"]["file"]  # persisted


def test_watch_needs_a_source(tmp_path: Path) -> None:
    (tmp_path / "federation.yaml").write_text(SPEC)
    result = CliRunner().invoke(app(), ["watch", "--spec", str(tmp_path / "federation.yaml")])
    assert result.exit_code == 2 and "name at least one source" in result.output


def test_live_view_shows_shards_changes_and_registry_health(tmp_path: Path) -> None:
    (tmp_path / "federation.yaml").write_text(SPEC)
    with FakeConsulAgent() as agent:
        for i in range(6):
            agent.register_local(exporter_service(i))
        options = WatchOptions(consul=ConsulConfig(address=agent.address, wait="100ms"), debounce_s=0)
        watcher = Watcher(spec=load_spec(tmp_path / "federation.yaml"), options=options)
        (source,) = watcher.sources
        source.poll_once()
        watcher.reconciler.tick()
        console = Console(width=120, record=True)
        console.print(render_view(watcher))
        text = console.export_text()
    assert "region-0" in text and "region-1" in text and "consul" in text
    assert "+6 -0 moved 0" in text


def test_restart_during_an_outage_starts_from_the_persisted_set(tmp_path: Path) -> None:
    (tmp_path / "federation.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "federation.yaml")
    state = tmp_path / "state" / "last-known.json"
    with FakeConsulAgent() as agent:
        for i in range(8):
            agent.register_local(exporter_service(i))
        options = WatchOptions(consul=ConsulConfig(address=agent.address, wait="100ms", timeout_s=1),
                               state=state, debounce_s=0)
        first = Watcher(spec=spec, options=options)
        first.sources[0].poll_once()
        before = first.reconciler.tick()
        assert before is not None and len(before.targets) == 8
        agent.kill()  # the registry goes away, and so does gpufed
        second = Watcher(spec=spec, options=options)
        assert not second.sources[0].poll_once()  # still down
        after = second.reconciler.tick()
        assert after is not None and after.targets == before.targets
        agent.revive()
