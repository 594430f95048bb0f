"""``gpufed serve --store kubernetes``: the settings build a KubeStore in the pod's namespace
(the stand-in API of tests/fakes/kube_api.py, reached through a kubeconfig file), and
settings that cannot work name their flag."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from federation.cli import _register, app
from federation.controller.kube_store import KubeStore
from federation.controller.service import ServeSettings, SettingsError, build_elector, build_store
from federation.controller.store import StoreError
from federation.spec import load_gpufed_spec
from tests.controller.ha_helpers import state
from tests.controller.harness import TOKEN, write_spec
from tests.fakes.kube_api import FakeKubeAPI


def kubeconfig(fake: FakeKubeAPI, path: Path) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
        "users": [{"name": "ci", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "ci"}}],
    }))  # fmt: skip
    return str(path)


def settings(tmp_path: Path, **overrides: Any) -> ServeSettings:
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    values: dict[str, Any] = {
        "spec": load_gpufed_spec(spec), "data_dir": tmp_path / "d", "store_url": "kubernetes",
        "env": {"POD_NAME": "gpufed-controller-0", "POD_NAMESPACE": "monitoring"},
    }  # fmt: skip
    return ServeSettings(**(values | overrides))


def test_store_kubernetes_keeps_the_state_in_configmaps_of_the_pods_namespace(tmp_path: Path) -> None:
    with FakeKubeAPI() as fake:
        config = kubeconfig(fake, tmp_path / "kubeconfig")
        store = build_store(settings(tmp_path, kubeconfig=config, store_prefix="rel-state"))
        assert isinstance(store, KubeStore) and store.where == "kubernetes://monitoring/rel-state"
        saved = store.save(state(), expected_revision=None)
        store.close()
        assert ("configmaps", "monitoring", "rel-state") in fake.objects
        other = build_store(settings(tmp_path, kubeconfig=config, store_prefix="rel-state",
                                     store_namespace="gpufed-system"))  # fmt: skip
        assert other.load() is None  # --store-namespace wins over the pod's namespace
        again = build_store(settings(tmp_path, kubeconfig=config, store_prefix="rel-state"))
        assert again.load() == saved


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"env": {}}, SettingsError, "--store-namespace: give the state's namespace"),
        ({"store_namespace": "Bad NS"}, SettingsError, "--store-namespace: give the state's namespace"),
        ({"store_prefix": "Bad_Prefix", "kubeconfig": "K"}, StoreError, "--store-prefix: not a lowercase"),
        ({}, StoreError, "--store kubernetes: no cluster credentials from the pod's service account"),
    ],
)
def test_settings_that_cannot_work_name_their_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], error: type, message: str
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    with FakeKubeAPI() as fake:
        if overrides.get("kubeconfig") == "K":
            overrides["kubeconfig"] = kubeconfig(fake, tmp_path / "kubeconfig")
        with pytest.raises(error) as caught:
            build_store(settings(tmp_path, **overrides))
    assert message in str(caught.value)


def test_an_elected_leader_accepts_the_kubernetes_store(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="needs --advertise-url"):  # past the shared-store check
        build_elector(settings(tmp_path, election="kubernetes"))


def test_cli_store_kubernetes_without_credentials_exits_2_naming_the_flag(tmp_path: Path) -> None:
    _register()
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    result = CliRunner().invoke(
        app,
        ["serve", "--spec", str(spec), "--data-dir", str(tmp_path / "d"), "--store", "kubernetes",
         "--store-namespace", "monitoring", "--store-prefix", "gpufed-state"],
        env={**env, "GPUFED_TOKEN": TOKEN, "KUBERNETES_SERVICE_HOST": ""},
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--store kubernetes: no cluster credentials" in result.output
    assert "Traceback" not in result.output
