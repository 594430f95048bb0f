// The controller page: polls the JSON API every few seconds and redraws each panel.
// Identities and labels come from registries, so every API value enters the DOM through
// el() as text or as an attribute, never as markup (and the page's CSP forbids inline code).
"use strict";

const REFRESH_MS = 4000;
const TOKEN_KEY = "gpufed.token";
const TARGET_LIMIT = 100;
const LIST_LIMIT = 40;

const ui = {
  shards: [],
  shardFilter: null,
  query: "",
  paused: false,
  plan: null,
  timer: null,
  busy: false,
  targetSeq: 0,
};

// ---- tiny DOM helpers -------------------------------------------------------------------
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key === "width") node.style.width = value;
    else if (key === "left") node.style.left = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const $ = (id) => document.getElementById(id);

function fill(id, ...children) {
  $(id).replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

function fmtNum(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits });
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 60) return `${Math.round(seconds)}s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m ago`;
  return `${(seconds / 3600).toFixed(1)}h ago`;
}

function fmtTime(unix) {
  const d = new Date(unix * 1000);
  const sameDay = d.toDateString() === new Date().toDateString();
  return sameDay ? d.toLocaleTimeString("en-GB") : d.toLocaleString("en-GB");
}

function badge(kind, text, title) {
  return el("span", { class: `badge ${kind}`, title }, text);
}

// ---- the API -------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, body) {
    const title = body && body.title ? body.title : `HTTP ${status}`;
    const detail = body && body.detail && body.detail !== body.title ? `: ${body.detail}` : "";
    const hint = status === 401 ? " — check the token." : status === 403 ? " — this token may not write." : "";
    super(`${status} ${title}${detail}${hint}`);
    this.status = status;
    this.body = body;
  }
}

async function api(path, { method = "GET", body, auth = false } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  // reads carry the token too when one is entered: a token's reads are never throttled
  if ((auth || method === "GET") && token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    signal: AbortSignal.timeout(15000), // a hung request must not stall the refresh loop
  });
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

// ---- header facts ----------------------------------------------------------------------------
function renderStatus(status) {
  fill("fact-ready", status.ready ? badge("ok", "ready") : badge("down", "not ready"));
  fill("fact-version", `v${status.assignment_version}`, el("span", { class: "muted" }, ` · rev ${status.version}`));
  fill("fact-targets", fmtNum(status.targets));
  fill("fact-shards", fmtNum(status.shards));
  fill("fact-handovers", status.handovers ? badge("warn", fmtNum(status.handovers)) : "0");
  const configs = status.configs;
  if (!configs) fill("fact-configs", badge("unknown", "not published"));
  else if (configs.ok) fill("fact-configs", badge("ok", `v${configs.version} ok`));
  else fill("fact-configs", badge("down", `v${configs.failed_version} failed`, configs.error));
  fill("fact-auth", status.leader ? `${status.auth} · leader ${status.leader}` : status.auth);
  renderDiscovery(status.discovery || []);
  renderConfigs(configs);
}

