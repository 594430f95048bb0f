"""The KV store and sessions of the Consul stand-in, as Consul's HTTP API documents them.

    GET    /v1/kv/{key}[?recurse][?keys[&separator=/]][?raw]   blocking: ?index=N&wait=5s
    PUT    /v1/kv/{key}[?flags=F][?cas=N | ?acquire=S | ?release=S]   -> true / false
    DELETE /v1/kv/{key}[?recurse | ?cas=N]                              -> true / false
    PUT    /v1/session/create   {"Name", "Node", "Checks"/"NodeChecks", "LockDelay", "Behavior", "TTL"}
    PUT    /v1/session/renew/{id}     404 "Session id '...' not found" once it is gone
    PUT    /v1/session/destroy/{id}   -> true (also for an unknown id)
    GET    /v1/session/info/{id}, /v1/session/list

Entries carry ``CreateIndex``/``ModifyIndex``/``LockIndex``/``Flags``/``Session`` and a
base64 ``Value`` (null when empty); one raft index (the agent's) orders every write, and
reads answer ``X-Consul-Index`` (404s too). ``?cas=0`` creates only; an ``acquire`` bumps
``LockIndex`` unless the session already holds the key, fails (false) while another
session holds it or while the key's lock-delay runs, and answers 500 ``invalid session``
for an unknown session; a ``release`` by a session that does not hold the key is false.
Values over 512 KiB answer 413.

**Sessions.** TTL between ``session_ttl_min_s`` (Consul's ``session_ttl_min``, 10 s) and
24 h; LockDelay 0-60 s (a number under 1000 means seconds, more means nanoseconds, as
Consul reads it). A session is bound to its checks (default ``serfHealth``; any check id
of the node, a service's TTL check too): creating one with a missing or critical check
answers 500, and a check that turns critical or is deregistered invalidates it. An
invalidated session (destroyed, not renewed in time, or a check failed) releases or
deletes what it holds per its Behavior and blocks those keys for its lock-delay. Consul's
servers invalidate a TTL session ``SessionTTLMultiplier`` (2) times its TTL after the last
renewal (the docs: "not before the TTL ... up to double"); ``ttl_multiplier`` keeps that.
``advance(seconds)`` moves this stand-in's clock (and reaps) so tests need not sleep.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

MAX_VALUE_SIZE = 512 * 1024
MAX_TTL_S = 86400.0
MAX_LOCK_DELAY_S = 60.0

Reply = tuple[int, Any, int | None]
"""(HTTP status, body: JSON-able or str (text) or bytes (raw), X-Consul-Index or None)."""


class KvError(Exception):
    def __init__(self, status: int, text: str) -> None:
        self.status, self.text = status, text
        super().__init__(text)


@dataclass
class Entry:
    key: str
    value: bytes
    flags: int
    create_index: int
    modify_index: int
    lock_index: int = 0
    session: str = ""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "LockIndex": self.lock_index,
            "Key": self.key,
            "Flags": self.flags,
            "Value": base64.b64encode(self.value).decode() if self.value else None,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }
        if self.session:
            out["Session"] = self.session
        return out


@dataclass
class Session:
    session_id: str
    name: str
    node: str
    checks: list[str]
    lock_delay_s: float
    behavior: str
    ttl: str
    ttl_s: float | None
    create_index: int
    expires_at: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "ID": self.session_id,
            "Name": self.name,
            "Node": self.node,
            "LockDelay": round(self.lock_delay_s * 1e9),
            "Behavior": self.behavior,
            "TTL": self.ttl,
            "NodeChecks": list(self.checks),
            "ServiceChecks": None,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.create_index,
        }


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return name in query


def _uint(query: dict[str, list[str]], name: str) -> int:
    text = query[name][0]
    if not text.isdigit():
        raise KvError(400, f'strconv.ParseUint: parsing "{text}": invalid syntax')
    return int(text)


def _go_ns(seconds: float) -> int:
    return round(seconds * 1e9)


class KvSessions:
    """KV and sessions over the agent's raft index and condition (``agent._cond``/``_bump``)."""

    def __init__(self, agent: Any, *, ttl_multiplier: float = 2.0, session_ttl_min_s: float = 10.0) -> None:
        self.agent = agent
        self.ttl_multiplier = ttl_multiplier
        self.session_ttl_min_s = session_ttl_min_s
        self.entries: dict[str, Entry] = {}
        self.tombstones: dict[str, int] = {}
        self.sessions: dict[str, Session] = {}
        self.lock_delays: dict[str, float] = {}
        self.kv_index = 1
        self._offset = 0.0
        self._stopped = threading.Event()
        self._reaper: threading.Thread | None = None

    # ---- clock and reaping ---------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        """Move this stand-in's clock forward (TTLs and lock-delays run out) and reap."""
        with self.agent._cond:
            self._offset += seconds
            self._reap()

    def start(self) -> None:
        self._stopped.clear()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True, name="consul-session-reaper")
        self._reaper.start()

    def stop(self) -> None:
        self._stopped.set()
        with self.agent._cond:
            self.agent._cond.notify_all()
        if self._reaper is not None:
            self._reaper.join(timeout=5)

    def _reap_loop(self) -> None:
        cond = self.agent._cond
        with cond:
            while not self._stopped.is_set():
                check_due = self._reap()
                due = [s.expires_at for s in self.sessions.values() if s.expires_at is not None]
                due += [check_due] if check_due is not None else []
                cond.wait(timeout=min(1.0, max(0.01, min(due) - self.now())) if due else 1.0)

    def _reap(self) -> float | None:
        """Invalidate sessions past their TTL or whose checks are critical or gone (a session
        is bound to its checks); returns when the next TTL check falls due."""
        now = self.now()
        check_due: float | None = self.agent.expire_ttl_checks(now)
        statuses = self.agent.known_checks()
        for session in list(self.sessions.values()):
            expired = session.expires_at is not None and session.expires_at <= now
            if expired or any(statuses.get(c, "critical") == "critical" for c in session.checks):
                self._invalidate(session.session_id)
        return check_due

    def _invalidate(self, session_id: str) -> None:
        """Destroy a session: release or delete what it holds, start their lock-delay."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        self.agent._bump()
        index = self.agent.index
        for entry in [e for e in self.entries.values() if e.session == session_id]:
            if session.behavior == "delete":
                del self.entries[entry.key]
                self.tombstones[entry.key] = index
            else:
                entry.session, entry.modify_index = "", index
            if session.lock_delay_s > 0:
                self.lock_delays[entry.key] = self.now() + session.lock_delay_s
        self.kv_index = index

    # ---- KV ------------------------------------------------------------------------------
    def _key_index(self, key: str, recurse: bool) -> int:
        if recurse:
            found = [e.modify_index for k, e in self.entries.items() if k.startswith(key)]
            found += [i for k, i in self.tombstones.items() if k.startswith(key)]
            return max(found) if found else max(self.kv_index, 1)
        entry = self.entries.get(key)
        return entry.modify_index if entry is not None else max(self.kv_index, 1)

    def kv_get(self, key: str, query: dict[str, list[str]]) -> Reply:
        keys = _flag(query, "keys")
        recurse = keys or _flag(query, "recurse")
        if not recurse and not key:
            raise KvError(400, "Missing key name")
        want = int(query.get("index", ["0"])[0] or 0)
        wait = min(self.agent.wait_seconds(query), 600.0)
        cond = self.agent._cond
        with cond:
            if want > 0:
                cond.wait_for(
                    lambda: self._key_index(key, recurse) > want or self._stopped.is_set(), timeout=wait
                )
            index = self._key_index(key, recurse)
            if keys:
                sep = query.get("separator", query.get("seperator", [""]))[0]
                listed: set[str] = set()
                for k in self.entries:
                    if k.startswith(key):
                        rest = k[len(key) :]
                        cut = rest.find(sep) if sep else -1
                        listed.add(key + rest[: cut + len(sep)] if cut >= 0 else k)
                if not listed and key:
                    return 404, "", index
                return 200, sorted(listed), index
            if recurse:
                found = [self.entries[k].as_json() for k in sorted(self.entries) if k.startswith(key)]
                return (200, found, index) if found else (404, "", index)
            entry = self.entries.get(key)
            if entry is None:
                return 404, "", index
            if _flag(query, "raw"):
                return 200, entry.value, index
            return 200, [entry.as_json()], index

    def kv_put(self, key: str, query: dict[str, list[str]], body: bytes) -> Reply:
        if not key:
            raise KvError(400, "Missing key name")
        if sum(_flag(query, f) for f in ("cas", "acquire", "release")) > 1:
            flat = [(k, v) for k, vs in sorted(query.items()) for v in vs]
            raise KvError(400, f"Conflicting flags: {urlencode(flat)}\n")
        flags = _uint(query, "flags") if _flag(query, "flags") else 0
        if len(body) > MAX_VALUE_SIZE:
            raise KvError(
                413,
                f"Request body({len(body)} bytes) too large, max size: {MAX_VALUE_SIZE} bytes. See "
                "https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size.",
            )
        with self.agent._cond:
            self._reap()
            entry = self.entries.get(key)
            if _flag(query, "cas"):
                cas = _uint(query, "cas")
                if (cas == 0 and entry is not None) or (
                    cas != 0 and (entry is None or entry.modify_index != cas)
                ):
                    return 200, False, None
            if _flag(query, "acquire"):
                return 200, self._acquire(key, entry, query["acquire"][0], body, flags), None
            if _flag(query, "release"):
                session = query["release"][0]
                if not session:
                    raise KvError(500, "missing session")
                if entry is None or entry.session != session:
                    return 200, False, None
                self._write(key, entry, body, flags, session="", lock_index=entry.lock_index)
                return 200, True, None
            self._write(
                key,
                entry,
                body,
                flags,
                session=entry.session if entry else "",
                lock_index=entry.lock_index if entry else 0,
            )
            return 200, True, None

    def _acquire(self, key: str, entry: Entry | None, session: str, body: bytes, flags: int) -> bool:
        if not session:
            raise KvError(500, "missing session")
        if session not in self.sessions:
            raise KvError(500, f'invalid session "{session}"')
        if self.lock_delays.get(key, 0.0) > self.now():
            return False
        if entry is not None and entry.session and entry.session != session:
            return False
        held = entry is not None and entry.session == session
        lock_index = (entry.lock_index if entry else 0) + (0 if held else 1)
        self._write(key, entry, body, flags, session=session, lock_index=lock_index)
        return True

    def _write(
        self, key: str, entry: Entry | None, body: bytes, flags: int, *, session: str, lock_index: int
    ) -> None:
        self.agent._bump()
        index = self.agent.index
        self.entries[key] = Entry(
            key=key,
            value=body,
            flags=flags,
            create_index=entry.create_index if entry else index,
            modify_index=index,
            lock_index=lock_index,
            session=session,
        )
        self.tombstones.pop(key, None)
        self.kv_index = index

    def kv_delete(self, key: str, query: dict[str, list[str]]) -> Reply:
        recurse = _flag(query, "recurse")
        if recurse and _flag(query, "cas"):
            flat = [(k, v) for k, vs in sorted(query.items()) for v in vs]
            raise KvError(400, f"Conflicting flags: {urlencode(flat)}\n")
        if not recurse and not key:
            raise KvError(400, "Missing key name")
        with self.agent._cond:
            if recurse:
                doomed = [k for k in self.entries if k.startswith(key)]
            else:
                entry = self.entries.get(key)
                if _flag(query, "cas"):
                    cas = _uint(query, "cas")
                    if cas == 0 or entry is None or entry.modify_index != cas:
                        return 200, False, None
                doomed = [key] if entry is not None else []
            if doomed:
                self.agent._bump()
                for k in doomed:
                    del self.entries[k]
                    self.tombstones[k] = self.agent.index
                self.kv_index = self.agent.index
            return 200, True, None

    # ---- sessions ---------------------------------------------------------------------------
    def session_create(self, body: bytes, *, node: str, known_checks: dict[str, str]) -> Reply:
        spec = {str(k).lower(): v for k, v in json.loads(body).items()} if body.strip() else {}
        ttl = str(spec.get("ttl") or "")
        ttl_s: float | None = None
        if ttl:
            ttl_s = self.agent.parse_duration(ttl)
            if ttl_s != 0 and not self.session_ttl_min_s <= ttl_s <= MAX_TTL_S:
                raise KvError(
                    400,
                    f"Invalid Session TTL '{_go_ns(ttl_s)}', must be between "
                    f"[{self.session_ttl_min_s:g}s=24h0m0s]",
                )
            ttl_s = ttl_s or None
        raw_delay = spec.get("lockdelay", "15s")
        if isinstance(raw_delay, (int, float)):
            delay_s = float(raw_delay) if raw_delay < 1000 else raw_delay / 1e9
        else:
            delay_s = self.agent.parse_duration(str(raw_delay))
        if not 0 <= delay_s <= MAX_LOCK_DELAY_S:
            raise KvError(400, f"Request decode failed: lock delay {raw_delay!r} is not between 0s and 60s")
        behavior = str(spec.get("behavior") or "release")
        if behavior not in ("release", "delete"):
            raise KvError(400, f"Request decode failed: Invalid Behavior setting '{behavior}'")
        session_node = str(spec.get("node") or node)
        if session_node != node:
            raise KvError(500, f"Missing node registration: {session_node}")
        checks = spec.get("nodechecks") if spec.get("nodechecks") is not None else spec.get("checks")
        checks = ["serfHealth"] if checks is None else [str(c) for c in checks]
        for check in checks:
            if check not in known_checks:
                raise KvError(500, f"Missing check '{check}' registration")
            if known_checks[check] == "critical":
                raise KvError(500, f"Check '{check}' is in critical state")
        with self.agent._cond:
            self.agent._bump()
            session = Session(
                session_id=str(uuid.uuid4()),
                name=str(spec.get("name") or ""),
                node=session_node,
                checks=checks,
                lock_delay_s=delay_s,
                behavior=behavior,
                ttl=ttl,
                ttl_s=ttl_s,
                create_index=self.agent.index,
            )
            self._arm(session)
            self.sessions[session.session_id] = session
            return 200, {"ID": session.session_id}, None

    def _arm(self, session: Session) -> None:
        if session.ttl_s is not None:
            session.expires_at = self.now() + session.ttl_s * self.ttl_multiplier

    def session_renew(self, session_id: str) -> Reply:
        with self.agent._cond:
            self._reap()
            session = self.sessions.get(session_id)
            if session is None:
                return 404, f"Session id '{session_id}' not found", None
            self._arm(session)
            self.agent._cond.notify_all()
            return 200, [session.as_json()], None

    def session_destroy(self, session_id: str) -> Reply:
        with self.agent._cond:
            self._invalidate(session_id)
            return 200, True, None

    def session_info(self, session_id: str) -> Reply:
        with self.agent._cond:
            self._reap()
            session = self.sessions.get(session_id)
            return 200, [session.as_json()] if session else [], self.agent.index

    def session_list(self) -> Reply:
        with self.agent._cond:
            self._reap()
            return 200, [s.as_json() for _, s in sorted(self.sessions.items())], self.agent.index

    # ---- routing ------------------------------------------------------------------------------
    def dispatch(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes, **ctx: Any
    ) -> Reply | None:
        """The reply for a KV or session request, or None when ``path`` is neither."""
        if path.startswith("/v1/kv/") or path == "/v1/kv":
            key = path[len("/v1/kv/") :] if path.startswith("/v1/kv/") else ""
            if method == "GET":
                return self.kv_get(key, query)
            if method == "PUT":
                return self.kv_put(key, query, body)
            if method == "DELETE":
                return self.kv_delete(key, query)
            return 405, f"method {method} not allowed", None
        if not path.startswith("/v1/session/"):
            return None
        action, _, session_id = path[len("/v1/session/") :].partition("/")
        if method == "PUT" and action == "create":
            return self.session_create(body, node=ctx["node"], known_checks=ctx["checks"])
        if method == "PUT" and action == "renew" and session_id:
            return self.session_renew(session_id)
        if method == "PUT" and action == "destroy" and session_id:
            return self.session_destroy(session_id)
        if method == "GET" and action == "info" and session_id:
            return self.session_info(session_id)
        if method == "GET" and action == "list":
            return self.session_list()
        return None
