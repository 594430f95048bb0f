"""The Consul source over real HTTP: py-consul against the in-process agent (a stand-in)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from conftest import wait_for
from prometheus_client import CollectorRegistry

from exporter.consul_registry import ConsulAgentRegistry
from exporter.registration import service_definition
from federation.testing.standins.consul.agent import FakeConsulAgent
from sharder.engine.assigning import assign
from sharder.live.reconcile import Reconciler
from sharder.sources.base import Backoff
from sharder.sources.consul import (
    ConsulConfig,
    ConsulSource,
    make_client,
    meta_labels,
    split_address,
    target_document,
)
from sharder.sources.discovery_metrics import DiscoveryMetrics
from tests.sharder.sources.helpers import FakeClock, RecordingSink, make_spec


@pytest.fixture
def agent() -> Iterator[FakeConsulAgent]:
    with FakeConsulAgent() as fake:
        yield fake


def exporter_service(i: int, *, region: str = "r1", gpus: int = 8):  # type: ignore[no-untyped-def]
    """What the real gpufed-exporter registers for one node."""
    return service_definition(
        "gpufed-exporter", f"node-{i}", address=f"10.1.{i // 250}.{i % 250 + 1}", port=9400,
        meta={"region": region, "rack": f"rack-{i % 4}", "team": "llm", "cluster": "c",
              "gpu_count": gpus, "gpu_model": "H100", "metrics_path": "/metrics", "node": f"node-{i}"},
    )


def source_for(agent: FakeConsulAgent, sink: object, **kw: object) -> ConsulSource:
    config = ConsulConfig(address=agent.address, wait=kw.pop("wait", "200ms"), min_interval_s=0, **kw)  # type: ignore[arg-type]
    return ConsulSource(config, sink=sink)  # type: ignore[arg-type]


def test_exporter_registration_becomes_a_target_in_the_assignment(agent: FakeConsulAgent) -> None:
    clock = FakeClock()
    rec = Reconciler(spec=make_spec(), clock=clock)
    registry = ConsulAgentRegistry(agent.address)
    service = exporter_service(7)
    registry.register(service)
    source = source_for(agent, rec)
    assert source.poll_once()
    clock.advance(1)
    assert rec.tick() is None or rec.targets == []  # the new check is still critical
    agent.set_status(service.service_id, "passing")
    assert source.poll_once()
    clock.advance(1)
    assignment = rec.tick()
    assert assignment is not None
    (target,) = rec.targets
    assert (target.address, target.port, target.node, target.region) == ("10.1.0.8", 9400, "node-7", "r1")
    assert (target.rack, target.team, target.gpus, target.metrics_path) == ("rack-3", "llm", 8, "/metrics")
    assert assignment.targets == {"10.1.0.8:9400": "r1-0"}


def test_deregistration_and_failing_check_remove_after_grace(agent: FakeConsulAgent) -> None:
    clock = FakeClock()
    rec = Reconciler(spec=make_spec(), clock=clock, grace_s=120)
    registry = ConsulAgentRegistry(agent.address)
    services = [exporter_service(i) for i in range(3)]
    for service in services:
        registry.register(service)
        agent.set_status(service.service_id, "passing")
    source = source_for(agent, rec)
    source.poll_once()
    clock.advance(1)
    rec.tick()
    assert len(rec.targets) == 3
    registry.deregister(services[0].service_id)
    agent.set_status(services[1].service_id, "critical")
    source.poll_once()
    source.poll_once()
    clock.advance(60)
    assert rec.tick() is None and len(rec.targets) == 3  # within the grace period
    clock.advance(61)
    assert rec.tick() is not None
    assert [t.node for t in rec.targets] == ["node-2"]


def test_registry_down_keeps_targets_staleness_rises_and_recovers(agent: FakeConsulAgent) -> None:
    clock = FakeClock()
    wall = FakeClock(1_700_000_000)
    metrics = DiscoveryMetrics(registry=CollectorRegistry(), wall_clock=wall)
    rec = Reconciler(spec=make_spec(), clock=clock, observer=metrics)
    for i in range(5):
        agent.register_local({"Name": "gpufed-exporter", "ID": f"s{i}", "Address": f"10.0.0.{i + 1}",
                              "Port": 9400, "Meta": {"region": "r1", "node": f"n{i}"},
                              "Check": {"TTL": "30s", "Status": "passing"}})
    source = source_for(agent, rec)
    source.poll_once()
    clock.advance(1)
    before = rec.tick()
    assert before is not None and len(rec.targets) == 5
    agent.kill()
    for _ in range(30):  # 30 s of failed polls
        assert not source.poll_once()
        clock.advance(1)
        wall.advance(1)
        assert rec.tick() is None
    assert rec.assignment == before and len(rec.targets) == 5
    assert metrics.staleness("consul") == 30
    assert metrics.errors.labels(source="consul", reason="unreachable")._value.get() == 30
    agent.revive()
    assert source.poll_once()
    assert metrics.staleness("consul") == 0
    clock.advance(1)
    assert rec.tick() is None and rec.assignment == before  # same set: nothing to do


def test_index_rules_reset_backwards_floor_one_and_never_spin(agent: FakeConsulAgent) -> None:
    sink = RecordingSink()
    clock = FakeClock()
    slept: list[float] = []
    config = ConsulConfig(address=agent.address, wait="100ms", min_interval_s=0.25)
    source = ConsulSource(config, sink=sink, clock=clock)
    watch = source.watches[0]
    for i in range(3):
        agent.register_local({"Name": "gpufed-exporter", "ID": f"s{i}", "Port": 9400 + i})
    source.poll_once(sleep=slept.append)
    assert watch.index == agent.index and slept == []
    source.poll_once(sleep=slept.append)  # index unchanged: the wait elapsed
    assert slept == [0.25]  # rate-limited, not spinning
    agent.set_index(1)  # e.g. a snapshot restore on the servers
    clock.advance(1)
    source.poll_once(sleep=slept.append)
    assert watch.index == 0  # went backwards: reset
    agent.inject(200, "[]", {"X-Consul-Index": "0"})
    clock.advance(1)
    source.poll_once(sleep=slept.append)
    assert "index=" not in agent.requests[-1][1]
    assert watch.index == 1  # an answer of 0 becomes 1: blocking on 0 would be a busy loop
    clock.advance(1)
    source.poll_once(sleep=slept.append)
    assert "index=1" in agent.requests[-1][1] and watch.index == agent.index == 1


def test_malformed_answers_are_skipped_target_by_target(agent: FakeConsulAgent) -> None:
    sink = RecordingSink()
    source = source_for(agent, sink)
    good = {"Node": {"Node": "n", "Address": "10.0.0.1", "Datacenter": "dc1", "Meta": {}, "ModifyIndex": 1},
            "Service": {"ID": "ok", "Service": "gpufed-exporter", "Address": "10.0.0.1", "Port": 9400,
                        "Tags": [], "Meta": {"region": "r1", "node": "n1"}, "ModifyIndex": 5},
            "Checks": [{"Status": "passing"}]}

    def variant(sid: str, **service: object) -> dict[str, object]:
        return {**good, "Service": {**good["Service"], "ID": sid, **service}}  # type: ignore[dict-item]

    answer = [
        good,
        variant("port0", Port=0),
        variant("port70000", Port=70000),
        variant("noport", Port=None),
        variant("notahost", Address="not a host!"),
        variant("url", Address="http://10.0.0.7/"),
        variant("noregion", Meta={"node": "x"}),
        variant("badgpus", Meta={"region": "r1", "node": "x", "gpu_count": "eight"}),
        {"Node": good["Node"], "Checks": []},  # no Service at all
        "garbage",
    ]
    agent.inject(200, json.dumps(answer), {"X-Consul-Index": "10"})
    assert source.poll_once()
    (_, targets, _) = sink.changes[-1]
    assert [t.address for t in targets] == ["10.0.0.1"]
    assert sink.errors.count(("consul", "invalid_target")) == len(answer) - 1

    for body, headers, reason in (
        ("{not json", {"X-Consul-Index": "11"}, "invalid_json"),
        ("[]", {}, "missing_index"),
        ('{"an": "object"}', {"X-Consul-Index": "12"}, "invalid_answer"),
        ("rpc error", {"X-Consul-Index": "12"}, "server_error"),
    ):
        agent.inject(500 if reason == "server_error" else 200, body, headers)
        assert not source.poll_once()
        assert sink.errors[-1] == ("consul", reason)
    assert len(sink.changes) == 1  # the good set was never replaced by a bad answer


def test_acl_token_from_env_and_address_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeConsulAgent(acl_token="s3cret") as agent:
        agent.register_local({"Name": "gpufed-exporter", "ID": "a", "Address": "10.0.0.1", "Port": 9400,
                              "Meta": {"region": "r1", "node": "a"},
                              "Check": {"TTL": "9s", "Status": "passing"}})
        sink = RecordingSink()
        denied = ConsulSource(ConsulConfig(address=agent.address, min_interval_s=0), sink=sink)
        assert not denied.poll_once() and sink.errors[-1] == ("consul", "acl_denied")
        monkeypatch.setenv("CONSUL_HTTP_ADDR", f"http://{agent.address}")
        monkeypatch.setenv("CONSUL_HTTP_TOKEN", "s3cret")
        allowed = ConsulSource(ConsulConfig(min_interval_s=0), sink=sink)
        assert allowed.poll_once() and [t.node for t in sink.changes[-1][1]] == ["a"]


def test_warning_counts_as_up_only_when_configured(agent: FakeConsulAgent) -> None:
    agent.register_local({"Name": "gpufed-exporter", "ID": "w", "Address": "10.0.0.9", "Port": 9400,
                          "Meta": {"region": "r1", "node": "w"}, "Check": {"TTL": "9s", "Status": "warning"}})
    strict, lenient = RecordingSink(), RecordingSink()
    source_for(agent, strict).poll_once()
    source_for(agent, lenient, allow_warning=True).poll_once()
    assert strict.changes[-1][1] == [] and [t.node for t in lenient.changes[-1][1]] == ["w"]


def test_thousand_registrations_in_bursts_equal_a_fresh_sticky_assignment(agent: FakeConsulAgent) -> None:
    clock = FakeClock()
    spec = make_spec()
    rec = Reconciler(spec=spec, clock=clock)
    registry = ConsulAgentRegistry(agent.address)
    source = source_for(agent, rec)
    for burst in range(10):
        for i in range(burst * 100, (burst + 1) * 100):
            service = exporter_service(i, region=("r1", "r2")[i % 2], gpus=(4, 8)[i % 3 == 0])
            registry.register(service)
            agent.set_status(service.service_id, "passing")
        assert source.poll_once()
        clock.advance(0.05)  # ten bursts within one debounce window
        assert rec.tick() is None
    clock.advance(1)
    assert rec.tick() is not None and rec.assignments == 1
    assert len(rec.targets) == 1000
    fresh = assign(spec, rec.targets, shard_counts={"r1": 50, "r2": 50})
    assert rec.assignment == fresh


def test_mapping_names_follow_consul_sd_labels() -> None:
    entry = {"Node": {"Node": "host-1", "Address": "10.0.0.5", "Meta": {"rack": "nr"}},
             "Service": {"ID": "x", "Service": "svc", "Address": "", "Port": 9100, "Tags": ["a", "b"],
                         "Meta": {"region": "r2", "metrics_path": "/nodes/host-1/metrics"}},
             "Checks": [{"Status": "passing"}, {"Status": "warning"}]}
    labels = meta_labels(entry, dc="dc9")
    assert labels["__meta_consul_tags"] == ",a,b," and labels["__meta_consul_health"] == "warning"
    assert labels["__meta_consul_dc"] == "dc9" and labels["__meta_consul_metadata_rack"] == "nr"
    doc = target_document(labels, ConsulConfig().mapping)
    assert doc == {"address": "10.0.0.5", "port": "9100", "job": "gpu", "node": "host-1", "region": "r2",
                   "rack": "nr", "metrics_path": "/nodes/host-1/metrics",
                   "identity": "10.0.0.5:9100/nodes/host-1/metrics"}
    assert split_address("https://[::1]:8501") == ("https", "::1", 8501)
    assert split_address("consul.service") == ("http", "consul.service", 8500)


def test_follow_loop_recovers_by_itself_after_the_agent_comes_back(agent: FakeConsulAgent) -> None:
    agent.register_local({"Name": "gpufed-exporter", "ID": "a", "Address": "10.0.0.1", "Port": 9400,
                          "Meta": {"region": "r1", "node": "a"}, "Check": {"TTL": "9s", "Status": "passing"}})
    sink = RecordingSink()
    config = ConsulConfig(address=agent.address, wait="200ms", min_interval_s=0.01, timeout_s=1)
    source = ConsulSource(config, sink=sink, backoff=lambda: Backoff(initial=0.02, maximum=0.1))
    stop = threading.Event()
    thread = threading.Thread(target=source.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: sink.changes, timeout=5, what="first answer")
        agent.kill()
        wait_for(lambda: sink.errors.count(("consul", "unreachable")) >= 3, timeout=5, what="failures")
        pushes = len(sink.changes)
        agent.revive()
        agent.register_local({"Name": "gpufed-exporter", "ID": "b", "Address": "10.0.0.2", "Port": 9400,
                              "Meta": {"region": "r1", "node": "b"},
                              "Check": {"TTL": "9s", "Status": "passing"}})
        wait_for(lambda: len(sink.changes) > pushes and len(sink.changes[-1][1]) == 2, timeout=5,
                 what="recovery")
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_backoff_grows_with_jitter_and_resets() -> None:
    backoff = Backoff(initial=1, maximum=8, jitter=0.5, rand=lambda: 1.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    backoff.reset()
    assert Backoff(initial=1, jitter=0.5, rand=lambda: 0.0).next() == 1.0 and backoff.next() == 0.5


def test_tls_and_token_settings_reach_the_client(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "from-env")
    config = ConsulConfig(address="consul.internal:8501", token="from-flag", ca_file="/etc/ca.pem",
                          cert_file="/etc/client.pem", key_file="/etc/client-key.pem")
    client = make_client(config)
    assert client.http.base_uri == "https://consul.internal:8501"
    assert client.http.verify == "/etc/ca.pem"
    assert client.http.cert == ("/etc/client.pem", "/etc/client-key.pem")
    assert client.token == "from-flag"  # an explicit token wins over CONSUL_HTTP_TOKEN
    assert make_client(ConsulConfig(address="10.0.0.1")).token == "from-env"


def test_each_datacenter_is_its_own_source_so_one_outage_keeps_its_set(agent: FakeConsulAgent) -> None:
    agent.register_local({"Name": "gpufed-exporter", "ID": "a", "Address": "10.0.0.1", "Port": 9400,
                          "Meta": {"region": "r1", "node": "a"}, "Check": {"TTL": "9s", "Status": "passing"}})
    sink = RecordingSink()
    config = ConsulConfig(address=agent.address, wait="100ms", min_interval_s=0, datacenters=("dc1", "dc2"))
    source = ConsulSource(config, sink=sink)
    local, remote = source.watches
    assert source.poll_once(local) and not source.poll_once(remote)  # the fake knows only dc1
    assert [(name, len(ts)) for name, ts, _ in sink.changes] == [("consul/gpufed-exporter@dc1", 1)]
    assert sink.errors == [("consul/gpufed-exporter@dc2", "server_error")]


def test_answered_once_every_datacenter_answered_or_failed(agent: FakeConsulAgent) -> None:
    """``answered`` (what a settling controller waits for): each (service, datacenter) has
    ended one query; one the agent refuses counts, so an outage never holds readiness."""
    sink = RecordingSink()
    config = ConsulConfig(address=agent.address, wait="100ms", min_interval_s=0, datacenters=("dc1", "dc2"))
    source = ConsulSource(config, sink=sink)
    local, remote = source.watches
    assert source.answered is False
    assert source.poll_once(local) and source.answered is False
    assert not source.poll_once(remote)  # the fake knows only dc1
    assert source.answered and sink.errors == [("consul/gpufed-exporter@dc2", "server_error")]
