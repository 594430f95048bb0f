"""The three state stores, each opened on one backing storage by a factory (a fresh store
object per call is a second replica, or the same one after a restart).

SQLite is a file; Consul is the Consul stand-in (``federation.testing.standins.consul.agent``) through
py-consul; Kubernetes is ``federation/testing/standins/kube.py`` (a stand-in for the API server's
ConfigMap CRUD with its optimistic lock and 1 MiB limit) through the official client.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes

from federation.controller.base.state import Desired
from federation.controller.stores.kube_store import KubeStore
from federation.controller.stores.sqlite_store import SqliteStore
from federation.controller.stores.store import StateStore, StoreConflict
from federation.testing.standins.consul.agent import FakeConsulAgent
from federation.testing.standins.kube import FakeKubeAPI
from tests.controller.ha_helpers import store as consul_store

Opener = Callable[..., StateStore]
BACKENDS = ("sqlite", "consul", "kubernetes")


def kube_api(fake: FakeKubeAPI) -> kubernetes.client.CoreV1Api:
    configuration = kubernetes.client.Configuration()
    configuration.host = fake.url
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


def kube_store(fake: FakeKubeAPI, **kwargs: Any) -> KubeStore:
    return KubeStore(kube_api(fake), namespace="monitoring", **kwargs)


@contextmanager
def backend(name: str, tmp_path: Path) -> Iterator[Opener]:
    opened: list[StateStore] = []

    def remember(store: StateStore) -> StateStore:
        opened.append(store)
        return store

    try:
        if name == "sqlite":
            yield lambda **kw: remember(SqliteStore(tmp_path / "state.db", **kw))
        elif name == "consul":
            with FakeConsulAgent() as agent:
                yield lambda **kw: remember(consul_store(agent, **kw))
        else:
            with FakeKubeAPI() as fake:
                yield lambda **kw: remember(kube_store(fake, **kw))
    finally:
        for store in opened:
            store.close()


def race_writers(open_store: Callable[[], StateStore], *, writers: int, per_writer: int) -> list[str]:
    """``writers`` threads, each on its own store object, add ``per_writer`` desired weights
    one at a time, reloading and retrying on a lost check-and-set; the names that lost one."""
    conflicts: list[str] = []

    def writer(name: str) -> None:
        s = open_store()
        done = 0
        while done < per_writer:
            current = s.load()
            assert current is not None
            weights = {**current.desired.weights, f"{name}-{done}": 1}
            try:
                s.save(
                    current.model_copy(update={"desired": Desired(weights=weights)}),
                    expected_revision=current.revision,
                )
            except StoreConflict:
                conflicts.append(name)
                continue
            done += 1

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return conflicts
