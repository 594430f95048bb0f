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
(``Replication``: may this replica write, with which fencing token, what a follower adopts;
injected by ``service.build_service``), ``load`` (measured load), ``store`` (state, fencing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from federation.controller import adoption, plans, sdcache
from federation.controller import changes as changing
from federation.controller import load as loading
from federation.controller import loop as looping
from federation.controller.children import Children
from federation.controller.errors import Conflict, Unavailable
from federation.controller.load_policy import LoadPolicy
from federation.controller.metrics import ControllerMetrics
from federation.controller.options import ControllerOptions
from federation.controller.plans import ApplyResult, PlannedChange
from federation.controller.probe import ChildProbe
from federation.controller.publication import Publication
from federation.controller.publisher import Publisher
from federation.controller.replica import Replication
from federation.controller.settling import HandoverSettler
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
from sharder.sources.registry import SOURCE as REGISTRY
from sharder.sources.registry import BuiltinRegistry

log = logging.getLogger(__name__)


class Controller:
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
        replication: Replication | None = None,
        load: loading.LoadTracker | None = None,
    ) -> None:
        self.spec = spec
        self.store = store
        self.metrics = metrics
        self.options = options
        self.probe = probe
        self.publisher = publisher
        self._wall = wall_clock
        self.replication = replication or Replication(store=store, metrics=metrics)
        self.load = load
        self._lock = threading.RLock()
        self.restored_fresh = False
        """``restore`` ran and no ``take_over`` since (``adoption.take_over``)."""
        self.jobs = {job.name: job for job in spec.jobs}
        self.discovery = DiscoveryMetrics(registry=metrics.registry, wall_clock=wall_clock)
        self.state = store.load() or ControllerState()
        self.reconciler = Reconciler(
            spec=spec,
            previous=self.state.assignment,
            debounce_s=options.debounce_s,
            grace_s=options.grace_s,
            hysteresis=options.hysteresis,
            precedence=options.precedence,
            on_summary=self._on_discovery,
            observer=self.discovery,
            store=LastKnownView(store),
            persist_interval_s=options.persist_interval_s,
        )
        self.reconciler.set_overrides(**overrides_of(self.state.desired))
        self.registry = BuiltinRegistry(
            sink=self.reconciler,
            jobs=self.jobs,
            ttl_s=options.registry_ttl_s,
            endpoint_owner=partial(self.reconciler.endpoint_owner, excluding=REGISTRY),
            max_entries=options.registry_max_entries,
            regions=spec.region_names(),
            journal=self._journal_registry,
            on_accepted=partial(self.discovery.heartbeat, REGISTRY),
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
            spec=spec, load=load, children=self.children, can_write=self.replication.may_write,
            targets=self._known_targets,
        )
        self.settler = HandoverSettler(spec=spec, options=options, children=self.children, metrics=metrics)
        self.views = ReadViews(spec=spec, children=self.children, load=load, discovery=self.discovery)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- start / stop, and adopting a stored state (``adoption``) --------------------------
    def restore(self) -> None:
        adoption.restore(self)

    def take_over(self) -> None:
        adoption.take_over(self)

    def refresh_from_store(self) -> bool:
        return adoption.refresh_from_store(self)

    def _resync(self) -> None:
        adoption.resync(self)

    @property
    def lock(self) -> threading.RLock:  # what ``adoption.AdoptionHost`` reads
        return self._lock

    def now(self) -> float:
        return self._wall()

    def commit(self, state: ControllerState, *, audit: AuditEntry | None) -> None:
        self._commit(state, audit=audit)

    def publish(self, *, targets: Mapping[str, Target], state: ControllerState) -> None:
        self._publish(targets=targets, state=state)

    def share_fetches(self) -> None:
        self.replication.share_fetches(self.children)

    def replica_status(self) -> dict[str, Any]:
        return self.replication.status(revision=self.state.revision)

    def check_writable(self) -> None:
        """Raise :class:`Unavailable` naming the leader when this replica may not write."""
        if not self.replication.may_write():
            raise Unavailable(
                "this replica is a follower: send changes to the leader", leader=self.replication.leader()
            )

    def start(self, sources: Sequence[Any] = ()) -> None:
        self.sources = [self.registry, *sources]
        loops: list[Callable[[threading.Event], None]] = [
            lambda stop: looping.run(self, stop),
            *(s.run for s in self.sources),
        ]
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

    # ---- the loop (``loop.run``) ------------------------------------------------------------
    def tick(self, *, idle: bool) -> None:
        """One reconcile step as the leader; idle after a restart: index for the first change."""
        with self._lock:
            if self.reconciler.tick() is None and idle:
                self.reconciler.prepare()

    def _on_discovery(self, assignment: Assignment, plan: planning.PlanSummary) -> None:
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
                fence=self.replication.fencing_token(),
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

    def _known_targets(self) -> Mapping[str, Target]:
        return self.reconciler.target_map

    # ---- what the API and the tests reach through the façade ------------------------------
    @property
    def sd(self) -> sdcache.SdSnapshot:
        return self.publication.sd

    def note_fetch(self, shard: str) -> None:
        self.children.note_fetch(shard)

    def publish_configs(self) -> bool:
        return self.publication.publish_configs()

    # ---- hand-overs (``settling``) ------------------------------------------------------------
    def _handovers(
        self, previous: Assignment | None, current: Assignment, targets: Mapping[str, Target]
    ) -> list[Handover]:
        rec = self.reconciler
        only = rec.touched if rec.touched_base is previous and rec.assignment is current else None
        return self.settler.for_change(
            previous, current, existing=self.state.handovers, targets=targets, touched=only, now=self._wall()
        )

    def settle(self) -> int:
        """Finish hand-overs whose new children scrape the target (or whose window passed)."""
        if not self.state.handovers:
            return 0
        answers = self.settler.ask(self.state)
        with self._lock:
            targets = self._known_targets()
            settled = self.settler.settle(self.state, targets, answers, now=self._wall())
            if settled is None:
                return 0
            pending, done = settled
            self._commit(self.state.model_copy(update={"handovers": pending}), audit=None)
            self.settler.count(done)
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
            new, audit = self.planner.applied(
                planned, state, assignment=assignment, plan=plan, handovers=handovers, actor=actor
            )
            try:
                self._commit(new, audit=audit)
            except StoreConflict as exc:
                raise Conflict(
                    f"another writer changed the state meanwhile ({exc}); plan again",
                    current_version=self.current_version(),
                ) from exc
            except FencedOut as exc:
                leader = self.replication.leader()
                raise Unavailable(f"this replica lost the leadership ({exc})", leader=leader) from exc
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
        """HTTP SD answers for an assignment are published (a commit alone is not enough: a
        first SD build of a million targets takes seconds after it)."""
        return self.state.assignment is not None and self.publication.sd.assignment is not None

    def shard_rows(self) -> list[dict[str, Any]]:
        return self.views.shard_rows(self.state)

    def target_rows(self, *, region: str | None, shard: str | None, q: str | None) -> list[dict[str, Any]]:
        return self.views.target_rows(self.state, self._known_targets(), region=region, shard=shard, q=q)

    def explain(self, identity: str) -> dict[str, Any]:
        return self.views.explain(self.state, self._known_targets(), identity)

    def discovery_rows(self) -> list[dict[str, Any]]:
        names = [getattr(s, "name", "?") for s in self.sources]
        return self.views.discovery_rows(self.reconciler.source_sets(), names)

