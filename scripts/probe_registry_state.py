"""Issue 21 (items 1, 3, 5): replay the probe's hostile inputs in-process and print one JSON object.

Run it against any checkout to compare behaviour before and after, e.g.
``PYTHONPATH=<checkout> python scripts/probe_registry_state.py``. Every figure is what the
controller answered or stored; nothing is asserted here (the tests do that).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from federation.controller.base.options import ControllerOptions
from federation.controller.base.state import ControllerState
from federation.controller.stores.sqlite_store import SqliteStore
from federation.spec import load_gpufed_spec
from tests.controller.harness import ControllerHarness, build, fleet, spec_document


def body(i: int, job: str = "gpu") -> dict[str, Any]:
    address = f"10.5.{i // 250}.{i % 250 + 1}"
    return {"address": address, "port": 9400, "job": job, "node": f"n{i}", "region": "r1"}


def ident(i: int) -> str:
    return f"10.5.{i // 250}.{i % 250 + 1}:9400"


async def send(harness: ControllerHarness, method: str, path: str, document: Any = None) -> Any:
    async with harness.client() as client:
        return await client.request(method, path, json=document, headers=harness.auth())


def outcome(call: Any) -> str:
    try:
        call()
    except Exception as exc:  # what a caller sees: the exception's type and first words
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:140]}"
    return "started"


def probe(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    limits = {"registry_rate": 20.0, "registry_burst": 200}  # options a checkout may not have
    known = {k: v for k, v in limits.items() if k in ControllerOptions.__dataclass_fields__}
    document = spec_document()
    document["children"] = {"target_discovery": "file_sd"}  # the bundle holds every target
    (root / "a").mkdir(parents=True)
    (root / "a" / "spec.yaml").write_text(yaml.safe_dump(document))
    h = build(
        root / "a",
        spec=load_gpufed_spec(root / "a" / "spec.yaml"),
        options=ControllerOptions(debounce_s=0.0, grace_s=0.0, **known),  # type: ignore[arg-type]
    )
    h.feed(fleet(4))
    put = "/v1/registry/targets/"
    bad = asyncio.run(send(h, "PUT", put + ident(1), body(1, "nosuchjob")))
    out["put_undefined_job_status"] = bad.status_code
    out["put_valid_status"] = asyncio.run(send(h, "PUT", put + ident(2), body(2))).status_code
    h.tick()
    out["publish_configs_ok"] = h.controller.publish_configs()
    status = asyncio.run(send(h, "GET", "/v1/status")).json()["configs"] or {}
    out["status_configs"] = {k: status.get(k) for k in ("ok", "error", "left_out_count")}
    placed = h.controller.state.assignment
    out["valid_target_in_assignment"] = placed is not None and ident(2) in placed.targets
    codes: dict[str, int] = {}
    for i in range(100, 1600):
        code = asyncio.run(send(h, "PUT", "/v1/registry/targets/" + ident(i), body(i))).status_code
        codes[str(code)] = codes.get(str(code), 0) + 1
    out["1500_puts_one_token_at_20_per_s_burst_200"] = codes
    out["registry_max_entries_default"] = h.controller.registry.max_entries
    h.tick()
    out["delete_status"] = asyncio.run(send(h, "DELETE", "/v1/registry/targets/" + ident(2))).status_code
    stored = SqliteStore(root / "a" / "data" / "state.db").load_sets().get("registry", [])
    out["deleted_entry_still_stored_before_tick"] = any(t.identity == ident(2) for t in stored)
    h.service.store._connect().execute("INSERT INTO audit (body) VALUES ('[1, 2')")  # type: ignore[attr-defined]
    try:
        out["audit_with_bad_row_status"] = asyncio.run(send(h, "GET", "/v1/audit")).status_code
    except Exception as exc:  # the in-process transport re-raises what a server answers 500 for
        out["audit_with_bad_row_status"] = f"500 ({type(exc).__name__})"
    h.service.store.close()

    data = root / "b"
    store = SqliteStore(data / "state.db")
    saved = store.save(ControllerState(), expected_revision=None)
    for _ in range(39):
        saved = store.save(saved, expected_revision=saved.revision)
    targets = fleet(30_000)
    store.save_sets({"registry": targets})
    full = (data / "state.db").stat().st_size + (data / "state.db-wal").stat().st_size
    crashed = root / "crashed"
    shutil.copytree(data, crashed)
    store.save_set_changes({"registry": {t.identity: None for t in targets}})
    wal = data / "state.db-wal"
    out["bytes_before_bulk_delete"] = full
    after = (data / "state.db").stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    out["bytes_after_bulk_delete"] = after
    store.close()
    damaged = bytearray((crashed / "state.db-wal").read_bytes())
    middle = len(damaged) // 2
    damaged[middle : middle + 4096] = bytes((i * 37 + 11) % 256 for i in range(4096))
    (crashed / "state.db-wal").write_bytes(bytes(damaged))

    def open_damaged() -> None:
        state = SqliteStore(crashed / "state.db").load()
        out["damaged_wal_revision_served"] = None if state is None else state.revision

    out["open_wal_with_garbage"] = outcome(open_damaged)
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (data / name).unlink(missing_ok=True)
    out["open_deleted_state_db"] = outcome(lambda: SqliteStore(data / "state.db"))
    bad = root / "c"
    store = SqliteStore(bad / "state.db")
    store.save_sets({"file": fleet(3)})
    store._connect().execute("INSERT INTO members VALUES ('file', 'bad:1', '{not json')")
    store.close()
    out["load_sets_with_broken_row"] = outcome(lambda: SqliteStore(bad / "state.db").load_sets())
    return out


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="gpufed-probe-"))
    try:
        print(json.dumps(probe(root), indent=1, sort_keys=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
