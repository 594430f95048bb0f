"""``gpufed serve --store kubernetes``: the settings build a KubeStore in the pod's namespace
(the stand-in API of federation/testing/standins/kube.py, reached through a kubeconfig file), and
settings that cannot work name their flag."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from federation.commands.cli import _register, app
from federation.controller.http.service import ServeSettings, SettingsError, build_elector, build_store
from federation.controller.stores.kube_store import KubeStore
from federation.controller.stores.store import StoreError
from federation.spec import load_gpufed_spec
from federation.testing.harnesses.replicas import ReplicaSet, write_fleet
from federation.testing.standins.kube import FakeKubeAPI
from tests.controller.ha_helpers import state
from tests.controller.harness import TOKEN, write_spec
from tests.controller.store_backends import kube_store


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


@pytest.mark.e2e
@pytest.mark.slow
def test_two_serve_processes_share_configmap_state_and_a_lease_and_fail_over(tmp_path: Path) -> None:
    """Real replicas on the stand-in API alone (no Consul): one leads by the Lease, both serve
    the state kept in ConfigMaps, and the follower takes over on SIGTERM moving nothing."""
    with FakeKubeAPI() as fake:
        config = kubeconfig(fake, tmp_path / "kubeconfig")
        spec, inventory = write_fleet(tmp_path, nodes=120, regions={"r1": 3})
        rs = ReplicaSet(
            workdir=tmp_path, spec=spec, inventory=inventory, consul="unused", ttl_s=10,
            election="kubernetes", store="kubernetes",
            extra_args=("--lease-kubeconfig", config, "--lease-namespace", "monitoring",
                        "--store-namespace", "monitoring", "--store-prefix", "gpufed-state"),
        )  # fmt: skip
        try:
            rs.start(2)
            leader = rs.one_leader(timeout=90)
            rs.settled(timeout=90)
            (follower,) = [r for r in rs.replicas if r is not leader]
            refused = rs.write(follower, "/v1/plan", {"add_shard": ["r1"]})
            assert refused.status_code == 503 and refused.json()["leader"] == leader.url
            before = rs.placement(follower)
            assert before == rs.placement(leader) and len(before) == 240  # 120 nodes, 2 jobs
            stored = kube_store(fake).load()
            assert stored is not None and stored.assignment is not None
            assert stored.assignment.targets == before
            lease = fake.objects["leases", "monitoring", "gpufed-controller"]
            assert lease["spec"]["holderIdentity"] == leader.name

            leader.proc.send_signal(signal.SIGTERM)  # a pod being deleted: resign, then exit
            leader.proc.wait(30)
            assert rs.one_leader(timeout=60) is follower
            assert rs.placement(follower) == before
            lease = fake.objects["leases", "monitoring", "gpufed-controller"]
            assert lease["spec"]["holderIdentity"] == follower.name
        finally:
            rs.close()
