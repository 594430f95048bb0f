"""The demo's plan and command lines: pure, checked against the models and renderers they feed."""

from __future__ import annotations

from itertools import count
from pathlib import Path

import pytest

from alertmanager import ha
from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from federation.demo import components, plan
from federation.master.render import master_flags, render_master_config
from federation.spec import GpufedSpec
from sharder.engine.assigning import assign
from sharder.model.loading import parse_model, parse_target


def ports() -> plan.Ports:
    return plan.Ports.allocate(count(30000).__next__)


def demo(layout: plan.Layout) -> GpufedSpec:
    doc = plan.demo_spec(plan.load_default_spec(), layout=layout, ports=ports(), master_data="/data/master")
    return parse_model(GpufedSpec, doc, source="demo")


def test_embedded_default_spec_is_valid_on_its_own() -> None:
    spec = parse_model(GpufedSpec, plan.load_default_spec(), source="default-spec.yaml")
    assert spec.children.target_discovery == "http_sd" and spec.children.agent_mode
    assert spec.alerting is not None and spec.master is not None


@pytest.mark.parametrize(
    ("nodes", "regions", "shards"),
    [(200, 3, {"region-0": 2, "region-1": 2, "region-2": 2}), (12, 3, {"region-0": 1, "region-1": 1,
                                                                         "region-2": 1}),
     (1000, 2, {"region-0": 13, "region-1": 13}), (5, 5, {f"region-{i}": 1 for i in range(5)})],
)
def test_shard_counts_follow_the_fleet(nodes: int, regions: int, shards: dict[str, int]) -> None:
    layout = plan.Layout(nodes=nodes, regions=regions)
    assert layout.shard_counts() == shards
    per_region = {name: sum(1 for n in fleet_nodes(nodes, regions=regions) if n.region == name)
                  for name in layout.region_names()}
    assert per_region == {name: layout.nodes_in(i) for i, name in enumerate(layout.region_names())}


def test_demo_spec_wires_every_port_and_routes_each_region_to_its_robot() -> None:
    layout = plan.Layout(nodes=200, regions=3, replication_factor=2)
    p = ports()
    doc = plan.demo_spec(plan.load_default_spec(), layout=layout, ports=p, master_data="/data/master")
    spec = parse_model(GpufedSpec, doc, source="demo")
    assert spec.sharding.replication_factor == 2
    assert spec.remote_write[0].url == f"http://127.0.0.1:{p.master}/api/v1/write"
    assert spec.children.http_sd_url == f"http://127.0.0.1:{p.controller}"
    assert spec.alerting is not None and spec.master is not None
    assert [(r.port, r.cluster_port) for r in spec.alerting.replicas] == list(p.alertmanagers)
    assert {r.region: r.robot for r in spec.alerting.routes} == {
        "region-0": "region-0-oncall", "region-1": "region-1-oncall", "region-2": "region-2-oncall"}
    assert all(robot.url.startswith(f"http://127.0.0.1:{p.sink}/robot/send?access_token=${{")
               for robot in spec.alerting.robots)
    assert spec.alerting.watchdog.receiver == "heartbeat"
    assert spec.master.port == p.master and spec.master.data_dir == "/data/master"
    # The default is never modified in place.
    assert plan.load_default_spec()["regions"] == [{"name": "region-0", "shards": 1}]


def test_fleet_entries_follow_the_exporter_registration_contract() -> None:
    layout = plan.Layout(nodes=7, gpus=4, regions=3)
    spec = demo(layout)
    jobs = {job.name: job for job in spec.jobs}
    entries = plan.fleet_entries(layout, port=9400)
    nodes = fleet_nodes(7, regions=3)
    assert [e["identity"] for e in entries] == [f"{n.name}:gpu" for n in nodes]
    assert [e["metrics_path"] for e in entries] == [f"/nodes/{n.name}/metrics" for n in nodes]
    targets = [parse_target(e, source="registry", jobs=jobs) for e in entries]
    assert [t.identity for t in targets] == [e["identity"] for e in entries]
    assert {t.instance for t in targets} == {"127.0.0.1:9400"}
    assert all(t.gpus == 4 and t.weight == 4 for t in targets)


