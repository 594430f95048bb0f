"""Spec errors name the spec field, and what the spec accepts Prometheus accepts.

The regex and duration rules are checked against the real promtool both ways: what
``check_re2`` refuses, Prometheus refuses too (so the check is not merely strict), and
specs at the edge of what is allowed render configs promtool accepts without ``--no-check``
having been needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from federation.master import pipeline
from federation.spec import GpufedSpec
from sharder.kernel import output
from sharder.kernel.errors import ConfigCheckError, SpecError
from sharder.kernel.promtool import Promtool, check_all
from sharder.kernel.re2check import check_re2
from sharder.model.inventory import Target
from sharder.model.loading import parse_model
from sharder.model.spec import RESERVED_HEADERS, FederationSpec

BASE: dict[str, Any] = {"cluster": "c", "regions": [{"name": "r-a", "shards": 1}], "jobs": [{"name": "gpu"}]}


def spec_error(**changes: Any) -> str:
    with pytest.raises(SpecError) as caught:
        parse_model(FederationSpec, {**BASE, **changes}, source="federation.yaml")
    return str(caught.value)


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"jobs": [{"name": "gpu", "scrape_interval": "0s"}]}, "jobs[0].scrape_interval", "longer than 0s"),
        (
            {"jobs": [{"name": "gpu", "scrape_interval": "15"}]},
            "jobs[0].scrape_interval",
            "not a Prometheus dur",
        ),
        (
            {"jobs": [{"name": "gpu", "scrape_interval": "15s\n"}]},
            "jobs[0].scrape_interval",
            "not a Prometheus",
        ),
        (
            {"jobs": [{"name": "gpu", "scrape_interval": "\u0661\u0665s"}]},
            "jobs[0].scrape_interval",
            "not a Prometheus",
        ),
        (
            {"jobs": [{"name": "gpu", "scrape_interval": "300y"}]},
            "jobs[0].scrape_interval",
            "longer than Prom",
        ),
        ({"children": {"evaluation_interval": "0s"}}, "children.evaluation_interval", "longer than 0s"),
        ({"children": {"http_sd_refresh_interval": "soon"}}, "children.http_sd_refresh_interval", "duration"),
        ({"children": {"http_sd_url": "http://"}}, "children.http_sd_url", "URL has no host"),
        ({"remote_write": [{"name": "m", "url": "http://"}]}, "remote_write[0].url", "URL has no host"),
        (
            {"remote_write": [{"name": "m", "url": "master:9090/w"}]},
            "remote_write[0].url",
            "http:// or https://",
        ),
        (
            {"remote_write": [{"name": "m", "url": "http://m:99999/w"}]},
            "remote_write[0].url",
            "not a valid URL",
        ),
        ({"remote_write": [{"name": "m", "url": "http://m /w"}]}, "remote_write[0].url", "spaces"),
        (
            {"remote_write": [{"name": "m", "url": "http://m/w", "remote_timeout": "0s"}]},
            "remote_write[0].remote_timeout",
            "longer than 0s",
        ),
        ({"external_labels": {"__tenant": "x"}}, "external_labels", "reserved for Prometheus"),
        ({"external_labels": {"bad-name": "x"}}, "external_labels", "not a valid label name"),
        ({"jobs": [{"name": "gpu", "drop_labels": ["instance"]}]}, "jobs[0].drop_labels", "merge series"),
        ({"jobs": [{"name": "gpu", "drop_labels": ["__name__"]}]}, "jobs[0].drop_labels", "merge series"),
        ({"jobs": [{"name": "gpu", "drop_labels": ["node"]}]}, "jobs[0].drop_labels", "merge series"),
        ({"jobs": [{"name": "gpu", "drop_labels": ["region"]}]}, "jobs[0].drop_labels", "merge series"),
        ({"jobs": [{"name": "gpu", "keep_metrics": ["(?!up).*"]}]}, "jobs[0].keep_metrics[0]", "RE2"),
        (
            {"jobs": [{"name": "gpu", "drop_metrics": ["(a)\\1"]}]},
            "jobs[0].drop_metrics[0]",
            "back-references",
        ),
        ({"jobs": [{"name": "gpu", "metrics_path": "metrics"}]}, "jobs[0].metrics_path", "starts with '/'"),
        ({"jobs": [{"name": "gpu", "weight": 0}]}, "jobs[0].weight", "whole number from 1"),
    ],
)
def test_spec_errors_name_the_spec_field(changes: dict[str, Any], field: str, reason: str) -> None:
    message = spec_error(**changes)
    assert message.startswith(f"federation.yaml: field '{field}'"), message
    assert reason in message


BAD_RE2 = [
    "(?=DCGM).*",
    "(?!up).*",
    "(?<=x)y",
    "(?<!x)y",
    "(a)\\1",
    "(?P<n>a)(?P=n)",
    "(a)?(?(1)b|c)",
    "(?>ab)",
    "a*+",
    "a{1001}",
    "(?x)a b",
    "(?a)\\w",
    "up\\Z",
]
GOOD_RE2 = ["DCGM_.*", "(?i)up", "(?i:node)_.*", "a{2,1000}", "(?P<g>x)", "[a-z]+|[0-9]+", "(?s).", "\\d+"]


@pytest.mark.parametrize("regex", BAD_RE2)
def test_check_re2_refuses(regex: str) -> None:
    with pytest.raises(ValueError, match=r"RE2|regex"):
        check_re2(regex)


def relabel_config(regex: str) -> bytes:
    rule = {"action": "drop", "source_labels": ["__name__"], "regex": regex}
    job = {
        "job_name": "j",
        "static_configs": [{"targets": ["127.0.0.1:9"]}],
        "metric_relabel_configs": [rule],
    }
    return output.dump_yaml({"scrape_configs": [job]})


def test_what_check_re2_refuses_prometheus_refuses_and_the_rest_it_accepts(
    tmp_path: Path, promtool: str
) -> None:
    checker = Promtool(promtool)
    for i, regex in enumerate(BAD_RE2):
        (tmp_path / f"bad{i}.yml").write_bytes(relabel_config(regex))
    for regex in GOOD_RE2:
        assert check_re2(regex) == regex
    (tmp_path / "good.yml").write_bytes(relabel_config("|".join(GOOD_RE2)))
    assert check_all(checker, tmp_path, ["good.yml"], workers=1) == 1
    for i, regex in enumerate(BAD_RE2):
        with pytest.raises(ConfigCheckError):
            checker.check(tmp_path, f"bad{i}.yml")
        del regex


def test_edge_of_valid_specs_render_configs_promtool_accepts(tmp_path: Path, promtool: str) -> None:
    spec = GpufedSpec.model_validate(
        {
            "cluster": "c",
            "regions": [{"name": "r-a", "shards": 1}],
            "jobs": [
                {
                    "name": "gpu",
                    "scrape_interval": "1h30m",
                    "scrape_timeout": "1m",
                    "keep_metrics": GOOD_RE2,
                    "drop_labels": ["exported_instance", "pod"],
                },
                {"name": "node", "scrape_interval": "1s", "metrics_path": "/x/metrics", "scheme": "https"},
            ],
            "remote_write": [
                {"name": "m", "url": "https://[fd00::1]:9090/api/v1/write", "remote_timeout": "5ms"}
            ],
            "external_labels": {"_tenant": "", "env": "prod"},
            "children": {
                "target_discovery": "http_sd",
                "http_sd_url": "http://ctl.local:8080/",
                "scrape_interval": "1s",
            },
        }
    )
    target = Target(address="fd00::2", port=9400, job="gpu", node="n1", region="r-a", gpus=8)
    result = pipeline.render(spec, [target], out=tmp_path / "out", checker=Promtool(promtool))
    assert result.checked == 1


REFUSED_HEADERS = [
    "Authorization",
    "user-agent",
    "Content-Type",
    "X-Prometheus-Remote-Write-Version",
    "X-Amz-Date",
]
REFUSED_HEADERS += ["Host", "Accept-Encoding", "Connection", "Bad Header", "X:Y"]


@pytest.mark.parametrize("name", REFUSED_HEADERS)
def test_remote_write_headers_prometheus_refuses_are_refused_at_load(name: str) -> None:
    message = spec_error(remote_write=[{"name": "m", "url": "http://m/w", "headers": {name: "v"}}])
    assert message.startswith("federation.yaml: field 'remote_write[0].headers'")


def test_reserved_headers_match_what_promtool_refuses(tmp_path: Path, promtool: str) -> None:
    """Our list against the real tool: each reserved name refused, an ordinary one accepted."""
    checker = Promtool(promtool)
    names = [*sorted(RESERVED_HEADERS), "authorization"]
    for i, name in enumerate(names):
        write = {"url": "http://m/w", "headers": {name.title(): "v"}}
        (tmp_path / f"h{i}.yml").write_bytes(output.dump_yaml({"remote_write": [write]}))
    for i, _ in enumerate(names):
        with pytest.raises(ConfigCheckError, match="header"):
            checker.check(tmp_path, f"h{i}.yml")
    ok = {"remote_write": [{"url": "http://m/w", "headers": {"X-Scope-OrgID": "gpu"}}]}
    (tmp_path / "ok.yml").write_bytes(output.dump_yaml(ok))
    checker.check(tmp_path, "ok.yml")
    assert parse_model(
        FederationSpec,
        {**BASE, "remote_write": [{"name": "m", "url": "http://m/w", "headers": {"X-Scope-OrgID": "gpu"}}]},
        source="f",
    )