function renderDiscovery(rows) {
  if (!rows.length) {
    fill("discovery", el("p", { class: "muted" }, "No discovery source configured."));
    return;
  }
  const body = rows.map((row) => {
    const age = row.last_success_age_s;
    const state =
      age === null ? badge("unknown", "never") : age > 300 ? badge("warn", "stale") : badge("ok", "ok");
    return el("tr", {}, el("td", {}, row.source), el("td", { class: "num" }, fmtNum(row.targets)),
      el("td", {}, fmtAge(age)), el("td", {}, state));
  });
  // endpoints a source left out (Kubernetes: a Node without a region the spec knows), with
  // what to set; the controller keeps at most 50 per source and counts the rest
  const skipped = rows.flatMap((row) => (row.skipped || []).map((s) =>
    el("tr", {}, el("td", {}, row.source), el("td", {}, s.node), el("td", {}, s.address),
      el("td", {}, badge("warn", s.reason)), el("td", {}, s.detail))));
  const total = rows.reduce((n, row) => n + (row.skipped_total || 0), 0);
  fill("discovery", el("table", { class: "compact" },
    el("thead", {}, el("tr", {}, el("th", {}, "Source"), el("th", { class: "num" }, "Targets"),
      el("th", {}, "Last success"), el("th", {}, "Health"))),
    el("tbody", {}, body)),
    ...(skipped.length ? [el("p", {}, `Skipped endpoints: ${fmtNum(total)}` +
      (total > skipped.length ? ` (first ${skipped.length} listed)` : "")),
    el("table", { class: "compact" },
      el("thead", {}, el("tr", {}, el("th", {}, "Source"), el("th", {}, "Node"), el("th", {}, "Address"),
        el("th", {}, "Reason"), el("th", {}, "What to set"))),
      el("tbody", {}, skipped))] : []));
}

function renderConfigs(configs) {
  if (!configs) {
    fill("configs", el("p", { class: "muted" }, "This controller does not publish configs."));
    return;
  }
  const age = configs.published_at ? Date.now() / 1000 - configs.published_at : null;
  const items = [
    el("li", {}, configs.ok ? badge("ok", "ok") : badge("down", "failed"),
      ` version ${configs.version}, published ${fmtAge(age)}`),
    el("li", {}, `${fmtNum(configs.checked_configs)} configs checked by promtool/amtool`),
  ];
  if (!configs.ok) items.push(el("li", { class: "error" }, `version ${configs.failed_version}: ${configs.error}`));
  fill("configs", el("ul", { class: "plain" }, items));
}

// ---- the shard map -----------------------------------------------------------------------------
function byRegion(rows) {
  const regions = new Map();
  for (const row of rows) {
    if (!regions.has(row.region)) regions.set(row.region, []);
    regions.get(row.region).push(row);
  }
  return regions;
}

function childChip(child, shard) {
  // A child is named after its shard (``<shard>`` or ``<shard>-r<k>``): the chip shows the
  // replica and what the child scrapes; the full name is in its title.
  const replica = child.child === shard ? "" : child.child.startsWith(`${shard}-`)
    ? child.child.slice(shard.length + 1) : child.child;
  let kind = "unknown";
  let title = "not probed yet (or no URL for this child)";
  let text = "not probed";
  if (child.reachable === false) {
    kind = "down";
    title = "unreachable";
    text = "unreachable";
  } else if (child.reachable === true) {
    kind = child.up_targets === child.active_targets ? "ok" : "warn";
    title = `${child.up_targets} of ${child.active_targets} targets up`;
    text = `${child.up_targets}/${child.active_targets} up`;
  }
  return el("span", { class: `chip ${kind}`, title: `child ${child.child}: ${title}` },
    el("span", { class: "dot", "aria-hidden": "true" }), replica ? el("b", {}, replica) : null, text);
}

function loadBar(row, scale, mean) {
  const pct = (v) => `${Math.max(0, Math.min(100, (v / scale) * 100)).toFixed(1)}%`;
  // Amber once past halfway from the mean to the capacity, red past the capacity.
  const over = row.capacity > 0 && row.load > row.capacity;
  const high = row.capacity > mean && row.load > (mean + row.capacity) / 2;
  const kind = row.drained ? "drained" : over ? "over" : high ? "high" : "fine";
  return el("div", {
    class: `bar ${kind}`, role: "meter", "aria-valuemin": 0, "aria-valuemax": row.capacity || row.load,
    "aria-valuenow": row.load, "aria-label": `${row.shard} load ${row.load} of capacity ${row.capacity}`,
  },
  el("span", { class: "fill", width: pct(row.load) }),
  mean > 0 ? el("span", { class: "mark mean", left: pct(mean), title: `region mean ${fmtNum(mean, 1)}` }) : null,
  row.capacity > 0 ? el("span", { class: "mark cap", left: pct(row.capacity), title: `capacity ${row.capacity}` }) : null);
}

