"""Every query of the training-jobs and distributed-training dashboards, on a real Prometheus.

Prometheus 2.42 scrapes ``training_series.SeriesServer`` (kube-state-metrics, DCGM with
pod attribution, NVLink, training-operator and ElasticQuota series) every second and
loads the rule pack's ``gpu.yml``, so per-job panels read the same records as in
production. Every query must return series, for ``$namespace`` = all and = ``training``,
and the headline panels must return the values the series imply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import ROOT, require_tool, wait_for
from prom_process import PrometheusProcess
from training_series import NS, SeriesServer

from federation.dashboards import DASHBOARDS_DIR

pytestmark = pytest.mark.e2e

UIDS = ("gpufed-training", "gpufed-distributed")
VARIABLE_REF = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
BUILTINS = {"__rate_interval": "5s"}  # Grafana: at least 4 scrape intervals (1s here)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    root = tmp_path_factory.mktemp("training")
    with SeriesServer() as series, httpx.Client(timeout=5.0) as client:
        (root / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ROOT / "federation" / "rules" / "gpu.yml")],
            "scrape_configs": [{"job_name": "cluster", "static_configs": [
                {"targets": [f"127.0.0.1:{series.port}"]}]}],
        }))
        with PrometheusProcess(require_tool("prometheus"), config=root / "prometheus.yml", data=root / "data",
                               log=root / "prom.log", client=client) as proc:
            proc.wait_ready()
            yield proc


def targets() -> list[tuple[str, str, str, str]]:
    out = []
    for uid in UIDS:
        model = json.loads((DASHBOARDS_DIR / f"{uid}.json").read_text(encoding="utf-8"))
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                out.append((uid, panel["title"], target["refId"], target["expr"]))
    return out


def substitute(expr: str, namespace: str, **jobs: str) -> str:
    """The training dashboard's ACK filters (job_namespace, job_type, job_name) and the
    distributed dashboard's namespace; a filter not given is at "all"."""
    values = {**BUILTINS, "namespace": namespace, "job_namespace": namespace, "job_type": ".*",
              "job_name": ".*", **jobs}
    return VARIABLE_REF.sub(lambda m: values[m.group(1) or m.group(2)], expr)


def results(prom: PrometheusProcess, namespace: str) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    return {(uid, title, ref): prom.query(substitute(expr, namespace)) for uid, title, ref, expr in targets()}


@pytest.mark.parametrize("namespace", [".*", NS])
def test_every_query_returns_series(prom: PrometheusProcess, namespace: str) -> None:
    def ready() -> dict[tuple[str, str, str], list[dict[str, Any]]] | None:
        found = results(prom, namespace)
        return found if all(found.values()) else None

    try:
        found = wait_for(ready, timeout=30, what="every panel query to return series")
    except AssertionError:
        empty = [key for key, value in results(prom, namespace).items() if not value]
        raise AssertionError(f"no series for {empty}") from None
    print(json.dumps({"namespace": namespace, "queries": len(found)}))


def value(prom: PrometheusProcess, uid: str, title: str, ref: str = "A", **jobs: str) -> dict[str, float]:
    (expr,) = [e for u, t, r, e in targets() if (u, t, r) == (uid, title, ref)]
    out = {}
    for sample in prom.query(substitute(expr, ".*", **jobs)):
        key = ",".join(f"{k}={v}" for k, v in sorted(sample["metric"].items()))
        out[key] = round(float(sample["value"][1]), 3)
    return out


