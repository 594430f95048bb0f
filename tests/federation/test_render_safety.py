"""Nothing good is lost: tampered state, mass removals, concurrent renders, bombs under ulimit."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from federation.commands import render
from federation.master import pipeline
from sharder.children.lock import lock_path, output_lock
from sharder.kernel import output
from sharder.kernel.errors import AssignmentError, LockedError, MassRemovalError, OutputError, SharderError

SPEC = """\
cluster: gpu-test
regions:
  - name: cn-beijing
    shards: 2
jobs:
  - name: gpu
  - name: node
"""


def inventory(count: int, *, first: int = 1) -> str:
    lines = ["defaults: {exporters: {gpu: 9400, node: 9100}}", "nodes:"]
    lines += [
        f"  - {{name: n{i}, address: 10.0.0.{i}, region: cn-beijing, gpus: 8}}"
        for i in range(first, first + count)
    ]
    return "\n".join(lines) + "\n" if count else "nodes: []\n"


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    render.register(app)
    return app


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run(app: typer.Typer, tmp: Path, inv: str, *extra: str) -> Result:
    (tmp / "federation.yaml").write_text(SPEC)
    (tmp / "inventory.yaml").write_text(inv)
    args = [
        "render",
        "--spec",
        tmp / "federation.yaml",
        "--inventory",
        tmp / "inventory.yaml",
        "--out",
        tmp / "out",
    ]
    return CliRunner().invoke(app, [str(a) for a in [*args, "--no-check", *extra]])


def test_mass_removal_is_refused_unless_allowed_and_the_summary_counts(
    app: typer.Typer, tmp_path: Path
) -> None:
    assert run(app, tmp_path, inventory(10)).exit_code == 0
    before = tree(tmp_path / "out")

    emptied = run(app, tmp_path, inventory(0))
    assert emptied.exit_code == 2
    assert emptied.stderr.startswith("error: this change removes 20 of 20 targets (100%; at most 50% at once")
    assert "--allow-mass-removal" in emptied.stderr and emptied.stderr.count("\n") == 1
    assert tree(tmp_path / "out") == before

    truncated = run(app, tmp_path, inventory(4))  # 12 of 20 targets gone: 60%
    assert truncated.exit_code == 2 and "removes 12 of 20 targets (60%" in truncated.stderr

    owners_before = json.loads((tmp_path / "out" / "assignment.json").read_text())["targets"]
    half = run(app, tmp_path, inventory(5, first=6))  # exactly half goes, the bound allows it
    assert half.exit_code == 0, half.output
    owners_after = json.loads((tmp_path / "out" / "assignment.json").read_text())["targets"]
    # Survivors may shed to the emptier shard as capacity shrinks; the summary counts exactly those.
    moved = sum(owners_before[key] != shard for key, shard in owners_after.items())
    assert f"0 added, 10 removed, {moved} moved" in " ".join(half.stdout.split())

    allowed = run(app, tmp_path, inventory(0), "--allow-mass-removal", "--json")
    assert allowed.exit_code == 0, allowed.output
    info = json.loads(allowed.stdout)
    assert (info["added"], info["removed"], info["moved"], info["targets"]) == (0, 10, 0, 0)


def test_max_removal_share_comes_from_the_spec(app: typer.Typer, tmp_path: Path) -> None:
    assert run(app, tmp_path, inventory(10)).exit_code == 0
    (tmp_path / "federation.yaml").write_text(SPEC + "sharding: {max_removal_share: 0.05}\n")
    (tmp_path / "inventory.yaml").write_text(inventory(9))
    spec, targets = pipeline.load_inputs(tmp_path / "federation.yaml", tmp_path / "inventory.yaml")
    with pytest.raises(MassRemovalError, match=r"removes 2 of 20 targets \(10%; at most 5%"):
        pipeline.render(spec, targets, out=tmp_path / "out", checker=None)


def rendered(tmp: Path) -> tuple[pipeline.GpufedSpec, list[pipeline.Target], Path]:
    (tmp / "federation.yaml").write_text(SPEC)
    (tmp / "inventory.yaml").write_text(inventory(6))
    spec, targets = pipeline.load_inputs(tmp / "federation.yaml", tmp / "inventory.yaml")
    out = tmp / "out"
    pipeline.render(spec, targets, out=out, checker=None)
    return spec, targets, out


def edit_assignment(out: Path, change: object) -> None:
    path = out / output.ASSIGNMENT_FILE
    data = json.loads(path.read_bytes())
    assert callable(change)
    change(data)
    path.write_text(json.dumps(data))


def test_targets_on_unknown_shards_are_placed_afresh_with_a_warning(tmp_path: Path) -> None:
    spec, targets, out = rendered(tmp_path)
    edit_assignment(
        out, lambda d: d["targets"].update({"10.0.0.1:9400": "cn-beijing-7", "ghost:1": "nowhere"})
    )
    warnings: list[str] = []
    result = pipeline.render(spec, targets, out=out, checker=None, warn=warnings.append)
    assert len(warnings) == 1 and "2 targets point at shards the file does not list" in warnings[0]
    assert result.assignment.targets["10.0.0.1:9400"] in result.assignment.shards
    plan = pipeline.plan(spec, targets, previous_dir=out, warn=warnings.append)
    assert not plan.changed and len(warnings) == 1


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe garbage", "not a valid assignment"),
        (b"[]", "not a valid assignment"),
        (b'{"algorithm": 7}', "not a valid assignment (algorithm: Input should be a valid string)"),
        (b"{" * 100_000, "not a valid assignment"),
    ],
)
def test_unreadable_assignment_is_a_clear_error_and_the_tree_stays(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    spec, targets, out = rendered(tmp_path)
    (out / output.ASSIGNMENT_FILE).write_bytes(content)
    before = tree(out)
    with pytest.raises(AssignmentError, match="delete it to start afresh") as caught:
        pipeline.render(spec, targets, out=out, checker=None)
    assert reason in str(caught.value) and len(str(caught.value)) < 400
    assert tree(out) == before


def test_weights_below_one_are_ignored_with_a_warning(tmp_path: Path) -> None:
    spec, targets, out = rendered(tmp_path)
    edit_assignment(out, lambda d: d["weights"].update({"10.0.0.1:9400": -5}))
    warnings: list[str] = []
    plan = pipeline.plan(spec, targets, previous_dir=out, warn=warnings.append)
    assert "weights below 1" in warnings[0] and min(plan.load_before.values()) > 0


def test_a_tree_of_another_cluster_is_not_replaced(tmp_path: Path) -> None:
    spec, targets, out = rendered(tmp_path)
    other = spec.model_copy(update={"cluster": "gpu-other"})
    before = tree(out)
    with pytest.raises(
        OutputError, match="holds the configs of cluster 'gpu-test', but the spec is for cluster"
    ):
        pipeline.render(other, targets, out=out, checker=None)
    assert tree(out) == before


class SlowChecker:
    """A ConfigChecker that holds the render inside its lock until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        del root, config, agent
        self.entered.set()
        assert self.release.wait(10)


