"""The logs tier's bundle: ``LogsSpec`` + the Thanos bucket in, files under ``logs/`` out.

Pipeline position: ``federation.master.pipeline.logs_part`` calls :func:`render_logs_bundle`::

    logs/promtail.yml                    every GPU node (node identity from its environment)
    logs/loki.yml                        single binary (compose)
    logs/loki-scalable.yml               simple scalable: read / write / backend (Kubernetes)
    logs/rules/<tenant>/gpufed-xid.yml   Loki ruler: XID lines per node
    logs/secrets.json                    VAR -> {env} | {file}: the bucket's secrets, as for Thanos

Dumping happens in ``sharder.kernel.output`` (sorted keys, byte-stable).
"""

from __future__ import annotations

from collections.abc import Sequence

from logs import loki, promtail, rules
from logs.models import LogsSpec
from sharder.kernel.output import Bundle, dump_json, dump_yaml
from thanos.objstore import ObjstoreSpec


def rules_dir(logs: LogsSpec) -> str:
    """Where Loki reads rule files: ``<config_dir>/rules`` (``<tenant>/*.yml`` below it)."""
    return f"{logs.config_dir.rstrip('/')}/rules"


def render_logs_bundle(
    logs: LogsSpec,
    *,
    cluster: str,
    objstore: ObjstoreSpec,
    alertmanagers: Sequence[str] = (),
    remote_write: str | None = None,
) -> Bundle:
    """``alertmanagers``: URLs the ruler sends alerts to; ``remote_write``: where it writes
    recorded series (the metrics tier), or None to keep them in Loki only."""
    single, secrets = loki.loki_config(
        logs,
        objstore=objstore,
        rules_dir=rules_dir(logs),
        alertmanagers=alertmanagers,
        remote_write=remote_write,
    )
    scalable, _ = loki.loki_config(
        logs,
        objstore=objstore,
        rules_dir=rules_dir(logs),
        alertmanagers=alertmanagers,
        remote_write=remote_write,
        scalable_members=f"{logs.loki.host}-memberlist",
    )
    bundle: Bundle = {
        promtail.CONFIG_FILE: dump_yaml(promtail.promtail_config(logs, cluster=cluster)),
        loki.CONFIG_FILE: dump_yaml(single),
        loki.SCALABLE_FILE: dump_yaml(scalable),
        rules.rules_file(logs): dump_yaml(rules.xid_rules(logs)),
    }
    if secrets:
        bundle[loki.SECRETS_FILE] = dump_json(secrets)
    return bundle
