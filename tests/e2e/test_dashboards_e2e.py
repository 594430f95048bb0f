"""Every PromQL expression of every dashboard panel, run against a real federation on loopback.

The stack (one per module, built by ``dashboard_stack.running_stack``):

* a simulated fleet (``FleetApp``: 4 nodes x 2 GPUs over two regions, opt-in families on);
* one more simulated node built from the exporter's own parts, with a test-side
  ``PodAttribution`` (GPUs 0-5 held by pods in two namespaces) and a backend whose driver
  reports XID 79 on GPU 0 and XID 13 on GPU 1, so health, XID and pod panels have data;
* one inventory target nobody listens on (an exporter that is down);
* HAMi-format series (``hami_series``: scheduler extender, vGPU monitor and the kube-scheduler
  in HAMi's scheduler pod) as job ``hami-scheduler``, so every HAMi panel has data;
* child Prometheus servers rendered by ``federation.master.pipeline`` (one shard per region, each
  an HA pair: replication factor 2),
  remote-writing to a master Prometheus 2.42 that loads the rule pack, scrapes the
  children as the ``gpufed-child`` meta-monitoring job, itself, an Alertmanager 0.25 and
  the DingTalk relay (``create_app``), which sends to the in-process DingTalk stand-in
  (one robot accepts, one rejects with errcode 310000).

Each query runs twice: with every template variable at the regex-all value ``.*``, and
with concrete values that the variables' own queries must offer. A query returns series
unless it is listed in ``PARSE_ONLY`` with the reason its source is not in this stack;
those must still be accepted by Prometheus (status success) and must return nothing, so
the list cannot hide a query that works.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import hami_series
import pytest
from conftest import wait_for
from dashboard_stack import (
    FAKE_LINK_DOWN,
    FAKE_LINKS,
    FAKE_NVML,
    FAKE_TX_KIB_S,
    GPUS_TOTAL,
    PODS,
    SPECIAL,
    Stack,
    running_stack,
)

from federation.dashboards import dashboard_files

pytestmark = pytest.mark.e2e

# Concrete values for the second run; each must be among the values its variable offers.
CHOICES = {"region": "region-0", "node": SPECIAL, "gpu": "0", "namespace": "training",
           "pod": "llm-pretrain-0", "shard": "region-0-0"}
GRAFANA_BUILTINS = {"__rate_interval": "30s", "__range": "5m", "__interval": "15s"}
VARIABLE_REF = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
CONVERGE_S = 40.0

CONTROLLER = "controller metric: the controller (gpufed serve) is built in parallel and not run here"
DISCOVERY = "discovery metric: gpufed discovery runs inside the controller, not run here"
KSM = "kube-state-metrics ResourceQuota metric: no Kubernetes API in this stack"
RELOAD = "the relay's reload counter has no series before the first SIGHUP reload; none happens here"
DROPPED = ("Prometheus 2.53 and 3.5.3 export samples_dropped_total only once a sample"
           " is dropped (checked against both binaries); a healthy stack drops none")
PARSE_ONLY: dict[tuple[str, str, str], str] = {
    ("gpufed-federation", "remote_write failures", "C"): DROPPED,
    ("gpufed-federation", "Targets per shard (controller)", "A"): CONTROLLER,
    ("gpufed-federation", "Hand-overs", "A"): CONTROLLER,
    ("gpufed-federation", "Hand-overs", "B"): CONTROLLER,
    ("gpufed-federation", "Time since last successful discovery", "A"): DISCOVERY,
    ("gpufed-federation", "Discovery errors", "A"): DISCOVERY,
    ("gpufed-federation", "Relay config reloads", "A"): RELOAD,
    ("gpufed-quota", "GPU quota used vs hard limit", "A"): KSM,
    ("gpufed-quota", "GPU quota used vs hard limit", "B"): KSM,
    ("gpufed-quota", "GPU quota used %", "A"): KSM,
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("dashboards")) as running:
        yield running


# Kubernetes-sourced dashboards, proven against their own series in test_training_dashboards_e2e.py.
PROVEN_ELSEWHERE = {"gpufed-training", "gpufed-distributed"}


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in dashboard_files()
            if path.stem not in PROVEN_ELSEWHERE}


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        value = values[name]
        # Grafana regex-escapes chosen values; ours need no escaping, so keep them plain.
        assert value == ".*" or re.fullmatch(r"[\w-]+", value), value
        return value

    return VARIABLE_REF.sub(one, expr)


@dataclass(frozen=True)
class Check:
    uid: str
    panel: str
    ref: str
    expr: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.uid, self.panel, self.ref)


def checks(values: dict[str, dict[str, str]]) -> list[Check]:
    out = []
    for uid, model in sorted(dashboards().items()):
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                expr = substitute(target["expr"], values[uid])
                out.append(Check(uid, panel["title"], target["refId"], expr))
    return out


def run_all(stack: Stack, all_checks: list[Check]) -> dict[tuple[str, str, str], int]:
    """Series count per query; every query must be accepted by Prometheus (status success)."""
    return {check.key: stack.count(check.expr, what=check.key) for check in all_checks}


def missing(counts: dict[tuple[str, str, str], int]) -> list[tuple[str, str, str]]:
    return sorted(key for key, n in counts.items() if n == 0 and key not in PARSE_ONLY)


def poll(stack: Stack, all_checks: list[Check]) -> dict[tuple[str, str, str], int]:
    """Run every query until all that should have data have it, or the deadline passes.

    Rates need two samples at the master and alerts must travel master -> Alertmanager ->
    relay -> DingTalk first; the caller's assertions name whatever is still empty.
    """
    counts: dict[tuple[str, str, str], int] = {}

    def converged() -> bool:
        counts.update(run_all(stack, all_checks))
        return not missing(counts)

    with contextlib.suppress(AssertionError):  # the caller's assertions name what is still empty
        wait_for(converged, timeout=CONVERGE_S, interval=1.0, what="every panel's series")
    return counts


def assert_expectations(all_checks: list[Check], counts: dict[tuple[str, str, str], int]) -> None:
    exprs = {check.key: check.expr for check in all_checks}
    empty = missing(counts)
    assert not empty, "no series for: " + "; ".join(f"{k} {exprs[k]}" for k in empty)
    assert set(PARSE_ONLY) <= set(counts), f"stale PARSE_ONLY keys: {sorted(set(PARSE_ONLY) - set(counts))}"
    now_working = sorted(key for key in PARSE_ONLY if counts[key])
    assert not now_working, f"these return series now; drop them from PARSE_ONLY: {now_working}"


def summary(label: str, counts: dict[tuple[str, str, str], int]) -> str:
    uids = {key[0] for key in counts}
    panels = {key[:2] for key in counts}
    with_series = sum(1 for n in counts.values() if n)
    return json.dumps({"run": label, "dashboards": len(uids), "panels": len(panels), "queries": len(counts),
                       "returned_series": with_series, "parse_only": len(PARSE_ONLY)}, sort_keys=True)


def test_every_panel_query_with_regex_all_values(stack: Stack) -> None:
    values = {uid: dict.fromkeys(variable_names(model), ".*") for uid, model in dashboards().items()}
    all_checks = checks(values)
    counts = poll(stack, all_checks)
    assert_expectations(all_checks, counts)
    print(summary("regex-all", counts))


def variable_names(model: dict[str, Any]) -> list[str]:
    return [v["name"] for v in model["templating"]["list"] if v["type"] == "query"]


def resolve(stack: Stack, variable: dict[str, Any], chosen: dict[str, str]) -> list[str]:
    """The values Grafana would offer for a query variable, given earlier choices."""
    definition = substitute(variable["definition"], chosen)
    if definition.startswith("label_values("):
        selector, label = definition[len("label_values("):-1].rsplit(",", 1)
        return stack.label_values(label.strip(), selector.strip())
    assert definition.startswith("query_result("), definition
    pattern = re.compile(variable["regex"].strip("/"))
    found = set()
    for series in stack.query(definition[len("query_result("):-1]):
        text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(series["metric"].items())) + "}"
        found.update(pattern.findall(text))
    return sorted(found)


def test_variables_offer_concrete_values_and_queries_return_series(stack: Stack) -> None:
    values: dict[str, dict[str, str]] = {}
    for uid, model in dashboards().items():
        chosen: dict[str, str] = {}
        for variable in model["templating"]["list"]:
            if variable["type"] != "query":
                continue
            offered = wait_for(lambda v=variable, c=dict(chosen): resolve(stack, v, c) or None,
                               timeout=CONVERGE_S, what=f"{uid} variable {variable['name']}")
            choice = CHOICES[variable["name"]]
            assert choice in offered, f"{uid}: ${variable['name']} offers {offered}, not {choice!r}"
            chosen[variable["name"]] = choice
        values[uid] = chosen
    all_checks = checks(values)
    counts = poll(stack, all_checks)
    assert_expectations(all_checks, counts)
    print(summary("concrete", counts))


def panel_expr(uid: str, title: str, values: dict[str, str]) -> str:
    panel = next(p for p in dashboards()[uid]["panels"] if p["title"] == title)
    (target,) = panel["targets"]
    return substitute(target["expr"], values)


def test_fleet_stats_count_each_gpu_once_across_ha_replicas(stack: Stack) -> None:
    """Every shard runs as an HA pair, so the master holds each series twice; the stats must not."""
    values = dict.fromkeys(["region", "node", "gpu", "namespace", "pod", "shard"], ".*")

    def value(title: str) -> float:
        (sample,) = stack.query(panel_expr("gpufed-cluster", title, values))
        return float(sample["value"][1])

    both = 'count({__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_GPU_UTIL_RATIO"})'  # 3.x and 4.x nodes
    raw = wait_for(lambda: int(stack.query(both)[0]["value"][1]) == 2 * GPUS_TOTAL
                   or None, timeout=CONVERGE_S, what="both replicas of every GPU series at the master")
    assert raw
    assert value("GPUs") == GPUS_TOTAL
    # 4 fleet nodes, the attributed node, the fake-NVML node, the node that is down
    assert value("GPU nodes") == 7
    assert value("GPUs allocated") == len(PODS)
    assert value("GPU exporters down") == 1
    assert value("Unhealthy GPUs") >= 1  # XID 79 on GPU 0; a simulated XID may add one
    assert value("Unhealthy GPU nodes") >= 2  # the node that is down and the attributed node
    per_child = {(s["metric"]["shard"], s["metric"]["replica"]): s["value"][1] for s in
                 stack.query(panel_expr("gpufed-federation", "Targets scraped per child", values))}
    # region-0: 2 fleet nodes, the attributed node, the node that is down, the attributed
    # node's node-exporter (job node) and the HAMi series (job hami-scheduler)
    assert per_child == {("region-0-0", "0"): "6", ("region-0-0", "1"): "6",
                         ("region-1-0", "0"): "3", ("region-1-0", "1"): "3"}  # 2 fleet nodes, fake NVML


def test_parse_only_queries_name_real_panels() -> None:
    keys = {(uid, panel["title"], target["refId"]) for uid, model in dashboards().items()
            for panel in model["panels"] for target in panel.get("targets", [])}
    assert set(PARSE_ONLY) <= keys
    assert all(reason.strip() for reason in PARSE_ONLY.values())


def test_hami_panels_read_v2_10_names_and_count_legacy_copies_once(stack: Stack) -> None:
    """HAMi v2.10 names on every HAMi series, legacy copies of one container, GPU and quota
    (``hami_series.LEGACY_TOO``): each panel's sums match the v2.10 series alone."""
    values = dict.fromkeys(["region", "node", "gpu", "namespace", "pod", "shard"], ".*")
    gib = hami_series.GIB

    def by(uid: str, title: str, label: str, ref: int = 0) -> dict[str, float]:
        panel = next(p for p in dashboards()[uid]["panels"] if p["title"] == title)
        return {s["metric"][label]: float(s["value"][1])
                for s in stack.query(substitute(panel["targets"][ref]["expr"], values))}

    want = {"training": 80.0 * gib, "inference": 40.0 * gib}  # 40 GiB per container's GPU
    got = wait_for(lambda: (lambda g: g if g == want else None)(
        by("gpufed-quota", "vGPU allocated per namespace", "namespace")),
        timeout=CONVERGE_S, what="HAMi allocation per namespace, legacy copy counted once")
    assert got == want
    assert by("gpufed-quota", "HAMi quota used (limit in the limit column)", "namespace") == {
        ns: float(v) for ns, v in hami_series.QUOTA_USED.items()}
    # three GPUs at 40 of 80 GiB on HAMi's node (exported_node: the target carries node too)
    per_node = "GPU memory allocated vs limit per node"
    assert by("gpufed-quota", per_node, "node") == {hami_series.NODE: 120.0 * gib}
    assert by("gpufed-quota", per_node, "node", 1) == {hami_series.NODE: 240.0 * gib}
    assert by("gpufed-quota", "Containers sharing a GPU", "device_index") == {"0": 2.0, "1": 1.0, "4": 1.0}
    used = by("gpufed-workloads", "vGPU memory used vs limit", "pod")
    assert used == {"llm-pretrain-0": 60.0 * gib, "chat-api-0": 30.0 * gib}  # 30 GiB per vGPU


