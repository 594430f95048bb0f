"""The logs tier: golden trees, strict parsing against Promtail's and Loki's structs.

Regenerate with ``GPUFED_REGEN_GOLDEN=1 pytest tests/logs`` and review the diff; without
the flag a mismatch fails and nothing is written. Promtail and Loki cannot run here: every
rendered file is parsed by ``logs.formats`` (models of their config structs, unknown keys
refused) instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from federation.master.pipeline import logs_part
from federation.spec import GpufedSpec, load_gpufed_spec
from logs import formats, loki, promtail, rules
from sharder.kernel.output import Bundle
from tests.golden_tree import GOLDEN, check_golden_tree

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "logs-example": ROOT / "examples" / "federation.yaml",  # filesystem bucket, receive, alerting
    "logs-s3": GOLDEN / "logs-s3" / "spec.yaml",  # S3 with env and file secrets, SSE-KMS, a tenant
    "logs-oss": GOLDEN / "logs-oss" / "spec.yaml",  # Aliyun OSS, sidecar mode (no remote write)
}


def spec_for(name: str) -> GpufedSpec:
    return load_gpufed_spec(CASES[name])


def bundle_for(name: str) -> Bundle:
    return logs_part(spec_for(name), [], None)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    bundle = bundle_for(name)
    check_golden_tree(GOLDEN / name, bundle)
    assert bundle_for(name) == bundle, "rendering is not deterministic"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_file_parses_strictly(name: str) -> None:
    bundle = bundle_for(name)
    spec = spec_for(name)
    assert spec.logs is not None and spec.thanos is not None
    config = formats.parse_promtail(bundle[promtail.CONFIG_FILE])
    single = formats.parse_loki(bundle[loki.CONFIG_FILE])
    scalable = formats.parse_loki(bundle[loki.SCALABLE_FILE])
    ruleset = formats.parse_rules(bundle[rules.rules_file(spec.logs)])
    assert config.clients[0].url.endswith("/loki/api/v1/push")
    assert single.target == "all" and single.common.ring.kvstore.store == "inmemory"
    assert scalable.common.ring.kvstore.store == "memberlist" and scalable.memberlist is not None
    assert {r.alert or r.record for g in ruleset.groups for r in g.rules} >= {"GPUXidInKernelLog"}
    # Loki's data sits in the Thanos bucket, under its own prefix
    store = single.storage_config.object_store
    assert store is not None and store.storage_prefix == spec.logs.storage_prefix
    assert store.storage_prefix != spec.thanos.objstore.prefix


def test_loki_uses_the_thanos_bucket_and_its_secrets() -> None:
    bundle = bundle_for("logs-s3")
    store = formats.parse_loki(bundle[loki.CONFIG_FILE]).storage_config.object_store
    assert store is not None and store.s3 is not None
    assert (store.s3.bucket_name, store.s3.endpoint, store.s3.insecure) == (
        "gpu-metrics",
        "minio.storage.internal:9000",
        True,
    )
    assert (store.s3.access_key_id, store.s3.secret_access_key) == (
        "${S3_ACCESS_KEY}",
        "${GPUFED_S3_SECRET_KEY}",
    )
    assert store.s3.sse == {"type": "SSE-KMS", "kms_key_id": "alias/gpu-metrics"}
    assert json.loads(bundle[loki.SECRETS_FILE]) == {
        "GPUFED_S3_SECRET_KEY": {"file": "/run/secrets/s3-secret-key"},
        "S3_ACCESS_KEY": {"env": "S3_ACCESS_KEY"},
    }
    oss = formats.parse_loki(bundle_for("logs-oss")[loki.CONFIG_FILE]).storage_config.object_store
    assert oss is not None and oss.alibaba is not None and oss.alibaba.endpoint.startswith("https://")


def test_promtail_labels_match_the_metrics() -> None:
    """The identity labels metrics carry (SD: node, region, rack, team; external: cluster)."""
    config = formats.parse_promtail(bundle_for("logs-example")[promtail.CONFIG_FILE])
    for job in config.scrape_configs:
        set_labels = {r.target_label: r.replacement for r in job.relabel_configs if r.action == "replace"}
        assert set_labels["cluster"] == "gpu-prod"
        assert {set_labels[k] for k in ("node", "region", "rack", "team")} == {
            "${NODE_NAME}",
            "${GPUFED_REGION}",
            "${GPUFED_RACK}",
            "${GPUFED_TEAM}",
        }
    journal = config.scrape_configs[0]
    assert journal.journal is not None
    keep = next(r for r in journal.relabel_configs if r.action == "keep")
    assert keep.regex.split("|")[0] == "kernel" and r"nvidia-fabricmanager\.service" in keep.regex


@pytest.mark.parametrize("service", ["alloy-config", "promtail"])
def test_node_yml_sets_what_promtail_expands(service: str) -> None:
    """Every ${VAR} the Promtail config expands is set where compose/node.yml expands it:
    alloy-config (for Alloy) and the end-of-life promtail service."""
    text = bundle_for("logs-example")[promtail.CONFIG_FILE].decode()
    wanted = set(__import__("re").findall(r"\$\{([A-Z_]+)", text))
    node = yaml.safe_load((ROOT / "compose" / "node.yml").read_text())
    env = node["services"][service]["environment"]
    assert wanted <= set(env), sorted(wanted - set(env))


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda d: d["clients"][0].update(bacthwait="1s"), "clients[0].bacthwait", "Extra inputs"),
        (
            lambda d: d["scrape_configs"][0]["journal"].update(maxage="1h"),
            "scrape_configs[0].journal.maxage",
            "Extra inputs",
        ),
        (
            lambda d: d["scrape_configs"][0]["pipeline_stages"].append({"regexp": {}}),
            "scrape_configs[0].pipeline_stages[1]",
            "unknown pipeline stage",
        ),
        (
            lambda d: d["clients"][0].update(url="http://loki:3100/api/prom/push"),
            "clients[0].url",
            "push path",
        ),
    ],
)
def test_promtail_model_refuses_what_promtail_refuses(mutate, field: str, message: str) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(bundle_for("logs-example")[promtail.CONFIG_FILE])
    mutate(data)
    with pytest.raises(formats.LogsFormatError) as caught:
        formats.parse_promtail(yaml.safe_dump(data))
    assert caught.value.field == field and message in str(caught.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["storage_config"]["object_store"].update(storage_prefix="logs/loki"),
            "invalid characters",
        ),
        (lambda d: d["schema_config"]["configs"][0].update(object_store="s3"), "configures 'filesystem'"),
        (lambda d: d["compactor"].pop("delete_request_store"), "delete_request_store"),
        (lambda d: d["limits_config"].update(retention="30d"), "Extra inputs"),
        (lambda d: d.update(target="querier,ingester"), "gpufed runs Loki"),
    ],
)
def test_loki_model_refuses_what_loki_refuses(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(bundle_for("logs-example")[loki.CONFIG_FILE])
    mutate(data)
    with pytest.raises(formats.LogsFormatError, match=message):
        formats.parse_loki(yaml.safe_dump(data))


@pytest.mark.parametrize(
    "query",
    ["{}", '{node=~".*"}', '{node="a" job="b"}', "count_over_time([5m])"],
)
def test_selector_check_refuses_empty_and_malformed(query: str) -> None:
    with pytest.raises(ValueError):
        formats.check_selector(query)


def test_the_one_bundle_check_refuses_a_bad_logs_or_grafana_file(tmp_path: Path) -> None:
    """``pipeline.check_bundle`` (render, controller, demo) parses these files before a swap."""
    from federation.master.pipeline import check_bundle
    from sharder.kernel.errors import ConfigCheckError

    bundle = dict(bundle_for("logs-example"))
    done = check_bundle(tmp_path, bundle, checker=None, alert_checker=None, agent=False)
    assert done.configs == 0
    bad = yaml.safe_load(bundle[loki.CONFIG_FILE])
    bad["limits_config"]["retention"] = "30d"
    bundle[loki.CONFIG_FILE] = yaml.safe_dump(bad).encode()
    with pytest.raises(ConfigCheckError) as caught:
        check_bundle(tmp_path, bundle, checker=None, alert_checker=None, agent=False)
    assert caught.value.path == loki.CONFIG_FILE and "retention" in str(caught.value)
    # an unchanged file is not checked again (the controller passes what it serves now)
    check_bundle(tmp_path, bundle, checker=None, alert_checker=None, agent=False, previous=bundle)


def test_bench_prints_json() -> None:
    from federation.testing.benches import logs as bench_logs

    result = bench_logs.measure(targets=300, teams=3, repeat=1)
    # 8 shared dashboards, 4 provisioning/API/HA files, 4 pinned per team: the 3 synthetic
    # teams and the example spec's own 2 (llm, vision; they have no synthetic nodes)
    assert result["grafana_part_synthetic"]["files"] == 8 + 4 + 4 * (3 + 2)
    assert result["logs_part_example"]["files"] == 4
