"""The README's commands are the product's front door, and the docs' examples run as written."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")
GPUFED = [sys.executable, "-m", "federation.commands.cli"]


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def sh_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def test_quick_start_has_exactly_the_two_setup_commands() -> None:
    assert sh_blocks(section("Quick start")) == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (ROOT / ".ci/run").read_text(encoding="utf-8")


def test_demo_script_runs_the_live_demo_with_its_arguments() -> None:
    lines = (ROOT / "scripts/demo.sh").read_text().splitlines()
    assert "bash scripts/bootstrap.sh" in lines
    assert lines[-1] == 'exec gpufed demo "$@"'
    assert lines.index("bash scripts/bootstrap.sh") < len(lines) - 1


def readme_render_args() -> list[str]:
    """The ``gpufed render`` example of "Shards and child configs", as docs/sharding.md writes it."""
    line = next(line for line in page("sharding.md").splitlines() if line.startswith("gpufed render "))
    return shlex.split(line)[1:]


def test_render_example_renders_the_bundled_example(tmp_path: Path, promtool: str, amtool: str) -> None:
    args = readme_render_args()
    assert args[:1] == ["render"]
    args[args.index("--out") + 1] = str(tmp_path / "out")
    done = subprocess.run(
        [*GPUFED, *args, "--json"], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["targets"] == 620
    assert summary["checked"] == summary["children"] == 26
    assert (tmp_path / "out/alertmanager/alertmanager.yml").is_file()


def test_benchmark_command_prints_json() -> None:
    (command,) = sh_blocks(page("benchmarks.md"))[:1]
    args = shlex.split(command)
    assert args[0].endswith("gpufed")
    # Same command, fewer movement trials so the suite stays fast.
    done = subprocess.run(
        [*GPUFED, *args[1:], "--trials", "2"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["targets"] == 100_000
    assert figures["max_over_mean"] <= 1.05 + 1e-9


def test_prometheus_versions_example_and_table_match_the_code() -> None:
    import yaml

    from federation.spec import GpufedSpec
    from sharder.kernel.prometheus_versions import Release, prometheus_rendering

    text = page("prometheus-versions.md")
    (example,) = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    doc = {**yaml.safe_load((ROOT / "examples" / "federation.yaml").read_text()), **yaml.safe_load(example)}
    spec = GpufedSpec.model_validate(doc)
    assert (spec.prometheus.version, spec.alertmanager.version) == ("3", "0.27")
    row = next(line for line in text.splitlines() if line.startswith("| agent mode"))
    two, three = prometheus_rendering(Release(2, 53)), prometheus_rendering(Release(3))
    assert f"`{two.agent_flag}`" in row.split("|")[2] and f"`{three.agent_flag}`" in row.split("|")[3]
