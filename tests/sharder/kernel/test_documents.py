"""The bounded document reader: same data as PyYAML, refusing bombs, cycles and bad bytes."""

from __future__ import annotations

import datetime
import json
import time

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.kernel import documents
from sharder.kernel.documents import DocumentError, decode, parse_json, parse_yaml

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
data = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=5),
    ),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(value=data, flow=st.booleans())
def test_reads_what_pyyaml_reads(value: object, flow: bool) -> None:
    text = yaml.safe_dump(value, default_flow_style=flow, allow_unicode=True)
    assert parse_yaml(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text",
    [
        "a: [1, 2.5, yes, no, ~, 0x1f, 0o17, 1_000, .inf, 2024-01-01, '7', !!str 8, 9:30]",
        "base: &b {x: 1, y: 2}\nd: {<<: *b, y: 3}\ne: {<<: [*b, {z: 4}], x: 0}",
        "l: [&a [1, 2], *a, &s scalar, *s]",
        "a: !!binary aGVsbG8=\nb: !!float '1'\nc: !!int '7'\nd: !!null ''",
        "? complex key\n: value\n",
        "",
        "# only a comment\n",
        "--- \nx: 1\n...\n",
    ],
)
def test_same_as_pyyaml_for_tricky_but_valid_yaml(text: str) -> None:
    assert parse_yaml(text) == yaml.safe_load(text)


def test_timestamps_and_binary_are_built_by_pyyaml_constructors() -> None:
    assert parse_yaml("d: 2024-01-02\nb: !!binary aGk=") == {"d": datetime.date(2024, 1, 2), "b": b"hi"}


def billion_laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_fast_and_small() -> None:
    text = billion_laughs()
    assert len(text) < 1000  # expands to 9**9 (387 million) strings
    start = time.perf_counter()
    with pytest.raises(DocumentError, match=r"aliases expand to more than 100000 nodes .*\(line \d+\)"):
        parse_yaml(text)
    assert time.perf_counter() - start < 5


def test_modest_aliases_are_fine_and_bound_scales_with_the_document() -> None:
    assert parse_yaml(billion_laughs(levels=4))["a3"][0][0][0] == ["lol"] * 9  # 9**4 strings
    with pytest.raises(DocumentError, match="aliases expand"):
        parse_yaml(billion_laughs(levels=4), max_alias_nodes=1000)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a: &x [1, *x]", "refers to itself"),
        ("a: &x {k: *x}", "refers to itself"),
        ("a: *nothing", "has no anchor"),
        ("a: !!set {x}", "unsupported YAML tag"),
        ("a: !!python/object:os.system ls", "unsupported YAML tag"),
        ("a: !custom 1", "unsupported YAML tag"),
        ("? [1, 2]\n: x", "mapping key must be a plain value"),
        ("a: <<", "only allowed as a mapping key"),
        ("a: {<<: 5}", "merge key needs a mapping"),
        ("a: 1\n---\nb: 2", "expected one YAML document"),
        ("a: " + "1" * 5000, "malformed YAML"),
        ("a: [1, 2\nb: 3", "malformed YAML: .*line"),
        ("\t- tab", "malformed YAML"),
        ("[" * 100 + "]" * 100, "nested deeper than 64"),
    ],
)
def test_refused_yaml_names_the_problem(text: str, reason: str) -> None:
    with pytest.raises(DocumentError, match=reason):
        parse_yaml(text)


def test_deep_nesting_in_either_format_is_an_error_not_a_crash() -> None:
    with pytest.raises(DocumentError, match="nested deeper"):
        parse_yaml("a: " + "[" * 50_000)
    with pytest.raises(DocumentError, match="nested too deeply"):
        parse_json("[" * 200_000 + "]" * 200_000)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a": NaN}', "NaN is not a JSON value"),
        ('{"a": 1', "malformed JSON"),
        ('{"a": ' + "9" * 5000 + "}", "malformed JSON"),
    ],
)
def test_refused_json(text: str, reason: str) -> None:
    with pytest.raises(DocumentError, match=reason):
        parse_json(text)


def test_json_reads_as_json() -> None:
    assert parse_json('{"a": [1, 2.5, null, "x"]}') == json.loads('{"a": [1, 2.5, null, "x"]}')


def test_undecodable_bytes_are_named_by_offset_and_line() -> None:
    with pytest.raises(DocumentError, match=r"not UTF-8 text: byte 0xff at offset 8 \(line 2\)"):
        decode(b"a: 1\nb: \xff\n")
    assert decode("\ufeffa: é".encode()) == "a: é"


def test_the_gc_comes_back_on_even_after_an_error() -> None:
    with pytest.raises(DocumentError):
        parse_yaml("a: &x [*x]")
    import gc

    assert gc.isenabled()
    assert documents.Loader.__name__ in {"CSafeLoader", "SafeLoader"}


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="-:[]{}&*!|>'\"#,?%@`<= \n\tab01yn~.\\\x00\x85\ufeff", max_size=60))
def test_any_yaml_text_is_data_or_a_document_error(text: str) -> None:
    try:
        parse_yaml(text)
    except DocumentError as exc:
        assert "\n" not in str(exc)