def test_panels_show_what_the_series_imply(prom: PrometheusProcess) -> None:
    wait_for(lambda: value(prom, "gpufed-distributed", "Straggler GPUs") or None, timeout=30, what="rules")
    t, d = "gpufed-training", "gpufed-distributed"
    assert value(prom, t, "Running jobs") == {"": 3}  # llama-ft, eval-nightly, nb-share
    assert value(prom, t, "Pending jobs") == {"": 1}  # bert-pt
    assert value(prom, t, "Succeeded jobs") == {"": 1} and value(prom, t, "Failed jobs") == {"": 1}
    gpus = value(prom, t, "Job table", "C")
    assert gpus == {f"namespace={NS},owner_kind=PyTorchJob,owner_name=llama-ft,status=Running": 8,
                    f"namespace={NS},owner_kind=PyTorchJob,owner_name=bert-pt,status=Pending": 4,
                    f"namespace={NS},owner_kind=Job,owner_name=eval-nightly,status=Running": 1,
                    f"namespace={NS},owner_kind=Job,owner_name=broken,status=Failed": 1}
    allocated = value(prom, t, "Allocated vs allocatable GPUs per node")
    assert allocated == {"node=gpu-node-1": 8, "node=gpu-node-2": 1}  # bert-pt has no node yet
    assert value(prom, t, "Allocated vs allocatable GPUs per node", "B") == {"node=gpu-node-1": 8,
                                                                             "node=gpu-node-2": 8}
    assert value(prom, t, "ElasticQuota min, max and used", "B")[
        f"name=training,namespace={NS},resource=nvidia.com/gpu"] == 24
    assert len(value(prom, t, "ResourceQuota used vs hard", "B")) == 5
    util = value(prom, d, "GPU utilisation per job")
    assert util[f"namespace={NS},owner_kind=PyTorchJob,owner_name=llama-ft"] == round((7 * 95 + 30) / 8, 3)
    slowest = value(prom, d, "Slowest GPU vs job median")
    assert slowest[f"namespace={NS},owner_kind=PyTorchJob,owner_name=llama-ft"] == round(30 / 95, 3)
    assert slowest[f"namespace={NS},owner_kind=Job,owner_name=eval-nightly"] == 1
    (straggler,) = value(prom, d, "Straggler GPUs")
    assert "gpu=6" in straggler and "node=gpu-node-1" in straggler
    assert list(value(prom, d, "NVLinks down per job").values()) == [1]
    job = f"namespace={NS},owner_kind=PyTorchJob,owner_name=llama-ft"
    # 8 GPUs x 4 links x 2 GB/s: DCGM_FI_PROF_NVLINK_TX_BYTES is already a rate per GPU.
    assert value(prom, d, "NVLink throughput per job")[job] == pytest.approx(64e9, rel=0.01)
    # GPU 5's 4 links x 1 CRC error/s, once the 5s rate window holds its samples
    wait_for(lambda: value(prom, d, "NVLink errors per job").get(job) == pytest.approx(4, rel=0.25) or None,
             timeout=20, what="NVLink CRC error rate of llama-ft")
    flit, data, replay, recovery = (value(prom, d, "NVLink errors per job", ref) for ref in "ABCD")
    assert list(flit) == list(data) == list(replay) == [job]  # only GPU 5 of llama-ft has errors
    assert 3 < flit[job] < 5 and 3 < data[job] < 5  # 4 links x 1/s
    assert 0 < replay[job] < 4  # 4 links x 0.5/s (whole counts)
    assert recovery.get(job, 1.0) < 2  # 4 links x 0.25/s


def test_job_table_status_memory_and_ack_filters(prom: PrometheusProcess) -> None:
    """Every job gets one status; allocated memory is ACK's gpu-mem request (GiB) where the job
    asks for shared GPUs, else the framebuffer of the GPUs its pods hold."""
    t = "gpufed-training"
    wait_for(lambda: value(prom, t, "Job table", "D") or None, timeout=30, what="records")
    statuses = {key.split("owner_name=")[1] for key in value(prom, t, "Job table", "E")}
    assert statuses == {"llama-ft,status=Running", "bert-pt,status=Pending", "eval-nightly,status=Running",
                        "data-prep,status=Succeeded", "broken,status=Failed", "nb-share,status=Running"}
    memory = {key.split("owner_name=")[1]: v for key, v in value(prom, t, "Job table", "D").items()}
    framebuffer = (60000 + 21559) * 2**20  # MiB used + free per H100 in the series
    assert memory == {"llama-ft,status=Running": 8 * framebuffer, "eval-nightly,status=Running": framebuffer,
                      "nb-share,status=Running": 12 * 2**30}
    # the three filters narrow the table: one job by name, PyTorchJobs by type
    only = value(prom, t, "Job table", "C", job_name="llama-ft")
    assert list(only) == [f"namespace={NS},owner_kind=PyTorchJob,owner_name=llama-ft,status=Running"]
    by_type = value(prom, t, "Job table", "C", job_type="PyTorchJob")
    assert {k.split("owner_name=")[1] for k in by_type} == {"llama-ft,status=Running",
                                                             "bert-pt,status=Pending"}
    assert value(prom, t, "Job table", "C", job_namespace="other") == {}


