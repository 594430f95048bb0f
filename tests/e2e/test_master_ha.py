"""One rendered config for an HA pair of masters: a real Prometheus expands the replica label.

The example spec has ``master.replicas: 2``, so ``master/prometheus.yml`` carries
``replica: ${GPUFED_MASTER_REPLICA}``; Prometheus 3.x expands it by default, 2.x only with
``--enable-feature=expand-external-labels``, which ``flags.json`` adds for a 2.x spec. Here
each line's real Prometheus (3.5.3, 2.53.3) runs the config rendered for it with the rendered
flags and the environment ``flags.json`` gives replica ``master-1``.
Its Alertmanagers and Thanos Receive are unreachable names, which Prometheus only logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import stack_tool
from prom_process import PrometheusProcess

from federation.master.render import FLAGS_FILE, MASTER_FILE, load_rule_pack, render_master_bundle
from federation.spec import load_gpufed_spec
from sharder.model.spec import PrometheusSpec

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("line", [3, 2])
def test_replica_label_comes_from_the_rendered_environment(
    line: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_gpufed_spec(ROOT / "examples" / "federation.yaml")
    spec = example.model_copy(update={"prometheus": PrometheusSpec(version="2.53" if line == 2 else "3")})
    bundle = render_master_bundle(spec, rule_pack=load_rule_pack())
    for rel, data in bundle.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    flags = json.loads(bundle[FLAGS_FILE])
    for name, value in flags["replicas"]["master-1"]["env"].items():
        monkeypatch.setenv(name, value)  # the child process inherits it, as a launcher would set it
    own = ("--storage.tsdb.path=", "--web.listen-address=")
    with (
        httpx.Client(timeout=2.0) as client,
        PrometheusProcess(
            stack_tool(line, "prometheus"),
            config=tmp_path / MASTER_FILE,
            data=tmp_path / "data",
            log=tmp_path / "master.log",
            client=client,
            extra_args=tuple(f for f in flags["flags"] if not f.startswith(own)),
        ) as master,
    ):
        master.wait_ready()
        loaded = yaml.safe_load(client.get(f"{master.url}/api/v1/status/config").json()["data"]["yaml"])
        assert loaded["global"]["external_labels"] == {"cluster": spec.cluster, "replica": "master-1"}
        groups = client.get(f"{master.url}/api/v1/rules").json()["data"]["groups"]
        assert {Path(g["file"]).name for g in groups} == set(load_rule_pack())
        assert [w["name"] for w in loaded["remote_write"]] == [
            *(f"thanos-{r}" for r in spec.region_names()),
            "thanos-cluster",
        ]
