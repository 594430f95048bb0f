"""The controller: one façade that wires its components, and the order data flows in.

Where a registration becomes an SD answer (follow it top to bottom):

1. intake: ``PUT /v1/registry/...`` -> ``sharder.sources.registry.BuiltinRegistry`` (and the
   file/Consul/Kubernetes sources) push into ``sharder.reconcile.Reconciler``;
2. placement: the reconciler debounces, applies grace and hysteresis, and places the change
   with its incremental engine, the operator's overrides being data it holds;
3. commit: :meth:`Controller._on_discovery` adds hand-overs and writes the state through
   the store (check-and-set, fenced) — nothing is served that the store refused;
4. publication: ``publication.Publication.publish`` swaps in the new HTTP SD snapshot
   (``sdcache``: changed shards only), then metrics, then the config bundle when the
   children's configs changed; ``api.py`` answers ``/v1/sd/<child>`` from that snapshot.

One lock orders every change to the served state: a reconcile tick, an applied plan and
a finished hand-over each take it, commit, then publish. Reads never take it.

Components (each its own module, wired only here): ``children`` (probes, health, SD
fetches), ``publication``, ``plans`` (plan and apply), ``views`` (read model), ``replica``
(leader/follower), ``load`` (measured load), ``store`` (state, fencing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from federation.controller import changes as changing
from federation.controller import handover as handing
from federation.controller import load as loading
from federation.controller import plans, sdcache
from federation.controller import replica as replication
from federation.controller.children import ChildHealth, Children
from federation.controller.errors import Conflict, ControllerError, Invalid, NotFound, Unavailable
from federation.controller.load_policy import LoadPolicy
from federation.controller.metrics import ControllerMetrics
from federation.controller.options import ControllerOptions
from federation.controller.plans import ApplyResult, PlannedChange
from federation.controller.probe import ChildProbe
from federation.controller.publication import Publication
from federation.controller.publisher import Publisher
from federation.controller.replica import Replication
from federation.controller.state import AuditEntry, ControllerState, Handover, overrides_of
from federation.controller.store import (
    Changed,
    FencedOut,
    LastKnownView,
    StateStore,
    StoreConflict,
    StoreError,
)
from federation.controller.views import ReadViews
from federation.spec import GpufedSpec
from sharder import plan as planning
from sharder.assignment import Assignment
from sharder.discovery_metrics import DiscoveryMetrics
from sharder.inventory import Target
from sharder.reconcile import Reconciler
from sharder.sources.registry import BuiltinRegistry

__all__ = [
    "ApplyResult",
    "ChildHealth",
    "Conflict",
    "Controller",
    "ControllerError",
    "ControllerOptions",
    "Invalid",
    "NotFound",
    "PlannedChange",
    "Unavailable",
]

log = logging.getLogger(__name__)


class Controller(Replication):
    def __init__(
        self,
        *,
        spec: GpufedSpec,
        store: StateStore,
        metrics: ControllerMetrics,
        options: ControllerOptions = ControllerOptions(),
        probe: ChildProbe | None = None,
        publisher: Publisher | None = None,
        wall_clock: Callable[[], float] = time.time,
        can_write: Callable[[], bool] = lambda: True,
        fence: Callable[[], int | None] = lambda: None,
        leader: Callable[[], str | None] = lambda: None,
        load: loading.LoadTracker | None = None,
    ) -> None:
        self.spec = spec
        self.store = store
        self.metrics = metrics
        self.options = options
        self.probe = probe
        self.publisher = publisher
        self._wall = wall_clock
        self._can_write = can_write
        self._fence = fence
        self._leader = leader
        self._leading = False
        self._refreshed_at: float | None = None
        self._sd_incomplete = False
        self._withheld = 0
        self.load = load
        self._lock = threading.RLock()
        self.jobs = {job.name: job for job in spec.jobs}
        self.discovery = DiscoveryMetrics(registry=metrics.registry)
        self.state = store.load() or ControllerState()
        self.reconciler = Reconciler(
            spec=spec,
            previous=self.state.assignment,
            debounce_s=options.debounce_s,
            grace_s=options.grace_s,
            hysteresis=options.hysteresis,
            precedence=options.precedence,
            on_assignment=self._on_discovery,
            observer=self.discovery,
            store=LastKnownView(store),
            persist_interval_s=options.persist_interval_s,
        )
        self.reconciler.set_overrides(**overrides_of(self.state.desired))
        self.registry = BuiltinRegistry(
            sink=self.reconciler,
            jobs=self.jobs,
            ttl_s=options.registry_ttl_s,
            max_entries=options.registry_max_entries,
            regions=spec.region_names(),
            journal=self._journal_registry,
        )
        self.sources: list[Any] = [self.registry]
        self.children = Children(
            spec=spec, options=options, probe=probe, metrics=metrics, wall_clock=wall_clock
        )
        self.publication = Publication(
            spec=spec, options=options, metrics=metrics, children=self.children, publisher=publisher
        )
        self.planner = plans.Planner(
            spec=spec, metrics=metrics, max_plans=options.max_plans, wall_clock=wall_clock
        )
        self.load_policy = LoadPolicy(
            spec=spec, load=load, children=self.children, can_write=can_write, targets=self._known_targets
        )
        self.views = ReadViews(spec=spec, children=self.children, load=load, discovery=self.discovery)
        self._fetches_shared: dict[str, float] = {}
        self.replica_id = replication.replica_id()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- start / stop ----------------------------------------------------------------
    def restore(self) -> None:
        """Seed discovery from the persisted sets and serve the stored assignment at once.

        Run at start and again by :meth:`take_over`: the state is read afresh, a source the
        reconcile loop has not heard from yet starts from its stored set, and the loop starts
        from the stored assignment and the targets it was made from, so nothing moves and
        SD answers in full before the first tick."""
        with self._lock:
            state = self.store.load() or ControllerState()
            sets = self.store.load_sets()
            self.registry.seed(sets.pop("registry", []))
            live = self.reconciler.source_sets()
            self.reconciler.seed({name: targets for name, targets in sets.items() if name not in live})
            registered = self.registry.targets()
            if registered:
                self.reconciler.on_change("registry", registered, version="persisted")
            self._adopt(state)

    def check_writable(self) -> None:
        """Raise :class:`Unavailable` naming the leader when this replica may not write."""
        if not self._can_write():
            raise Unavailable("this replica is a follower: send changes to the leader", leader=self._leader())

    def start(self, sources: Sequence[Any] = ()) -> None:
        self.sources = [self.registry, *sources]
        loops: list[Callable[[threading.Event], None]] = [self._loop, *(s.run for s in self.sources)]
        if self.probe is not None:
            loops.append(lambda stop: self.children.health_loop(stop, lambda: self.state.assignment))
        if self.publisher is not None:
            loops.append(self.publication.config_loop)
        if self.load is not None:
            loops.append(lambda stop: self.load_policy.loop(stop, self))
        self._threads = [
            threading.Thread(
                target=loop, args=(self._stop,), daemon=True, name=getattr(loop, "__qualname__", "loop")
            )
            for loop in loops
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.reconciler.interrupt()
        for thread in self._threads:
            thread.join(timeout=5)

    def _journal_registry(self, gone: Mapping[str, Target | None]) -> None:
        """A registry deletion, stored before it is acknowledged (SQLite rows; a store that
        keeps whole sets gets it with the loop's next save, see the README)."""
        LastKnownView(self.store).save_changes({"registry": gone})

    # ---- the loop ------------------------------------------------------------------------
    def _loop(self, stop: threading.Event) -> None:
        """Sleep until a source pushes a change, the reconciler has work due (debounce,
        grace, hysteresis) or a settle/refresh pass is due; never a fixed polling rate."""
        settle_at = refresh_at = 0.0
        while not stop.is_set():
            seen = self.reconciler.generation
            due = self.reconciler.next_due()
            if due is None or due > 0:
                periodic = min(settle_at, refresh_at) - time.monotonic()
                self.reconciler.wait_for_change(seen, periodic if due is None else min(due, periodic))
            if stop.is_set():
                break
            try:
                if not self._can_write():  # a follower: serve what the leader stored
                    if self._leading:
                        log.warning("no longer the leader; following %s", self._leader())
                    self._leading = False
                    if time.monotonic() >= refresh_at:
                        refresh_at = time.monotonic() + self.options.refresh_interval_s
                        self.refresh_from_store()
                        self.share_fetches()
                    continue
                refresh_at = time.monotonic() + self.options.refresh_interval_s
                if not self._leading:
                    self.take_over()
                    self._leading = True
                with self._lock:
                    if self.reconciler.tick() is None and due is None:
                        self.reconciler.prepare()  # idle after a restart: index for the first change
                if time.monotonic() >= settle_at:
                    settle_at = time.monotonic() + self.options.settle_interval_s
                    self.share_fetches()
                    self.settle()
            except Exception:  # the loop must outlive any one bad tick
                log.exception("controller loop iteration failed")

    def _on_discovery(self, assignment: Assignment, plan: planning.Plan) -> None:
        """A new assignment from the reconcile loop (lock held by ``_loop``)."""
        targets = self._known_targets()
        handovers = self._handovers(self.state.assignment, assignment, targets)
        audit = None
        if plan.counts.shards_added or plan.counts.shards_removed:
            audit = AuditEntry(
                at=self._wall(),
                actor="discovery",
                action="resize",
                detail={"added_shards": plan.added_shards, "removed_shards": plan.removed_shards},
                moved=plan.counts.moved,
            )
        state = self.state.model_copy(
            update={
                "assignment": assignment,
                "assignment_version": self.state.assignment_version + 1,
                "handovers": handovers,
            }
        )
        if self.options.sets_before_state:
            self.store.save_sets(self.reconciler.source_sets())
        base, touched = self.state.assignment, self.reconciler.touched
        known = base is not None and touched is not None and self.reconciler.touched_base is base
        changed = (base, touched) if base is not None and touched is not None and known else None
        self._commit(state, audit=audit, changed=changed)
        self.metrics.moves.labels(cause="discovery").inc(plan.counts.moved)
        fields = self.reconciler.changed
        sd_changed = (base, fields) if known and base is not None and fields is not None else None
        self.publication.publish(self.state, targets, changed=sd_changed)

    # ---- state writes ---------------------------------------------------------------------
    def _commit(
        self, state: ControllerState, *, audit: AuditEntry | None, changed: Changed | None = None
    ) -> None:
        try:
            self.state = self.store.save(
                state,
                expected_revision=self.state.revision if self.state.revision else None,
                audit=audit,
                fence=self._fence(),
                changed=changed,
            )
        except (StoreConflict, FencedOut):
            self.metrics.store_errors.inc()
            self._resync()
            raise
        except StoreError:
            self.metrics.store_errors.inc()
            raise

    def _publish(self, *, targets: Mapping[str, Target], state: ControllerState | None = None) -> None:
        self.publication.publish(state or self.state, targets)

    def _known_targets(self) -> dict[str, Target]:
        return self.reconciler.target_map

    # ---- what the API and the tests reach through the façade ------------------------------
    @property
    def sd(self) -> sdcache.SdSnapshot:
        return self.publication.sd

    @property
    def health(self) -> dict[str, ChildHealth]:
        return self.children.health

    @property
    def sd_fetched(self) -> dict[str, float]:
        return self.children.sd_fetched

    @property
    def remote_fetched(self) -> dict[str, float]:
        return self.children.remote_fetched

    @remote_fetched.setter
    def remote_fetched(self, fetched: dict[str, float]) -> None:
        self.children.remote_fetched = fetched

    def note_fetch(self, shard: str) -> None:
        self.children.note_fetch(shard)

    def child_url(self, child: str) -> str | None:
        return self.children.url(child)

    def publish_configs(self) -> bool:
        return self.publication.publish_configs()

    def check_health(self) -> None:
        self.children.check_health(self.state.assignment)

    # ---- hand-overs -------------------------------------------------------------------------
    def window_s(self, job: str) -> float:
        if self.options.handover_window_s is not None:
            return self.options.handover_window_s
        return handing.default_window_s(self.spec, job)

    def _handovers(
        self, previous: Assignment | None, current: Assignment, targets: Mapping[str, Target]
    ) -> list[Handover]:
        if not self.options.handover:
            return []
        rec = self.reconciler
        only = rec.touched if rec.touched_base is previous and rec.assignment is current else None
        candidates = targets.keys() if only is None else [i for i in only if i in targets]
        return handing.reconcile(
            previous,
            current,
            self.state.handovers,
            now=self._wall(),
            job_of={i: targets[i].job for i in candidates},
            max_wait_s=self.options.handover_max_wait_s,
            only=only,
        )

    def settle(self) -> int:
        """Finish hand-overs whose new children scrape the target (or whose window passed).

        The children are asked once each per pass, before the state lock is taken: a slow
        child must not hold up plans and discovery, and a hundred targets moving to one
        child cost one request to it, not a hundred."""
        if not self.state.handovers:
            return 0
        answers = self.children.answers(self.state.assignment, {h.to_shard for h in self.state.handovers})
        with self._lock:
            if not self.state.handovers:
                return 0
            targets = self._known_targets()
            pending, done = handing.settle(
                self.state.handovers,
                now=self._wall(),
                scraped=lambda h: self.children.scraped(h, targets, answers, self.state.assignment),
                fetched=self.children.fetched,
                window_s=self.window_s,
            )
            if pending == self.state.handovers:
                return 0
            self._commit(self.state.model_copy(update={"handovers": pending}), audit=None)
            for _, result in done:
                self.metrics.handovers.labels(result=result).inc()
            self._publish(targets=targets)
            return len(done)

    # ---- operator changes -------------------------------------------------------------------
    def current_version(self) -> str:
        return f"{self.state.desired_revision}"

    def plan(self, change: changing.ChangeRequest) -> PlannedChange:
        with self._lock:
            targets = self._known_targets()
            if change.use_observed_weights:
                current = self.state.desired.weights
                change = self.load_policy.with_observed_weights(change, targets, current=current)
            return self.planner.make(self.state, targets, change)

    def apply(self, version: str, *, actor: str) -> ApplyResult:
        with self._lock:
            state = self.state
            planned = self.planner.to_apply(version, state)
            if planned is None:
                return ApplyResult(
                    applied=False,
                    version=version,
                    plan=None,
                    message="this plan is already applied; nothing moved",
                )
            self.check_writable()
            targets = self._known_targets()
            assignment = self.planner.placement(planned, state, targets)
            plan = planning.diff(state.assignment, assignment)
            handovers = self._handovers(state.assignment, assignment, targets)
            change = planned.change.model_dump(mode="json", exclude_defaults=True)
            audit = AuditEntry(
                at=self._wall(),
                actor=actor,
                action="rebalance",
                moved=plan.counts.moved,
                detail={"version": version, "change": change, "counts": plan.counts.model_dump(mode="json")},
            )
            update = {
                "desired": planned.desired,
                "desired_revision": state.desired_revision + 1,
                "assignment": assignment,
                "assignment_version": state.assignment_version + 1,
                "last_plan": version,
                "handovers": handovers,
            }
            try:
                self._commit(state.model_copy(update=update), audit=audit)
            except StoreConflict as exc:
                raise Conflict(
                    f"another writer changed the state meanwhile ({exc}); plan again",
                    current_version=self.current_version(),
                ) from exc
            except FencedOut as exc:
                raise Unavailable(f"this replica lost the leadership ({exc})", leader=self._leader()) from exc
            self.reconciler.set_overrides(**overrides_of(planned.desired))
            self.reconciler.adopt(assignment)
            self.metrics.rebalances.labels(result="applied").inc()
            self.metrics.moves.labels(cause="rebalance").inc(plan.counts.moved)
            self._publish(targets=targets)
            return ApplyResult(applied=True, version=version, plan=plan, message="applied")

    def audit(self, *, limit: int, before_id: int | None) -> list[AuditEntry]:
        return self.store.audit_log(limit=limit, before_id=before_id)

    # ---- measured load (issue #11): weights only ever reach the assignment through a plan ----
    def observe_load(self) -> bool:
        return self.load_policy.observe(self.state)

    def load_report(self) -> dict[str, Any]:
        return self.load_policy.report(self.state)

    def auto_rebalance(self) -> ApplyResult | None:
        return self.load_policy.auto_rebalance(self)

    # ---- reads (views over the committed state and its targets) ------------------------------
    @property
    def ready(self) -> bool:
        return self.state.assignment is not None

    def shard_rows(self) -> list[dict[str, Any]]:
        return self.views.shard_rows(self.state)

    def target_rows(self, *, region: str | None, shard: str | None, q: str | None) -> list[dict[str, Any]]:
        return self.views.target_rows(self.state, self._known_targets(), region=region, shard=shard, q=q)

    def explain(self, identity: str) -> dict[str, Any]:
        return self.views.explain(self.state, self._known_targets(), identity)

    def discovery_rows(self) -> list[dict[str, Any]]:
        names = [getattr(s, "name", "?") for s in self.sources]
        return self.views.discovery_rows(self.reconciler.source_sets(), names)


dump_plan = plans.dump_plan
