"""The Kubernetes source with the official client against federation/testing/standins/kube.py (a stand-in).

This fake serves what kmock does not: resourceVersion bookkeeping, label selectors,
bookmarks, watch timeouts and 410 Gone (see its docstring).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import kubernetes
import pytest
from conftest import wait_for

from federation.testing.standins.kube import FakeKubeAPI
from sharder.live.reconcile import Reconciler
from sharder.sources.base import Backoff
from sharder.sources.kubernetes import KubernetesConfig, KubernetesSource
from tests.sharder.sources.helpers import FakeClock, RecordingSink, make_spec
from tests.sharder.sources.k8s_objects import endpoint, endpoint_slice, node, pod


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as fake:
        yield fake


def client_for(api: FakeKubeAPI) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = api.url
    return kubernetes.client.ApiClient(configuration)


def source_for(api: FakeKubeAPI, sink: object, **kw: object) -> KubernetesSource:
    config = KubernetesConfig(watch_timeout_s=1, **kw)  # type: ignore[arg-type]
    return KubernetesSource(config, sink=sink, api_client=client_for(api))  # type: ignore[arg-type]


def seed(api: FakeKubeAPI) -> None:
    for i in range(3):
        api.apply("nodes", node(f"gpu-{i}", zone=f"z{i}"))
    api.apply("endpointslices", endpoint_slice("exp-abc", [
        endpoint("10.2.0.1", "gpu-0"), endpoint("10.2.0.2", "gpu-1", ready=False),
        endpoint("10.2.0.3", "gpu-2", ready=None)]))
    api.apply("endpointslices", endpoint_slice("other-xyz", [endpoint("10.9.0.1", "gpu-0")], service="other"))


def test_lists_ready_endpoints_joined_with_nodes(api: FakeKubeAPI) -> None:
    seed(api)
    sink = RecordingSink()
    source = source_for(api, sink)
    assert source.sync()
    targets = sink.changes[-1][1]
    assert [(t.address, t.port, t.node, t.region, t.rack, t.gpus) for t in targets] == [
        ("10.2.0.1", 9400, "gpu-0", "r1", "z0", 8), ("10.2.0.3", 9400, "gpu-2", "r1", "z2", 8)]
    assert targets[0].labels == {"pod": "exporter-gpu-0", "namespace": "monitoring"}
    assert any("labelSelector=kubernetes.io/service-name%3Dgpufed-exporter" in r for r in api.requests)


def test_answered_once_both_resources_were_listed(api: FakeKubeAPI) -> None:
    """A set pushed after the nodes' list alone holds no endpoint: the source has not
    answered (``/readyz`` waits for it) until the endpoints were listed too."""
    seed(api)
    sink = RecordingSink()
    source = source_for(api, sink)
    assert source.relist(source.nodes)
    assert sink.changes[-1][1] == [] and source.answered is False
    assert source.relist(source.endpoints)
    assert source.answered and len(sink.changes[-1][1]) == 2


def test_watch_follows_changes_and_bookmarks_advance_the_version(api: FakeKubeAPI) -> None:
    seed(api)
    sink = RecordingSink()
    source = source_for(api, sink)
    source.sync()
    stream = source.endpoints
    api.apply("endpointslices", endpoint_slice("exp-abc", [endpoint("10.2.0.1", "gpu-0"),
                                                           endpoint("10.2.0.2", "gpu-1")]))
    api.bookmark()
    assert source.watch_once(stream)  # ends after timeoutSeconds=1
    assert [t.address for t in sink.changes[-1][1]] == ["10.2.0.1", "10.2.0.2"]
    assert stream.version == str(api.revision)  # the bookmark moved it past the unrelated writes
    assert "resourceVersion=" in api.requests[-1] and "allowWatchBookmarks=true" in api.requests[-1]


def test_410_gone_relists_without_losing_targets(api: FakeKubeAPI) -> None:
    seed(api)
    clock = FakeClock()
    rec = Reconciler(spec=make_spec(), clock=clock)
    source = source_for(api, rec)
    source.sync()
    clock.advance(1)
    before = rec.tick()
    assert before is not None and len(rec.targets) == 2
    api.apply("endpointslices", endpoint_slice("exp-def", [endpoint("10.2.0.4", "gpu-1")]))
    api.compact()  # the watch's version is now too old
    relists = source.endpoints.relists
    assert source.watch_once(source.endpoints)
    assert source.endpoints.relists == relists + 1
    clock.advance(1)
    after = rec.tick()
    assert after is not None and len(rec.targets) == 3
    assert all(after.targets[i] == s for i, s in before.targets.items())  # nothing lost, nothing moved


def test_a_watch_refused_with_http_410_relists_instead_of_retrying_the_old_version(api: FakeKubeAPI) -> None:
    seed(api)
    sink = RecordingSink()
    source = source_for(api, sink)
    source.sync()
    known = [t.address for t in sink.changes[-1][1]]
    relists = source.endpoints.relists
    api.fail_next.append(410)  # the watch request itself answers 410, no ERROR event
    assert source.watch_once(source.endpoints)
    assert source.endpoints.relists == relists + 1 and sink.errors[-1] == ("kubernetes", "gone")
    assert [t.address for t in sink.changes[-1][1]] == known


def test_api_errors_keep_the_last_set_and_node_changes_apply(api: FakeKubeAPI) -> None:
    seed(api)
    sink = RecordingSink()
    source = source_for(api, sink)
    source.sync()
    pushes = len(sink.changes)
    api.fail_next.append(500)
    assert not source.relist(source.endpoints)
    assert sink.errors[-1] == ("kubernetes", "api_error") and len(sink.changes) == pushes
    api.fail_next.append(403)
    assert not source.watch_once(source.nodes)
    assert sink.errors[-1] == ("kubernetes", "forbidden")
    api.apply("nodes", node("gpu-0", zone="z9", gpus="4"))
    assert source.watch_once(source.nodes)
    first = sink.changes[-1][1][0]
    assert (first.node, first.rack, first.gpus) == ("gpu-0", "z9", 4)


def test_pods_by_selector_mode(api: FakeKubeAPI) -> None:
    api.apply("nodes", node("gpu-0"))
    api.apply("pods", pod("exp-1", "10.3.0.1", "gpu-0"))
    api.apply("pods", pod("exp-2", "10.3.0.2", "gpu-0", ready=False))
    sink = RecordingSink()
    assert source_for(api, sink, service=None).sync()
    assert [t.address for t in sink.changes[-1][1]] == ["10.3.0.1"]


def test_run_restarts_watches_with_backoff_after_errors(api: FakeKubeAPI) -> None:
    seed(api)
    api.fail_next.extend([500, 503])
    sink = RecordingSink()
    config = KubernetesConfig(watch_timeout_s=1)
    source = KubernetesSource(config, sink=sink, api_client=client_for(api),  # type: ignore[arg-type]
                              backoff=lambda: Backoff(initial=0.02, maximum=0.1))
    stop = threading.Event()
    thread = threading.Thread(target=source.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(sink.changes) >= 2, timeout=10, what="both streams listed")
        api.apply("endpointslices", endpoint_slice("exp-new", [endpoint("10.2.0.9", "gpu-1")]))
        wait_for(lambda: "10.2.0.9" in {t.address for t in sink.changes[-1][1]}, timeout=10,
                 what="the watch to deliver the new slice")
    finally:
        stop.set()
        thread.join(timeout=5)
    assert ("kubernetes", "api_error") in sink.errors and not thread.is_alive()


def test_kubeconfig_file_is_used_when_given(api: FakeKubeAPI, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seed(api)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: fake, cluster: {{server: '{api.url}'}}}}]\n"
        "users: [{name: watcher, user: {token: t0ken}}]\n"
        "contexts: [{name: test, context: {cluster: fake, user: watcher}}]\n"
    )
    sink = RecordingSink()
    source = KubernetesSource(KubernetesConfig(kubeconfig=str(kubeconfig)), sink=sink)
    assert source.sync() and len(sink.changes[-1][1]) == 2


def test_a_relist_validates_only_what_changed(api: FakeKubeAPI) -> None:
    seed(api)
    sink = RecordingSink()
    source = source_for(api, sink)
    source.sync()
    first = sink.changes[-1][1]
    api.apply("nodes", node("gpu-2", zone="z7"))
    source.sync()
    second = sink.changes[-1][1]
    assert second[0] is first[0]  # unchanged endpoint: the same validated Target
    assert second[1] is not first[1] and second[1].rack == "z7"
