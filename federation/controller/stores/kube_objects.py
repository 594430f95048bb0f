"""ConfigMaps as the Kubernetes store's storage: parts written by digest, heads committed
on resourceVersion, API errors mapped to ``StoreError`` at this boundary.

:class:`ConfigMaps` is the I/O half of ``kube_store`` (which holds the contract's logic);
it imports ``kubernetes`` and is pinned to that by ``.importlinter``. See ``kube_store``
for the layout and ``kube_parts`` for how a document is cut into objects.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import CoreV1Api, V1ConfigMap, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

from federation.controller.stores import kube_parts
from federation.controller.stores.store import StoreError

log = logging.getLogger(__name__)
FORMAT = 1
READ_ATTEMPTS = 5
PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]{0,150}[a-z0-9])?$")
MANAGED = {"app.kubernetes.io/managed-by": "gpufed"}


@dataclass(frozen=True)
class Head:
    doc: dict[str, Any]
    version: str
    """The head object's resourceVersion: the optimistic lock of the next write."""

    @property
    def revision(self) -> int:
        value = self.doc.get("revision", 0)
        return value if isinstance(value, int) else 0

    @property
    def parts(self) -> dict[str, dict[str, Any]]:
        parts = self.doc.get("parts")
        return parts if isinstance(parts, dict) else {}

    def objects(self) -> set[str]:
        return {str(n) for entry in self.parts.values() for n in entry.get("objects", [])}


