"""The ``Controller``: discovery loop, operator plans, hand-overs and what the API serves.

One lock orders every change to the served state: a reconcile tick (discovery), an
applied plan (operator) and a finished hand-over each take it, compute the next
:class:`ControllerState`, write it to the store (check-and-set) and only then publish it
(SD bytes, metrics, config bundle). Reads never take the lock: HTTP SD answers come from
an immutable :class:`~federation.controller.sdcache.SdSnapshot` swapped in one assignment.

Plans are made against ``desired_revision`` (operator changes only), so discovery
churn does not make every plan stale; applying one re-runs the assignment on the
targets of that moment, sticky to the current assignment, and reports what really moved.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from federation import pipeline
from federation.controller import changes as changing
from federation.controller import handover as handing
from federation.controller import load as loading
from federation.controller import replica as replication
from federation.controller import sdcache
from federation.controller.metrics import ControllerMetrics
from federation.controller.probe import ChildProbe, ScrapeState, TargetKey
from federation.controller.publisher import Publisher
from federation.controller.replica import Replication
from federation.controller.shed import shed
from federation.controller.state import AuditEntry, ControllerState, Desired, Handover, overrides_of
from federation.controller.store import FencedOut, LastKnownView, StateStore, StoreConflict, StoreError
from federation.spec import GpufedSpec
from sharder import plan as planning
from sharder.assign import assign
from sharder.assignment import Assignment
from sharder.discovery_metrics import DiscoveryMetrics
from sharder.errors import AssignmentError
from sharder.inventory import Target
from sharder.reconcile import Reconciler
from sharder.sizing import Hysteresis
from sharder.sources.registry import BuiltinRegistry
from sharder.spec import parse_duration

log = logging.getLogger(__name__)
DISCOVERY_THROTTLE_S = 5.0


class ControllerError(Exception):
    """Base of what the API maps to problems."""


class NotFound(ControllerError):
    pass


class Conflict(ControllerError):
    def __init__(self, message: str, *, current_version: str) -> None:
        self.current_version = current_version
        super().__init__(message)


class Invalid(ControllerError):
    def __init__(self, message: str, *, field: str = "") -> None:
        self.field = field
        super().__init__(message)


class Unavailable(ControllerError):
    """This replica may not write (not the leader); ``leader`` says who may."""

    def __init__(self, message: str, *, leader: str | None = None) -> None:
        self.leader = leader
        super().__init__(message)


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
    """Least seconds between two saves of the discovery sets."""
    config_refresh_s: float = 300.0
    """With HTTP SD a child's config depends on the children set, not on its targets: the
    bundle is rendered again when that set changes, else at most this often (its
    assignment.json and manifest counts), not on every registration."""
    sets_before_state: bool = False
    """A shared store: followers and the next leader read each target from the stored sets,
    so the sets are saved before every state that places a new target."""


@dataclass(frozen=True)
class PlannedChange:
    version: str
    base_revision: int
    change: changing.ChangeRequest
    desired: Desired
    plan: planning.Plan
    created_at: float
    assignment_version: int = 0
    """The assignment the plan was made from: while it is still served, applying reuses the result."""
    result: Assignment | None = None


@dataclass(frozen=True)
class ApplyResult:
    applied: bool
    version: str
    plan: planning.Plan | None
    message: str


@dataclass
class ChildHealth:
    reachable: bool | None = None
    active: int = 0
    up: int = 0
    checked_at: float = 0.0
    scrapes: dict[TargetKey, ScrapeState] = field(default_factory=dict)


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
        self._auto_rebalanced_at = float("-inf")
        self._lock = threading.RLock()
        self._plans: OrderedDict[str, PlannedChange] = OrderedDict()
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
        self.registry = BuiltinRegistry(sink=self.reconciler, jobs=self.jobs, ttl_s=options.registry_ttl_s)
        self.sources: list[Any] = [self.registry]
        self.health: dict[str, ChildHealth] = {}
        self.sd_fetched: dict[str, float] = {}
        self.remote_fetched: dict[str, float] = {}
        self._fetches_shared: dict[str, float] = {}
        self.replica_id = replication.replica_id()
        self.sd = sdcache.SdSnapshot(version=0)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._config_lock = threading.Lock()
        self._config_wake = threading.Event()
        self._config_due: tuple[int, Assignment, list[Target]] | None = None
        self._config_key: object = None
        self._config_at = float("-inf")

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
            registered = [t for t, _ in self.registry.entries()]
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
            loops.append(self._health_loop)
        if self.publisher is not None:
            loops.append(self._config_loop)
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

    def stop(self) -> None:
        self._stop.set()
        self.reconciler.interrupt()
        for thread in self._threads:
            thread.join(timeout=5)

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
                    self.reconciler.tick()
                if time.monotonic() >= settle_at:
                    settle_at = time.monotonic() + self.options.settle_interval_s
                    self.share_fetches()
                    self.settle()
            except Exception:  # the loop must outlive any one bad tick
                log.exception("controller loop iteration failed")

    def _assign(
        self,
        desired: Desired,
        targets: Sequence[Target],
        *,
        previous: Assignment | None,
        hysteresis_counts: Mapping[str, int] | None = None,
    ) -> Assignment:
        counts = {**(hysteresis_counts or {}), **desired.shard_counts}
        return assign(
            self.spec,
            targets,
            previous=previous,
            shard_counts=counts or None,
            pins=desired.pins or None,
            drained=desired.drained or None,
            weight_overrides=desired.weights or None,
        )

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
        self._commit(state, audit=audit)
        self.metrics.moves.labels(cause="discovery").inc(plan.counts.moved)
        self._publish(targets=targets)

    # ---- state writes ---------------------------------------------------------------------
    def _commit(self, state: ControllerState, *, audit: AuditEntry | None) -> None:
        try:
            self.state = self.store.save(
                state,
                expected_revision=self.state.revision if self.state.revision else None,
                audit=audit,
                fence=self._fence(),
            )
        except (StoreConflict, FencedOut):
            self.metrics.store_errors.inc()
            self._resync()
            raise
        except StoreError:
            self.metrics.store_errors.inc()
            raise

    def _publish(self, *, targets: Mapping[str, Target], state: ControllerState | None = None) -> None:
        state = state or self.state
        assignment = state.assignment
        if assignment is None:
            return
        self.sd = sdcache.build(
            version=state.assignment_version,
            jobs=self.jobs,
            assignment=assignment,
            targets=targets,
            handovers=state.handovers,
            previous=self.sd,
        )
        load = assignment.load()
        sizes: dict[str, int] = dict.fromkeys(assignment.shards, 0)
        for shard in assignment.targets.values():
            sizes[shard] += 1
        self.metrics.publish_shards(
            [(info.region, shard, sizes[shard], load[shard]) for shard, info in assignment.shards.items()]
        )
        self.metrics.assignment_version.set(state.assignment_version)
        self.metrics.handovers_in_flight.set(len(state.handovers))
        self.metrics.ready.set(1)
        if self.publisher is not None:
            key = config_key(self.spec, assignment)
            now = time.monotonic()
            stale = now >= self._config_at + self.options.config_refresh_s
            if key is None or key != self._config_key or stale:
                self._config_key, self._config_at = key, now
                with self._config_lock:
                    self._config_due = (state.assignment_version, assignment, list(targets.values()))
                self._config_wake.set()

    def publish_configs(self) -> bool:
        """Render and check the bundle of the newest assignment (outside the state lock: promtool
        takes a while and SD must not wait for it). False when nothing was due or it failed."""
        with self._config_lock:
            due, self._config_due = self._config_due, None
        if due is None or self.publisher is None:
            return False
        version, assignment, targets = due
        try:
            bundle = pipeline.build_bundle(self.spec, targets, assignment)
        except Exception as exc:  # a render bug must not stop SD; the old bundle stays
            log.error("rendering the config bundle failed: %s", exc)
            self.metrics.config_checks.labels(result="failed").inc()
            return False
        before = dict(self.publisher.files)
        if not self.publisher.publish(bundle, version=version):
            return False
        self.reload_children(changed_children(before, self.publisher.files))
        return True

    def reload_children(self, children: list[str]) -> None:
        """POST ``/-/reload`` to each child (run with ``--web.enable-lifecycle``) whose config changed;
        a child we cannot reach picks its config up when it starts."""
        if self.probe is None or not children:
            return
        for child in children:
            url = self.child_url(child)
            if url is not None:
                result = "ok" if self.probe.reload(url) else "failed"
                self.metrics.reloads.labels(result=result).inc()

    def _config_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self._config_wake.wait(0.5):
                self._config_wake.clear()
                try:
                    self.publish_configs()
                except Exception:
                    log.exception("publishing configs failed")

    def _known_targets(self) -> dict[str, Target]:
        return self.reconciler.target_map

    # ---- hand-overs -------------------------------------------------------------------------
    def window_s(self, job: str) -> float:
        """How long the old child keeps a moved target once the new child has fetched it, when no
        proof comes: the SD refresh, Prometheus' discovery-to-scrape update throttle (5 s in
        ``discovery.Manager``) and two scrape intervals of the target's job."""
        if self.options.handover_window_s is not None:
            return self.options.handover_window_s
        spec_job = self.jobs.get(job)
        interval = parse_duration(
            spec_job.scrape_interval if spec_job else self.spec.children.scrape_interval
        )
        refresh = (
            parse_duration(self.spec.children.http_sd_refresh_interval)
            if self.spec.children.target_discovery == "http_sd"
            else 60.0
        )
        return refresh + DISCOVERY_THROTTLE_S + 2 * interval

    def _handovers(
        self, previous: Assignment | None, current: Assignment, targets: Mapping[str, Target]
    ) -> list[Handover]:
        if not self.options.handover:
            return []
        return handing.reconcile(
            previous,
            current,
            self.state.handovers,
            now=self._wall(),
            job_of={i: t.job for i, t in targets.items()},
            max_wait_s=self.options.handover_max_wait_s,
        )

    def settle(self) -> int:
        """Finish hand-overs whose new children scrape the target (or whose window passed).

        The children are asked once each per pass, before the state lock is taken: a slow
        child must not hold up plans and discovery, and a hundred targets moving to one
        child cost one request to it, not a hundred."""
        if not self.state.handovers:
            return 0
        answers = self._child_answers({h.to_shard for h in self.state.handovers})
        with self._lock:
            if not self.state.handovers:
                return 0
            targets = self._known_targets()
            pending, done = handing.settle(
                self.state.handovers,
                now=self._wall(),
                scraped=lambda h: self._scraped(h, targets, answers),
                fetched=self._fetched,
                window_s=self.window_s,
            )
            if pending == self.state.handovers:
                return 0
            self._commit(self.state.model_copy(update={"handovers": pending}), audit=None)
            for _, result in done:
                self.metrics.handovers.labels(result=result).inc()
            self._publish(targets=targets)
            return len(done)

    def _child_answers(self, shards: set[str]) -> dict[str, dict[TargetKey, ScrapeState] | None]:
        """child -> its active targets (None: unreachable or no URL), for the children of ``shards``."""
        assignment = self.state.assignment
        if assignment is None or self.probe is None:
            return {}
        answers: dict[str, dict[TargetKey, ScrapeState] | None] = {}
        for shard in shards & assignment.shards.keys():
            for child, _replica in assignment.children(shard):
                url = self.child_url(child)
                answers[child] = self.probe.active_targets(url) if url is not None else None
        return answers

    def note_fetch(self, shard: str) -> None:
        """A child of ``shard`` fetched its HTTP SD (called by the SD route; one dict write)."""
        self.sd_fetched[shard] = self._wall()

    def _fetched(self, shard: str) -> float | None:
        if self.spec.children.target_discovery != "http_sd":
            return self._wall()  # file_sd: the files are written now; nothing to wait for
        seen = [t for t in (self.sd_fetched.get(shard), self.remote_fetched.get(shard)) if t is not None]
        return max(seen) if seen else None  # fetches other replicas served count too

    def child_url(self, child: str) -> str | None:
        url = self.options.child_urls.get(child)
        if url is None and self.options.child_url_template:
            url = self.options.child_url_template.format(child=child)
        return url

    def _scraped(
        self,
        h: Handover,
        targets: Mapping[str, Target],
        answers: Mapping[str, dict[TargetKey, ScrapeState] | None],
    ) -> bool:
        """Every child of the new shard has scraped the target since the hand-over began."""
        target = targets.get(h.identity)
        assignment = self.state.assignment
        if target is None or assignment is None or h.to_shard not in assignment.shards:
            return False
        key = (target.job, target.instance, target.node)
        children = [child for child, _replica in assignment.children(h.to_shard)]
        for child in children:
            state = (answers.get(child) or {}).get(key)
            if state is None or state.health != "up" or state.last_scrape < h.started_at:
                return False
        return bool(children)

    def _health_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.options.health_interval_s):
            self.check_health()

    def check_health(self) -> None:
        assignment = self.state.assignment
        if assignment is None or self.probe is None:
            return
        for shard in assignment.shards:
            for child, _ in assignment.children(shard):
                url = self.child_url(child)
                if url is None:
                    continue
                scrapes = self.probe.active_targets(url)
                health = ChildHealth(reachable=scrapes is not None, checked_at=self._wall())
                if scrapes is not None:
                    health.active = len(scrapes)
                    health.up = sum(1 for s in scrapes.values() if s.health == "up")
                    health.scrapes = scrapes
                self.health[child] = health

    # ---- operator changes -------------------------------------------------------------------
    def current_version(self) -> str:
        return f"{self.state.desired_revision}"

    def plan(self, change: changing.ChangeRequest) -> PlannedChange:
        with self._lock:
            state = self.state
            targets = self._known_targets()
            if change.use_observed_weights:
                change = self._with_observed_weights(change, targets)
            try:
                desired = changing.apply_request(
                    state.desired, change, spec=self.spec, assignment=state.assignment
                )
            except changing.ChangeError as exc:
                raise Invalid(str(exc), field=exc.field) from exc
            for field_name, identities in (("pin", change.pin), ("weights", change.weights)):
                for identity in identities:
                    if identity not in targets:
                        raise NotFound(f"unknown target {identity!r} (in {field_name})")
            try:
                assignment = self._assign_change(change, desired, targets, previous=state.assignment)
            except AssignmentError as exc:
                raise Invalid(str(exc)) from exc
            plan = planning.diff(state.assignment, assignment)
            digest = hashlib.sha256(desired.model_dump_json().encode()).hexdigest()[:12]
            version = f"{state.desired_revision}-{digest}"
            planned = PlannedChange(
                version=version,
                base_revision=state.desired_revision,
                change=change,
                desired=desired,
                plan=plan,
                created_at=self._wall(),
                assignment_version=state.assignment_version,
                result=assignment,
            )
            self._plans[version] = planned
            self._plans.move_to_end(version)
            while len(self._plans) > self.options.max_plans:
                self._plans.popitem(last=False)
            self.metrics.plans.inc()
            return planned

    def apply(self, version: str, *, actor: str) -> ApplyResult:
        with self._lock:
            state = self.state
            if version == state.last_plan:
                self.metrics.rebalances.labels(result="noop").inc()
                return ApplyResult(
                    applied=False,
                    version=version,
                    plan=None,
                    message="this plan is already applied; nothing moved",
                )
            base = version.split("-", 1)[0]
            if base != str(state.desired_revision):
                self.metrics.rebalances.labels(result="conflict").inc()
                raise Conflict(
                    f"plan {version!r} was made against revision {base}, which another change "
                    f"replaced; plan again",
                    current_version=self.current_version(),
                )
            planned = self._plans.get(version)
            if planned is None:
                raise NotFound(f"no plan with version {version!r} (plans are kept in memory; plan again)")
            self.check_writable()
            targets = self._known_targets()
            if planned.result is not None and planned.assignment_version == state.assignment_version:
                assignment = planned.result  # nothing changed since the plan: it is still exact
            else:  # discovery moved on: place again, sticky to what is served now
                try:
                    assignment = self._assign_change(
                        planned.change, planned.desired, targets, previous=state.assignment
                    )
                except AssignmentError as exc:
                    raise Invalid(str(exc)) from exc
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
    def _assign_change(
        self,
        change: changing.ChangeRequest,
        desired: Desired,
        targets: Mapping[str, Target],
        *,
        previous: Assignment | None,
    ) -> Assignment:
        """The assignment a change leads to; a load-aware one sheds overloaded shards first.

        Plan and apply both come here, so applying a plan reproduces what it showed.
        """
        listed = list(targets.values())
        assignment = self._assign(desired, listed, previous=previous)
        if not change.use_observed_weights or previous is None:
            return assignment
        trimmed = shed(assignment, load_factor=self.spec.sharding.load_factor, pinned=desired.pins.keys())
        return self._assign(desired, listed, previous=trimmed)

    def _with_observed_weights(
        self, change: changing.ChangeRequest, targets: Mapping[str, Target]
    ) -> changing.ChangeRequest:
        if self.load is None:
            raise Invalid(
                "this controller reads no load (start gpufed serve with --load-url, or run full-Prometheus "
                "children with --child-url)",
                field="use_observed_weights",
            )
        if not self.load.rates():
            raise Invalid(
                "no load observed yet; try again after the first reading", field="use_observed_weights"
            )
        observed = self.load.weight_changes(targets, current=self.state.desired.weights)
        return change.model_copy(update={"weights": {**observed, **change.weights}})

    def _scrape_interval_s(self, job: str) -> float:
        spec_job = self.jobs.get(job)
        return parse_duration(spec_job.scrape_interval if spec_job else self.spec.children.scrape_interval)

    def observe_load(self) -> bool:
        """Read the children's load once (the load loop calls this); False when nothing was read."""
        if self.load is None:
            return False
        assignment = self.state.assignment
        urls: list[str] = []
        if assignment is not None and not self.spec.children.agent_mode:
            for shard in assignment.shards:
                urls.extend(u for c, _ in assignment.children(shard) if (u := self.child_url(c)) is not None)
        return self.load.refresh(
            targets=self._known_targets(), interval_s=self._scrape_interval_s, child_urls=urls
        )

    def load_report(self) -> dict[str, Any]:
        if self.load is None:
            raise NotFound("this controller reads no load (start gpufed serve with --load-url)")
        return self.load.report(
            assignment=self.state.assignment,
            targets=self._known_targets(),
            current=self.state.desired.weights,
        )

    def auto_rebalance(self) -> ApplyResult | None:
        """Apply a load-aware plan if the policy allows it and it helps; None when nothing was applied."""
        load, assignment = self.load, self.state.assignment
        if load is None or assignment is None or not self._can_write():
            return None
        threshold = load.options.auto_rebalance_imbalance
        if threshold is None or not load.rates():
            return None
        if time.monotonic() - self._auto_rebalanced_at < load.options.auto_rebalance_cooldown_s:
            return None
        targets = self._known_targets()
        before = load.region_imbalance(assignment, targets)
        worst = max(before.values(), default=0.0)
        if worst <= threshold:
            return None
        self._auto_rebalanced_at = time.monotonic()  # also after a plan that does not help
        reason = f"auto: samples/s max/mean {worst:.2f} above {threshold:g}"
        planned = self.plan(changing.ChangeRequest(use_observed_weights=True, reason=reason))
        after = load.region_imbalance(assignment, targets, plan=planned.plan)
        if not planned.plan.changed or max(after.values(), default=0.0) >= worst:
            log.info("auto rebalance skipped: the plan would not lower max/mean %.2f", worst)
            return None
        log.info("auto rebalance: %s; applying %s", reason, planned.version)
        return self.apply(planned.version, actor="auto-rebalance")

    def _load_loop(self, stop: threading.Event) -> None:
        assert self.load is not None
        while not stop.wait(self.load.options.interval_s):
            try:
                if self.observe_load():
                    self.auto_rebalance()
            except Exception:  # a bad reading must not end the loop
                log.exception("load reading failed")

    # ---- reads ----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state.assignment is not None

    def shard_rows(self) -> list[dict[str, Any]]:
        state = self.state
        assignment = state.assignment
        if assignment is None:
            return []
        load = assignment.load()
        sizes: dict[str, int] = dict.fromkeys(assignment.shards, 0)
        for shard in assignment.targets.values():
            sizes[shard] += 1
        means: dict[str, float] = {}
        for region in self.spec.region_names():
            active = [
                load[s]
                for s, i in assignment.shards.items()
                if i.region == region and s not in assignment.drained
            ]
            means[region] = sum(active) / len(active) if active else 0.0
        incoming: dict[str, int] = {}
        outgoing: dict[str, int] = {}
        for h in state.handovers:
            incoming[h.to_shard] = incoming.get(h.to_shard, 0) + 1
            outgoing[h.from_shard] = outgoing.get(h.from_shard, 0) + 1
        samples = self.load.shard_samples(assignment) if self.load is not None else {}
        rows = []
        for shard in planning._shard_order(assignment.shards):
            info = assignment.shards[shard]
            mean = means.get(info.region, 0.0)
            children = []
            for child, replica in assignment.children(shard):
                health = self.health.get(child)
                children.append(
                    {
                        "child": child,
                        "replica": replica,
                        "url": self.child_url(child),
                        "reachable": None if health is None else health.reachable,
                        "active_targets": None if health is None else health.active,
                        "up_targets": None if health is None else health.up,
                    }
                )
            rows.append(
                {
                    "shard": shard,
                    "region": info.region,
                    "index": info.index,
                    "children": children,
                    "targets": sizes[shard],
                    "load": load[shard],
                    "load_over_mean": round(load[shard] / mean, 3) if mean else 0.0,
                    "capacity": round(mean * self.spec.sharding.load_factor, 1),
                    "drained": shard in assignment.drained,
                    "handovers_in": incoming.get(shard, 0),
                    "handovers_out": outgoing.get(shard, 0),
                    "health": _shard_health(children),
                }
            )
            if samples.get(shard) is not None:
                rows[-1]["samples_per_s"] = samples[shard]
        return rows

    def target_rows(self, *, region: str | None, shard: str | None, q: str | None) -> list[dict[str, Any]]:
        assignment = self.state.assignment
        if assignment is None:
            return []
        rows = []
        needle = (q or "").lower()
        for identity, target in sorted(self._known_targets().items()):
            owner = assignment.targets.get(identity)
            if owner is None or (region and target.region != region) or (shard and owner != shard):
                continue
            if needle and needle not in identity.lower() and needle not in target.node.lower():
                continue
            rows.append(self._target_row(identity, target, owner, assignment))
        return rows

    def _target_row(
        self, identity: str, target: Target, owner: str, assignment: Assignment
    ) -> dict[str, Any]:
        return {
            "identity": identity,
            "instance": target.instance,
            "job": target.job,
            "node": target.node,
            "region": target.region,
            "shard": owner,
            "weight": assignment.weights.get(identity, 1),
            "children": [child for child, _ in assignment.children(owner)],
            "health": self._target_health(target, owner, assignment),
        }

    def _target_health(self, target: Target, owner: str, assignment: Assignment) -> dict[str, str]:
        """child -> how its last health check saw this target; children not checked are left out.

        ``absent``: the child answered but does not scrape the target (yet).
        """
        key = (target.job, target.instance, target.node)
        out: dict[str, str] = {}
        for child, _ in assignment.children(owner):
            health = self.health.get(child)
            if health is None or not health.reachable:
                continue
            scrape = health.scrapes.get(key)
            out[child] = "absent" if scrape is None else scrape.health
        return out

    def explain(self, identity: str) -> dict[str, Any]:
        state = self.state
        assignment = state.assignment
        target = self._known_targets().get(identity)
        if assignment is None or target is None or identity not in assignment.targets:
            raise NotFound(f"unknown target {identity!r}")
        owner = assignment.targets[identity]
        row = self._target_row(identity, target, owner, assignment)
        ring_owner = _ring_owner(assignment, identity, target.region)
        if identity in state.desired.pins:
            reason = "pinned"
        elif ring_owner == owner:
            reason = "ring owner"
        elif ring_owner in assignment.drained:
            reason = "drain"
        else:
            reason = "capacity spill"
        handover = next((h for h in state.handovers if h.identity == identity), None)
        row.update(
            reason=reason,
            ring_owner=ring_owner,
            pinned_to=state.desired.pins.get(identity),
            weight_override=state.desired.weights.get(identity),
            handover=None if handover is None else handover.model_dump(mode="json"),
            scraped_by=sorted(
                set(row["children"])
                | (
                    {c for c, _ in assignment.children(handover.from_shard)}
                    if handover is not None and handover.from_shard in assignment.shards
                    else set()
                )
            ),
            labels=target.target_labels(),
        )
        return row

    def discovery_rows(self) -> list[dict[str, Any]]:
        sets = self.reconciler.source_sets()
        names = sorted({getattr(s, "name", "?") for s in self.sources} | sets.keys())
        rows = []
        for name in names:
            age = self.discovery.staleness(name)
            rows.append(
                {
                    "source": name,
                    "targets": len(sets.get(name, [])),
                    "last_success_age_s": None if age is None else round(age, 1),
                }
            )
        return rows


