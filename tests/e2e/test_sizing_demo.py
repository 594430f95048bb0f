"""gpufed size against reality (issue 40): the demo at 60 and 200 nodes, each child's and the
master's RSS as the OS reports it (``federation.localrun.procstat``) next to the model's prediction
for the same spec and fleet. Off by more than 1.5x either way fails. About 40-50 s a size.

The model's memory is its request (the predicted steady RSS, rounded up to 64 MiB), so the
comparison uses the unrounded prediction. The model's master runs the rule pack (the cost bench
measures it with the pack); the demo's master also holds its own meta-monitoring, which the
model does not count.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import require_tool, wait_for

from federation.demo.plan import Layout
from federation.demo.stack import DemoOptions, DemoStack
from federation.sizing.costs import load_costs
from federation.sizing.model import Fleet, size

TOLERANCE = 1.5


def _predicted(stack: DemoStack, nodes: int) -> dict[str, float]:
    assert stack.spec is not None
    costs = load_costs()
    sizing = size(stack.spec, Fleet(nodes=nodes, gpus=stack.layout.gpus), costs)
    cost = costs[str(stack.spec.prometheus.release().major)]
    child, master = sizing.components[0], sizing.components[1]
    child_cost = cost.child_agent if stack.spec.children.agent_mode else cost.server
    return {
        "child": child_cost.rss_mib(series=child.series, samples_per_s=child.samples_per_s),
        "master": cost.server.rss_mib(series=master.series, samples_per_s=master.samples_per_s),
        "series_per_node": sizing.series_per_node,
    }


@pytest.mark.parametrize("nodes", [60, 200])
def test_demo_rss_is_within_the_model(tmp_path: Path, nodes: int) -> None:
    require_tool("prometheus")
    stack = DemoStack(
        DemoOptions(layout=Layout(nodes=nodes), data_dir=tmp_path / "demo"),
        say=lambda _: None,
        show_messages=False,
    )
    try:
        stack.start()
        predicted = _predicted(stack, nodes)
        expected = nodes * int(predicted["series_per_node"])

        def master_series() -> int | None:
            body = stack.http.get(f"{stack.master_url}/api/v1/status/tsdb").json()
            series = int(body["data"]["headStats"]["numSeries"])
            return series if series >= expected else None

        wait_for(master_series, timeout=60 + nodes, what=f"{expected} series at the master")
        # Steady state, not the first ingest: a few more scrape and remote-write rounds.
        time.sleep(20)
        stats = stack.supervisor.stats()
        measured = {
            name: s.rss_mib for name, s in stats.items() if name.startswith("child/") or name == "master"
        }
    finally:
        stack.finish(duration=None)
    children = {n: v for n, v in measured.items() if n.startswith("child/")}
    assert children and "master" in measured, measured
    report = {"nodes": nodes, "predicted": predicted, "measured": measured}
    print(json.dumps(report, sort_keys=True))  # the figures, for `pytest -s` and the docs
    for name, rss in children.items():
        assert predicted["child"] / TOLERANCE <= rss <= predicted["child"] * TOLERANCE, (name, report)
    assert predicted["master"] / TOLERANCE <= measured["master"] <= predicted["master"] * TOLERANCE, report
