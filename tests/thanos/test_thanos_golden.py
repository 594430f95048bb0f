"""Master and Thanos files: golden trees, strict Thanos-format parsing, real promtool.

Regenerate with ``GPUFED_REGEN_GOLDEN=1 pytest tests/thanos`` and review the diff; without
the flag a mismatch fails and nothing is written. Thanos itself cannot run here: every
Thanos file is parsed with ``thanos.formats`` (models of Thanos' structs, unknown keys
rejected) instead. The master config goes through the real ``promtool``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from federation.master.render import MASTER_FILE, load_rule_pack, master_instances, render_master_bundle
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.kernel.output import Bundle
from tests.conftest import stack_tool
from tests.golden_tree import GOLDEN, check_golden_tree
from thanos import formats
from thanos.render import HASHRINGS_FILE, OBJSTORE_FILE, SECRETS_FILE, render_thanos_bundle

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "thanos-example": ROOT / "examples" / "federation.yaml",  # receive, filesystem, per-region, split
    "thanos-s3-single": GOLDEN / "thanos-s3-single" / "spec.yaml",  # receive, S3, one tenant
    "thanos-oss-sidecar": GOLDEN / "thanos-oss-sidecar" / "spec.yaml",  # sidecar, OSS, HA masters
}


def spec_for(name: str) -> GpufedSpec:
    return load_gpufed_spec(CASES[name])


def bundle_for(name: str) -> Bundle:
    """master/ and thanos/ files; the rule pack's copies are checked in test_master, not here."""
    spec = spec_for(name)
    assert spec.thanos is not None
    bundle = render_thanos_bundle(spec.thanos, masters=master_instances(spec))
    if spec.master is not None:
        bundle.update(render_master_bundle(spec, rule_pack={}))
    return bundle


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    bundle = bundle_for(name)
    check_golden_tree(GOLDEN / name, bundle)
    assert bundle_for(name) == bundle, "rendering is not deterministic"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_thanos_file_parses_strictly(name: str) -> None:
    bundle = bundle_for(name)
    bucket, provider = formats.parse_objstore(bundle[OBJSTORE_FILE])
    assert bucket.type in formats.PROVIDERS
    assert isinstance(provider, formats.PROVIDERS[bucket.type])
    spec = spec_for(name)
    assert spec.thanos is not None
    if spec.thanos.mode == "receive":
        rings = formats.parse_hashrings(bundle[HASHRINGS_FILE])
        assert not rings[-1].tenants and all(r.tenants for r in rings[:-1])
    else:
        assert HASHRINGS_FILE not in bundle
        sidecars = json.loads(bundle["thanos/sidecar.json"])["instances"]
        assert sorted(sidecars) == ["sidecar-master-0", "sidecar-master-1"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_secrets_are_references_never_values(name: str) -> None:
    bundle = bundle_for(name)
    text = bundle[OBJSTORE_FILE].decode()
    secrets = json.loads(bundle.get(SECRETS_FILE, b"{}"))
    for variable, source in secrets.items():
        assert f"$({variable})" in text
        assert set(source) in ({"env"}, {"file"})
    for path in bundle:
        assert b"/run/secrets/" not in bundle[path] or path == SECRETS_FILE


def test_s3_keys_env_and_file_sse_kms() -> None:
    _, s3 = formats.parse_objstore(bundle_for("thanos-s3-single")[OBJSTORE_FILE])
    assert isinstance(s3, formats.S3Config)
    assert (s3.access_key, s3.secret_key) == ("$(S3_ACCESS_KEY)", "$(GPUFED_S3_SECRET_KEY)")
    assert s3.endpoint == "minio.storage.internal:9000" and s3.insecure
    assert s3.sse_config.type == "SSE-KMS"
    secrets = json.loads(bundle_for("thanos-s3-single")[SECRETS_FILE])
    assert secrets == {
        "GPUFED_S3_SECRET_KEY": {"file": "/run/secrets/s3-secret-key"},
        "S3_ACCESS_KEY": {"env": "S3_ACCESS_KEY"},
    }


def test_query_deduplicates_replica_and_shard() -> None:
    """HA copies differ in replica; a hand-over's old and new owner's copies in shard."""
    for name in CASES:
        args = json.loads(bundle_for(name)["thanos/query.json"])["instances"]["query"]["args"]
        labels = [a.split("=", 1)[1] for a in args if a.startswith("--query.replica-label=")]
        assert labels[:2] == ["replica", "shard"], name
        assert "handover" not in labels, name
        thanos = spec_for(name).thanos
        assert thanos is not None
        assert ("receive_replica" in labels) == (thanos.mode == "receive"), name
        assert all(
            a.split("=", 1)[1].startswith(("dns+", "dnssrv+")) for a in args if a.startswith("--endpoint=")
        )


def test_split_mode_routers_route_and_ingestors_ingest() -> None:
    instances = json.loads(bundle_for("thanos-example")["thanos/receive.json"])["instances"]
    roles = {name: i["role"] for name, i in instances.items()}
    assert roles["thanos-router-0"] == "router"
    assert {r for n, r in roles.items() if n != "thanos-router-0"} == {"ingestor"}
    for name, instance in instances.items():
        flags = {a.split("=", 1)[0] for a in instance["args"][1:]}
        if instance["role"] == "router":  # hashring file, no local endpoint: Thanos' RouterOnly mode
            assert "--receive.hashrings-file" in flags and "--receive.local-endpoint" not in flags
            assert "--tsdb.path" not in flags and "--objstore.config-file" not in flags
        else:  # local endpoint, no hashring file: IngestorOnly mode
            assert "--receive.local-endpoint" in flags and "--receive.hashrings-file" not in flags, name
            assert "--objstore.config-file" in flags


def test_compactor_retention_flags() -> None:
    args = json.loads(bundle_for("thanos-s3-single")["thanos/compact.json"])["instances"]["compact"]["args"]
    assert "--retention.resolution-raw=40h" in args
    assert "--retention.resolution-5m=10d" in args
    assert "--retention.resolution-1h=0d" in args


# thanos-oss-sidecar names a rule file on the target host, so promtool cannot check it here.
# The master's prometheus.yml is the same for both lines (only its flags differ): both promtools.
@pytest.mark.parametrize("line", [2, 3])
@pytest.mark.parametrize("name", ["thanos-example", "thanos-s3-single"])
def test_master_config_passes_promtool(name: str, line: int, tmp_path: Path) -> None:
    promtool = stack_tool(line, "promtool")
    spec = spec_for(name)
    bundle = render_master_bundle(spec, rule_pack=load_rule_pack())
    for rel, data in bundle.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    done = subprocess.run(
        [promtool, "check", "config", MASTER_FILE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # every rule file the bundle carries is one the config names and promtool loads
    rule_files = [rel for rel in bundle if rel.startswith("master/rules/") and rel.endswith(".yml")]
    assert len(rule_files) >= 5  # freshness, federation, gpu, hami, storage
    assert f"SUCCESS: {len(rule_files)} rule files found" in done.stdout + done.stderr