def test_job_filters_offer_the_jobs(prom: PrometheusProcess) -> None:
    """Each filter's own query (Grafana's label_values, chained on the filters before it)."""
    model = json.loads((DASHBOARDS_DIR / "gpufed-training.json").read_text(encoding="utf-8"))
    variables = {v["name"]: v["definition"] for v in model["templating"]["list"] if v["type"] == "query"}
    assert list(variables) == ["job_namespace", "job_type", "job_name"]

    def offered(name: str, **chosen: str) -> set[str]:
        selector, label = variables[name][len("label_values("):-1].rsplit(",", 1)
        found = prom.query(f"group by ({label.strip()}) ({substitute(selector.strip(), '.*', **chosen)})")
        return {s["metric"][label.strip()] for s in found}

    wait_for(lambda: offered("job_namespace") or None, timeout=30, what="kube_pod_owner")
    assert offered("job_namespace") == {NS}
    assert offered("job_type", job_namespace=NS) == {"PyTorchJob", "Job", "Notebook"}
    assert offered("job_name", job_namespace=NS, job_type="PyTorchJob") == {"llama-ft", "bert-pt"}


def test_gpu_node_table(prom: PrometheusProcess) -> None:
    """Name, IP, role, status and GPU mode per GPU node (a node without GPUs is not listed)."""
    t = "gpufed-training"
    wait_for(lambda: len(value(prom, t, "GPU nodes", "E")) == 3 or None, timeout=30, what="node records")

    def row(node: str, ip: str, mode: str, status: str) -> str:
        return f"gpu_mode={mode},internal_ip={ip},node={node},role=worker,status={status}"

    one = row("gpu-node-1", "10.0.1.11", "exclusive", "Ready")
    two = row("gpu-node-2", "10.0.1.12", "exclusive", "Ready")
    three = row("gpu-node-3", "10.0.1.13", "shared", "NotReady")
    assert value(prom, t, "GPU nodes", "A") == {one: 8, two: 8, three: 4}
    assert value(prom, t, "GPU nodes", "B") == {one: 8, two: 1}  # bert-pt has no node; broken failed
    assert value(prom, t, "GPU nodes", "C") == {three: 12 * 2**30}
    used = 60000 * 2**20  # MiB per held GPU in the series
    assert value(prom, t, "GPU nodes", "D") == {one: 8 * used, two: used, three: used}
    assert value(prom, t, "GPU nodes", "E") == {one: round((7 * 95 + 30) / 8, 3), two: 47.5, three: 95}


def test_cluster_gpus_allocated_comes_from_requests(prom: PrometheusProcess) -> None:
    """The cluster page's count reads kube-state-metrics requests of bound Running/Pending pods
    (llama-ft 8 + eval-nightly 1), not pod attribution (which also holds nb-share's GPU: 10)."""
    model = json.loads((DASHBOARDS_DIR / "gpufed-cluster.json").read_text(encoding="utf-8"))
    (panel,) = [p for p in model["panels"] if p["title"] == "GPUs allocated"]
    expr = panel["targets"][0]["expr"].replace("$region", ".*")
    attributed = 'count(group by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{pod!=""}))'  # no SD node label here
    wait_for(lambda: prom.query(attributed) or None, timeout=30, what="DCGM series")
    assert float(prom.query(attributed)[0]["value"][1]) == 10
    assert float(prom.query(expr)[0]["value"][1]) == 9


def test_dashboards_files_exist() -> None:
    assert all((DASHBOARDS_DIR / f"{uid}.json").is_file() for uid in UIDS)
    assert Path(__file__).with_name("training_series.py").is_file()