def test_a_second_render_into_one_out_fails_clearly_or_waits(tmp_path: Path) -> None:
    spec, targets, out = rendered(tmp_path)
    slow = SlowChecker()
    first = threading.Thread(
        target=pipeline.render, args=(spec, targets), kwargs={"out": out, "checker": slow}
    )
    first.start()
    try:
        assert slow.entered.wait(10)
        with pytest.raises(LockedError, match=r"another gpufed run is writing this output \(pid \d+\)"):
            pipeline.render(spec, targets, out=out, checker=None)
        threading.Timer(0.3, slow.release.set).start()
        started = time.monotonic()
        pipeline.render(spec, targets, out=out, checker=None, lock_timeout=10)  # waits, then runs
        assert time.monotonic() - started >= 0.2
    finally:
        slow.release.set()
        first.join(10)
    assert not lock_path(out).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["federation.yaml", "inventory.yaml", "out"]


def test_a_lock_left_by_a_dead_process_does_not_block(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = (
        "import sys, time; from sharder.children.lock import output_lock\n"
        "with output_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(30)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(LockedError, match=f"pid {holder.pid}"), output_lock(out, timeout=0.2):
            pass
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    with output_lock(out):  # the kernel released the dead holder's lock
        assert lock_path(out).exists()


BOMB = (
    'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
    + "nodes: *a8\n"
)


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3_000_000 * 1024, 3_000_000 * 1024))  # ulimit -v 3000000


@pytest.mark.parametrize("which", ["inventory", "spec"])
def test_alias_bomb_under_ulimit_fails_cleanly_in_seconds(tmp_path: Path, which: str) -> None:
    (tmp_path / "federation.yaml").write_text(SPEC)
    (tmp_path / "inventory.yaml").write_text(inventory(6))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "federation.commands.cli", "render", "--no-check", "--out", str(out)]
    command += ["--spec", str(tmp_path / "federation.yaml"), "--inventory", str(tmp_path / "inventory.yaml")]
    good = subprocess.run(command, capture_output=True, preexec_fn=limit_memory, timeout=60, check=False)
    assert good.returncode == 0, good.stderr
    before = tree(out)
    (tmp_path / f"{'inventory' if which == 'inventory' else 'federation'}.yaml").write_text(BOMB)
    started = time.monotonic()
    bad = subprocess.run(command, capture_output=True, preexec_fn=limit_memory, timeout=60, check=False)
    assert time.monotonic() - started < 20
    assert bad.returncode == 2 and bad.stdout == b""
    lines = bad.stderr.decode().splitlines()
    assert len(lines) == 1 and "aliases expand to more than 100000 nodes" in lines[0], bad.stderr
    assert tree(out) == before


shard_names = st.sampled_from(["cn-beijing-0", "cn-beijing-1", "cn-beijing-9", "other-0", "x"])
assignments = st.fixed_dictionaries(
    {
        "algorithm": st.sampled_from(["bounded-ring", "bounded-rendezvous", "consistent-hash"]),
        "algorithm_version": st.integers(min_value=-1, max_value=3),
        "replication_factor": st.integers(min_value=-2, max_value=3),
        "shards": st.dictionaries(
            shard_names,
            st.fixed_dictionaries(
                {"region": st.sampled_from(["cn-beijing", "other", ""]), "index": st.integers(0, 12)}
            ),
            max_size=4,
        ),
        "targets": st.dictionaries(
            st.sampled_from(["10.0.0.1:9400", "10.0.0.2:9100", "ghost:1", ""]), shard_names, max_size=4
        ),
        "weights": st.dictionaries(
            st.sampled_from(["10.0.0.1:9400", "ghost:1"]), st.integers(-(2**40), 2**40), max_size=2
        ),
    }
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(previous=assignments)
def test_any_well_typed_previous_assignment_plans_or_errors_cleanly(tmp_path: Path, previous: dict) -> None:
    (tmp_path / "federation.yaml").write_text(SPEC)
    (tmp_path / "inventory.yaml").write_text(inventory(3))
    spec, targets = pipeline.load_inputs(tmp_path / "federation.yaml", tmp_path / "inventory.yaml")
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / output.ASSIGNMENT_FILE).write_text(json.dumps(previous))
    try:
        plan = pipeline.plan(spec, targets, previous_dir=out, allow_algorithm_change=True)
    except SharderError as exc:
        assert "\n" not in str(exc)
    else:
        assert plan.counts.targets_after == 6
