"""The master Prometheus: ``master/prometheus.yml``, its flags and the rule pack beside it.

Pipeline position: ``federation.master.pipeline.master_part`` calls ``render_master_bundle`` with
the loaded rule pack (``load_rule_pack``, the only function here that reads files; its
``freshness.yml`` is rendered again from the spec, ``federation.master.freshness``); the
bundle is written under ``master/`` and ``promtool check config`` runs on it (which also
checks every rule file) before the output tree is swapped.

What the config wires together:

* the children's remote_write lands here (``--web.enable-remote-write-receiver`` in
  ``flags.json``), and the rule pack evaluates over every region;
* ``alerting.alertmanagers`` lists every Alertmanager replica (never a VIP), and
  ``alert_relabel_configs`` drops the replica labels, so the copies an HA pair of children
  (or of masters) produce are one alert to Alertmanager, and clears ``shard`` on alerts
  about one machine, so the copies the old and the new shard produce during a hand-over
  are one alert too (see ``SHARD_OF_MACHINE_ALERTS``);
* ``scrape_configs`` are the meta-monitoring jobs (``federation.master.meta_monitoring``): the
  children through the controller's ``/v1/sd-children``, the controllers, Alertmanagers,
  relay, Thanos components and the master replicas;
* ``remote_write`` forwards everything to the long-term store (``master.long_term``): with
  Thanos Receive (the default when ``thanos.mode`` is ``receive``) with the tenant header, one
  tenant (the cluster) or one per region plus the cluster tenant for series with no region;
  with VictoriaMetrics or another receiver, one write to its URL. Every write gets the
  spec's ``queue_config`` (``MasterQueueConfig``: capacity 50000, max_shards 100 by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

from alertmanager import ha
from federation.master import freshness, meta_monitoring
from federation.master_spec import REPLICA_ENV, LongTermSpec, MasterSpec
from federation.spec import GpufedSpec
from sharder.kernel import prometheus_versions
from sharder.kernel.output import Bundle, dump_json, dump_yaml
from sharder.kernel.tls import TlsSpec
from thanos.models import RECEIVE_REPLICA_LABEL, ThanosSpec
from thanos.render import MasterInstance

MASTER_FILE = "master/prometheus.yml"
FLAGS_FILE = "master/flags.json"
RULES_DIR = "master/rules"
#: Labels that tell copies of one series apart; an alert must not carry them.
DEDUP_LABELS = ("replica", RECEIVE_REPLICA_LABEL)
#: During a make-before-break hand-over the old and the new shard's children both scrape a
#: target; an alert computed here per target (a GPU too hot on node X) then comes out twice,
#: differing only in ``shard``. Alerts about one machine carry its name in ``node``, so
#: ``shard`` is cleared on those (an empty replacement removes the label). Alerts about a
#: shard or a child's remote_write carry the rule pack's ``node="*"`` placeholder and keep
#: ``shard``: it is what tells them apart. PrometheusChildDown names the child's host in
#: ``node`` and so loses ``shard``; its ``instance`` still tells children apart and its
#: summary names the shard. (The rule pack itself aggregates ``without (shard, replica)``
#: before alerting; this also covers rules added through ``extra_rule_files``.)
SHARD_OF_MACHINE_ALERTS: dict[str, Any] = {
    "action": "replace",
    "source_labels": ["node"],
    "regex": "[^*].*",
    "target_label": "shard",
    "replacement": "",
}


def load_rule_pack() -> dict[str, bytes]:
    """The GPU rule pack shipped with gpufed: file name -> bytes."""
    pack = resources.files("federation.rules")
    return {
        p.name: p.read_bytes()
        for p in sorted(pack.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".yml")
    }


def master_instances(spec: GpufedSpec) -> list[MasterInstance]:
    master = spec.master
    if master is None:
        return []
    return [
        MasterInstance(
            name=name,
            host=master.replica_host(i),
            prometheus_url=f"http://127.0.0.1:{master.port}",
            tsdb_path=master.data_dir,
        )
        for i, name in enumerate(master.replica_names())
    ]


#: The ``name`` of the one remote_write a long-term store that is not Thanos gets; it is
#: the ``remote_name`` label of the master's ``prometheus_remote_storage_*`` series.
WRITE_NAMES = {"victoriametrics": "victoriametrics", "remote_write": "long-term"}


def long_term_of(spec: GpufedSpec) -> LongTermSpec | None:
    """Where the master remote-writes: ``master.long_term``, else Thanos Receive if it runs."""
    assert spec.master is not None
    if spec.master.long_term is not None:
        return spec.master.long_term
    if spec.thanos is not None and spec.thanos.mode == "receive":
        return LongTermSpec(kind="thanos")
    return None


def _write_settings(long_term: LongTermSpec, tls: TlsSpec | None) -> dict[str, Any]:
    """What every remote_write to the store shares: queue, timeout, credentials, TLS."""
    settings: dict[str, Any] = {"queue_config": long_term.queue_config.model_dump(exclude_none=True)}
    if tls is not None and tls.hops.long_term:
        settings["tls_config"] = tls.client_config()
    if long_term.remote_timeout is not None:
        settings["remote_timeout"] = long_term.remote_timeout
    if long_term.basic_auth is not None:
        settings["basic_auth"] = long_term.basic_auth.model_dump()
    if long_term.authorization is not None:
        settings["authorization"] = long_term.authorization.model_dump()
    return settings


def _remote_write(spec: GpufedSpec, master: MasterSpec, long_term: LongTermSpec) -> list[dict[str, Any]]:
    if long_term.kind == "thanos":
        assert spec.thanos is not None
        writes = _thanos_writes(spec, master, spec.thanos)
    else:
        assert long_term.url is not None
        writes = [{"name": WRITE_NAMES[long_term.kind], "url": long_term.url}]
    shared = _write_settings(long_term, spec.tls)
    return [{**write, **shared} for write in writes]


def _thanos_writes(spec: GpufedSpec, master: MasterSpec, thanos: ThanosSpec) -> list[dict[str, Any]]:
    receive = thanos.receive
    assert receive is not None
    url, header = thanos.receive_url(), receive.tenant_header
    if master.tenants == "single":
        return [{"name": "thanos-receive", "url": url, "headers": {header: spec.cluster}}]
    regions = spec.region_names()
    writes: list[dict[str, Any]] = [
        {
            "name": f"thanos-{region}",
            "url": url,
            "headers": {header: region},
            "write_relabel_configs": [{"source_labels": ["region"], "regex": region, "action": "keep"}],
        }
        for region in regions
    ]
    writes.append(
        {
            "name": "thanos-cluster",
            "url": url,
            "headers": {header: spec.cluster},
            "write_relabel_configs": [
                {"source_labels": ["region"], "regex": "|".join(regions), "action": "drop"}
            ],
        }
    )
    return writes


def _alerting(spec: GpufedSpec) -> dict[str, Any] | None:
    if spec.alerting is None:
        return None
    block = ha.prometheus_alerting(spec.alerting, cluster=spec.cluster, tls=spec.tls)
    block.setdefault("alert_relabel_configs", []).extend(
        [{"action": "labeldrop", "regex": "|".join(DEDUP_LABELS)}, dict(SHARD_OF_MACHINE_ALERTS)]
    )
    return block


def render_master_config(spec: GpufedSpec) -> dict[str, Any]:
    master = spec.master
    assert master is not None
    external = dict(master.external_labels)
    external["cluster"] = spec.cluster
    external["replica"] = "master-0" if master.replicas == 1 else f"${{{REPLICA_ENV}}}"
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": master.scrape_interval,
            "evaluation_interval": master.evaluation_interval,
            "external_labels": external,
        },
        "scrape_configs": meta_monitoring.scrape_jobs(spec),
    }
    rule_files = (["rules/*.yml"] if master.rule_pack else []) + list(master.extra_rule_files)
    if rule_files:
        config["rule_files"] = rule_files
    alerting = _alerting(spec)
    if alerting is not None:
        config["alerting"] = alerting
    long_term = long_term_of(spec)
    if long_term is not None:
        config["remote_write"] = _remote_write(spec, master, long_term)
    return config


def master_flags(spec: GpufedSpec) -> dict[str, Any]:
    """``flags.json``: flags every replica runs with, and each replica's environment."""
    master = spec.master
    assert master is not None
    flags = [
        f"--storage.tsdb.path={master.data_dir}",
        f"--storage.tsdb.retention.time={master.retention}",
        f"--web.listen-address=0.0.0.0:{master.port}",
        "--web.enable-remote-write-receiver",
        "--web.enable-lifecycle",
    ]
    if master.external_url is not None:
        # One URL for every replica: the alerts' source links point where users can go.
        flags.append(f"--web.external-url={master.external_url}")
    if master.query.max_concurrency is not None:
        # Grafana panels and the rule pack share this limit; Prometheus queues the rest.
        flags.append(f"--query.max-concurrency={master.query.max_concurrency}")
    rendering = spec.prometheus.rendering()
    if any(write.protocol == "2.0" for write in spec.remote_write):
        # The children send 2.0 only where the spec opts in; the master then takes both.
        # The flag repeats (one message each), as `prometheus --help` shows it ("...").
        flags += [f"--web.remote-write-receiver.accepted-protobuf-messages={message}"
                  for message in (prometheus_versions.REMOTE_WRITE_V1_MESSAGE,
                                  prometheus_versions.REMOTE_WRITE_V2_MESSAGE)]
    if master.replicas > 1:
        # replica=${GPUFED_MASTER_REPLICA} in external_labels: 2.x expands it behind a feature flag.
        flags += rendering.external_label_env_flags
    if spec.thanos is not None and spec.thanos.mode == "sidecar":
        # The sidecar uploads only blocks Prometheus never compacts further.
        flags += ["--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"]
    replicas = {
        name: {"host": master.replica_host(i), "env": {REPLICA_ENV: name} if master.replicas > 1 else {}}
        for i, name in enumerate(master.replica_names())
    }
    return {"config": "prometheus.yml", "flags": flags, "replicas": replicas}


def render_master_bundle(spec: GpufedSpec, *, rule_pack: Mapping[str, bytes]) -> Bundle:
    master = spec.master
    assert master is not None
    bundle: Bundle = {
        MASTER_FILE: dump_yaml(render_master_config(spec)),
        FLAGS_FILE: dump_json(master_flags(spec)),
    }
    if master.rule_pack:
        bundle.update({f"{RULES_DIR}/{name}": data for name, data in rule_pack.items()})
        # The shipped freshness.yml holds examples/federation.yaml's bounds; this spec's own.
        bundle[f"{RULES_DIR}/{freshness.FILE_NAME}"] = freshness.render_file(spec)
    return bundle