function renderShards(data) {
  ui.shards = data.shards;
  refreshFormChoices();
  if (!data.shards.length) {
    fill("shard-map", el("p", { class: "muted" }, "No assignment yet: waiting for discovery."));
    return;
  }
  const focused = document.activeElement && document.activeElement.dataset
    ? document.activeElement.dataset.shard : undefined;
  const sections = [];
  for (const [region, rows] of byRegion(data.shards)) {
    const active = rows.filter((r) => !r.drained);
    const mean = active.length ? active.reduce((s, r) => s + r.load, 0) / active.length : 0;
    const scale = Math.max(1, ...rows.map((r) => Math.max(r.load, r.capacity))) * 1.05;
    const targets = rows.reduce((s, r) => s + r.targets, 0);
    const body = rows.map((row) => {
      const selected = ui.shardFilter === row.shard;
      const flags = [];
      if (row.drained) flags.push(badge("drained", "drained"));
      if (row.handovers_in) flags.push(badge("warn", `+${row.handovers_in} in`, "hand-overs arriving"));
      if (row.handovers_out) flags.push(badge("warn", `−${row.handovers_out} out`, "hand-overs leaving"));
      return el("tr", { class: selected ? "selected" : null, "data-shard-row": row.shard },
        el("th", { scope: "row" },
          el("button", {
            type: "button", class: "shard-link", "data-shard": row.shard, "aria-pressed": selected ? "true" : "false",
            title: `list the targets of ${row.shard}`, onclick: () => selectShard(selected ? null : row.shard),
          }, row.shard), " ", flags),
        el("td", {}, row.children.map((c) => childChip(c, row.shard))),
        el("td", { class: "num" }, fmtNum(row.targets)),
        el("td", { class: "load" }, loadBar(row, scale, mean)),
        el("td", { class: "num" }, `${fmtNum(row.load)} / ${fmtNum(row.capacity, 1)}`),
        el("td", { class: "num", title: "load over the region mean" }, `${Number(row.load_over_mean).toFixed(2)}×`),
        el("td", {}, badge(row.health, row.health)));
    });
    sections.push(el("section", { class: "region", "aria-label": `region ${region}` },
      el("h3", {}, region, el("span", { class: "muted" },
        ` · ${rows.length} shards · ${fmtNum(targets)} targets · mean ${fmtNum(mean, 1)} GPUs`)),
      el("table", { class: "shards" },
        el("thead", {}, el("tr", {}, el("th", {}, "Shard"), el("th", {}, "Children"), el("th", { class: "num" }, "Targets"),
          el("th", { class: "load" }, "Load"), el("th", { class: "num" }, "GPUs / cap"),
          el("th", { class: "num" }, "÷ mean"), el("th", {}, "Health"))),
        el("tbody", {}, body))));
  }
  fill("shard-map", sections);
  if (focused) {
    const again = document.querySelector(`button[data-shard="${CSS.escape(focused)}"]`);
    if (again) again.focus();
  }
}

// ---- targets ------------------------------------------------------------------------------------
function selectShard(shard) {
  ui.shardFilter = shard;
  for (const row of document.querySelectorAll("tr[data-shard-row]")) {
    const on = row.dataset.shardRow === shard;
    row.classList.toggle("selected", on);
    row.querySelector("button").setAttribute("aria-pressed", on ? "true" : "false");
  }
  const filter = $("shard-filter");
  if (shard) {
    filter.replaceChildren(el("span", { class: "chip filter" }, `shard ${shard}`,
      el("button", { type: "button", class: "link", "aria-label": "show all shards", onclick: () => selectShard(null) }, "×")));
    filter.hidden = false;
  } else {
    filter.hidden = true;
    filter.replaceChildren();
  }
  loadTargets();
}

