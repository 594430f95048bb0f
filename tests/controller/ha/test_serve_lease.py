"""``gpufed serve --leader-election kubernetes``: the Lease elector wired into serve.

What ``helm/gpufed`` runs: two replicas, a shared Consul KV store, and one
``coordination.k8s.io`` Lease named by ``--lease-name``, in ``POD_NAMESPACE``, held as
``POD_NAME``. The API server is kmock with the optimistic lock of ``test_lease``; the
store is the Consul stand-in in its own process, as in ``test_failover_e2e``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from federation.commands.cli import _register, app
from federation.controller.ha.lease import ADDRESS_ANNOTATION, LeaseElector
from federation.controller.http.service import ServeSettings, SettingsError, build_elector
from federation.spec import load_gpufed_spec
from federation.testing.harnesses.replicas import ReplicaSet, Standin, write_fleet
from tests.controller.ha.test_lease import LEASES, LeaseStore
from tests.controller.harness import TOKEN, write_spec

STORE = "consul://127.0.0.1:1/gpufed"


def kubeconfig_for(kmock: Any, path: Path) -> Path:
    """A kubeconfig file whose cluster is kmock."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "ci", "user": {"token": "not-checked-by-kmock"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "ci"}}],
    }))  # fmt: skip
    return path


def settings(tmp_path: Path, **overrides: Any) -> ServeSettings:
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    values: dict[str, Any] = {
        "spec": load_gpufed_spec(spec), "data_dir": tmp_path / "d", "election": "kubernetes",
        "store_url": STORE, "advertise_url": "http://10.0.0.5:8080",
        "env": {"POD_NAME": "gpufed-controller-7d9f-abcde", "POD_NAMESPACE": "monitoring"},
    }  # fmt: skip
    return ServeSettings(**(values | overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"store_url": None}, "--leader-election kubernetes needs a shared store: --store kubernetes or"),
        ({"advertise_url": None}, "--leader-election kubernetes needs --advertise-url"),
        ({"lease_name": "Gpufed_Ctl"}, "--lease-name: not a Kubernetes object name: 'Gpufed_Ctl'"),
        ({"env": {"POD_NAME": "p"}}, "--lease-namespace: give the Lease's namespace"),
        ({"lease_namespace": "Bad NS"}, "--lease-namespace: give the Lease's namespace"),
        ({}, "no cluster credentials from the pod's service account"),
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "no cluster credentials from --kubeconfig /nonexistent"),
        ({"election": "raft"}, "--leader-election: expected kubernetes, consul or none, got 'raft'"),
    ],
)
def test_settings_that_cannot_work_name_their_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], message: str
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    with pytest.raises(SettingsError) as caught:
        build_elector(settings(tmp_path, **overrides))
    assert message in str(caught.value)


@pytest.mark.asyncio
async def test_serve_holds_the_named_lease_as_this_pod(kmock: Any, tmp_path: Path) -> None:
    store = LeaseStore(kmock)
    kubeconfig = str(kubeconfig_for(kmock, tmp_path / "kubeconfig"))
    elector = build_elector(
        settings(tmp_path, kubeconfig=kubeconfig, lease_name="rel-controller", lock_ttl_s=20)
    )
    assert isinstance(elector, LeaseElector)
    assert await asyncio.to_thread(elector.try_acquire_or_renew)
    lease = dict(kmock.objects[LEASES, "monitoring", "rel-controller"].raw)
    assert lease["spec"]["holderIdentity"] == "gpufed-controller-7d9f-abcde"
    assert lease["spec"]["leaseDurationSeconds"] == 20
    assert lease["metadata"]["annotations"] == {ADDRESS_ANNOTATION: "http://10.0.0.5:8080"}
    assert elector.is_leader() and elector.fence() == 0 and store.conflicts == 0
    # --lease-namespace wins over the pod's namespace
    other = build_elector(settings(tmp_path, kubeconfig=kubeconfig, lease_namespace="gpufed-system"))
    assert await asyncio.to_thread(other.try_acquire_or_renew)
    assert (LEASES, "gpufed-system", "gpufed-controller") in kmock.objects


def test_cli_without_cluster_credentials_exits_2_naming_the_flag(tmp_path: Path) -> None:
    _register()
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    result = CliRunner().invoke(
        app,
        ["serve", "--spec", str(spec), "--data-dir", str(tmp_path / "d"), "--store", STORE,
         "--leader-election", "kubernetes", "--advertise-url", "http://10.0.0.5:8080",
         "--lease-namespace", "monitoring"],
        env={**env, "GPUFED_TOKEN": TOKEN, "KUBERNETES_SERVICE_HOST": ""},
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--leader-election kubernetes: no cluster credentials" in result.output
    assert "Traceback" not in result.output


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.asyncio
async def test_two_serve_processes_share_one_lease_and_hand_over_on_shutdown(
    kmock: Any, tmp_path: Path
) -> None:
    """Real replicas: one leader by the Lease, the follower names it; SIGTERM resigns, the
    follower takes over without waiting out the lease, and nothing moves."""
    LeaseStore(kmock)
    kubeconfig = kubeconfig_for(kmock, tmp_path / "kubeconfig")
    standin = await asyncio.to_thread(Standin.start)
    spec, inventory = write_fleet(tmp_path, nodes=120, regions={"r1": 3})
    rs = ReplicaSet(
        workdir=tmp_path, spec=spec, inventory=inventory, consul=standin.address, ttl_s=10,
        election="kubernetes",
        extra_args=("--lease-kubeconfig", str(kubeconfig), "--lease-namespace", "monitoring",
                    "--lease-name", "gpufed-controller"),
    )  # fmt: skip
    try:
        rs.start(2)  # each advertises http://127.0.0.1:<its port> (the chart: http://$(POD_IP):8080)
        leader = await asyncio.to_thread(rs.one_leader, timeout=90)
        await asyncio.to_thread(rs.settled, timeout=90)
        (follower,) = [r for r in rs.replicas if r is not leader]
        lease = dict(kmock.objects[LEASES, "monitoring", "gpufed-controller"].raw)
        assert lease["spec"]["holderIdentity"] == leader.name  # POD_NAME
        refused = await asyncio.to_thread(rs.write, follower, "/v1/plan", {"add_shard": ["r1"]})
        assert refused.status_code == 503 and refused.json()["leader"] == leader.url
        before = await asyncio.to_thread(rs.placement, follower)
        assert before == await asyncio.to_thread(rs.placement, leader)

        leader.proc.send_signal(signal.SIGTERM)  # a pod being deleted: resign, then exit
        await asyncio.to_thread(leader.proc.wait, 30)
        assert await asyncio.to_thread(rs.one_leader, timeout=60) is follower
        lease = dict(kmock.objects[LEASES, "monitoring", "gpufed-controller"].raw)
        assert lease["spec"]["holderIdentity"] == follower.name and lease["spec"]["leaseTransitions"] == 1
        assert await asyncio.to_thread(rs.placement, follower) == before
    finally:
        await asyncio.to_thread(rs.close)
        await asyncio.to_thread(standin.stop)
