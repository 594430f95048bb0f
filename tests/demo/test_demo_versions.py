"""``gpufed demo`` and the releases of the binaries it is given: read, written, refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import stack_tool

from federation.demo import binaries, plan
from federation.demo.plan import Layout
from federation.demo.stack import DemoError, DemoOptions, DemoStack
from sharder.kernel.prometheus_versions import Release


@pytest.mark.parametrize(("line", "prometheus", "alertmanager"), [(3, "3.5", "0.33"), (2, "2.53", "0.28")])
def test_each_lines_binaries_and_tools_are_found(line: int, prometheus: str, alertmanager: str) -> None:
    found = binaries.find_binaries(prometheus=stack_tool(line, "prometheus"),
                                   alertmanager=stack_tool(line, "prometheus-alertmanager"))
    assert found.promtool == stack_tool(line, "promtool") and found.amtool == stack_tool(line, "amtool")
    assert f"{found.prometheus_release.major}.{found.prometheus_release.minor}" == prometheus
    assert f"0.{found.alertmanager_release.minor}" == alertmanager
    assert found.tool_path().split(":")[0] == str(Path(stack_tool(line, "promtool")).parent)


def test_a_missing_binary_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(binaries.BinaryError, match="--prometheus"):
        binaries.find_binaries(prometheus=str(tmp_path / "nope"))


@pytest.mark.parametrize(
    ("section", "version", "said"),
    [("prometheus", "2.53", "prometheus.version in the spec names 2.x"),
     ("prometheus", "3.13", "names 3.x from 3.13.0"),
     ("alertmanager", "0.34", "alertmanager.version in the spec names 0.x from 0.34.0")],
)
def test_a_spec_naming_another_line_is_refused_before_anything_starts(
    section: str, version: str, said: str, tmp_path: Path
) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc[section] = {"version": version}

    stack = DemoStack(DemoOptions(layout=Layout(nodes=3), data_dir=tmp_path / "demo", edit_spec=edit,
                                  prometheus=stack_tool(3, "prometheus"),
                                  alertmanager=stack_tool(3, "prometheus-alertmanager")),
                      say=lambda _: None, show_messages=False)
    try:
        with pytest.raises(DemoError, match=said):
            stack.start()
        assert stack.supervisor.names() == []  # refused before the first process
    finally:
        stack.stop()


def test_the_demo_spec_takes_the_binaries_releases() -> None:
    ports = plan.Ports.allocate(iter(range(20000, 20100)).__next__)
    doc = plan.demo_spec(plan.load_default_spec(), layout=Layout(nodes=3), ports=ports, master_data="/tmp/x",
                         prometheus=Release(2, 53, 3), alertmanager=Release(0, 28, 1))
    assert (doc["prometheus"], doc["alertmanager"]) == ({"version": "2.53"}, {"version": "0.28"})