function targetHealth(health) {
  const entries = Object.entries(health || {});
  if (!entries.length) return el("span", { class: "muted", title: "no child health check yet" }, "unknown");
  return entries.map(([child, state]) => badge(state === "up" ? "ok" : state === "absent" ? "warn" : "down",
    state, `${child}: ${state}`));
}

async function loadTargets() {
  const seq = ++ui.targetSeq; // answers can overtake each other: only the latest request draws
  const params = new URLSearchParams({ limit: String(TARGET_LIMIT) });
  if (ui.shardFilter) params.set("shard", ui.shardFilter);
  if (ui.query) params.set("q", ui.query);
  let data;
  try {
    data = await api(`/v1/targets?${params}`);
  } catch (err) {
    if (seq === ui.targetSeq) fill("targets", el("p", { class: "error" }, `Targets: ${err.message}`));
    return;
  }
  if (seq !== ui.targetSeq) return;
  const where = [ui.shardFilter && `on ${ui.shardFilter}`, ui.query && `matching “${ui.query}”`].filter(Boolean).join(" ");
  $("targets-count").textContent = data.total > data.targets.length
    ? `Showing ${data.targets.length} of ${fmtNum(data.total)} targets ${where} — search or pick a shard to narrow.`
    : `${fmtNum(data.total)} ${data.total === 1 ? "target" : "targets"} ${where}`;
  if (!data.targets.length) {
    fill("targets", el("p", { class: "muted" }, "No target matches."));
    return;
  }
  const rows = data.targets.map((t) => el("tr", {},
    el("td", { class: "mono" }, t.identity),
    el("td", {}, t.job), el("td", {}, t.node), el("td", {}, t.region),
    el("td", {}, el("button", { type: "button", class: "link", onclick: () => selectShard(t.shard) }, t.shard)),
    el("td", { class: "num" }, fmtNum(t.weight)),
    el("td", {}, targetHealth(t.health)),
    el("td", {}, el("button", {
      type: "button", class: "small", title: `plan to pin ${t.identity}`,
      onclick: () => startPin(t.identity, t.shard),
    }, "Pin…"))));
  fill("targets", el("table", { class: "compact targets" },
    el("thead", {}, el("tr", {}, ["Identity", "Job", "Node", "Region", "Shard", "Weight", "Health", ""]
      .map((h) => el("th", { class: h === "Weight" ? "num" : null }, h)))),
    el("tbody", {}, rows)));
}

// ---- hand-overs and audit ---------------------------------------------------------------------
function renderHandovers(data) {
  const list = data.handovers;
  if (!list.length) {
    fill("handovers", el("p", { class: "muted" }, "No hand-overs in flight."));
    return;
  }
  const rows = list.slice(0, LIST_LIMIT).map((h) => el("tr", {},
    el("td", { class: "mono" }, h.identity), el("td", { class: "nowrap" }, `${h.from_shard} → ${h.to_shard}`),
    el("td", { class: "num", title: `started ${fmtNum(h.age_s)}s ago` }, `${fmtNum(h.remaining_s)}s`)));
  fill("handovers",
    el("p", { class: "muted" }, `${list.length} target(s) scraped by both shards until the new child has them.`),
    el("div", { class: "scroll short" }, el("table", { class: "compact" },
      el("thead", {}, el("tr", {}, el("th", {}, "Target"), el("th", {}, "Move"),
        el("th", { class: "num", title: "seconds until the old child drops it even without proof" }, "Left"))),
      el("tbody", {}, rows))),
    list.length > LIST_LIMIT ? el("p", { class: "muted" }, `… and ${list.length - LIST_LIMIT} more`) : null);
}

