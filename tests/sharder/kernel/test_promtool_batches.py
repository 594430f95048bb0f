"""promtool checks a bundle's child configs a hundred per process, and a refused config is
still named with promtool's own message, whichever batch it was in."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharder.kernel.errors import ConfigCheckError
from sharder.kernel.promtool import BATCH, Promtool, check_all

GOOD = (
    "global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: gpu\n"
    "    static_configs:\n      - targets: ['10.0.0.1:9400']\n"
)
BAD = "global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: gpu\n    scrape_interval: nonsense\n"


class Counting(Promtool):
    def __init__(self, binary: str) -> None:
        super().__init__(binary)
        self.processes = 0

    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        self.processes += 1
        super().check(root, config, agent=agent)

    def check_many(self, root: Path, configs: list[str], *, agent: bool = False) -> list[str]:
        self.processes += 1
        return super().check_many(root, configs, agent=agent)


def _configs(root: Path, count: int, *, bad: int | None = None) -> list[str]:
    names = []
    for i in range(count):
        path = root / "children" / f"c-{i:03d}" / "prometheus.yml"
        path.parent.mkdir(parents=True)
        path.write_text(BAD if i == bad else GOOD)
        names.append(str(path.relative_to(root)))
    return names


def test_a_good_bundle_costs_one_process_per_batch(tmp_path: Path, promtool: str) -> None:
    checker = Counting(promtool)
    assert check_all(checker, tmp_path, _configs(tmp_path, BATCH + 5), workers=2) == BATCH + 5
    assert checker.processes == 2


def test_a_bad_config_in_a_batch_is_named_with_promtools_message(tmp_path: Path, promtool: str) -> None:
    checker = Counting(promtool)
    configs = _configs(tmp_path, BATCH + 5, bad=BATCH + 2)
    with pytest.raises(ConfigCheckError) as caught:
        check_all(checker, tmp_path, configs, workers=2)
    assert caught.value.path == configs[BATCH + 2]
    assert "nonsense" in str(caught.value)
    assert checker.processes == 2 + 5  # the failed batch is checked again file by file
