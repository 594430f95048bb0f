"""Any spec or inventory content ends in success or one ``SharderError``, never another exception.

Three sources of input, each with a bounded example count: random data written as YAML
or JSON, valid documents with a random part replaced (wrong shapes, nulls, mixed key
types, huge or odd values), and raw bytes. Everything runs the loaders and the whole pure
path (assign, render the bundle) of ``federation.master.pipeline``; promtool is not needed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation.master import pipeline
from federation.spec import GpufedSpec
from sharder.kernel.errors import SharderError
from sharder.model.inventory import Target
from sharder.model.loading import StaticFileSource, parse_model, parse_target

SPEC = {
    "cluster": "fuzz",
    "regions": [{"name": "r-a", "shards": 2}, {"name": "r-b"}],
    "jobs": [{"name": "gpu", "keep_metrics": ["DCGM_.*"]}, {"name": "node", "drop_labels": ["x"]}],
    "remote_write": [{"name": "m", "url": "http://m:9090/api/v1/write", "queue_config": {"capacity": 10}}],
    "external_labels": {"env": "test"},
    "children": {"target_discovery": "file_sd"},
}
INVENTORY = {
    "defaults": {"exporters": {"gpu": 9400, "node": 9100}},
    "nodes": [
        {"name": "n1", "address": "10.0.0.1", "region": "r-a", "gpus": 8, "labels": {"pool": "a"}},
        {"name": "n2", "address": "fd00::2", "region": "r-b", "gpus": 4, "rack": "k1"},
    ],
    "targets": [{"address": "gpu.example", "port": 9400, "job": "gpu", "node": "s1", "region": "r-a"}],
}

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["10.0.0.1", "[fd00::1]:9400", "0s", "http://", "__x", "(?=a)", "gpu", "r-a", "9400"]),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers(), st.booleans()), inner, max_size=4),
    ),
    max_leaves=12,
)
SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a document, so a mutation can land anywhere."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += paths(value, (*prefix, i))
    return found


def replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = replace(doc[path[0]], path[1:], value)
    return copy


def dump(doc: Any, *, as_json: bool) -> bytes:
    if as_json:
        return json.dumps(doc, default=str).encode()
    return yaml.safe_dump(doc, allow_unicode=True).encode()


def run_everything(tmp: Path, *, spec: bytes, inventory: bytes, suffix: str) -> None:
    spec_path, inventory_path = tmp / f"spec{suffix}", tmp / f"inventory{suffix}"
    spec_path.write_bytes(spec)
    inventory_path.write_bytes(inventory)
    try:
        loaded, targets = pipeline.load_inputs(spec_path, inventory_path)
        assignment = pipeline.assigning.assign(loaded, targets)
        pipeline.build_bundle(loaded, targets, assignment)
    except SharderError as exc:
        message = str(exc)
        assert len(message) < 1200, "errors stay short whatever the input"
        assert "Traceback" not in message


def mutated(base: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.sampled_from(paths(base)).flatmap(lambda p: values.map(lambda v: replace(base, p, v)))


@SETTINGS
@given(doc=values, as_json=st.booleans(), which=st.sampled_from(["spec", "inventory"]))
def test_random_documents(tmp_path: Path, doc: Any, as_json: bool, which: str) -> None:
    good = {"spec": dump(SPEC, as_json=as_json), "inventory": dump(INVENTORY, as_json=as_json)}
    good[which] = dump(doc, as_json=as_json)
    run_everything(
        tmp_path, spec=good["spec"], inventory=good["inventory"], suffix=".json" if as_json else ".yaml"
    )


@SETTINGS
@given(inventory=mutated(INVENTORY), as_json=st.booleans())
def test_inventories_with_one_part_replaced(tmp_path: Path, inventory: Any, as_json: bool) -> None:
    run_everything(
        tmp_path,
        spec=dump(SPEC, as_json=as_json),
        inventory=dump(inventory, as_json=as_json),
        suffix=".json" if as_json else ".yaml",
    )


@SETTINGS
@given(spec=mutated(SPEC))
def test_specs_with_one_part_replaced(tmp_path: Path, spec: Any) -> None:
    run_everything(
        tmp_path, spec=dump(spec, as_json=False), inventory=dump(INVENTORY, as_json=False), suffix=".yaml"
    )


@SETTINGS
@given(raw=st.binary(max_size=200), which=st.sampled_from(["spec", "inventory"]), as_json=st.booleans())
def test_raw_bytes(tmp_path: Path, raw: bytes, which: str, as_json: bool) -> None:
    good = {"spec": dump(SPEC, as_json=as_json), "inventory": dump(INVENTORY, as_json=as_json)}
    good[which] = raw
    run_everything(
        tmp_path, spec=good["spec"], inventory=good["inventory"], suffix=".json" if as_json else ".yaml"
    )


def test_the_unmutated_documents_load(tmp_path: Path) -> None:
    for as_json in (False, True):
        suffix = ".json" if as_json else ".yaml"
        (tmp_path / f"s{suffix}").write_bytes(dump(SPEC, as_json=as_json))
        (tmp_path / f"i{suffix}").write_bytes(dump(INVENTORY, as_json=as_json))
        spec, targets = pipeline.load_inputs(tmp_path / f"s{suffix}", tmp_path / f"i{suffix}")
        assert len(targets) == 5 and spec.cluster == "fuzz"


@settings(max_examples=150, deadline=None)
@given(
    raw=st.one_of(values, st.dictionaries(st.sampled_from([*sorted(Target.model_fields), "weight"]), leaves))
)
def test_parse_target_is_a_target_or_an_inventory_error(raw: Any) -> None:
    """The seam live registry data and REST bodies use: one raw mapping in."""
    try:
        target = parse_target(raw, where="items[0]", source="consul")
    except SharderError as exc:
        assert str(exc).startswith("consul:")
    else:
        assert isinstance(target, Target)


def test_static_source_names_the_file_for_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SharderError, match="is a directory"):
        StaticFileSource(tmp_path).list_targets()


EXAMPLE_SPEC = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "federation.yaml").read_text()
)


@SETTINGS
@given(spec=mutated(EXAMPLE_SPEC))
def test_the_example_spec_with_alerting_and_one_part_replaced(spec: Any) -> None:
    """The whole ``federation.yaml`` (alerting included) goes through the same one-error path."""
    try:
        parse_model(GpufedSpec, spec, source="federation.yaml")
    except SharderError as exc:
        assert str(exc).startswith("federation.yaml:") and len(str(exc)) < 1200
