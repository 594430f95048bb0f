"""Splitting a Consul health answer into entries gives exactly what decoding it all gives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.sources.entries import NotAList, decode_answer, split_entries

text = st.text(alphabet='ab"{}[],: \\\n', max_size=8)
fields = {
    "Node": st.fixed_dictionaries({"Node": text, "Meta": st.dictionaries(text, text, max_size=2)}),
    "Service": st.fixed_dictionaries({"ID": text, "Port": st.integers(0, 70000)}),
    "Checks": st.lists(st.fixed_dictionaries({"Node": text, "Status": text}), max_size=2),
}
consul_entry = st.tuples(*fields.values()).map(lambda v: dict(zip(fields, v, strict=True)))
any_order = st.permutations(list(fields)).flatmap(
    lambda order: st.tuples(*(fields[k] for k in order)).map(lambda v: dict(zip(order, v, strict=True))))


def body_of(entries: list[Any], compact: bool) -> bytes:
    return json.dumps(entries, separators=(",", ":") if compact else (", ", ": ")).encode()


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(consul_entry, max_size=5), compact=st.booleans())
def test_consul_shaped_answers_split_into_their_entries(entries: list[Any], compact: bool) -> None:
    fragments = split_entries(body_of(entries, compact))
    assert fragments is not None and [json.loads(f) for f in fragments] == entries


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(st.one_of(any_order, text, st.integers()), max_size=5), compact=st.booleans())
def test_any_answer_decodes_to_what_json_loads_gives(entries: list[Any], compact: bool) -> None:
    body = body_of(entries, compact)
    keys, decoded = decode_answer(body, known=())
    assert [decoded[k] for k in keys] == json.loads(body)
    again, fresh = decode_answer(body, known=set(keys))
    assert again == keys and fresh == {}  # a repeated answer decodes nothing


def test_unusual_shapes_are_left_to_the_full_decoder() -> None:
    assert split_entries(b"[]") == [] and split_entries(b" [ ] ") == []
    assert split_entries(b"{not json") is None and split_entries(b'["garbage"]') is None
    with pytest.raises(ValueError):
        decode_answer(b"{not json", known=())
    with pytest.raises(NotAList):
        decode_answer(b'{"an": "object"}', known=())
