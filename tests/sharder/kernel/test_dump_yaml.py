"""``dump_yaml`` writes libyaml's bytes only where they are PyYAML's own.

The fast path (``CSafeDumper``) is taken for mappings of printable-ASCII strings with
non-empty keys; these tests hold it to the pure-Python emitter byte for byte, show where the
two differ (so the guard is needed), and that a rendered child config takes the fast path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.spec import GpufedSpec
from sharder.children.render import render_children
from sharder.engine.assigning import assign
from sharder.kernel import output
from sharder.kernel.output import dump_yaml
from sharder.model.loading import parse_model
from tests.controller.harness import fleet

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "federation.yaml"
STYLE = {"sort_keys": True, "default_flow_style": False, "allow_unicode": True, "width": 4096}


def pure(data: Any) -> bytes:
    return yaml.safe_dump(data, **STYLE).encode("utf-8")


_ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from(
    ["\n", "\t", "  ", ": ", " #", "- ", "'", '"', "\\", "---", "...", "y", "null", "0x1F", "1e3"])
_ANY = st.characters(codec="utf-8") | st.sampled_from(["\x85", "\u2028", "\U0001f600", "\r", "\x00"])
_SCALARS = st.integers() | st.floats(allow_nan=False) | st.booleans() | st.none()


def documents(chars: st.SearchStrategy[str], *, empty_keys: bool) -> st.SearchStrategy[dict[str, Any]]:
    text = st.lists(chars, max_size=60).map("".join)
    key = st.lists(chars, min_size=0 if empty_keys else 1, max_size=20).map("".join)
    inner = st.recursive(text | _SCALARS,
                         lambda c: st.lists(c, max_size=4) | st.dictionaries(key, c, max_size=4),
                         max_leaves=25)
    return st.dictionaries(key, inner, min_size=1, max_size=4)


@settings(max_examples=600, deadline=None)
@given(documents(_ASCII, empty_keys=False))
def test_the_fast_path_writes_pyyamls_bytes(doc: dict[str, Any]) -> None:
    assert output._plain(doc)
    assert dump_yaml(doc) == pure(doc)


@settings(max_examples=600, deadline=None)
@given(documents(_ANY, empty_keys=True))
def test_any_mapping_is_dumped_as_pyyaml_dumps_it(doc: dict[str, Any]) -> None:
    assert dump_yaml(doc) == pure(doc)


def test_the_guard_is_needed_libyaml_differs_on_these() -> None:
    for doc in ({"k": "\U0001f600"}, {"k": "\x85"}, {"": "v"}):
        fast = yaml.dump(doc, Dumper=yaml.CSafeDumper, **STYLE).encode("utf-8")  # type: ignore[call-overload]
        assert fast != pure(doc) and not output._plain(doc)
        assert dump_yaml(doc) == pure(doc)


def test_a_rendered_child_config_takes_the_fast_path() -> None:
    spec = parse_model(GpufedSpec, yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")), source=str(EXAMPLE))
    regions = [r.name for r in spec.regions][:2]
    targets = [t for k, region in enumerate(regions) for t in fleet(30, region=region, start=1 + 100 * k)]
    child = render_children(spec, targets, assign(spec, targets))[0]
    assert output._plain(child.prometheus)
    assert dump_yaml(child.prometheus) == pure(child.prometheus)
