"""The controller: one façade that wires its components, and the order data flows in.

Where a registration becomes an SD answer (follow it top to bottom):

1. intake: ``PUT /v1/registry/...`` -> ``sharder.sources.registry.BuiltinRegistry``, which
   offers each change to ``sharder.live.reconcile.Reconciler.offer`` (checked and applied
   under the loop's lock on the request's thread, the worker woken); the file/Consul/
   Kubernetes sources push into the same loop from their own threads;
2. placement: the worker (``loop.Worker``, woken by ``live.inbox``) runs
   ``live.route.Route.tick``: the reconciler debounces, applies grace and hysteresis, and
   places the change with its incremental engine, the operator's overrides being data it
   holds;
3. place: ``live.place.state_after`` turns the reconciler's ``Step`` into the next state
   (hand-overs, the audit of a resize);
4. commit and publish: ``live.pipeline.Pipeline`` writes it in one fenced
   ``StateStore.apply`` (state, audit, the step's set changes) — nothing is served that the
   store refused — then ``live.publish.Publication`` swaps in the new HTTP SD snapshot
   (``sdcache``: changed shards only), metrics, file_sd lists or the config bundle.

The pipeline's one lock orders every change to the served state: a reconcile step, an
applied plan, finished hand-overs and an adopted stored state (``ha.adoption``) each take
it, commit, then publish. Reads never take it.

Components (each its own module, wired only here): ``loop`` (the worker), ``live`` (inbox,
route, children, publication, pipeline), ``plans`` (plan and apply), ``views`` (read
model), ``ha`` (``Replication``: may this replica write, with which fencing token, what a
follower adopts; ``Adoption``), ``load`` (measured load), ``stores`` (state, fencing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from federation.controller.base import changing, plans
from federation.controller.base.errors import Conflict, Unavailable
from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.options import ControllerOptions
from federation.controller.base.plans import ApplyResult, PlannedChange
from federation.controller.base.state import AuditEntry, ControllerState, overrides_of
from federation.controller.ha.adoption import Adoption
from federation.controller.ha.replicating import Replication
from federation.controller.live import place
from federation.controller.live.children import Children
from federation.controller.live.inbox import Inbox
from federation.controller.live.pipeline import Pipeline
from federation.controller.live.probe import ChildProbe
from federation.controller.live.publish import Publication
from federation.controller.live.publisher import Publisher
from federation.controller.live.route import Route
from federation.controller.live.settling import HandoverSettler
from federation.controller.live.startup import Readiness, StartUp
from federation.controller.load import tracking
from federation.controller.load.policy import LoadPolicy
from federation.controller.loop import Worker
from federation.controller.stores import store_watch
from federation.controller.stores.store import (
    FencedOut,
    StateStore,
    StoreConflict,
)
from federation.controller.views import ReadViews
from federation.spec import GpufedSpec
from sharder.engine import planning
from sharder.engine.step import Step
from sharder.live.reconcile import Reconciler
from sharder.model.inventory import Target
from sharder.sources.discovery_metrics import DiscoveryMetrics
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
        load: tracking.LoadTracker | None = None,
    ) -> None:
        self.spec = spec
        self.store = store
        self.audit_pages = store_watch.AuditPages(
            lambda limit, before_id: self.store.audit_log(limit=limit, before_id=before_id)
        )
        self.metrics = metrics
        self.options = options
        self.probe = probe
        self.publisher = publisher
        self._wall = wall_clock
        self.replication = replication or Replication(store=store, metrics=metrics)
        self.load = load
        self.jobs = {job.name: job for job in spec.jobs}
        self.discovery = DiscoveryMetrics(registry=metrics.registry, wall_clock=wall_clock)
        stored = store.load() or ControllerState()
        self.reconciler = Reconciler(
            spec=spec,
            previous=stored.assignment,
            debounce_s=options.debounce_s,
            grace_s=options.grace_s,
            hysteresis=options.hysteresis,
            precedence=options.precedence,
            observer=self.discovery,
            sets_in_steps=True,  # each step's set changes commit with its state (``store.apply``)
        )
        self.reconciler.set_overrides(**overrides_of(stored.desired))
        self.registry = BuiltinRegistry(
            loop=self.reconciler,
            jobs=self.jobs,
            ttl_s=options.registry_ttl_s,
            max_entries=options.registry_max_entries,
            regions=spec.region_names(),
        )
        self.sources: list[Any] = [self.registry]
        self.children = Children(
            spec=spec, options=options, probe=probe, metrics=metrics, wall_clock=wall_clock
        )
        self.publication = Publication(
            spec=spec, options=options, metrics=metrics, children=self.children, publisher=publisher
        )
        self.pipeline = Pipeline(
            store=store, publication=self.publication, metrics=metrics,
            fence=self.replication.fencing_token, state=stored,
        )  # fmt: skip
        self._lock = self.pipeline.lock
        self.adoption = Adoption(
            pipeline=self.pipeline, store=store, registry=self.registry, reconciler=self.reconciler,
            replication=self.replication, options=options, now=wall_clock,
        )  # fmt: skip
        self.planner = plans.Planner(
            spec=spec, metrics=metrics, max_plans=options.max_plans, wall_clock=wall_clock
        )
        self.load_policy = LoadPolicy(
            spec=spec, load=load, children=self.children, can_write=self.replication.may_write,
            targets=self._known_targets,
        )
        self.settler = HandoverSettler(spec=spec, options=options, children=self.children, metrics=metrics)
        self.route = Route(
            reconciler=self.reconciler, pipeline=self.pipeline, settler=self.settler, metrics=metrics,
            wall_clock=wall_clock,
        )  # fmt: skip
        self.worker = Worker(
            inbox=Inbox(self.reconciler, options), route=self.route, adoption=self.adoption,
            replication=self.replication, children=self.children, registry=self.registry,
        )  # fmt: skip
        self.views = ReadViews(
            spec=spec, pipeline=self.pipeline, reconciler=self.reconciler, children=self.children,
            load=load, discovery=self.discovery,
        )  # fmt: skip
        self.startup = StartUp(published=lambda: self.ready, work_done=self._start_up_done)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._followed: Sequence[Any] = ()
        """The sources ``start`` runs (each says when it has ``answered``: ``sharder.sources.base``)."""
        self._answered_at: int | None = None
        """The reconciler's ``generation`` once every followed source had answered: the
        start-up placement is the step that takes it in (later changes are not waited for)."""

    # ---- the committed state (the pipeline's) and adopting a stored one (``ha.adoption``) ----
    @property
    def state(self) -> ControllerState:
        """The committed state (the pipeline's): it changes only through the pipeline's doors."""
        return self.pipeline.state

    def restore(self) -> None:
        self.adoption.restore()

    def take_over(self) -> None:
        self.adoption.take_over()

    def refresh_from_store(self) -> bool:
        return self.adoption.refresh_from_store()

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
        self._followed, self._answered_at = tuple(sources), None
        self.startup.arm()  # /readyz: "settling" until the work started here has ended
        loops: list[Callable[[threading.Event], None]] = [
            self.worker.run,  # it expires the registry, which has no thread of its own
            *(s.run for s in sources),
        ]
        if self.probe is not None:
            loops.append(lambda stop: self.children.health_loop(stop, lambda: self.state.assignment))
        if self.publisher is not None:
            loops.append(self.publication.config_loop)
        if self.load is not None:
            loops.append(self._load_loop)
        self._threads = [
            threading.Thread(
                target=loop, args=(self._stop,), daemon=True, name=getattr(loop, "__qualname__", "loop")
            )
            for loop in loops
        ]
        for thread in self._threads:
            thread.start()

    def _start_up_done(self) -> bool:
        """The work the loops' start began has ended (``live.startup``), checked in the
        order it happens, so a step that starts between two checks is still seen: as the
        leader, every followed source answered once (before, SD could serve one source's
        set while another's million targets were still read: ready at 6 s, settled at
        3 minutes), a step took their answers in and let go of the pipeline (so it is
        published), the engine indexed it; then the first bundle of what was placed is
        rendered and checked. Changes arriving later are not waited for: a stream of
        registrations never holds readiness back. A follower places nothing."""
        if self.replication.may_write():
            if self._answered_at is None:
                if not all(source.answered for source in self._followed):
                    return False
                self._answered_at = self.reconciler.generation  # what their answers made dirty
            if self.reconciler.placed_through < self._answered_at or self.pipeline.busy():
                return False
            if not self.reconciler.prepared:
                return False
        return self.publication.first_bundle_done()

    def stop(self) -> None:
        self._stop.set()
        self.reconciler.interrupt()
        for thread in self._threads:
            thread.join(timeout=5)

    # ---- one pass of the worker (``loop``), for tests and tools that drive it by hand ------
    def tick(self, *, idle: bool) -> Step | None:
        """One reconcile step as the leader, committed and published (``Route.tick``)."""
        return self.worker.step(idle=idle)

    def settle(self) -> int:
        """Finish hand-overs whose new children scrape the target (``Route.settle``)."""
        return self.worker.settle()

    def _known_targets(self) -> Mapping[str, Target]:
        return self.reconciler.target_map

    # ---- what the API and the tests reach through the façade ------------------------------
    def publish_configs(self) -> bool:
        return self.publication.publish_configs()

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
            step = place.plan_step(state.assignment, assignment, plan, targets)
            handovers = self.settler.for_change(
                step.base, step.assignment, existing=state.handovers, targets=step.targets, touched=None,
                now=self._wall(),
            )  # fmt: skip
            new, audit = self.planner.applied(
                planned, state, assignment=assignment, plan=plan, handovers=handovers, actor=actor
            )
            try:  # commit -> the loop builds on it -> publish, as a registration's step goes
                self.route.carry_plan(step, new, audit=audit, desired=planned.desired)
            except StoreConflict as exc:
                self.adoption.resync()  # the stored state wins
                raise Conflict(
                    f"another writer changed the state meanwhile ({exc}); plan again",
                    current_version=self.current_version(),
                ) from exc
            except FencedOut as exc:
                self.adoption.resync()
                leader = self.replication.leader()
                raise Unavailable(f"this replica lost the leadership ({exc})", leader=leader) from exc
            self.metrics.rebalances.labels(result="applied").inc()
            self.metrics.moves.labels(cause="rebalance").inc(plan.counts.moved)
            return ApplyResult(applied=True, version=version, plan=plan, message="applied")

    def audit(self, *, limit: int, before_id: int | None) -> list[AuditEntry]:
        """A page of the audit, kept per state revision and read off the API's threads with a
        bound (``store_watch.AuditPages``): a sick store never holds a read."""
        return self.audit_pages.page(revision=self.state.revision, limit=limit, before_id=before_id)

    # ---- measured load (issue #11): weights only ever reach the assignment through a plan ----
    def observe_load(self) -> bool:
        return self.load_policy.observe(self.state)

    def load_report(self) -> dict[str, Any]:
        return self.load_policy.report(self.state)

    def auto_rebalance(self) -> ApplyResult | None:
        """Plan and apply the load-aware change the policy wants, if its plan helps; None
        when nothing was applied."""
        wanted = self.load_policy.wanted(self.state)
        if wanted is None:
            return None
        planned = self.plan(wanted.change)
        if not self.load_policy.helps(wanted, planned):
            return None
        return self.apply(planned.version, actor="auto-rebalance")

    def _load_loop(self, stop: threading.Event) -> None:
        """Read the children's load every interval; rebalance when the policy wants it."""
        assert self.load is not None
        while not stop.wait(self.load.options.interval_s):
            try:
                if self.load_policy.observe(self.state):
                    self.auto_rebalance()
            except Exception:  # a bad reading must not end the loop
                log.exception("load reading failed")

    # ---- reads (views over the committed state and its targets) ------------------------------
    @property
    def ready(self) -> bool:
        """HTTP SD answers for an assignment are published (a commit alone is not enough: a
        first SD build of a million targets takes seconds after it)."""
        return self.state.assignment is not None and self.publication.sd.assignment is not None

    def readiness(self) -> Readiness:
        """``starting`` (no SD answers yet), ``settling`` (SD served, start-up work in
        flight: ``live.startup``) or ``ready``."""
        return self.startup.state()

    def discovery_rows(self) -> list[dict[str, Any]]:
        names = [getattr(s, "name", "?") for s in self.sources]
        rows = self.views.discovery_rows(names)
        # endpoints a source left out, with the node and what to set (Kubernetes: no region label)
        skipped = {getattr(s, "name", "?"): s for s in self.sources if hasattr(s, "skipped")}
        for row in rows:
            source = skipped.get(row["source"])
            if source is not None:
                row["skipped"] = list(source.skipped)
                row["skipped_total"] = source.skipped_total
        return rows