class ConfigMaps:
    """One store's ConfigMaps in one namespace, named under ``prefix``."""

    def __init__(
        self, api: CoreV1Api, *, namespace: str, prefix: str, piece_bytes: int = kube_parts.PIECE_BYTES
    ) -> None:
        if not PREFIX.match(prefix):
            raise StoreError(f"--store-prefix: not a lowercase DNS label of up to 152 characters: {prefix!r}")
        if not PREFIX.match(namespace):
            raise StoreError(f"--store-namespace: not a Kubernetes namespace name: {namespace!r}")
        self.api, self.namespace, self.prefix, self.piece_bytes = api, namespace, prefix, piece_bytes
        self.where = f"kubernetes://{namespace}/{prefix}"
        self._pieces: dict[str, bytes] = {}
        """part digest -> packed bytes of the parts the heads below reference (no GET to read
        them again); what a save wrote and no head took is dropped at the next commit."""
        self._referenced: dict[str, set[str]] = {}
        """head name -> the part digests of its head as last read or committed."""

    # ---- API calls, errors mapped -----------------------------------------------------------------
    def _call(self, what: str, fn: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=30, **kwargs)
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            if exc.status == 409:
                raise
            raise StoreError(f"state store {self.where}: {what}: {exc.status} {_message(exc)}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreError(f"state store {self.where}: {what}: {str(exc)[:300]}") from exc

    def list_data(self, role: str) -> dict[str, dict[str, str]]:
        """name -> data of this store's objects of one role (small ones only: heads, fetch times)."""
        selector = f"gpufed.io/store={self.prefix},gpufed.io/role={role}"
        found = self._call(
            f"list {role} configmaps",
            self.api.list_namespaced_config_map,
            self.namespace,
            label_selector=selector,
        )
        return {str(item.metadata.name): dict(item.data or {}) for item in found.items}

    def list_names(self, role: str) -> list[str]:
        """Names of this store's objects of one role."""
        return sorted(self.list_data(role))

    def get(self, name: str) -> V1ConfigMap | None:
        return self._call(
            f"read configmap {name}",
            self.api.read_namespaced_config_map,
            name,
            self.namespace,
            missing_ok=True,
        )

    def body(
        self,
        name: str,
        role: str,
        *,
        data: dict[str, str] | None = None,
        binary: dict[str, bytes | str] | None = None,
        version: str | None = None,
    ) -> V1ConfigMap:
        labels = {**MANAGED, "gpufed.io/store": self.prefix, "gpufed.io/role": role}
        meta = V1ObjectMeta(name=name, namespace=self.namespace, labels=labels, resource_version=version)
        return V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=meta, data=data, binary_data=binary)

    def write(self, body: V1ConfigMap, *, create: bool) -> None:
        """Create, or replace at ``body``'s resourceVersion; a 409 propagates as ApiException."""
        name = body.metadata.name if body.metadata is not None else ""
        if create:
            self._call(
                f"create configmap {name}", self.api.create_namespaced_config_map, self.namespace, body
            )
        else:
            self._call(
                f"replace configmap {name}",
                self.api.replace_namespaced_config_map,
                name,
                self.namespace,
                body,
            )

    def delete(self, name: str) -> None:
        try:
            self._call(
                f"delete configmap {name}",
                self.api.delete_namespaced_config_map,
                name,
                self.namespace,
                missing_ok=True,
            )
        except (StoreError, ApiException) as exc:  # an orphan costs space, never correctness
            log.warning("state store %s: %s", self.where, exc)

    def head(self, name: str) -> Head | None:
        found = self.get(name)
        if found is None:
            return None
        try:
            doc = json.loads((found.data or {}).get("head", ""))
        except ValueError as exc:
            raise StoreError(f"state store {self.where}: configmap {name} holds no JSON head: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise StoreError(f"state store {self.where}: configmap {name} has an unknown format {doc!r:.200}")
        return Head(doc=doc, version=_version(found))

    # ---- parts ------------------------------------------------------------------------------------
    def write_parts(
        self, raw: Mapping[str, bytes], *, head: Head | None, generation: int, created: list[str]
    ) -> dict[str, dict[str, Any]]:
        """Head entries for ``raw``; only parts whose bytes changed get new objects."""
        before = head.parts if head is not None else {}
        entries: dict[str, dict[str, Any]] = {}
        for name, payload in raw.items():
            raw_digest = hashlib.sha256(payload).hexdigest()
            old = before.get(name)
            if old is not None and old.get("raw") == raw_digest:
                entries[name] = old
                continue
            part = kube_parts.encode(payload, piece_bytes=self.piece_bytes)
            objects = kube_parts.object_names(
                self.prefix, generation=generation, digest=part.digest, count=len(part.parts)
            )
            for object_name, piece in zip(objects, part.parts, strict=True):
                body = self.body(object_name, "piece", binary={"data": base64.b64encode(piece).decode()})
                with contextlib.suppress(ApiException):  # 409: a racing writer wrote these very bytes
                    self.write(body, create=True)
                created.append(object_name)
            self._pieces[part.digest] = b"".join(part.parts)
            entries[name] = {
                "digest": part.digest,
                "raw": raw_digest,
                "size": part.raw_size,
                "objects": objects,
            }
        return entries

    def _read_parts(self, head: Head, name: str) -> dict[str, bytes]:
        """The head's parts, raw; :class:`kube_parts.PartError` when a piece is missing or torn."""
        out: dict[str, bytes] = {}
        keep: dict[str, bytes] = {}
        for part_name, entry in sorted(head.parts.items()):
            digest = str(entry.get("digest"))
            packed = self._pieces.get(digest)
            if packed is None:
                pieces = []
                for object_name in entry.get("objects", []):
                    found = self.get(str(object_name))
                    if found is None:
                        raise kube_parts.PartError(
                            f"part {part_name} of {name}: configmap {object_name} is gone"
                        )
                    pieces.append(base64.b64decode((found.binary_data or {}).get("data", "")))
                packed = b"".join(pieces)
            out[part_name] = kube_parts.decode([packed], entry=entry, name=f"{part_name} of {name}")
            keep[digest] = packed
        self._pieces = keep
        self._referenced = {name: set(keep)}
        return out

    def load_parts(self, name: str) -> tuple[Head | None, dict[str, bytes]]:
        """(head, raw parts), re-reading the head after a torn read."""
        last: Exception | None = None
        for _ in range(READ_ATTEMPTS):
            head = self.head(name)
            if head is None:
                return None, {}
            try:
                return head, self._read_parts(head, name)
            except kube_parts.PartError as exc:
                again = self.head(name)
                if again is not None and again.version == head.version:  # not torn: broken
                    raise StoreError(f"state store {self.where}: {exc}; start afresh with --init") from exc
                log.info("re-reading %s after a torn read: %s", name, exc)
                last = exc
        raise StoreError(
            f"state store {self.where}: {name} kept changing under {READ_ATTEMPTS} reads ({last})"
        )

    def commit(self, name: str, doc: dict[str, Any], *, head: Head | None, role: str) -> None:
        body = self.body(
            name,
            role,
            data={"head": json.dumps(doc, sort_keys=True)},
            version=head.version if head is not None else None,
        )
        self.write(body, create=head is None)
        self._referenced[name] = {str(entry.get("digest")) for entry in doc.get("parts", {}).values()}
        held = set().union(*self._referenced.values())
        # before, every part any save wrote stayed here: the state's core part and a bucket or
        # two a change, about 250 KiB a change at a million targets, for the process's life
        self._pieces = {digest: packed for digest, packed in self._pieces.items() if digest in held}

    def collect(self, head: Head | None, doc: dict[str, Any]) -> None:
        """Delete what the head before ``head`` referenced and neither it nor ``doc`` does."""
        if head is None:
            return
        keep = head.objects() | Head(doc=doc, version="").objects()
        for name in sorted(set(head.doc.get("previous", [])) - keep):
            self.delete(name)


def api_from_cluster(kubeconfig: str | None = None) -> CoreV1Api:
    """The pod's service account (no ``kubeconfig``), or a kubeconfig file."""
    try:
        if kubeconfig is None:
            kubernetes.config.load_incluster_config()
            client = kubernetes.client.ApiClient()
        else:
            client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    except Exception as exc:  # the client's ConfigException, or an unreadable kubeconfig
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "the pod's service account"
        raise StoreError(f"--store kubernetes: no cluster credentials from {where} ({exc})") from exc
    return CoreV1Api(client)


def _message(exc: ApiException) -> str:
    """The Status message the API server sent, else the HTTP reason."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)[:300]
    except (ValueError, AttributeError):
        return str(exc.reason)


def conflict(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def _version(found: V1ConfigMap) -> str:
    return str(found.metadata.resource_version) if found.metadata is not None else ""