def test_hami_scheduler_latency_and_node_nvlink_panels_read_their_sources(stack: Stack) -> None:
    """p99 per step from the HAMi-format histogram (every observation in one bucket: linear
    interpolation inside it), and NVLink throughput and links up from the attributed node's
    simulated NVML links (18 per H100, all families on)."""
    values = dict.fromkeys(["region", "node", "gpu", "namespace", "pod", "shard"], ".*")
    model = dashboards()["gpufed-quota"]
    panel = next(p for p in model["panels"] if p["title"] == "HAMi scheduler latency (Filter, Score, Bind)")

    def p99() -> dict[str, float]:
        out = {}
        for target in panel["targets"]:
            for sample in stack.query(substitute(target["expr"], values)):
                out[sample["metric"]["extension_point"]] = float(sample["value"][1])
        return out

    found = wait_for(lambda: (lambda got: got if len(got) == 3 else None)(p99()), timeout=CONVERGE_S,
                     what="HAMi scheduler p99 per step")
    # Filter 1.5 ms in (0.8, 1.6] ms, Score 0.4 ms in (0.2, 0.4], Bind 12 ms in (6.4, 12.8]
    assert found == pytest.approx({"Filter": 0.0008 + 0.99 * 0.0008, "Score": 0.0002 + 0.99 * 0.0002,
                                   "Bind": 0.0064 + 0.99 * 0.0064}, rel=1e-6)
    node = {**values, "node": SPECIAL}
    node_model = dashboards()["gpufed-node"]
    links = next(p for p in node_model["panels"] if p["title"] == "NVLinks up per GPU")
    per_gpu = {s["metric"]["gpu"]: float(s["value"][1])
               for s in stack.query(substitute(links["targets"][0]["expr"], node))}
    assert sorted(per_gpu, key=int) == [str(g) for g in range(8)]
    assert all(n in (17, 18) for n in per_gpu.values()) and sum(per_gpu.values()) >= 8 * 18 - 1
    throughput = next(p for p in node_model["panels"] if p["title"] == "NVLink throughput")

    def per_gpu_values(ref: int) -> dict[str, float]:
        return {s["metric"]["gpu"]: float(s["value"][1])
                for s in stack.query(substitute(throughput["targets"][ref]["expr"], node))}

    tx, rx = per_gpu_values(0), per_gpu_values(1)
    assert len(tx) == 8 and all(v > 0 for v in tx.values()) and rx.keys() == tx.keys()
    # The counter's rate (KiB/s x 1024) is TX + RX once the series fill the 30s rate window
    # (before that, rate() divides a few seconds' increase by the whole window).
    def matches() -> dict[str, float] | None:
        counter = per_gpu_values(2)
        return counter if counter.keys() == tx.keys() and all(
            counter[g] == pytest.approx(tx[g] + rx[g], rel=0.02) for g in tx) else None

    assert wait_for(matches, timeout=CONVERGE_S + 30, what="NVLink counter rate = TX + RX")


