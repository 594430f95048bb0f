"""Regions on clusters whose Nodes lack ``topology.kubernetes.io/region`` (kubeadm, bare
metal) or carry a provider's value (ACK ``cn-hangzhou``) the spec does not name: the
``--k8s-*`` region flags, and the skipped endpoints ``/v1/status`` lists (issue #39)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import typer
import yaml

from federation.commands import serve
from federation.spec import load_gpufed_spec
from federation.testing.standins.kube import FakeKubeAPI
from sharder.live.merging import MergedSources
from sharder.sources.kubernetes import SKIPPED_LIMIT, KubernetesConfig, KubernetesSource
from tests.sharder.sources.helpers import RecordingSink
from tests.sharder.sources.k8s_objects import endpoint, endpoint_slice, node


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as fake:
        yield fake


def source_for(api: FakeKubeAPI, sink: Any, *, regions: tuple[str, ...] = ("r1",),
               **kw: Any) -> KubernetesSource:
    configuration = kubernetes.client.Configuration()
    configuration.host = api.url
    client = kubernetes.client.ApiClient(configuration)
    config = KubernetesConfig(watch_timeout_s=1, **kw)
    return KubernetesSource(config, sink=sink, api_client=client, regions=regions)


def bare(name: str) -> dict[str, Any]:
    """A kubeadm Node: hostname label only."""
    doc = node(name)
    doc["metadata"]["labels"] = {"kubernetes.io/hostname": name}
    return doc


def test_nodes_without_a_region_label_are_listed_with_what_to_set(api: FakeKubeAPI) -> None:
    api.apply("nodes", bare("gpu-0"))
    api.apply("nodes", node("gpu-1", region="cn-hangzhou"))
    api.apply("endpointslices", endpoint_slice("exp", [endpoint("10.0.0.1", "gpu-0"),
                                                       endpoint("10.0.0.2", "gpu-1")]))
    sink = RecordingSink()
    source = source_for(api, sink)
    assert source.sync()
    assert sink.changes[-1][1] == [t for t in sink.changes[-1][1] if t.node == "gpu-1"]
    reasons = {row["node"]: (row["reason"], row["detail"]) for row in source.skipped}
    assert reasons["gpu-0"][0] == "no_region" and "--k8s-default-region" in reasons["gpu-0"][1]
    assert reasons["gpu-1"][0] == "unknown_region" and "'cn-hangzhou'" in reasons["gpu-1"][1]
    assert source.skipped_total == 2


def test_default_region_and_region_map_place_every_node(api: FakeKubeAPI) -> None:
    api.apply("nodes", bare("gpu-0"))
    api.apply("nodes", node("gpu-1", region="cn-hangzhou"))
    api.apply("endpointslices", endpoint_slice("exp", [endpoint("10.0.0.1", "gpu-0"),
                                                       endpoint("10.0.0.2", "gpu-1")]))
    sink = RecordingSink()
    source = source_for(api, sink, regions=("r1", "r2"), default_region="r1",
                        region_map=(("cn-hangzhou", "r2"),))
    assert source.sync()
    assert sorted((t.node, t.region) for t in sink.changes[-1][1]) == [("gpu-0", "r1"), ("gpu-1", "r2")]
    assert source.skipped == () and source.skipped_total == 0


def test_node_pool_label_as_the_region_label(api: FakeKubeAPI) -> None:
    doc = bare("gpu-0")
    doc["metadata"]["labels"]["cloud.google.com/gke-nodepool"] = "a100-pool"
    api.apply("nodes", doc)
    api.apply("endpointslices", endpoint_slice("exp", [endpoint("10.0.0.1", "gpu-0")]))
    sink = RecordingSink()
    source = source_for(api, sink, region_label="cloud.google.com/gke-nodepool",
                        region_map=(("a100-pool", "r1"),))
    assert source.sync()
    assert [(t.node, t.region) for t in sink.changes[-1][1]] == [("gpu-0", "r1")]


def test_the_skipped_list_is_bounded(api: FakeKubeAPI) -> None:
    count = SKIPPED_LIMIT + 7
    for i in range(count):
        api.apply("nodes", bare(f"gpu-{i:03d}"))
    endpoints = [endpoint(f"10.0.0.{i + 1}", f"gpu-{i:03d}") for i in range(count)]
    api.apply("endpointslices", endpoint_slice("exp", endpoints))
    source = source_for(api, RecordingSink())
    assert source.sync()
    assert len(source.skipped) == SKIPPED_LIMIT and source.skipped_total == count
    assert source.skipped[0]["node"] == "gpu-000"


def test_an_empty_first_answer_is_an_answer() -> None:
    """"No targets yet" must reach the loop: the first assignment (children with empty
    target lists, the master's config) is published without waiting for a target."""
    merged = MergedSources(jobs={}, precedence=(), grace_s=0, observer=None)
    changed = merged.replace("kubernetes", {}, index=merged.new_index(), version="1", applied={}, now=0.0)
    assert changed == set() and merged.sets == {"kubernetes": {}}
    again = merged.replace("kubernetes", {}, index=merged.new_index(), version="2", applied={}, now=1.0)
    assert again is None


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump({"cluster": "c", "regions": [{"name": "hz"}, {"name": "bj"}],
                                    "jobs": [{"name": "gpu"}]}))
    return path


def test_region_flags_are_checked_against_the_spec(spec_file: Path) -> None:
    flags = serve.RegionFlags(spec=load_gpufed_spec(spec_file))
    assert flags.mapping(["cn-hangzhou=hz", "cn-beijing=bj"]) == (("cn-beijing", "bj"), ("cn-hangzhou", "hz"))
    with pytest.raises(typer.BadParameter, match="'sh' is not in the spec's regions"):
        flags.mapping(["cn-shanghai=sh"])
    with pytest.raises(typer.BadParameter, match="VALUE=REGION"):
        flags.mapping(["cn-hangzhou"])
    with pytest.raises(typer.BadParameter, match="'nowhere'"):
        flags.known("nowhere", flag="--k8s-default-region")
