"""Issue 21 item 1: a registration the render cannot place is refused (422 naming the field),
and a render failure or a left-out target is visible in /v1/status, /readyz and /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation.spec import load_gpufed_spec
from sharder.kernel.promtool import ConfigCheckError
from sharder.model.inventory import Target
from tests.controller.harness import ControllerHarness, build, fleet, spec_document


def body(i: int = 1, **changes: Any) -> dict[str, Any]:
    return {"address": f"10.9.0.{i}", "port": 9400, "job": "gpu", "node": f"n{i}", "region": "r1", **changes}


async def put(harness: ControllerHarness, identity: str, document: dict[str, Any]) -> tuple[int, Any]:
    async with harness.client() as client:
        response = await client.put(f"/v1/registry/targets/{identity}", json=document, headers=harness.auth())
        return response.status_code, response.json()


def test_an_undefined_job_is_refused_naming_the_field(tmp_path: Path) -> None:
    harness = build(tmp_path)
    status, problem = asyncio.run(put(harness, "10.9.0.1:9400", body(job="nosuchjob")))
    assert status == 422 and problem["field"] == "job"
    assert "nosuchjob" in problem["detail"] and "not defined by the spec" in problem["detail"]
    assert harness.controller.registry.targets() == []


def test_an_undefined_region_is_refused_naming_the_field(tmp_path: Path) -> None:
    harness = build(tmp_path)
    status, problem = asyncio.run(put(harness, "10.9.0.1:9400", body(region="mars")))
    assert status == 422 and problem["field"] == "region" and "'mars'" in problem["detail"]


def test_a_batch_names_each_bad_entry_and_applies_nothing(tmp_path: Path) -> None:
    harness = build(tmp_path)

    async def call() -> tuple[int, Any]:
        async with harness.client() as client:
            response = await client.post(
                "/v1/registry/batch",
                json={"put": [body(1), body(2, job="nosuchjob"), body(3, region="mars")]},
                headers=harness.auth(),
            )
            return response.status_code, response.json()

    status, problem = asyncio.run(call())
    assert status == 422 and problem["invalid"] == 2
    assert [(e["index"], e["field"]) for e in problem["errors"]] == [(1, "job"), (2, "region")]
    assert harness.controller.registry.targets() == []


def test_no_job_outside_the_spec_is_ever_accepted(tmp_path: Path) -> None:
    harness = build(tmp_path)

    @given(job=st.text(min_size=1, max_size=30).filter(lambda j: j not in ("gpu", "node")))
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def one(job: str) -> None:
        status, problem = asyncio.run(put(harness, "10.9.0.1:9400", body(job=job)))
        assert status == 422, (job, problem)
        assert harness.controller.registry.targets() == []

    one()


def test_a_target_with_an_undefined_job_from_another_source_is_left_out_and_named(tmp_path: Path) -> None:
    document = spec_document()
    document["children"] = {"target_discovery": "file_sd"}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    harness = build(tmp_path, spec=load_gpufed_spec(tmp_path / "spec.yaml"))
    stray = Target(address="10.8.0.1", port=9400, job="nosuchjob", node="stray", region="r1", gpus=8)
    harness.feed([*fleet(4), stray], source="consul")
    assert harness.controller.publish_configs()
    status = asyncio.run(get_json(harness, "/v1/status"))["configs"]
    assert status["ok"] is True and status["left_out_count"] == 1
    assert "'10.8.0.1:9400'" in status["left_out"][0] and "nosuchjob" in status["left_out"][0]
    files = harness.controller.publisher.files  # type: ignore[union-attr]
    lists = {path: content for path, content in files.items() if "/targets/" in path}
    assert b"10.0.0.2:9400" in b"".join(lists.values())  # the good ones are published
    assert b"10.8.0.1" not in b"".join(lists.values())
    assert "gpufed_controller_config_targets_left_out 1.0" in asyncio.run(get_text(harness, "/metrics"))
    assignment = harness.controller.state.assignment
    assert assignment is not None
    sd = asyncio.run(get_text(harness, f"/v1/sd/{assignment.targets['10.8.0.1:9400']}"))
    assert ("10.8.0.1" not in sd and "10.0.0.2" in sd) or "10.8.0.1" not in sd


class RefusingChecker:
    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        raise ConfigCheckError(f"{config}: refused by the test's checker")


def test_a_failed_bundle_is_not_silent_and_a_good_one_clears_it(tmp_path: Path) -> None:
    harness = build(tmp_path)
    publisher, publication = harness.controller.publisher, harness.controller.publication
    assert publisher is not None
    publisher.checker = RefusingChecker()
    harness.feed(fleet(4))
    assert not harness.controller.publish_configs()
    status = asyncio.run(get_json(harness, "/v1/status"))["configs"]
    assert status["ok"] is False and "refused by the test's checker" in status["error"]
    ready = asyncio.run(get_json(harness, "/readyz"))
    assert ready["ready"] is True and ready["configs_ok"] is False and "refused" in ready["configs_error"]
    metrics = asyncio.run(get_text(harness, "/metrics"))
    assert "gpufed_controller_config_render_ok 0.0" in metrics
    assert "gpufed_controller_config_last_success_timestamp_seconds 0.0" in metrics

    publisher.checker = None
    publication._config_key = None  # nothing the configs depend on changed: render again anyway
    publication.publish(harness.controller.state, harness.controller.reconciler.target_map)
    assert harness.controller.publish_configs()
    assert asyncio.run(get_json(harness, "/readyz"))["configs_ok"] is True
    metrics = asyncio.run(get_text(harness, "/metrics"))
    assert "gpufed_controller_config_render_ok 1.0" in metrics
    assert "gpufed_controller_config_last_success_timestamp_seconds 0.0" not in metrics


async def get_json(harness: ControllerHarness, path: str) -> Any:
    async with harness.client() as client:
        return (await client.get(path)).json()


async def get_text(harness: ControllerHarness, path: str) -> str:
    async with harness.client() as client:
        return (await client.get(path)).text
