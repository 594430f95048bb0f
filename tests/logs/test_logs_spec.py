"""The ``logs:`` section refuses what Loki would refuse or misuse, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from federation.spec import load_gpufed_spec
from logs import loki
from sharder.kernel.errors import SpecError
from thanos.objstore import S3Store

ROOT = Path(__file__).resolve().parents[2]


def spec_with(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "federation.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"logs": {"retention": "36h"}}, "whole days"),
        ({"logs": {"retention": "12h"}}, "whole days"),
        ({"logs": {"storage_prefix": "logs/loki"}}, "letters, digits and '-'"),
        ({"logs": {"units": ["kubelet"]}}, "not a systemd service unit"),
        ({"logs": {"retentoin": "30d"}}, "retentoin"),
        ({"thanos": None, "logs": {}}, "add a thanos section"),
    ],
)
def test_bad_logs_sections_are_refused(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    if "thanos" in changes:
        changes = {**changes, "master": {"replicas": 1}}
    with pytest.raises(SpecError) as caught:
        load_gpufed_spec(spec_with(tmp_path, **changes))
    assert message in str(caught.value)
    assert "Traceback" not in str(caught.value)


def test_same_prefix_as_thanos_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "examples" / "federation.yaml").read_text())
    data["thanos"]["objstore"]["prefix"] = "loki"
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="their own prefixes"):
        load_gpufed_spec(path)


def test_sse_c_is_refused_for_loki() -> None:
    store = S3Store.model_validate(
        {
            "type": "S3",
            "config": {
                "bucket": "b",
                "endpoint": "s3.example:9000",
                "sse": {"type": "SSE-C", "encryption_key_file": "/run/secrets/k"},
            },
        }
    )
    with pytest.raises(ValueError, match="SSE-C"):
        loki.object_store(store, prefix="loki")
