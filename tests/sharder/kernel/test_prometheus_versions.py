"""prometheus.version / alertmanager.version: what the spec accepts, and what the table gives."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from alertmanager.models import AlertmanagerReleaseSpec
from sharder.kernel import prometheus_versions as pv
from sharder.kernel.errors import SharderError
from sharder.model.loading import parse_model
from sharder.model.spec import FederationSpec, PrometheusSpec

BASE = {"cluster": "c", "regions": [{"name": "r"}], "jobs": [{"name": "gpu"}]}


@pytest.mark.parametrize(
    ("text", "release"),
    [("3", pv.Release(3)), ("3.5", pv.Release(3, 5)), ("3.13.1", pv.Release(3, 13, 1)),
     ("2.53", pv.Release(2, 53)), ("2.53.3", pv.Release(2, 53, 3)), ("2", pv.Release(2, 53)),
     ("v3.13", pv.Release(3, 13))],
)
def test_accepted_versions(text: str, release: pv.Release) -> None:
    assert PrometheusSpec(version=text).release() == release


@pytest.mark.parametrize("text", ["4", "1.8", "2.42", "2.52.9", "3.x", "", "3.5.3+ds1", "03", "latest"])
def test_refused_versions_name_the_field(text: str) -> None:
    with pytest.raises(SharderError, match=r"prometheus\.version"):
        parse_model(FederationSpec, {**BASE, "prometheus": {"version": text}}, source="f.yaml")


def test_an_unquoted_yaml_number_is_refused_not_misread() -> None:
    # YAML reads 3.10 as 3.1; the spec refuses the number rather than render for 3.1.
    with pytest.raises(ValidationError, match="quoted"):
        PrometheusSpec.model_validate({"version": 3.10})
    assert PrometheusSpec.model_validate({"version": 3}).version == "3"


@pytest.mark.parametrize("text", ["0.27", "0.28.1", "0.33", "0.35.1"])
def test_alertmanager_versions(text: str) -> None:
    assert AlertmanagerReleaseSpec(version=text).release().minor >= 27


@pytest.mark.parametrize("text", ["0.26", "1.0", "0.25.0", "x"])
def test_alertmanager_versions_refused(text: str) -> None:
    with pytest.raises(ValidationError, match=r"alertmanager\.version"):
        AlertmanagerReleaseSpec(version=text)


def test_default_is_line_3() -> None:
    spec = FederationSpec.model_validate(BASE)
    assert spec.prometheus.rendering().agent_flag == "--agent"


def test_rendering_per_line() -> None:
    three, two = pv.prometheus_rendering(pv.Release(3, 5, 3)), pv.prometheus_rendering(pv.Release(2, 53))
    assert (three.agent_flag, three.external_label_env_flags) == ("--agent", ())
    assert (two.agent_flag, two.external_label_env_flags) == (
        "--enable-feature=agent", ("--enable-feature=expand-external-labels",)
    )
    assert three.fallback_scrape_protocol == "PrometheusText0.0.4" and two.fallback_scrape_protocol is None
    assert three.remote_write_v2 and not two.remote_write_v2


def test_every_table_row_cites_its_release_note() -> None:
    for row in pv.DIFFERENCES:
        assert row.source.startswith("https://"), row.name


@pytest.mark.parametrize(
    ("banner", "release"),
    [("prometheus, version 3.5.3+ds1 (branch: debian/sid)", pv.Release(3, 5, 3)),
     ("alertmanager, version 0.28.1+ds (branch: debian/sid)", pv.Release(0, 28, 1)),
     ("nothing here", None)],
)
def test_binary_release(banner: str, release: pv.Release | None) -> None:
    assert pv.binary_release(banner) == release


def test_a_binary_of_another_line_or_older_is_refused() -> None:
    pv.check_binary(component="prometheus", wanted=pv.Release(3), found=pv.Release(3, 5, 3), path="p")
    with pytest.raises(ValueError, match=r"set prometheus\.version to 2\.53"):
        pv.check_binary(component="prometheus", wanted=pv.Release(3), found=pv.Release(2, 53, 3), path="p")
    with pytest.raises(ValueError, match=r"is 3\.5\.3"):
        pv.check_binary(component="prometheus", wanted=pv.Release(3, 13), found=pv.Release(3, 5, 3), path="p")
