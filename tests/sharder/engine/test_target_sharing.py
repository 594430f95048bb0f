"""A million targets live as long as the controller: what they repeat is held once."""

from __future__ import annotations

from sharder.model.inventory import Target
from sharder.model.loading import parse_target


def _raw(i: int) -> dict[str, object]:
    # strings built at run time, as a YAML or JSON parser hands them over (never shared)
    return {
        "address": "".join(["10.0.0.", str(i % 4 + 1)]),
        "port": 9400,
        "job": "".join(["g", "pu"]),
        "node": "".join(["gpu-", str(i % 4)]),
        "region": "".join(["r", "1"]),
        "rack": "".join(["rack-", "07"]),
        "team": "".join(["ll", "m"]),
        "gpus": 8,
    }


def test_two_parsed_targets_share_their_names_and_fields_set() -> None:
    a, b = parse_target(_raw(0)), parse_target(_raw(4))
    for name in ("address", "job", "node", "region", "rack", "team"):
        assert getattr(a, name) is getattr(b, name), name
    assert a.model_fields_set is b.model_fields_set


def test_a_copy_with_changes_leaves_the_shared_fields_set_alone() -> None:
    a, b = Target.model_validate(_raw(0)), Target.model_validate(_raw(1))
    shared = set(a.model_fields_set)
    copied = a.model_copy(update={"metrics_path": "/m"})
    assert copied.metrics_path == "/m" and "metrics_path" in copied.model_fields_set
    assert a.model_fields_set == shared and b.model_fields_set == shared
    assert a.model_dump(exclude_unset=True).keys() == shared


def test_shared_names_change_no_value_or_equality() -> None:
    a = parse_target(_raw(0))
    assert a == Target.model_validate(_raw(0))
    assert a.model_dump(mode="json", exclude_defaults=True) == {
        "address": "10.0.0.1", "port": 9400, "job": "gpu", "node": "gpu-0", "region": "r1",
        "rack": "rack-07", "team": "llm", "gpus": 8,
    }


def test_targets_without_labels_share_one_empty_dict_and_a_copy_with_labels_has_its_own() -> None:
    a, b = parse_target(_raw(0)), parse_target(_raw(1))
    assert a.labels == {} and a.labels is b.labels
    labelled = a.model_copy(update={"labels": {"pod": "p"}})
    assert labelled.labels == {"pod": "p"} and a.labels == {} and b.labels == {}
    own = parse_target({**_raw(2), "labels": {"pod": "q"}})
    assert own.labels == {"pod": "q"} and own.labels is not a.labels and a.labels == {}
    assert a.model_dump(mode="json")["labels"] == {} and a == Target.model_validate(_raw(0))
