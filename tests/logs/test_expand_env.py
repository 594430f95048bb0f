"""logs.expand_env: what alloy-config (compose/node.yml) does to the rendered Promtail file
before Alloy, which does not expand variables, reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from federation.master.pipeline import logs_part
from federation.spec import load_gpufed_spec
from logs import expand_env, formats, promtail

NODE = {
    "NODE_NAME": "gpu-node-007",
    "GPUFED_REGION": "cn-beijing",
    "GPUFED_RACK": "r12",
    "GPUFED_TEAM": "llm",
}


def rendered() -> str:
    spec = load_gpufed_spec(ROOT / "examples" / "federation.yaml")
    return logs_part(spec, [], None)[promtail.CONFIG_FILE].decode()  # type: ignore[arg-type]


def identity(config: dict) -> dict[str, object]:
    rules = config["scrape_configs"][0]["relabel_configs"]
    return {
        r["target_label"]: r.get("replacement")
        for r in rules
        if "target_label" in r and r["target_label"] in {"node", "region", "rack", "team"}
    }


def test_the_node_identity_lands_in_the_rendered_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "promtail.yml", tmp_path / "alloy" / "promtail.yml"
    src.write_text(rendered())
    for name, value in NODE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GPUFED_LOKI_URL", raising=False)
    assert expand_env.main([str(src), str(dst)]) == 0
    text = dst.read_text()
    assert "${" not in text
    formats.parse_promtail(text.encode())  # still a Promtail file, strictly parsed
    config = yaml.safe_load(text)
    assert identity(config) == {"node": "gpu-node-007", "region": "cn-beijing", "rack": "r12", "team": "llm"}
    assert config["clients"][0]["url"] == "http://loki:3100/loki/api/v1/push"  # the :- default
    monkeypatch.setenv("GPUFED_LOKI_URL", "http://mon-1:3100")
    monkeypatch.setenv("GPUFED_RACK", "")
    assert expand_env.main([str(src), str(dst)]) == 0
    config = yaml.safe_load(dst.read_text())
    assert config["clients"][0]["url"] == "http://mon-1:3100/loki/api/v1/push"
    # empty rack: a null replacement (Go's yaml.v2: ""), which drops the label, as Promtail's
    # own expansion does
    assert identity(config)["rack"] is None


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("a: ${X}", {"X": "1"}, "a: 1"),
        ("a: ${X}", {}, "a: "),
        ("a: ${X:-d}", {"X": ""}, "a: d"),
        ("a: ${X:-d}", {"X": "v"}, "a: v"),
        ("a: $$", {}, "a: $"),
    ],
)
def test_forms(text: str, env: dict[str, str], expected: str) -> None:
    assert expand_env.expand(text, env) == expected


@pytest.mark.parametrize("text", ["a: $X", "a: ${X=d}", "a: ${X:?e}", "b: 1\na: $"])
def test_other_forms_are_refused_with_their_line(text: str) -> None:
    with pytest.raises(expand_env.ExpandError, match=f"line {text.count(chr(10)) + 1}: unsupported"):
        expand_env.expand(text, {})


def test_unreadable_source_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expand_env.main([str(tmp_path / "missing.yml"), str(tmp_path / "out.yml")]) == 1
    assert "error:" in capsys.readouterr().err and not (tmp_path / "out.yml").exists()


def test_nothing_alloy_refuses_to_convert() -> None:
    """Alloy's Promtail converter stops `alloy run --config.format=promtail` on these
    (grafana/alloy internal/converter/internal/promtailconvert/validate.go): a WAL, a
    non-default limits_config, stdin targets, server.http_path_prefix."""
    config = yaml.safe_load(rendered())
    assert not config.get("wal", {}).get("enabled")
    assert "limits_config" not in config
    assert not config.get("target_config", {}).get("stdin")
    assert not config.get("server", {}).get("http_path_prefix")
