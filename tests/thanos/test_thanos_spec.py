"""Bad ``master:``/``thanos:`` values fail with file, field and value; Thanos files parse strictly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.kernel.errors import SpecError
from sharder.model.loading import raise_first_error
from thanos import formats

ROOT = Path(__file__).resolve().parents[2]
S3_SPEC = ROOT / "tests" / "golden" / "thanos-s3-single" / "spec.yaml"


def base() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(S3_SPEC.read_text())
    return document


def load_error(tmp_path: Path, document: dict[str, Any]) -> SpecError:
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(SpecError) as info:
        load_gpufed_spec(path)
    assert info.value.source == str(path)
    return info.value


def test_raw_retention_below_40h_is_refused_with_the_reason(tmp_path: Path) -> None:
    document = base()
    document["thanos"]["compactor"]["retention_raw"] = "39h"
    error = load_error(tmp_path, document)
    assert error.field == "thanos.compactor"
    assert "retention_raw 39h is shorter than 40h" in error.reason
    assert "deleted before they are downsampled" in error.reason


def test_5m_retention_below_10d_is_refused(tmp_path: Path) -> None:
    document = base()
    document["thanos"]["compactor"]["retention_5m"] = "9d"
    error = load_error(tmp_path, document)
    assert "retention_5m 9d is shorter than 10d" in error.reason


def test_zero_retention_means_forever_and_passes(tmp_path: Path) -> None:
    document = base()
    document["thanos"]["compactor"] = {"retention_raw": "0d", "retention_5m": "0d", "retention_1h": "0d"}
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(document))
    spec = load_gpufed_spec(path)
    assert spec.thanos is not None and spec.thanos.compactor.retention_raw == "0d"


def test_replication_factor_above_ring_endpoints(tmp_path: Path) -> None:
    document = base()
    document["thanos"]["receive"]["replication_factor"] = 3
    error = load_error(tmp_path, document)
    assert error.field == "thanos.receive"
    assert "replication_factor 3 exceeds the 2 endpoints of hashring 'default'" in error.reason


@pytest.mark.parametrize(
    ("path", "value", "field", "needle"),
    [
        (
            ("objstore", "config", "endpoint"),
            "https://minio:9000",
            "thanos.objstore.S3.config.endpoint",
            "without http(s)://",
        ),
        (
            ("objstore", "config", "access_key"),
            "AKIAPLAINTEXT",
            "thanos.objstore.S3.config.access_key",
            "valid dictionary",
        ),
        (("objstore", "config", "buckt"), "x", "thanos.objstore.S3.config.buckt", "Extra inputs"),
        (
            ("receive", "hashrings", 0, "endpoints", 0, "address"),
            "http://receive-0:10901",
            "thanos.receive.hashrings[0].endpoints[0].address",
            "without a scheme",
        ),
        (("mode",), "ruler", "thanos.mode", "'receive' or 'sidecar'"),
    ],
)
def test_field_and_value_are_named(
    tmp_path: Path, path: tuple[str | int, ...], value: str, field: str, needle: str
) -> None:
    document = base()
    node: Any = document["thanos"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    error = load_error(tmp_path, document)
    assert error.field == field
    assert needle in error.reason
    assert error.value == value


def test_oss_needs_https(tmp_path: Path) -> None:
    document = base()
    document["thanos"]["objstore"] = {
        "type": "ALIYUNOSS",
        "config": {
            "bucket": "b",
            "endpoint": "http://oss-cn-beijing.aliyuncs.com",
            "access_key_id": {"env": "A"},
            "access_key_secret": {"env": "B"},
        },
    }
    error = load_error(tmp_path, document)
    assert error.field == "thanos.objstore.ALIYUNOSS.config.endpoint"
    assert "https://" in error.reason


def test_sidecar_needs_a_master_and_no_receive(tmp_path: Path) -> None:
    document = base()
    document["thanos"]["mode"] = "sidecar"
    assert "drop the receive section" in load_error(tmp_path, document).reason
    del document["thanos"]["receive"]
    del document["master"]
    assert "add a master section" in load_error(tmp_path, document).reason


def test_hashring_tenant_the_master_never_sends(tmp_path: Path) -> None:
    document = base()
    ring = document["thanos"]["receive"]["hashrings"][0]
    document["thanos"]["receive"]["hashrings"].insert(0, {**ring, "name": "typo", "tenants": ["dc-1"]})
    document["thanos"]["receive"]["hashrings"][0]["endpoints"] = [{"address": "receive-9:10901"}]
    assert "names tenants ['dc-1'] the master never sends" in load_error(tmp_path, document).reason


def test_master_fields(tmp_path: Path) -> None:
    document = base()
    document["master"]["replicas"] = 3
    error = load_error(tmp_path, document)
    assert (error.field, error.value) == ("master.replicas", 3)
    document["master"]["replicas"] = 2
    document["master"]["tenants"] = "per-tenant"
    assert load_error(tmp_path, document).field == "master.tenants"


def test_hashrings_typo_is_rejected_with_the_field() -> None:
    rings = [{"hashring": "default", "endpoints": [{"address": "r:10901", "zone": "a"}]}]
    with pytest.raises(formats.ThanosFormatError) as info:
        formats.parse_hashrings(json.dumps(rings))
    assert info.value.field.startswith("[0].endpoints[0]")
    assert "zone" in info.value.field


def test_catch_all_ring_must_be_last() -> None:
    rings = [
        {"hashring": "all", "endpoints": ["a:1"]},
        {"hashring": "t", "tenants": ["x"], "endpoints": ["b:1"]},
    ]
    with pytest.raises(formats.ThanosFormatError) as info:
        formats.parse_hashrings(json.dumps(rings))
    assert info.value.field == "[0].tenants"


def test_objstore_typo_and_unknown_type() -> None:
    with pytest.raises(formats.ThanosFormatError) as info:
        formats.parse_objstore("type: FILESYSTEM\nconfig: {dir: /x}\n")
    assert info.value.field == "config.dir"
    with pytest.raises(formats.ThanosFormatError) as info:
        formats.parse_objstore("type: NFS\nconfig: {}\n")
    assert (info.value.field, info.value.value) == ("type", "NFS")
    with pytest.raises(formats.ThanosFormatError) as info:
        formats.parse_objstore("type: S3\nconfig: {bucket: b, endpoint: s3.amazonaws.com}\nprefixx: a\n")
    assert info.value.field == "prefixx"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "hashring",
        "tenants",
        "endpoints",
        "address",
        "az",
        "tenant_matcher_type",
        "type",
        "config",
        "bucket",
        "endpoint",
        "directory",
        "prefix",
        "algorithm",
    ]
)
SHAPED = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.one_of(JSON, SHAPED))
def test_parsers_fail_only_with_a_format_error(data: Any) -> None:
    for parse, text in (
        (formats.parse_hashrings, json.dumps(data)),
        (formats.parse_objstore, yaml.safe_dump(data)),
    ):
        try:
            parse(text)
        except formats.ThanosFormatError as exc:
            assert str(exc)


@settings(max_examples=40, deadline=None)
@given(SHAPED)
def test_bad_thanos_sections_fail_with_a_spec_error(section: Any) -> None:
    document = base()
    document["thanos"] = section
    try:
        GpufedSpec.model_validate(document)
    except ValidationError as exc:
        with pytest.raises(SpecError):
            raise_first_error(exc, source="federation.yaml")
