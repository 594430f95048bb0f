"""Render the latest snapshot as Prometheus metric families on each scrape.

`SnapshotCollector` is a prometheus-client collector (one `collect` method) whose data
source, a `Collection`, is a constructor argument; it is registered on an app-owned
`CollectorRegistry`, never the global one. A scrape only walks the snapshot: no backend
call, no pod lookup.

DCGM names are 3.x or 4.x (`exporter.naming`, `--dcgm-names`); the snapshot always holds
3.x names and units, and the rename happens here, at render time.

DCGM counters are typed `counter` under their own names, as dcgm-exporter writes them
(`textformat.ExactCounter`: no `_total` is added). The driver version rides on every GPU
series as the `DCGM_FI_DRIVER_VERSION` label, as dcgm-exporter's `label` rows do.

MIG: a GPU instance's own values (`Reading.instances`) are written with the GPU's labels
plus dcgm-exporter's `GPU_I_PROFILE` and `GPU_I_ID`, and carry the pods that hold that
instance. The whole GPU's series carry no MIG label and no MIG pod, so a MIG pod's series
are its instance's values, never the whole GPU's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from exporter import naming, xid_messages
from exporter.catalogue import metrics_for
from exporter.collection import Collection
from exporter.models import GpuDevice, InstanceReading, Snapshot
from exporter.naming import DcgmNames, exposed
from exporter.textformat import ExactCounter

MIB = 1024.0 * 1024.0
# NvLinkReading attribute -> (series name without _total, help); names are fixed (dashboards).
NVLINK_COUNTERS = (
    ("tx_bytes", "gpufed_nvlink_tx_bytes", "Bytes of data sent over the NVLink."),
    ("rx_bytes", "gpufed_nvlink_rx_bytes", "Bytes of data received over the NVLink."),
    ("replay_errors", "gpufed_nvlink_replay_errors", "NVLink data-link replays (retransmissions)."),
    ("recovery_errors", "gpufed_nvlink_recovery_errors", "NVLink link recoveries (retraining)."),
)


#: The host label of dcgm-exporter's NVLink entity series (`--nvlink-series dcgm`).
LINK_HOST_LABEL = "hostname"
#: dcgm-exporter's MIG labels (its GPU template, tag 4.5.3-4.8.2): profile name, NVML GPU instance id.
MIG_PROFILE_LABEL, MIG_ID_LABEL = "GPU_I_PROFILE", "GPU_I_ID"


@dataclass(frozen=True, slots=True)
class LabelPolicy:
    """Labels shared by every GPU series: ONE host label plus the placement labels."""

    node: str
    hostname_label: str = "Hostname"
    placement: Mapping[str, str] = field(default_factory=dict)
    hami_legacy: bool = False
    driver_label: str = "DCGM_FI_DRIVER_VERSION"

    def gpu_labels(self, device: GpuDevice, pod: Mapping[str, str] | None = None, *,
                   driver: str = "", instance: InstanceReading | None = None) -> dict[str, str]:
        labels = {
            "gpu": str(device.index),
            "UUID": device.uuid,
            "device": device.device,
            "modelName": device.model,
            "pci_bus_id": device.pci_bus_id,
        }
        if instance is not None:
            labels[MIG_PROFILE_LABEL] = instance.profile
            labels[MIG_ID_LABEL] = str(instance.gpu_instance_id)
        labels |= {self.hostname_label: self.node, **self.placement}
        if driver:
            labels[self.driver_label] = driver
        if pod:
            labels.update(pod)
        return labels

    def link_labels(self, device: GpuDevice, link: int, *, driver: str = "") -> dict[str, str]:
        """dcgm-exporter's labels for a GPU's NVLink entity (its `linkMetricsFormat`):
        `nvlink`, `gpu`, `gpu_uuid`, `pci_bus_id`, `device`, `model_name`, `hostname`.

        Always lower-case `hostname`: dcgm-exporter's link template writes it so (tag
        4.5.3-4.8.2, `internal/pkg/rendermetrics/render_metrics.go`), while its GPU template
        wrote `Hostname` until main renamed it; `hostname_label` picks the GPU series' spelling."""
        labels = {
            "nvlink": str(link),
            "gpu": str(device.index),
            "gpu_uuid": device.uuid,
            "pci_bus_id": device.pci_bus_id,
            "device": device.device,
            "model_name": device.model,
            LINK_HOST_LABEL: self.node,
            **self.placement,
        }
        if driver:
            labels[self.driver_label] = driver
        return labels