def test_the_children_known_before_start_are_the_assignment_children() -> None:
    layout = plan.Layout(nodes=200, regions=3, replication_factor=2)
    spec = demo(layout)
    jobs = {job.name: job for job in spec.jobs}
    targets = [parse_target(e, source="registry", jobs=jobs) for e in plan.fleet_entries(layout, port=1)]
    assignment = assign(spec, targets)
    assert sorted(assignment.shards) == [f"region-{r}-{i}" for r in range(3) for i in range(2)]
    assert assignment.children("region-0-1") == [("region-0-1-r0", 0), ("region-0-1-r1", 1)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"nodes": 2, "regions": 3}, "--regions (3) cannot exceed --nodes (2)"),
     ({"gpus": 65}, "--gpus must be from 0 to 64"),
     ({"replication_factor": 4}, "--replication-factor must be 1, 2 or 3"),
     ({"nodes_per_child": 0}, "--nodes-per-child must be at least 1")],
)
def test_bad_layouts_name_the_flag(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan.Layout(**kwargs)


def test_rendered_flags_move_to_loopback_and_keep_everything_else() -> None:
    spec = demo(plan.Layout(nodes=12))
    assert spec.alerting is not None and spec.master is not None
    flags = ha.all_replica_flags(spec.alerting)["am-0"]
    moved = components.loopback(flags)
    assert [f for f in moved if "0.0.0.0" in f] == []
    assert len(moved) == len(flags)
    assert [f for f in moved if f.startswith("--cluster.peer=")] == [
        f for f in flags if f.startswith("--cluster.peer=")]
    master = components.master(binary="prometheus", config=Path("/c/prometheus.yml"),
                               flags=master_flags(spec)["flags"], port=spec.master.port)
    assert f"--web.listen-address=127.0.0.1:{spec.master.port}" in master.argv
    assert "--web.enable-remote-write-receiver" in master.argv
    # Links in alerts: one external URL per component, from the spec, not the host name.
    assert f"--web.external-url=http://127.0.0.1:{spec.master.port}" in master.argv
    am_port = spec.alerting.replicas[0].port
    for replica_flags in ha.all_replica_flags(spec.alerting).values():
        assert f"--web.external-url=http://127.0.0.1:{am_port}" in replica_flags


def test_the_token_travels_in_the_environment_never_on_the_command_line() -> None:
    launch = components.controller(
        spec=Path("/d/spec.yaml"), data_dir=Path("/d/controller"), port=8080, token="t" * 48,
        child_urls={"region-0-0": "http://127.0.0.1:1"}, child_url_template="http://127.0.0.1:2/{child}",
        consul=None,
    )
    assert launch.env == {"GPUFED_TOKEN": "t" * 48}
    assert not any("t" * 48 in arg for arg in launch.argv)
    assert "--child-url=region-0-0=http://127.0.0.1:1" in launch.argv
    assert "--child-url-template=http://127.0.0.1:2/{child}" in launch.argv


def test_fleet_registers_itself_with_the_controller_or_consul() -> None:
    layout = plan.Layout(nodes=12)
    plain = components.fleet(layout=layout, port=1, consul=None, register_url="http://c:1", token="t" * 48)
    assert "--register-url=http://c:1" in plain.argv
    assert plain.env == {"GPUFED_EXPORTER_REGISTER_TOKEN": "t" * 48}
    consul = components.fleet(layout=layout, port=1, consul="127.0.0.1:8500", register_url="http://c:1",
                              token="t" * 48)
    assert "--consul=127.0.0.1:8500" in consul.argv and consul.env == {}
    assert not any(a.startswith("--register-url") for a in consul.argv)


def test_fleet_entries_are_what_the_exporter_fleet_registers() -> None:
    """The demo predicts the first assignment from these; the exporter must register the same."""
    layout = plan.Layout(nodes=9, gpus=4, regions=3)
    settings = ExporterSettings(backend="simulated", gpus=4, listen="127.0.0.1:0", register_url="http://c:1")
    app = FleetApp(settings, fleet_nodes(9, regions=3))
    try:
        registered = [entry.body() for entry in app.targets("127.0.0.1")]
        assert registered == plan.fleet_entries(layout, port=app.http.port)
    finally:
        app.stop()


def test_the_demo_master_watches_every_component_on_its_loopback_port() -> None:
    p = ports()
    spec = demo(plan.Layout(nodes=12))
    jobs = {j["job_name"]: j for j in render_master_config(spec)["scrape_configs"]}
    targets = {name: j.get("static_configs", [{}])[0].get("targets") for name, j in jobs.items()}
    assert targets == {
        "alertmanager": [f"127.0.0.1:{web}" for web, _ in p.alertmanagers],
        "gpufed-child": None,
        "gpufed-controller": [f"127.0.0.1:{p.controller}"],
        "gpufed-dingtalk": [f"127.0.0.1:{p.relay}"],
        "gpufed-master": [f"127.0.0.1:{p.master}"],
    }
    assert jobs["gpufed-child"]["http_sd_configs"][0]["url"] == f"http://127.0.0.1:{p.controller}/v1/sd-children"
    assert spec.master is not None
    assert spec.master.monitoring.child_url == f"http://127.0.0.1:{p.router}/{{child}}"


def test_what_the_demo_leaves_out_is_named() -> None:
    spec = demo(plan.Layout(nodes=12))
    def first_words(consul: bool) -> list[str]:
        return [item.split(" ")[0] for item in plan.left_out(spec, consul=consul)]

    assert first_words(False) == ["Grafana", "Thanos", "Consul"]
    assert first_words(True) == ["Grafana", "Thanos"]


def test_with_tls_every_hop_says_https_but_the_dingtalk_stand_in() -> None:
    run = ports()
    doc = plan.demo_spec(plan.load_default_spec(), layout=plan.Layout(nodes=6), ports=run,
                         master_data="/data/master", tls=Path("/run/demo/tls"))
    spec = parse_model(GpufedSpec, doc, source="demo --tls")  # the spec's own https checks pass
    assert spec.tls is not None and spec.tls.serve is not None
    assert spec.tls.serve.client_auth_type == "RequireAndVerifyClientCert"
    assert (spec.tls.ca_file, spec.tls.cert_file) == ("/run/demo/tls/ca.crt", "/run/demo/tls/client.crt")
    assert doc["remote_write"][0]["url"].startswith("https://")
    assert doc["children"]["http_sd_url"].startswith("https://")
    assert doc["alerting"]["relay_url"].startswith("https://")
    assert doc["master"]["monitoring"]["child_url"] == f"https://127.0.0.1:{run.router}/{{child}}"
    assert all(r["url"].startswith(f"http://127.0.0.1:{run.sink}/") for r in doc["alerting"]["robots"])
    plain = plan.demo_spec(plan.load_default_spec(), layout=plan.Layout(nodes=6), ports=run,
                           master_data="/data/master")
    assert "tls" not in plain and plain["children"]["http_sd_url"].startswith("http://")


def test_with_tls_every_server_serves_the_web_config_and_every_client_the_client_file() -> None:
    tls = plan.TlsFiles(certs=Path("/d/tls"), web_config=Path("/d/config/tls/web-config.yml"),
                        http_config=Path("/d/config/tls/http-client.yml"),
                        cluster_config=Path("/d/config/tls/cluster-tls.yml"))
    web = f"--web.config.file={tls.web_config}"
    controller = components.controller(spec=Path("/d/spec.yaml"), data_dir=Path("/d/c"), port=1, token="t",
                                       child_urls={"region-0-0": "https://127.0.0.1:2"},
                                       child_url_template="https://127.0.0.1:3/{child}", consul=None, tls=tls)
    assert web in controller.argv and f"--http.config.file={tls.http_config}" in controller.argv
    fleet = components.fleet(layout=plan.Layout(nodes=6), port=4, consul=None,
                             register_url="https://127.0.0.1:1", token="t", tls=tls)
    assert web in fleet.argv and f"--register-http-config-file={tls.http_config}" in fleet.argv
    others = [
        components.relay(config=Path("/d/relay.yml"), port=5, credentials={}, data_dir=Path("/d/r"), tls=tls),
        components.alertmanager(binary="am", name="am-0", flags=[], config=Path("/d/am.yml"),
                                storage=Path("/d/a"), port=6, tls=tls),
        components.master(binary="prometheus", config=Path("/d/m.yml"), flags=[], port=7, tls=tls),
        components.child(binary="prometheus", name="region-0-0", config=Path("/d/c.yml"), wal=Path("/d/w"),
                         port=8, agent_flag="--agent", tls=tls),
    ]
    for launch in (controller, fleet, *others):
        assert launch.ready_url is not None and launch.ready_url.startswith("https://127.0.0.1:"), launch.name
        assert launch.argv.count(web) == 1, launch.name
    gossip = [launch.name for launch in (controller, fleet, *others)
              if f"--cluster.tls-config={tls.cluster_config}" in launch.argv]
    assert gossip == ["alertmanager-0"]
