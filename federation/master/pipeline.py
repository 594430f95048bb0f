"""Render and plan as plain functions: what ``gpufed render``/``plan`` and the controller call.

Pipeline: load spec + inventory -> lock the output -> read the previous
``assignment.json`` (sticky; ``sharder.children.previous_state``) ->
``sharder.engine.assigning`` -> refuse a mass removal -> bundle (relative path -> bytes,
composed from ``BUNDLE_PARTS``) -> write into a staging dir -> :func:`check_bundle`
(promtool/amtool, the one check) -> swap -> unlock.
A failed check or bad input leaves the existing output tree untouched.

More bundles (Alertmanager, master, Thanos) join by adding a ``BundlePart`` to the tuple or by
passing ``parts=``; the sharder never imports them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alertmanager import ha
from alertmanager.amtool import ConfigTool
from alertmanager.render import ALERTMANAGER_FILE, RELAY_FILE, render_alerting_bundle
from federation.dashboards import dashboard_files
from federation.grafana.render import relay_with_grafana, render_grafana_bundle
from federation.master import bundle_formats, compose_secrets, render_root
from federation.master.compose import render_compose_bundle
from federation.master.render import MASTER_FILE, load_rule_pack, master_instances, render_master_bundle
from federation.spec import GpufedSpec, load_gpufed_spec
from logs.render import render_logs_bundle
from sharder.children import previous_state, tree
from sharder.children.lock import output_lock
from sharder.engine import assigning, planning
from sharder.engine.assignment import Assignment
from sharder.kernel import output
from sharder.kernel.errors import OutputError
from sharder.kernel.promtool import ConfigChecker, WebConfigChecker, check_all
from sharder.kernel.tls import CLUSTER_TLS_FILE, HTTP_CLIENT_FILE, WEB_CONFIG_FILE
from sharder.model.inventory import Target
from sharder.model.loading import StaticFileSource
from thanos.render import render_thanos_bundle

BundlePart = Callable[[GpufedSpec, list[Target], Assignment], output.Bundle]


def sharder_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    return tree.build_bundle(spec, targets, assignment)


GRAFANA_DIR = "grafana/"


def refreshed_bundle(
    spec: GpufedSpec, targets: list[Target], assignment: Assignment, *, current: Mapping[str, bytes]
) -> output.Bundle:
    """:func:`build_bundle` for a children set that ``current`` already renders.

    Every child's config depends on the children set alone (HTTP SD; file_sd lists are
    written apart), and the alerting, master, Thanos, logs and TLS parts on the spec: they
    are kept as ``current`` has them. What follows the targets is made again: the
    manifest's counts, ``assignment.json`` and Grafana's folders (teams come from the
    targets' labels). A million targets' children are about 30 s of a core to render, this
    a few.
    """
    bundle = {path: body for path, body in current.items() if not path.startswith(GRAFANA_DIR)}
    bundle.update(tree.summary_files(spec, targets, assignment))
    bundle.update(grafana_part(spec, targets, assignment))
    return bundle


def alerting_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    """``alertmanager/`` files (config, HA flags, relay robots) when the spec has alerting."""
    del targets, assignment  # routing depends on the spec's regions, not on placement
    if spec.alerting is None:
        return {}
    bundle = render_alerting_bundle(spec.alerting, cluster=spec.cluster, regions=spec.region_names(),
                                    tls=spec.tls)
    if spec.grafana is not None and RELAY_FILE in bundle:  # messages link to Grafana and the nodes' logs
        bundle[RELAY_FILE] = relay_with_grafana(bundle[RELAY_FILE], spec.grafana.url)
    return bundle


def tls_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    """``tls/web-config.yml`` (the children's, the master's and the Alertmanagers'
    ``--web.config.file``), ``tls/http-client.yml`` (health checks' client) and
    ``tls/cluster-tls.yml`` (the Alertmanagers' ``--cluster.tls-config``, unless the ``gossip``
    hop is off) when the spec's ``tls`` section has ``serve``."""
    del targets, assignment
    document = spec.tls.web_config() if spec.tls is not None else None
    if spec.tls is None or document is None:
        return {}
    bundle = {WEB_CONFIG_FILE: output.dump_yaml(document),
              HTTP_CLIENT_FILE: output.dump_yaml(spec.tls.http_client_config())}
    peer = None if spec.alerting is None else ha.gossip_peer_name(spec.alerting)
    gossip = spec.tls.cluster_tls_config(peer_name=peer)
    if gossip is not None:
        bundle[CLUSTER_TLS_FILE] = output.dump_yaml(gossip)
    return bundle


def master_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    """``master/`` (config, flags, rule pack) when the spec has a master section."""
    del targets, assignment  # the master receives whatever the children send
    if spec.master is None:
        return {}
    return render_master_bundle(spec, rule_pack=load_rule_pack())


def thanos_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    """``thanos/`` (hashrings, objstore, component arguments) when the spec has a thanos section."""
    del targets, assignment
    if spec.thanos is None:
        return {}
    return render_thanos_bundle(spec.thanos, masters=master_instances(spec))


def logs_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    """``logs/`` (Promtail, Loki, the XID ruler rules) when the spec has a logs section."""
    del targets, assignment
    if spec.logs is None or spec.thanos is None:
        return {}
    alertmanagers = [f"http://{r.address}" for r in spec.alerting.replicas] if spec.alerting else []
    remote_write = spec.thanos.receive_url() if spec.thanos.receive is not None else None
    return render_logs_bundle(spec.logs, cluster=spec.cluster, objstore=spec.thanos.objstore,
                              alertmanagers=alertmanagers, remote_write=remote_write)


def grafana_prometheus_url(spec: GpufedSpec) -> str | None:
    """What Grafana reads metrics from by default: Thanos Query, else the first master; agent-mode
    children alone cannot be queried, so without either there is none."""
    if spec.thanos is not None:
        return f"http://thanos-query:{spec.thanos.query.http_port}"
    if spec.master is not None:
        return f"http://{master_instances(spec)[0].host}:{spec.master.port}"
    return None


def grafana_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    """``grafana/`` (datasources linked by node, one folder per team, HA) when the spec has grafana."""
    del assignment  # teams and their regions come from the targets' labels
    if spec.grafana is None:
        return {}
    return render_grafana_bundle(
        spec.grafana,
        targets=targets,
        regions=spec.region_names(),
        dashboards={p.name: p.read_bytes() for p in dashboard_files()},
        prometheus_url=grafana_prometheus_url(spec),
        loki_url=spec.logs.loki.url if spec.logs is not None else None,
        loki_tenant=spec.logs.loki.tenant if spec.logs is not None else "",
    )


BUNDLE_PARTS: tuple[BundlePart, ...] = (
    sharder_part, alerting_part, master_part, thanos_part, logs_part, grafana_part, tls_part,
)
TARGETS = ("prometheus", "compose")


def compose_part(*, out_name: str, resources: dict[str, dict[str, Any]] | None = None) -> BundlePart:
    """``compose/`` for ``--target compose``: services over what the other parts render.

    It renders those parts once more (pure and cheap) rather than reading the bundle being
    built, so every part keeps the one signature.
    """

    def part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
        files = build_bundle(spec, targets, assignment, parts=BUNDLE_PARTS)
        dashboards = {p.name: p.read_bytes() for p in dashboard_files()}
        receive = spec.thanos.receive if spec.thanos is not None else None
        routers = {r.name: r.host for r in receive.routers} if receive is not None else {}
        return render_compose_bundle(
            out_name=out_name,
            files=files,
            dashboards=dashboards,
            router_hosts=routers,
            http_sd_url=spec.children.http_sd_url,
            resources=resources,
            tls=spec.tls,
            alertmanager_secrets=compose_secrets.secret_files(spec.alerting),
        )

    return part


def target_parts(
    target: str, *, out: str | Path, resources: dict[str, dict[str, Any]] | None = None
) -> tuple[BundlePart, ...]:
    """The parts one ``--target`` renders: ``prometheus`` (the configs) or ``compose`` (plus services).

    ``resources``: compose services' ``deploy.resources`` by kind (``--fleet-nodes``).
    """
    if target not in TARGETS:
        raise OutputError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    if target == "compose":
        render_root.check_render_root(out)
        return (*BUNDLE_PARTS, compose_part(out_name=Path(out).resolve().name, resources=resources))
    return BUNDLE_PARTS


@dataclass(frozen=True)
class RenderResult:
    out: Path
    assignment: Assignment
    previous: Assignment | None
    manifest: dict[str, Any]
    checked: int
    """Child configs promtool accepted; 0 when checking was skipped."""
    alerting_checked: bool = False
    """amtool accepted ``alertmanager/alertmanager.yml``."""
    master_checked: bool = False
    """promtool accepted ``master/prometheus.yml`` and its rule files."""


def load_inputs(
    spec_path: str | Path, inventory_path: str | Path | None
) -> tuple[GpufedSpec, list[Target]]:
    """``inventory_path`` None: no static targets (compose nodes register with the controller)."""
    spec = load_gpufed_spec(spec_path)
    if inventory_path is None:
        return spec, []
    jobs = {job.name: job for job in spec.jobs}
    return spec, StaticFileSource(inventory_path, jobs=jobs).list_targets()


def build_bundle(
    spec: GpufedSpec,
    targets: list[Target],
    assignment: Assignment,
    *,
    parts: Sequence[BundlePart] = BUNDLE_PARTS,
) -> output.Bundle:
    """Merge every part's files; two parts writing one path is a bug, not a merge."""
    bundle: output.Bundle = {}
    for part in parts:
        files = part(spec, targets, assignment)
        clash = sorted(bundle.keys() & files.keys())
        if clash:
            raise OutputError(f"two bundle parts write {clash[0]}")
        bundle.update(files)
    return bundle


def render(
    spec: GpufedSpec,
    targets: list[Target],
    *,
    out: str | Path,
    checker: ConfigChecker | None,
    alert_checker: ConfigTool | None = None,
    allow_algorithm_change: bool = False,
    allow_mass_removal: bool = False,
    parts: Sequence[BundlePart] = BUNDLE_PARTS,
    workers: int = 8,
    lock_timeout: float = 0.0,
    warn: previous_state.Warn | None = None,
) -> RenderResult:
    """Assign (sticky to ``out``), render, check every child config, then swap ``out``.

    Holds ``out``'s lock throughout (waiting up to ``lock_timeout`` seconds for another
    run); refuses to drop more than ``spec.sharding.max_removal_share`` of the previous
    targets unless ``allow_mass_removal``. ``warn`` gets one line per repaired oddity.
    """
    with output_lock(out, timeout=lock_timeout):
        return _render_locked(
            spec,
            targets,
            out=Path(out),
            checker=checker,
            alert_checker=alert_checker,
            allow_algorithm_change=allow_algorithm_change,
            allow_mass_removal=allow_mass_removal,
            parts=parts,
            workers=workers,
            warn=warn,
        )


def _render_locked(
    spec: GpufedSpec,
    targets: list[Target],
    *,
    out: Path,
    checker: ConfigChecker | None,
    alert_checker: ConfigTool | None,
    allow_algorithm_change: bool,
    allow_mass_removal: bool,
    parts: Sequence[BundlePart],
    workers: int,
    warn: previous_state.Warn | None,
) -> RenderResult:
    previous = previous_state.load_previous(out, cluster=spec.cluster, warn=warn or _quiet)
    assignment = assigning.assign(
        spec, targets, previous=previous, allow_algorithm_change=allow_algorithm_change
    )
    previous_state.check_removal(
        previous, assignment, max_share=spec.sharding.max_removal_share, allow=allow_mass_removal
    )
    bundle = build_bundle(spec, targets, assignment, parts=parts)
    checks: list[BundleCheck] = []

    def validate(root: Path) -> None:
        checks.append(
            check_bundle(
                root,
                bundle,
                checker=checker,
                alert_checker=alert_checker,
                agent=spec.children.agent_mode,
                workers=workers,
            )
        )

    written = output.write_tree(out, bundle, validate=validate)
    done = checks[0]
    manifest = json.loads(bundle[output.MANIFEST_FILE])
    return RenderResult(
        out=written,
        assignment=assignment,
        previous=previous,
        manifest=manifest,
        checked=done.configs,
        alerting_checked=done.alerting,
        master_checked=done.master,
    )


@dataclass(frozen=True)
class BundleCheck:
    """What :func:`check_bundle` had checked (and accepted)."""

    configs: int
    """Child Prometheus configs promtool accepted."""
    master: bool = False
    alerting: bool = False


def check_bundle(
    root: Path,
    bundle: output.Bundle,
    *,
    checker: ConfigChecker | None,
    alert_checker: ConfigTool | None,
    agent: bool,
    previous: Mapping[str, bytes] | None = None,
    workers: int = 8,
) -> BundleCheck:
    """The one check of a bundle staged at ``root``, used by ``gpufed render``, the
    controller's publisher and the demo: promtool on every child config and the master's,
    amtool on Alertmanager's, strict models for Promtail, Loki and Grafana files. With
    ``previous`` (the bundle served now) only files whose bytes changed are checked: target
    lists and the assignment need no promtool at all.
    Raises ``ConfigCheckError`` (or the checker's error) on the first refusal."""

    def changed(path: str) -> bool:
        return previous is None or previous.get(path) != bundle[path]

    configs = [p for p in tree.prometheus_configs(bundle) if changed(p)]
    checked, master, alerting = 0, False, False
    if checker is not None:
        checked = check_all(checker, root, configs, agent=agent, workers=workers)
        if MASTER_FILE in bundle and changed(MASTER_FILE):
            checker.check(root, MASTER_FILE)
            master = True
    if isinstance(checker, WebConfigChecker) and WEB_CONFIG_FILE in bundle and changed(WEB_CONFIG_FILE):
        checker.check_web_config(root, WEB_CONFIG_FILE)
    if alert_checker is not None and ALERTMANAGER_FILE in bundle and changed(ALERTMANAGER_FILE):
        alert_checker.check_config(root / ALERTMANAGER_FILE)
        alerting = True
    # Promtail, Loki and Grafana files: no binary here, so their upstream structs' models
    modelled = [p for p in bundle if p.startswith(bundle_formats.PREFIXES) and changed(p)]
    bundle_formats.check_formats(bundle, modelled)
    return BundleCheck(configs=checked, master=master, alerting=alerting)


def _quiet(message: str) -> None:
    del message


def plan(
    spec: GpufedSpec,
    targets: list[Target],
    *,
    previous_dir: str | Path,
    allow_algorithm_change: bool = False,
    warn: previous_state.Warn | None = None,
) -> planning.Plan:
    """What a render into ``previous_dir`` would change; writes nothing."""
    previous = previous_state.load_previous(previous_dir, cluster=spec.cluster, warn=warn or _quiet)
    current = assigning.assign(
        spec, targets, previous=previous, allow_algorithm_change=allow_algorithm_change
    )
    return planning.diff(previous, current)


def summary(result: RenderResult) -> dict[str, Any]:
    """Machine summary of a render: totals and per-region load spread."""
    assignment = result.assignment
    counts = planning.diff(result.previous, assignment).counts
    load = assignment.load()
    sizes = Counter(assignment.targets.values())
    regions: dict[str, dict[str, Any]] = {}
    for shard, info in sorted(assignment.shards.items()):
        row = regions.setdefault(info.region, {"shards": 0, "targets": 0, "load": 0, "max_load": 0})
        row["shards"] += 1
        row["targets"] += sizes[shard]
        row["load"] += load[shard]
        row["max_load"] = max(row["max_load"], load[shard])
    for row in regions.values():
        row["mean_load"] = round(row["load"] / row["shards"], 2)
        row["children"] = row["shards"] * assignment.replication_factor
    return {
        "out": str(result.out),
        "children": len(result.manifest["children"]),
        "shards": len(assignment.shards),
        "targets": len(assignment.targets),
        "checked": result.checked,
        "alerting_checked": result.alerting_checked,
        "master_checked": result.master_checked,
        "moved": counts.moved,
        "added": counts.added,
        "removed": counts.removed,
        "first_run": result.previous is None,
        "regions": regions,
    }
