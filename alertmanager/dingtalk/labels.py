"""Which alert labels a DingTalk reader sees first, and which are folded away.

Pure; used as the ``lead`` and ``folded`` template filters by ``render``. A group
reading on a phone wants where (node, GPU, region) and whose (team) before anything
else; the rest (UUID, cluster, instance, job, ...) is kept for whoever digs, in one
compact line at the end of the alert, capped so one alert with many labels cannot
crowd the others out of a message (the split module keeps the message itself under
DingTalk's 20,000-byte limit).
"""

from __future__ import annotations

from collections.abc import Mapping

#: Lead fields in reading order; each takes the first label present among its sources
#: (dcgm-exporter spells the node ``Hostname``, and ``hostname`` since after 4.5.3-4.8.2 and
#: under ``gpufed-exporter --dcgm-names 4``; the node-level temperature alert lists ``gpus``).
LEAD_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("node", ("node", "Hostname", "hostname", "kubernetes_node")),
    ("gpu", ("gpu", "gpus", "gpu_index")),
    ("region", ("region",)),
    ("team", ("team", "owner")),
)
#: Shown elsewhere in the alert's line (name, severity), never in the details.
SHOWN_ELSEWHERE = frozenset({"alertname", "severity"})
#: UTF-8 bytes of folded labels per alert before the rest is counted, not listed.
FOLD_MAX_BYTES = 320


def lead_pairs(labels: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(field, source label, value) for each lead field the alert has, in reading order."""
    out = []
    for field, sources in LEAD_FIELDS:
        source = next((name for name in sources if labels.get(name)), None)
        if source is not None:
            out.append((field, source, labels[source]))
    return out


def lead(labels: Mapping[str, str]) -> str:
    """``node=n7 · gpu=3 · region=cn-bj · team=llm``: the fields present, in that order."""
    return " · ".join(f"{field}={value}" for field, _, value in lead_pairs(labels))


def folded(labels: Mapping[str, str], *, max_bytes: int = FOLD_MAX_BYTES) -> str:
    """The other labels, sorted, ``k=v`` joined by spaces, cut at ``max_bytes`` with a count.

    A label whose value repeats a lead value (``Hostname`` beside ``node``) adds nothing
    and is dropped.
    """
    pairs = lead_pairs(labels)
    used = {source for _, source, _ in pairs}
    shown = {value for _, _, value in pairs}
    rest = [f"{key}={value}" for key, value in sorted(labels.items())
            if key not in used and key not in SHOWN_ELSEWHERE and not (
                value in shown and any(key in sources for _, sources in LEAD_FIELDS))]
    kept: list[str] = []
    size = 0
    for item in rest:
        cost = len(item.encode()) + 1
        if size + cost > max_bytes:
            break
        kept.append(item)
        size += cost
    if len(kept) < len(rest):
        kept.append(f"(+{len(rest) - len(kept)} more)")
    return " ".join(kept)
