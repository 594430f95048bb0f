"""Each child's heartbeat (``sharder.children.render.heartbeat_config``): the child scrapes itself
where the master's meta-monitoring finds it, and its remote_write sends that scrape's
``up`` renamed ``gpufed_child_heartbeat``; the freshness rules read it for the shard record.

That the renamed series, and nothing else of the job, reaches a real master is checked live in
``tests/e2e/test_federation_e2e.py``; that the scrape succeeds over mTLS where the master's does,
in the compose and Helm runs (``tests/deploy``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import stack_tool

from federation.spec import GpufedSpec
from sharder.children.render import HEARTBEAT_METRIC, HEARTBEAT_WRITE_RELABEL, render_children
from sharder.engine.assigning import assign
from sharder.kernel.errors import SpecError
from sharder.kernel.output import dump_yaml
from sharder.model.loading import parse_model
from sharder.model.spec import HEARTBEAT_JOB
from tests.controller.harness import fleet, spec_document


def spec_of(**extra: Any) -> GpufedSpec:
    doc = spec_document(regions={"r1": 2, "r2": 1}, replication_factor=2)
    doc["jobs"][1]["scrape_interval"] = "30s"  # gpu 15s, node 30s
    doc["remote_write"] = [{"name": "master", "url": "http://master:9090/api/v1/write"}]
    doc.update(extra)
    return parse_model(GpufedSpec, doc, source="test")


def configs(spec: GpufedSpec) -> dict[str, dict[str, Any]]:
    targets = fleet(6, region="r1") + fleet(3, region="r2", start=100)
    assignment = assign(spec, targets)
    return {child.child: child.prometheus for child in render_children(spec, targets, assignment)}


def heartbeat_job(config: dict[str, Any]) -> dict[str, Any] | None:
    return next((job for job in config["scrape_configs"] if job["job_name"] == HEARTBEAT_JOB), None)


def test_every_child_scrapes_itself_at_its_master_address_at_the_shortest_interval() -> None:
    spec = spec_of(master={"monitoring": {"child_url": "http://prom-{region}-{ordinal}.kids:9091"}})
    rendered = configs(spec)
    assert len(rendered) == 6  # 3 shards x 2 replicas
    ordinals: dict[str, set[str]] = {}
    for child, config in rendered.items():
        job = heartbeat_job(config)
        assert job is not None, child
        region = config["global"]["external_labels"]["region"]
        (target,) = job["static_configs"][0]["targets"]
        assert target.startswith(f"prom-{region}-") and target.endswith(".kids:9091")
        ordinals.setdefault(region, set()).add(target)
        assert (job["scrape_interval"], job["scheme"], job["metrics_path"]) == ("15s", "http", "/metrics")
        # Nothing it scrapes is kept: only the report series, whose `up` the write renames.
        assert job["metric_relabel_configs"] == [
            {"action": "drop", "source_labels": ["__name__"], "regex": ".+"}]
        for write in config["remote_write"]:
            assert write["write_relabel_configs"] == HEARTBEAT_WRITE_RELABEL
    # The master's ordinals: shard index x replication factor + replica, one address per child.
    assert ordinals == {"r1": {f"prom-r1-{i}.kids:9091" for i in range(4)}, "r2": {"prom-r2-0.kids:9091",
                                                                                   "prom-r2-1.kids:9091"}}


def test_a_child_behind_a_proxy_scrapes_itself_through_it() -> None:
    spec = spec_of(master={"monitoring": {"child_url": "http://127.0.0.1:7000/{child}"}})
    for child, config in configs(spec).items():
        job = heartbeat_job(config)
        assert job is not None
        assert job["static_configs"][0]["targets"] == ["127.0.0.1:7000"]
        assert job["metrics_path"] == f"/{child}/metrics"


def test_no_remote_write_no_heartbeat() -> None:
    """Nothing would carry it: the child's samples never reach a master."""
    spec = spec_of(remote_write=[{"name": "bj", "url": "http://bj:9090/api/v1/write", "regions": ["r1"]}])
    for config in configs(spec).values():
        region = config["global"]["external_labels"]["region"]
        assert (heartbeat_job(config) is not None) == (region == "r1")
        assert ("remote_write" in config) == (region == "r1")


def test_a_spec_job_may_not_take_the_heartbeat_name() -> None:
    doc = spec_document()
    doc["jobs"].append({"name": HEARTBEAT_JOB})
    with pytest.raises(SpecError, match=HEARTBEAT_JOB):
        parse_model(GpufedSpec, doc, source="test")


def test_write_relabel_renames_the_heartbeat_up_alone() -> None:
    """Prometheus' relabel semantics, replayed on the label sets the heartbeat job produces: the
    regexes are anchored, the source labels joined with ';'."""

    def relabel(labels: dict[str, str]) -> dict[str, str] | None:
        for rule in HEARTBEAT_WRITE_RELABEL:
            value = ";".join(labels.get(name, "") for name in rule["source_labels"])
            if re.fullmatch(rule["regex"], value):
                if rule.get("action") == "drop":
                    return None
                labels = {**labels, rule["target_label"]: rule["replacement"]}
        return labels

    beat = {"job": HEARTBEAT_JOB, "instance": "child-0:9090"}
    assert relabel({"__name__": "up", **beat}) == {"__name__": HEARTBEAT_METRIC, **beat}
    for name in ("scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added",
                 "scrape_samples_post_metric_relabeling"):  # sent as they are: nothing dropped
        assert relabel({"__name__": name, **beat}) == {"__name__": name, **beat}
    fleet_up = {"__name__": "up", "job": "gpu", "instance": "10.0.0.1:9400"}
    assert relabel(fleet_up) == fleet_up
    assert relabel({"__name__": "scrape_duration_seconds", "job": "gpu"}) is not None


@pytest.mark.parametrize("line", [2, 3])
def test_promtool_accepts_every_child_with_its_heartbeat(line: int, tmp_path: Path) -> None:
    spec = spec_of(prometheus={"version": "2.53" if line == 2 else "3.5"})
    for child, config in configs(spec).items():
        path = tmp_path / f"{child}.yml"
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run([stack_tool(line, "promtool"), "check", "config", "--syntax-only", str(path)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_two_writes_each_get_their_own_rules_no_yaml_alias() -> None:
    """Objects shared between two remote_writes would dump as ``&id001``/``*id001``."""
    spec = spec_of(remote_write=[{"name": "a", "url": "http://a:9090/api/v1/write"},
                                 {"name": "b", "url": "http://b:9090/api/v1/write"}])
    for config in configs(spec).values():
        text = dump_yaml(config).decode()
        assert "&id" not in text and text.count(HEARTBEAT_METRIC) == 2