function describeChange(change) {
  const parts = [];
  for (const region of change.add_shard || []) parts.push(`add a shard to ${region}`);
  for (const region of change.remove_shard || []) parts.push(`remove a shard from ${region}`);
  for (const [region, n] of Object.entries(change.shard_counts || {})) parts.push(`${region}: ${n} shards`);
  for (const shard of change.drain || []) parts.push(`drain ${shard}`);
  for (const shard of change.undrain || []) parts.push(`undrain ${shard}`);
  for (const [identity, shard] of Object.entries(change.pin || {})) parts.push(`pin ${identity} → ${shard}`);
  for (const identity of change.unpin || []) parts.push(`unpin ${identity}`);
  for (const [identity, w] of Object.entries(change.weights || {})) parts.push(`weight ${identity} = ${w}`);
  return parts.join(", ");
}

function shardList(verb, shards) {
  if (!shards || !shards.length) return "";
  const shown = shards.slice(0, 4).join(", ");
  return `${shards.length} shard(s) ${verb}: ${shown}${shards.length > 4 ? `, … ${shards.length - 4} more` : ""}`;
}

function renderAudit(data) {
  const entries = data.entries;
  if (!entries.length) {
    fill("audit", el("li", { class: "muted" }, "No changes recorded yet."));
    return;
  }
  fill("audit", entries.map((e) => {
    const detail = e.detail || {};
    let what = e.action;
    if (detail.change) what = describeChange(detail.change) || e.action;
    else if (detail.added_shards || detail.removed_shards) {
      what = [shardList("added", detail.added_shards), shardList("removed", detail.removed_shards)]
        .filter(Boolean).join("; ") || e.action;
    }
    const reason = detail.change && detail.change.reason;
    return el("li", { "data-audit-id": e.id },
      el("div", { class: "audit-head" }, el("time", { datetime: new Date(e.at * 1000).toISOString() }, fmtTime(e.at)),
        badge(e.action === "rebalance" ? "info" : "unknown", e.action), el("span", { class: "muted" }, `by ${e.actor}`),
        el("span", { class: "moved" }, `${fmtNum(e.moved)} moved`)),
      el("div", { class: "audit-what" }, what),
      reason ? el("div", { class: "muted audit-why" }, `“${reason}”`) : null);
  }));
}

// ---- plan and rebalance --------------------------------------------------------------------------
function setOptions(select, values, labels) {
  const current = select.value;
  select.replaceChildren(...values.map((v, i) => el("option", { value: v }, labels ? labels[i] : v)));
  if (values.includes(current)) select.value = current;
}

function refreshFormChoices() {
  const regions = [...new Set(ui.shards.map((s) => s.region))];
  setOptions($("plan-region"), regions);
  const action = $("plan-action").value;
  const shards = ui.shards.filter((s) => (action === "undrain" ? s.drained : action === "drain" ? !s.drained : true));
  setOptions($("plan-shard"), shards.map((s) => s.shard), shards.map((s) => `${s.shard} (${s.region})`));
}

function showActionFields() {
  const action = $("plan-action").value;
  for (const row of document.querySelectorAll("#plan-form [data-for]")) {
    row.hidden = !row.dataset.for.split(" ").includes(action);
  }
  refreshFormChoices();
}

function startPin(identity, shard) {
  $("plan-action").value = "pin";
  showActionFields();
  $("plan-identity").value = identity;
  $("plan-shard").value = shard;
  $("plan-identity").scrollIntoView({ block: "center" });
  $("plan-shard").focus();
}

function changeFromForm() {
  const action = $("plan-action").value;
  const change = {};
  if (action === "add_shard") change.add_shard = [$("plan-region").value];
  else if (action === "drain") change.drain = [$("plan-shard").value];
  else if (action === "undrain") change.undrain = [$("plan-shard").value];
  else if (action === "pin") {
    const identity = $("plan-identity").value.trim();
    if (!identity) throw new Error("Pick a target to pin (type its identity, or use Pin… in the target list).");
    change.pin = { [identity]: $("plan-shard").value };
  }
  const reason = $("plan-reason").value.trim();
  if (reason) change.reason = reason;
  return change;
}