def test_node_nvlink_panels_on_the_fake_nvml_node(stack: Stack) -> None:
    """The NVML backend over the suite's fake NVML: 4 links per GPU, GPU 0's link 2 down; each
    link's counters grow (link + 1) x FAKE_TX_KIB_S KiB/s TX and half that RX."""
    values = {**dict.fromkeys(["region", "gpu", "namespace", "pod", "shard"], ".*"), "node": FAKE_NVML}
    model = dashboards()["gpufed-node"]
    panel = {p["title"]: p for p in model["panels"]}

    def per_gpu(title: str, ref: int = 0) -> dict[str, float]:
        expr = substitute(panel[title]["targets"][ref]["expr"], values)
        return {s["metric"]["gpu"]: float(s["value"][1]) for s in stack.query(expr)}

    links = wait_for(lambda: per_gpu("NVLinks up per GPU") or None, timeout=CONVERGE_S,
                     what="fake NVML links")
    assert links == {"0": FAKE_LINKS - 1, "1": FAKE_LINKS}
    assert FAKE_LINK_DOWN < FAKE_LINKS
    # all-links TX: sum over links of (link + 1) x FAKE_TX_KIB_S KiB/s, between two collections
    tx_all = sum(link + 1 for link in range(FAKE_LINKS)) * FAKE_TX_KIB_S * 1024

    def steady() -> dict[str, float] | None:
        tx, rx, counter = per_gpu("NVLink throughput", 0), per_gpu("NVLink throughput", 1), per_gpu(
            "NVLink throughput", 2)
        ok = (set(tx) == set(rx) == set(counter) == {"0", "1"}
              and all(tx[g] == pytest.approx(tx_all, rel=0.1) for g in tx)
              and all(counter[g] == pytest.approx(tx[g] + rx[g], rel=0.1) for g in tx))
        return tx if ok else None

    assert wait_for(steady, timeout=CONVERGE_S + 30,
                    what="fake NVML throughput: TX and TX + RX from the counter")