def _whole_gpu(pods: tuple[Mapping[str, str], ...]) -> tuple[Mapping[str, str], ...]:
    """The pods that hold the whole GPU (not one of its MIG instances)."""
    return tuple(pod for pod in pods if MIG_ID_LABEL not in pod)


def _family(name: str, doc: str, kind: str) -> Metric:
    return Metric(name, doc, kind)


def _dcgm_family(name: str, doc: str, kind: str) -> Metric:
    """A DCGM family: counters keep their exact name (`# TYPE NAME counter`)."""
    return ExactCounter(name, doc) if kind == "counter" else Metric(name, doc, "gauge")


class SnapshotCollector:
    """Collector over one `Collection`; cheap enough to run on every scrape."""

    def __init__(self, collection: Collection, policy: LabelPolicy, *, dcgm_names: DcgmNames = "3",
                 nvlink_series: str = "gpufed") -> None:
        self._collection = collection
        self._policy = policy
        self._specs = metrics_for(collection.families)
        self._names: DcgmNames = dcgm_names
        self._nvlink_series = nvlink_series

    def collect(self) -> Iterator[Metric]:
        snap = self._collection.snapshot
        if snap is not None:
            yield from self._gpu_families(snap)
            yield from self._attribution_families(snap)
        yield from self._self_families()

    def _gpu_families(self, snap: Snapshot) -> Iterator[Metric]:
        fams = self._collection.families
        # One label set per pod holding the GPU (a shared GPU is written once per pod, as
        # dcgm-exporter does); a GPU no pod holds has one set without pod labels. Pods on a
        # MIG instance are on that instance's series only.
        labels = {
            d.index: [self._policy.gpu_labels(d, pod, driver=snap.driver_version)
                      for pod in _whole_gpu(snap.pod_labels.get(d.uuid, ())) or (None,)]
            for d in snap.devices
        }
        instances = self._instance_labels(snap)
        for spec in self._specs:
            for out in exposed(spec.name, spec.help, self._names):
                metric = _dcgm_family(out.name, out.help, spec.kind)
                for index, reading in snap.readings.items():
                    value = reading.values.get(spec.name)
                    if value is not None:
                        converted = out.convert(value)
                        metric.samples.extend(Sample(out.name, lab, converted) for lab in labels[index])
                for instance, sets in instances:
                    value = instance.values.get(spec.name)
                    if value is not None:
                        converted = out.convert(value)
                        metric.samples.extend(Sample(out.name, lab, converted) for lab in sets)
                if metric.samples:
                    yield metric
        if any(spec.name == "DCGM_FI_DEV_FB_USED" for spec in self._specs):
            yield from self._capacity_family(snap, labels)
        if "xid" in fams:
            yield from self._xid_families(snap, labels)
        if "health" in fams:
            health = _family("gpufed_gpu_health", "1 if the GPU read fine and had no critical XID "
                             "within the health window, else 0.", "gauge")
            for index, ok in snap.health.items():
                health.samples.extend(Sample(health.name, lab, 1.0 if ok else 0.0) for lab in labels[index])
            yield health
        if "hami" in fams:
            yield from self._hami_families(snap)
        if "nvlink" in fams and self._nvlink_series == "dcgm":
            yield from self._dcgm_link_families(snap)
        elif "nvlink" in fams:
            yield from self._nvlink_families(snap, labels)
        if "process" in fams:
            procs = _family("gpufed_gpu_process_memory_used_bytes",
                            "GPU memory used by one process.", "gauge")
            for index, reading in snap.readings.items():
                for proc in reading.processes:
                    procs.samples.extend(Sample(
                        procs.name, {**lab, "pid": str(proc.pid)}, proc.used_memory_mib * MIB
                    ) for lab in labels[index])
            yield procs

    def _instance_labels(self, snap: Snapshot) -> list[tuple[InstanceReading, list[dict[str, str]]]]:
        """Each MIG instance with its label sets: one per pod holding it, else one without pods."""
        devices = {d.index: d for d in snap.devices}
        out = []
        for index, reading in snap.readings.items():
            if index not in devices or not reading.instances:
                continue
            device = devices[index]
            pods = snap.pod_labels.get(device.uuid, ())
            for instance in reading.instances:
                held = [pod for pod in pods if pod.get(MIG_ID_LABEL) == str(instance.gpu_instance_id)]
                sets = [self._policy.gpu_labels(device, pod, driver=snap.driver_version, instance=instance)
                        for pod in held or (None,)]
                out.append((instance, sets))
        return out

    def _nvlink_families(self, snap: Snapshot, labels: dict[int, list[dict[str, str]]]) -> Iterator[Metric]:
        """Per-link series: the GPU's labels plus `link`; a value the GPU does not give is left out."""
        up = _family("gpufed_nvlink_link_up", "1 if the NVLink is active, else 0.", "gauge")
        counters = {
            attr: _family(name, doc, "counter") for attr, name, doc in NVLINK_COUNTERS
        }
        crc = _family("gpufed_nvlink_crc_errors", "NVLink CRC errors, by type (flit, data).", "counter")
        for index, reading in snap.readings.items():
            for link, base in ((link, base) for link in reading.links for base in labels[index]):
                link_labels = {**base, "link": str(link.link)}
                up.samples.append(Sample(up.name, link_labels, 1.0 if link.up else 0.0))
                for attr, family in counters.items():
                    value = getattr(link, attr)
                    if value is not None:
                        family.samples.append(Sample(f"{family.name}_total", link_labels, value))
                for kind, value in (("flit", link.crc_flit_errors), ("data", link.crc_data_errors)):
                    if value is not None:
                        crc.samples.append(Sample(f"{crc.name}_total", {**link_labels, "type": kind}, value))
        for family in (up, *counters.values(), crc):
            if family.samples:
                yield family

    def _dcgm_link_families(self, snap: Snapshot) -> Iterator[Metric]:
        """Per-link series under DCGM 4.6.0's per-link field names, labelled as dcgm-exporter
        labels its NVLink entities (`--nvlink-series dcgm`); links that are down are left
        out, as dcgm-exporter watches only links whose state is up."""
        devices = {d.index: d for d in snap.devices}
        for row in naming.link_rows():
            attr = row.reading.removeprefix(naming.LINK_PREFIX)
            metric = _dcgm_family(row.rename.name, row.rename.help, row.rename.kind)
            for index, reading in snap.readings.items():
                for link in reading.links:
                    if not link.up or index not in devices:
                        continue
                    if attr == "throughput":
                        tx, rx = link.tx_bytes, link.rx_bytes
                        value = None if tx is None or rx is None else tx + rx
                    else:
                        value = getattr(link, attr)
                    if value is not None:
                        labels = self._policy.link_labels(devices[index], link.link,
                                                          driver=snap.driver_version)
                        metric.samples.append(Sample(metric.name, labels, row.rename.convert(value)))
            if metric.samples:
                yield metric

    def _capacity_family(self, snap: Snapshot, labels: dict[int, list[dict[str, str]]]) -> Iterator[Metric]:
        """The total framebuffer in bytes (`--dcgm-names 4-draft` only), where the backend knows it."""
        found = exposed(naming.CAPACITY_READING, "", self._names)
        if not found or found[0].name != naming.CAPACITY:
            return
        metric = _family(naming.CAPACITY, found[0].help, "gauge")
        for device in snap.devices:
            total = naming.capacity_bytes(device.memory_total_mib)
            if total is not None and device.index in labels:
                metric.samples.extend(Sample(metric.name, lab, total) for lab in labels[device.index])
        if metric.samples:
            yield metric

    def _xid_families(self, snap: Snapshot, labels: dict[int, list[dict[str, str]]]) -> Iterator[Metric]:
        for out in exposed("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", self._names):
            last = _family(out.name, out.help, "gauge")
            for index in labels:
                code = snap.last_xid.get(index, 0)
                xid = {"err_code": str(code), "err_msg": xid_messages.message(code)}  # as dcgm-exporter
                last.samples.extend(Sample(last.name, {**lab, **xid}, float(code)) for lab in labels[index])
            yield last
        total = _family("gpufed_gpu_xid_errors", "XID errors reported by the driver, by code.", "counter")
        seen = _family("gpufed_gpu_xid_last_seen_timestamp_seconds",
                       "Unix time the XID code was last reported.", "gauge")
        for (index, code), tally in sorted(snap.xids.items()):
            if index not in labels:
                continue
            for lab in labels[index]:
                xid_labels = {**lab, "err_code": str(code)}
                total.samples.append(Sample("gpufed_gpu_xid_errors_total", xid_labels, float(tally.count)))
                seen.samples.append(Sample(seen.name, xid_labels, tally.last_seen))
        yield total
        yield seen

    def _hami_families(self, snap: Snapshot) -> Iterator[Metric]:
        """HAMi's vGPU monitor host series as HAMi v2.10 writes them (cmd/vGPUmonitor/metrics.go).

        Names, labels and values are HAMi's, one series per device whatever pods hold it:
        ``node``/``device_index``/``device_uuid``/``device_type`` (``NVIDIA-`` + the device
        name), utilisation in percent despite the ``_ratio`` name. Only the two series HAMi's
        dashboards read: v2.10's memory-controller series would add a third per GPU, which no
        panel shows. ``hami_legacy`` adds the pre-2.9 names (HAMi's ``--legacy-metrics``).
        """
        mem = _family("hami_host_gpu_memory_used_bytes", "Device memory in use, bytes.", "gauge")
        util = _family("hami_host_gpu_utilization_ratio", "Core utilisation in percent (0-100).", "gauge")
        legacy_mem = _family("HostGPUMemoryUsage", "Device memory in use, bytes (HAMi's old name).", "gauge")
        legacy_util = _family("HostCoreUtilization", "Core utilisation, percent (HAMi's old name).", "gauge")
        by_index = {d.index: d for d in snap.devices}
        for index, reading in snap.readings.items():
            dev = by_index[index]
            device = {"device_index": str(index), "device_uuid": dev.uuid,
                      "device_type": f"NVIDIA-{dev.model}"}
            host = {"node": self._policy.node, **device}
            legacy = {"nodeid": self._policy.node, "deviceidx": str(index),
                      "deviceuuid": dev.uuid, "devicetype": device["device_type"]}
            used = reading.values.get("DCGM_FI_DEV_FB_USED")
            busy = reading.values.get("DCGM_FI_DEV_GPU_UTIL")
            if used is not None:
                mem.samples.append(Sample(mem.name, host, used * MIB))
                legacy_mem.samples.append(Sample(legacy_mem.name, legacy, used * MIB))
            if busy is not None:
                util.samples.append(Sample(util.name, host, busy))
                legacy_util.samples.append(Sample(legacy_util.name, legacy, busy))
        yield mem
        yield util
        if self._policy.hami_legacy:
            yield legacy_mem
            yield legacy_util

    def _attribution_families(self, snap: Snapshot) -> Iterator[Metric]:
        """Freshness of the GPU -> pod map and kubelet's allocatable GPUs (kubelet attribution)."""
        status = snap.attribution
        if status is None:
            return
        last = _family("gpufed_exporter_pod_attribution_last_success_timestamp_seconds",
                       "Unix time of kubelet's last good pod-resources answer; 0 if none yet.", "gauge")
        last.samples.append(Sample(last.name, {}, status.last_success or 0.0))
        stale = _family("gpufed_exporter_pod_attribution_stale",
                        "1 while pod labels are dropped because kubelet's last answer is too old.", "gauge")
        stale.samples.append(Sample(stale.name, {}, 1.0 if status.stale else 0.0))
        errors = _family("gpufed_exporter_pod_attribution_errors",
                         "Failed kubelet pod-resources calls, by gRPC status code.", "counter")
        for code, count in sorted(status.errors.items()):
            errors.samples.append(Sample(f"{errors.name}_total", {"code": code}, float(count)))
        yield from (last, stale, errors)
        if status.allocatable:
            alloc = _family("gpufed_kubelet_allocatable_gpus", "Devices kubelet can allocate, by GPU "
                            "resource (GetAllocatableResources).", "gauge")
            for resource, count in status.allocatable.items():
                alloc.samples.append(Sample(alloc.name, {"resource": resource}, float(count)))
            yield alloc

    def _self_families(self) -> Iterator[Metric]:
        stats = self._collection.stats
        if stats.last_success is not None:
            ts = _family("gpufed_exporter_last_collection_success_timestamp_seconds",
                         "Unix time of the last successful collection.", "gauge")
            ts.samples.append(Sample(ts.name, {}, stats.last_success))
            yield ts
        duration = _family("gpufed_exporter_collection_duration_seconds",
                           "Wall time of the last successful collection.", "gauge")
        duration.samples.append(Sample(duration.name, {}, stats.last_duration))
        yield duration
        for name, doc, value in (
            ("gpufed_exporter_collections", "Successful collections.", stats.collections),
            ("gpufed_exporter_collection_errors", "Failed or partial collections.", stats.errors),
            ("gpufed_exporter_collection_timeouts", "Collections abandoned at the timeout.", stats.timeouts),
        ):
            counter = _family(name, doc, "counter")
            counter.samples.append(Sample(f"{name}_total", {}, float(value)))
            yield counter