function message(kind, text) {
  return el("p", { class: `msg ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

function saveToken() {
  const value = $("token").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

async function onPlan(event) {
  event.preventDefault();
  saveToken();
  ui.plan = null;
  let change;
  try {
    change = changeFromForm();
  } catch (err) {
    fill("plan-result", message("error", err.message));
    return;
  }
  if (!token()) {
    fill("plan-result", message("error", "Enter a token with the write scope first."));
    return;
  }
  fill("plan-result", message("info", "Planning…"));
  try {
    ui.plan = await api("/v1/plan", { method: "POST", body: change, auth: true });
  } catch (err) {
    fill("plan-result", message("error", err.message));
    return;
  }
  renderPlan(ui.plan);
}

function movesTable(moves, caption) {
  const rows = moves.slice(0, LIST_LIMIT).map((m) => el("tr", {},
    el("td", { class: "mono" }, m.identity), el("td", {}, m.from_shard), el("td", {}, m.to_shard)));
  return [
    el("div", { class: "scroll short" }, el("table", { class: "compact moves" }, el("caption", {}, caption),
      el("thead", {}, el("tr", {}, el("th", {}, "Target"), el("th", {}, "From"), el("th", {}, "To"))),
      el("tbody", {}, rows))),
    moves.length > LIST_LIMIT ? el("p", { class: "muted" }, `… and ${moves.length - LIST_LIMIT} more`) : null,
  ];
}

function renderPlan(plan) {
  const c = plan.counts;
  const shards = [...new Set([...Object.keys(plan.load_before), ...Object.keys(plan.load_after)])];
  const changed = shards.filter((s) => plan.load_before[s] !== plan.load_after[s]);
  const scale = Math.max(1, ...changed.map((s) => Math.max(plan.load_before[s] || 0, plan.load_after[s] || 0)));
  const loadRows = changed.map((s) => {
    const before = plan.load_before[s];
    const after = plan.load_after[s];
    const delta = (after || 0) - (before || 0);
    return el("tr", {},
      el("th", { scope: "row" }, s, plan.added_shards.includes(s) ? badge("ok", "new") : null,
        plan.removed_shards.includes(s) ? badge("down", "removed") : null),
      el("td", { class: "num" }, before === undefined ? "—" : fmtNum(before)),
      el("td", { class: "num" }, after === undefined ? "—" : fmtNum(after)),
      el("td", { class: `num ${delta > 0 ? "delta-up" : "delta-down"}` }, delta > 0 ? `+${delta}` : `${delta}`),
      el("td", { class: "load" }, el("div", { class: "bar pair", "aria-hidden": "true" },
        el("span", { class: "fill before", width: `${((before || 0) / scale) * 100}%` }),
        el("span", { class: "fill after", width: `${((after || 0) / scale) * 100}%` }))));
  });
  const summary = `${fmtNum(c.moved)} of ${fmtNum(c.targets_before)} targets move (${fmtNum(c.moved_fraction * 100, 1)}%)`
    + (plan.added_shards.length ? ` · new shards: ${plan.added_shards.join(", ")}` : "")
    + (plan.removed_shards.length ? ` · removed shards: ${plan.removed_shards.join(", ")}` : "");
  fill("plan-result", el("div", { class: "plan", id: "plan" },
    el("h3", {}, "Plan ", el("code", { id: "plan-version" }, plan.version), " ", badge("warn", "not applied")),
    el("p", { class: "plan-what" }, describeChange(plan.change)),
    el("p", { id: "plan-summary" }, summary),
    changed.length ? el("table", { class: "compact loads" }, el("caption", {}, "Load per shard (GPUs), before → after"),
      el("thead", {}, el("tr", {}, el("th", {}, "Shard"), el("th", { class: "num" }, "Before"),
        el("th", { class: "num" }, "After"), el("th", { class: "num" }, "Δ"), el("th", {}, ""))),
      el("tbody", {}, loadRows)) : el("p", { class: "muted" }, "No shard's load changes."),
    el("div", { id: "plan-moves" },
      plan.moves.length ? movesTable(plan.moves, "Moves") : el("p", { class: "muted" }, "Nothing moves.")),
    el("div", { id: "apply-result", "aria-live": "polite" }),
    el("div", { class: "actions", id: "plan-actions" },
      el("button", { type: "button", id: "apply-button", class: "primary", onclick: onApply }, "Apply plan"),
      el("button", { type: "button", onclick: () => { ui.plan = null; fill("plan-result"); } }, "Discard"))));
}

async function onApply() {
  if (!ui.plan) return;
  saveToken();
  const button = $("apply-button");
  button.disabled = true;
  fill("apply-result", message("info", "Applying…"));
  let result;
  try {
    result = await api("/v1/rebalance", { method: "POST", body: { version: ui.plan.version }, auth: true });
  } catch (err) {
    fill("apply-result", message("error", err.message));
    if (err.status === 409) {
      // Stale for good: only a new plan can be applied now.
      const head = document.querySelector("#plan .badge");
      if (head) head.replaceWith(badge("down", "stale"));
    } else {
      button.disabled = false;
    }
    return;
  }
  const moves = result.moves || [];
  const text = result.applied
    ? `Applied plan ${result.version}: ${moves.length} target(s) moved; assignment v${result.assignment_version}.`
    : `${result.message} (assignment v${result.assignment_version}).`;
  // The result replaces the plan's moves and buttons: what really moved is what counts now.
  $("plan-moves").remove();
  $("plan-actions").replaceChildren(
    el("button", { type: "button", onclick: () => { ui.plan = null; fill("plan-result"); } }, "Close"));
  fill("apply-result", message("ok", text), moves.length ? movesTable(moves, "Moved") : null);
  const head = document.querySelector("#plan .badge");
  if (head && result.applied) head.replaceWith(badge("ok", "applied"));
  refresh();
}

// ---- the refresh loop ------------------------------------------------------------------------------
async function refresh() {
  if (ui.busy) return;
  ui.busy = true;
  clearTimeout(ui.timer);
  const calls = [
    ["shards", api("/v1/shards"), renderShards],
    ["status", api("/v1/status"), renderStatus],
    ["hand-overs", api("/v1/handovers"), renderHandovers],
    ["audit", api("/v1/audit?limit=12"), renderAudit],
  ];
  const failed = [];
  for (const [name, promise, render] of calls) {
    try {
      render(await promise);
    } catch (err) {
      failed.push(`${name}: ${err.message}`);
    }
  }
  const banner = $("banner");
  banner.hidden = !failed.length;
  if (failed.length === calls.length) {
    banner.textContent = `The controller does not answer (${failed[0]}); retrying every ${REFRESH_MS / 1000}s.`;
  } else {
    banner.textContent = failed.length ? `Could not refresh ${failed.join("; ")}; retrying.` : "";
  }
  if (failed.length < calls.length) {
    await loadTargets();
    $("updated").textContent = `updated ${new Date().toLocaleTimeString("en-GB")}`;
  }
  ui.busy = false;
  if (!ui.paused) ui.timer = setTimeout(refresh, REFRESH_MS);
}

function init() {
  $("token").value = token();
  $("plan-form").addEventListener("submit", onPlan);
  $("plan-action").addEventListener("change", showActionFields);
  $("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
  });
  let typing = null;
  $("target-q").addEventListener("input", (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      ui.query = event.target.value.trim();
      loadTargets();
    }, 250);
  });
  $("pause").addEventListener("click", (event) => {
    ui.paused = !ui.paused;
    event.target.setAttribute("aria-pressed", String(ui.paused));
    event.target.textContent = ui.paused ? "Resume updates" : "Pause updates";
    if (ui.paused) clearTimeout(ui.timer);
    else refresh();
  });
  showActionFields();
  refresh();
}

document.addEventListener("DOMContentLoaded", init);
