"""The fitted costs of a Prometheus, per release line, read from ``costs.json``.

``gpufed bench costs`` measures them (real Prometheus processes on the simulated fleet) and
prints the same ``coefficients`` block this file holds, with the machine, version, date and
command they came from; re-running it re-derives them. Memory per series is robust on a
shared machine; CPU per sample/s is kept too but is noisy (see ``cpu_note``). ``rules``: the
seconds one evaluation of the shipped rule pack takes at the master, per 1,000 series.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

COSTS_FILE = "costs.json"


@dataclass(frozen=True)
class ProcessCost:
    base_mib: float
    mib_per_1k_series: float
    mib_per_1k_samples_per_s: float
    cpu_cores_per_1k_samples_per_s: float

    def rss_mib(self, *, series: float, samples_per_s: float) -> float:
        return (
            self.base_mib
            + self.mib_per_1k_series * series / 1000
            + self.mib_per_1k_samples_per_s * samples_per_s / 1000
        )

    def cpu_cores(self, *, samples_per_s: float) -> float:
        return self.cpu_cores_per_1k_samples_per_s * samples_per_s / 1000


@dataclass(frozen=True)
class RuleCost:
    """What one evaluation of the shipped rule pack takes at the master, in seconds."""

    eval_base_s: float
    eval_s_per_1k_series: float

    def cpu_cores(self, *, series: float, evaluation_interval_s: float) -> float:
        """Cores the pack keeps busy: one evaluation's seconds over the interval between them."""
        return (self.eval_base_s + self.eval_s_per_1k_series * series / 1000) / evaluation_interval_s


#: Costs measured before the bench ran the rule pack: no rule CPU.
NO_RULES = RuleCost(eval_base_s=0.0, eval_s_per_1k_series=0.0)


@dataclass(frozen=True)
class LineCosts:
    line: str
    version: str
    child_agent: ProcessCost
    server: ProcessCost
    chunk_bytes_per_sample: float
    chunk_bytes_per_series_chunk: float
    index_bytes_per_series_per_block: float
    measured_on: dict[str, Any]
    rules: RuleCost = NO_RULES


def _process(data: dict[str, Any], cpu: float) -> ProcessCost:
    return ProcessCost(
        base_mib=float(data["base_mib"]),
        mib_per_1k_series=float(data["mib_per_1k_series"]),
        mib_per_1k_samples_per_s=float(data["mib_per_1k_samples_per_s"]),
        cpu_cores_per_1k_samples_per_s=cpu,
    )


def load_costs(text: str | None = None) -> dict[str, LineCosts]:
    """Release line ("2", "3") -> its costs, from the shipped ``costs.json`` or ``text``."""
    raw = json.loads(
        text if text is not None else resources.files(__package__).joinpath(COSTS_FILE).read_text()
    )
    out = {}
    for line, entry in raw["lines"].items():
        coefficients, cpu = entry["coefficients"], entry["cpu_cores_per_1k_samples_per_s"]
        rules = entry.get("rules")
        out[line] = LineCosts(
            line=line,
            version=entry["version"],
            child_agent=_process(coefficients["child_agent"], float(cpu["child_agent"])),
            server=_process(coefficients["server"], float(cpu["server"])),
            chunk_bytes_per_sample=float(coefficients["server"]["chunk_bytes_per_sample"]),
            chunk_bytes_per_series_chunk=float(coefficients["server"]["chunk_bytes_per_series_chunk"]),
            index_bytes_per_series_per_block=float(
                coefficients["server"]["index_bytes_per_series_per_block"]
            ),
            measured_on=entry["measured_on"],
            rules=RuleCost(
                eval_base_s=float(rules["eval_base_s"]),
                eval_s_per_1k_series=float(rules["eval_s_per_1k_series"]),
            )
            if rules
            else NO_RULES,
        )
    return out
