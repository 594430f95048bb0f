"""The name table and the vendored upstream files: provenance, consistency, what is emitted.

`exporter/dcgm_names.csv` is the one list of DCGM names the exporter writes; each row
names its DCGM field id and the upstream file (repository, path, commit) that defines it.
The vendored files under `exporter/upstream/` are byte-for-byte upstream copies (their
hashes are in SOURCES.md). Where a checkout of the upstream header or bindings is at hand
(`GPUFED_DCGM_FIELDS_H`, `GPUFED_GO_DCGM_CONST_FIELDS`), every row is checked against it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml

from exporter import naming, textformat
from exporter.catalogue import FAMILIES, select_families
from exporter.collection import Collection
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.nvml_backend import NvmlBackend

UPSTREAM = Path(naming.__file__).parent / "upstream"
UUID = "GPU-00000000-0000-0000-0000-000000000000"


def _sources_rows() -> dict[str, str]:
    rows = {}
    for line in (UPSTREAM / "SOURCES.md").read_text(encoding="utf-8").splitlines():
        found = re.match(r"^\| `([^`]+)` \|.*\| ([0-9a-f]{64}) \|$", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


def test_vendored_files_are_the_upstream_bytes() -> None:
    rows = _sources_rows()
    assert set(rows) == {"kubelet-podresources-v1-api.proto", "dcgm-exporter-default-counters.csv"}
    for name, digest in rows.items():
        assert hashlib.sha256((UPSTREAM / name).read_bytes()).hexdigest() == digest, f"{name} was edited"
    assert "Apache License" in (UPSTREAM / "LICENSE-Apache-2.0").read_text(encoding="utf-8")


def test_every_row_names_a_known_source_with_a_commit() -> None:
    sources = naming.sources()
    for row in naming.table():
        source = sources[row.rename.source]
        assert source["repository"].startswith("NVIDIA/"), row
        if row.rename.source == naming.DRAFT_SOURCE:
            assert row.modes == {"4-draft"}, f"{row.rename.name}: an unproven name outside 4-draft"
        else:
            assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), row
            assert row.rename.field_id is not None, row


def test_no_mode_writes_two_readings_under_one_name() -> None:
    for mode in ("3", "4", "4-draft"):
        seen: dict[str, str] = {}
        for row in naming.table():
            if mode in row.modes:
                assert seen.setdefault(row.rename.name, row.reading) == row.reading, (mode, row)


@pytest.mark.parametrize("links", ["gpufed", "dcgm"])
@pytest.mark.parametrize("mode", ["3", "4", "both", "4-draft"])
def test_every_dcgm_name_on_the_wire_is_in_the_table(mode: naming.DcgmNames, links: str) -> None:
    nvml = NvmlBackend(FakeNvml([FakeGpu(uuid=UUID, nvlinks=4)]), event_timeout_ms=20)
    now = [1000.0]
    try:
        collection = Collection(nvml, FAMILIES, timeout=None, clock=lambda: now[0], timer=lambda: 0.0)
        for _ in range(2):
            now[0] += 5
            assert collection.collect_once()
        registry = _registry(collection, mode, links)
        text = textformat.fallback(registry).decode()
    finally:
        nvml.close()
    wanted = {"3", "4"} if mode == "both" else ({"4", "4-draft"} if mode == "4-draft" else {mode})
    allowed = {row.rename.name for row in naming.table() if row.modes & wanted}
    on_wire = set(re.findall(r"^(DCGM_FI_\w+)\{", text, re.M))
    assert on_wire and on_wire <= allowed, sorted(on_wire - allowed)
    labels = set(re.findall(r"[{,](DCGM_FI_\w+)=", text))
    assert labels == {"DCGM_FI_DRIVER_VERSION"}


def _registry(collection: Collection, mode: naming.DcgmNames, links: str):  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, LabelPolicy("n"), dcgm_names=mode, nvlink_series=links))
    return registry


def test_default_families_include_the_per_gpu_nvlink_totals() -> None:
    assert select_families() == {"core", "ecc", "xid", "health", "hami", "nvlink_gpu", "gpm"}


def _defines(path: str) -> dict[str, str]:
    text = Path(path).read_text(encoding="utf-8")
    return dict(re.findall(r"#define\s+(DCGM_FI_\w+)\s+(\w+)", text))


@pytest.mark.skipif(not os.environ.get("GPUFED_DCGM_FIELDS_H"), reason="no DCGM dcgm_fields.h checkout given")
def test_rows_match_dcgm_fields_h() -> None:
    """GPUFED_DCGM_FIELDS_H=<NVIDIA/DCGM at the table's commit>/dcgmlib/dcgm_fields.h"""
    defines = _defines(os.environ["GPUFED_DCGM_FIELDS_H"])

    def resolve(name: str) -> str | None:
        for _ in range(4):  # aliases point at the renamed field, which holds the number
            value = defines.get(name)
            if value is None or value.isdigit():
                return value
            name = value
        return None

    for row in naming.table():
        if row.rename.source == "dcgm-4.6.0":
            assert resolve(row.rename.name) == str(row.rename.field_id), row
        if row.rename.source == naming.DRAFT_SOURCE and row.rename.name != "DCGM_FI_DEV_GPU_UTIL_RATIO":
            assert resolve(row.rename.name) is None, f"{row.rename.name} is defined upstream: not a draft"


@pytest.mark.skipif(not os.environ.get("GPUFED_GO_DCGM_CONST_FIELDS"), reason="no go-dcgm checkout given")
def test_rows_match_go_dcgm() -> None:
    """GPUFED_GO_DCGM_CONST_FIELDS=<NVIDIA/go-dcgm at the table's commit>/pkg/dcgm/const_fields.go"""
    text = Path(os.environ["GPUFED_GO_DCGM_CONST_FIELDS"]).read_text(encoding="utf-8")
    consts = dict(re.findall(r"^\s*(DCGM_FI_\w+)\s+Short\s*=\s*(\d+)", text, re.M))
    for row in naming.table():
        if row.rename.source == "go-dcgm-4.6.1":
            assert consts.get(row.rename.name) == str(row.rename.field_id), row