def config_key(spec: GpufedSpec, assignment: Assignment) -> object:
    """What the children's configs depend on; None when it is every target (file_sd lists)."""
    if spec.children.target_discovery == "file_sd":
        return None
    shards = tuple(sorted((name, info.region) for name, info in assignment.shards.items()))
    return (shards, assignment.replication_factor, tuple(sorted(assignment.drained)))


def changed_children(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> list[str]:
    """Children whose ``prometheus.yml`` existed before and changed (new children start fresh)."""
    out = []
    for path, content in after.items():
        parts = path.split("/")
        if len(parts) == 3 and parts[0] == "children" and parts[2] == "prometheus.yml":
            old = before.get(path)
            if old is not None and old != content:
                out.append(parts[1])
    return sorted(out)


def _shard_health(children: list[dict[str, Any]]) -> str:
    known = [c for c in children if c["reachable"] is not None]
    if not known:
        return "unknown"
    if any(not c["reachable"] for c in known):
        return "down"
    if any(c["up_targets"] != c["active_targets"] for c in known):
        return "degraded"
    return "ok"


def _ring_owner(assignment: Assignment, identity: str, region: str) -> str | None:
    """The shard the ring alone would pick (no capacity bound), for ``explain``."""
    if assignment.algorithm != "bounded-ring":
        return None
    from sharder.assign import VNODES
    from sharder.hashing import Ring, key_hash

    active = [
        s
        for s, i in sorted(assignment.shards.items(), key=lambda kv: kv[1].index)
        if i.region == region and s not in assignment.drained
    ]
    if not active:
        return None
    return active[Ring(active, vnodes=VNODES).primary(key_hash(identity))]


def dump_plan(planned: PlannedChange) -> dict[str, Any]:
    return {
        "version": planned.version,
        "base_version": str(planned.base_revision),
        "change": json.loads(planned.change.model_dump_json(exclude_defaults=True)),
        **planned.plan.to_json_dict(),
    }
