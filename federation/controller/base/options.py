"""How one controller behaves: timings, hand-over policy, child addresses (``gpufed serve`` flags)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sharder.engine.sizing import Hysteresis


@dataclass(frozen=True)
class ControllerOptions:
    debounce_s: float = 1.0
    grace_s: float = 120.0
    hysteresis: Hysteresis = field(default_factory=Hysteresis)
    handover: bool = True
    """False: a moved target leaves its old shard at once (what Prometheus Operator and the
    OpenTelemetry allocator do); kept for comparisons and emergencies."""
    handover_window_s: float | None = None
    handover_max_wait_s: float = 600.0
    """How long an old child keeps a moved target while the new shard's child never fetches it."""
    """None: the SD refresh interval plus two scrape intervals of the target's job."""
    registry_ttl_s: float = 90.0
    registry_max_entries: int = 2_000_000
    """Entries the built-in registry holds at most (``--registry-max-entries``); more: 429."""
    registry_rate: float = 50_000.0
    """Registrations per second per token, batch entries counted one each (0: no limit). Exporters
    often share one token: a fleet refreshing every 30 s sends targets/30 a second (1M: 33,000)."""
    registry_burst: int = 100_000
    """Registrations a token may send at once (two full batch bodies)."""
    read_rate: float = 20.0
    """List-read units per second per client address without a token (0: no limit;
    ``federation.controller.http.read_guard``)."""
    read_burst: int = 100
    precedence: tuple[str, ...] = ("file", "registry", "consul", "kubernetes")
    child_urls: Mapping[str, str] = field(default_factory=dict)
    """child id -> base URL of its Prometheus (for hand-over proof, health and reloads)."""
    child_url_template: str | None = None
    """e.g. ``http://{child}:9090`` when children are reachable by name."""
    settle_interval_s: float = 1.0
    health_interval_s: float = 10.0
    max_plans: int = 64
    refresh_interval_s: float = 1.0
    """How often a follower re-reads the shared state (what ``state_age_s`` is bounded by)."""
    persist_interval_s: float = 5.0
    """Kept for callers that set it: the controller now writes a step's set changes with the
    step's state (``stores.store.StateStore.apply``), not on an interval."""
    config_refresh_s: float = 300.0
    """With HTTP SD a child's config depends on the children set, not on its targets: the
    bundle is rendered again when that set changes, else at most this often (its
    assignment.json and manifest counts), not on every registration."""
    sets_before_state: bool = False
    """Kept for callers that set it: every store now writes the sets a state places in the
    same fenced call, before (or, SQLite, with) the state."""
