"""Publication: a committed state becomes what the outside sees.

Three outputs, each built only from a state the store has accepted:

* the HTTP SD snapshot (``sdcache``): rebuilt for the shards whose members changed and
  swapped in one assignment, so readers never take a lock;
* the shard metrics;
* the config bundle (``federation.master.pipeline``), rendered and checked on its own thread
  (promtool takes a while and SD must not wait for it), and only when what the children's
  configs depend on changed (:func:`config_key`: the children set, the spec), then the
  children whose config changed are reloaded;
* with file_sd, between two such renders, the target lists of the shards the change
  touched (``filesd``), swapped in file by file right after SD (on the config thread after
  the bundle when one is due or being written; no promtool: lists are not configs). Work in
  proportion to the change, as HTTP SD's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from federation.controller.base import heap
from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.options import ControllerOptions
from federation.controller.base.state import ControllerState
from federation.controller.live import filesd, sdcache
from federation.controller.live.children import Children
from federation.controller.live.publisher import Publisher
from federation.controller.stores.store import Changed
from federation.master import pipeline
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.model.inventory import Target

log = logging.getLogger(__name__)

REFRESH_SHARE = 20
"""A refresh waits at least this many times the last render's seconds: at 300,000 targets
a render of 8,338 children took a minute of a core on a loaded host, and one every 5
minutes held file_sd lists behind it (served p99 60 s) and was most of the CPU the
change phase measured (issue #44)."""


class Publication:
    def __init__(
        self,
        *,
        spec: GpufedSpec,
        options: ControllerOptions,
        metrics: ControllerMetrics,
        children: Children,
        publisher: Publisher | None,
    ) -> None:
        self.spec = spec
        self.options = options
        self.metrics = metrics
        self.children = children
        self.publisher = publisher
        self.jobs = {job.name: job for job in spec.jobs}
        self.sd = sdcache.SdSnapshot(version=0)
        self._config_lock = threading.Lock()
        self._config_wake = threading.Event()
        self._config_due: tuple[int, Assignment, list[Target], object] | None = None
        """(version, assignment, targets, :func:`config_key`) of the bundle to publish next."""
        self._served_key: object = None
        """:func:`config_key` of the bundle served: one due with the same key is a refresh,
        which re-renders no child (``pipeline.refreshed_bundle``)."""
        self._lists_due: tuple[int, sdcache.SdSnapshot, Assignment] | None = None
        self._lists_shards: set[str] = set()
        """file_sd: shards whose target lists changed since the last write (``_config_lock``)."""
        self.file_sd = spec.children.target_discovery == "file_sd"
        self._rendering = False
        """A bundle is being rendered and written (``_config_lock``): lists wait for it."""
        self._config_key: object = None
        self._key_held: tuple[object, object, object] | None = None
        self._render_s = 0.0
        """How long the last bundle took to render, check and write (paces the refresh)."""
        self._config_at = float("-inf")
        self._lists = filesd.ListCache()
        """file_sd: the lists written last, per shard (re-encodes only what changed)."""

    def publish(
        self, state: ControllerState, targets: Mapping[str, Target], *, changed: Changed | None = None
    ) -> None:
        """Serve ``state`` (already committed): SD first, then metrics, then the bundle.
        ``changed``: what may differ from the assignment served now (``sdcache.build``)."""
        assignment = state.assignment
        if assignment is None:
            return
        before = self.sd
        self.sd = sdcache.build(
            version=state.assignment_version,
            jobs=self.jobs,
            assignment=assignment,
            targets=targets,
            handovers=state.handovers,
            previous=self.sd,
            changed=changed,
        )
        load, sizes = assignment.totals()  # read-only: no copy of every shard's figures
        was = before.assignment
        # an incremental step keeps the shards' dict: no compare of every shard then
        same_shards = was is not None and (was.shards is assignment.shards or was.shards == assignment.shards)
        shards = filesd.changed_shards(before, self.sd) if same_shards else assignment.shards.keys()
        rows = [(assignment.shards[s].region, s, sizes[s], load[s]) for s in shards if s in assignment.shards]
        if same_shards:  # the other shards' gauges hold their values already
            self.metrics.update_shards(rows)
        else:
            self.metrics.publish_shards(rows)
        self.metrics.assignment_version.set(state.assignment_version)
        self.metrics.handovers_in_flight.set(len(state.handovers))
        self.metrics.ready.set(1)
        if self.publisher is not None:
            key = self._key_of(assignment)
            now = time.monotonic()
            # a refresh (nothing the configs depend on changed: the manifest, assignment.json
            # and Grafana's folders) at most 1/REFRESH_SHARE of the time it takes
            every = max(self.options.config_refresh_s, REFRESH_SHARE * self._render_s)
            stale = now >= self._config_at + every
            if key != self._config_key or stale:
                self._config_key, self._config_at = key, now
                whole = key != self._served_key
                with self._config_lock:
                    self._config_due = (state.assignment_version, assignment, list(targets.values()), key)
                    if whole:
                        self._lists_due, self._lists_shards = None, set()  # the bundle holds every list
                self._config_wake.set()
                if whole or not self.file_sd:
                    return
                # a refresh keeps the lists as written: this change's go after it, as below
            if self.file_sd:
                shards = filesd.changed_shards(before, self.sd)
                if shards:
                    with self._config_lock:
                        self._lists_due = (state.assignment_version, self.sd, assignment)
                        self._lists_shards |= shards
                        # no bundle due or being written: nothing older can land over the lists,
                        # so they are written here and now (a shard's few files), not a thread later
                        inline = self._config_due is None and not self._rendering
                    if inline:
                        self.publish_lists()
                    else:
                        self._config_wake.set()

    def _key_of(self, assignment: Assignment) -> object:
        """:func:`config_key`, sorted once per shard set (an incremental step keeps the
        shards' dict: no sort of every shard per change)."""
        held = self._key_held
        extra = (assignment.replication_factor, tuple(assignment.drained))
        if held is None or held[0] is not assignment.shards or held[1] != extra:
            held = self._key_held = (assignment.shards, extra, config_key(self.spec, assignment))
        return held[2]

    def first_bundle_done(self) -> bool:
        """The first bundle's render and check ended (published or failed), and nothing is
        due or being written (``StartUp``); True without a publisher."""
        if self.publisher is None:
            return True
        with self._config_lock:
            idle = self._config_due is None and not self._rendering and self._lists_due is None
        status = self.publisher.status
        return idle and (status.version > 0 or status.failed_version > 0)

    def publish_configs(self) -> bool:
        """Render and check the bundle of the newest assignment (outside the state lock).
        False when nothing was due or it failed (the old bundle stays served)."""
        with self._config_lock:
            due, self._config_due = self._config_due, None
            self._rendering = due is not None
        if due is None:
            self.publish_lists()
            return False
        started = time.monotonic()
        try:
            return self._publish_bundle(due)
        finally:
            self._render_s = time.monotonic() - started
            with self._config_lock:
                self._rendering = False
            self.publish_lists()  # changes placed while the bundle was rendered
            heap.trim()  # a bundle of every child is built and dropped: give the pages back

    def _publish_bundle(self, due: tuple[int, Assignment, list[Target], object]) -> bool:
        if self.publisher is None:
            return False
        version, assignment, all_targets, key = due
        targets, left_out = renderable(self.jobs, all_targets, assignment)
        if left_out:
            log.error(
                "config bundle for assignment %d leaves out %d target(s) it cannot render: %s",
                version, len(left_out), "; ".join(left_out[:5]),
            )
        self.metrics.config_left_out.set(len(left_out))
        refresh = key == self._served_key and self.publisher.status.version > 0
        if not refresh:
            with self._config_lock:  # lists placed up to this version: the bundle holds them
                if self._lists_due is not None and self._lists_due[0] <= version:
                    self._lists_due, self._lists_shards = None, set()
        try:
            if refresh:
                bundle = pipeline.refreshed_bundle(
                    self.spec, targets, assignment, current=self.publisher.files)
            else:
                bundle = pipeline.build_bundle(self.spec, targets, assignment)
        except Exception as exc:  # a render bug must not stop SD; the old bundle stays
            log.error("rendering the config bundle failed: %s", exc)
            self.publisher.fail(version=version, error=f"render: {exc}")
            self.metrics.config_ok.set(0)
            return False
        before = dict(self.publisher.files)
        ok = self.publisher.publish(bundle, version=version)
        self.publisher.status.left_out, self.publisher.status.left_out_count = left_out[:20], len(left_out)
        self.metrics.config_ok.set(1 if ok else 0)
        if not ok:
            return False
        self.metrics.config_published_at.set(self.publisher.status.published_at)
        self._served_key = key
        if self.file_sd and not refresh:  # the lists this render wrote: what the next change cuts
            self._lists.seed(files=bundle, jobs=self.jobs, snapshot=self.sd, assignment=assignment)
        self.children.reload(changed_children(before, self.publisher.files))
        return True

    def publish_lists(self) -> int:
        """file_sd: write the target lists of the shards changed since the last write (after
        any bundle due, so a list is never older than the tree under it)."""
        with self._config_lock:
            due, shards = self._lists_due, self._lists_shards
            self._lists_due, self._lists_shards = None, set()
        if due is None or self.publisher is None:
            return 0
        version, snapshot, assignment = due
        lists = self._lists.target_lists(
            jobs=self.jobs, snapshot=snapshot, assignment=assignment, shards=shards
        )
        return self.publisher.publish_lists(lists, version=version)

    def config_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self._config_wake.wait(0.5):
                self._config_wake.clear()
                try:
                    self.publish_configs()
                except Exception:
                    log.exception("publishing configs failed")


def renderable(
    jobs: Mapping[str, object], targets: list[Target], assignment: Assignment
) -> tuple[list[Target], list[str]]:
    """(targets the bundle can hold, one line naming each left out). A target whose job the
    spec does not define (one that came from Consul, say) would fail every child's config:
    it is left out and named, so one bad target never stops the rest from being published."""
    kept: list[Target] = []
    left_out: list[str] = []
    for target in targets:
        if target.job not in jobs:
            left_out.append(f"{target.identity!r}: job {target.job!r} is not defined by the spec")
        elif target.identity not in assignment.targets:
            left_out.append(f"{target.identity!r}: not in assignment (region {target.region!r})")
        else:
            kept.append(target)
    return kept, left_out


def config_key(spec: GpufedSpec, assignment: Assignment) -> object:
    """What the children's configs depend on: the children set (file_sd target lists change
    with targets, and are written apart: ``filesd``)."""
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
