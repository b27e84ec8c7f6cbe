// raftcron dashboard: plain JS, no build step. Polls the JSON API of this origin.
// Everything from the API is put in the page with textContent, never as HTML.
"use strict";

const MIN_RENDER_MS = 1000; // at most one re-render a second however fast the cluster applies
const RETRY_MS = 2000; // after a failed load or watch
const WATCH_S = 20; // a watch's timeout (GET /v1/watch)
const PAGE = 100; // jobs or runs per page
const STRIP = 20;
const CHART_RUNS = 200; // runs drawn on a job's chart
const TOKEN_KEY = "raftcron.token";
const $ = (sel) => document.querySelector(sel);
let timer = null;
let applied = 0; // the applied index the page last rendered at (the watch waits past it)
let lastRender = 0; // when the last render started or ended, whichever is later
let routeKey = null; // the route the page shows, to tell a live update from a navigation
let selectedRun = null; // run id whose output is shown on a job page (#/jobs/NAME/runs/ID)
let loadFailed = false; // the notice shows a load error, to clear once loading works again

// ---- the API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
  }
}

window.raftcronRequests = []; // every API path this page asked for, in order

async function api(path, method = "GET") {
  window.raftcronRequests.push(path);
  const headers = { Accept: "application/json" };
  const token = localStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const resp = await fetch(path, { method, headers, cache: "no-store" });
  const body = await resp.json().catch(() => null);
  if (resp.status === 401) askToken(token ? "The saved token was refused." : "");
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body;
}

function askToken(why) {
  const form = $("#token");
  form.hidden = false;
  if (why) notice(why);
}

$("#token").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem(TOKEN_KEY, $("#token-input").value.trim());
  $("#token").hidden = true;
  notice("");
  refresh(true);
});

async function act(path, what) {
  try {
    await api(path, "POST");
    notice(what);
  } catch (err) {
    notice(`${what} failed: ${err.message}`, true);
  }
  refresh(false);
}

// ---- small DOM helpers ---------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

function notice(text, bad) {
  const el = $("#notice");
  el.textContent = text;
  el.hidden = !text;
  el.classList.toggle("bad", !!bad);
}

const STATUS_TEXT = {
  timed_out: "timed out", claimed: "claimed (about to run)", running: "running",
};

function badge(status) {
  return h("span", { class: `badge s-${status}` }, (STATUS_TEXT[status] || status).split(" (")[0]);
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  const secs = Math.round((d - Date.now()) / 1000);
  const rel = Math.abs(secs) < 90 ? `${Math.abs(secs)}s` : Math.abs(secs) < 5400
    ? `${Math.round(Math.abs(secs) / 60)}m` : `${Math.round(Math.abs(secs) / 3600)}h`;
  const today = d.toDateString() === new Date().toDateString();
  return `${today ? d.toLocaleTimeString() : d.toLocaleString()} (${secs >= 0 ? "in " + rel : rel + " ago"})`;
}

function dur(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms < 1000 ? `${ms} ms` : ms < 120000 ? `${(ms / 1000).toFixed(1)} s` : `${(ms / 60000).toFixed(1)} min`;
}

function runTip(r) {
  return `${r.status} · slot ${r.slot} · attempt ${r.attempt} · node ${r.node || "—"} · ${dur(r.duration_ms)}`;
}

function strip(runs) {
  const boxes = runs.slice(0, STRIP).reverse().map((r) =>
    h("span", { class: `box s-${r.status}`, title: runTip(r), role: "img", "aria-label": runTip(r) }));
  return h("span", { class: "strip" }, boxes.length ? boxes : h("span", { class: "muted" }, "no runs yet"));
}

function table(head, rows, caption) {
  return h("table", {},
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows));
}

// ---- views -------------------------------------------------------------------------------

async function viewCluster() {
  // The charts are extra: a node that cannot answer the history (an older version) still shows the rest.
  const [c, hist] = await Promise.all([api("/v1/cluster"), api("/v1/cluster/history").catch(() => null)]);
  const perSecond = (v) => `${v.toFixed(v < 10 ? 1 : 0)}/s`;
  const rows = c.members.map((m) => h("tr", {},
    h("td", {}, m.node_id || "(unregistered)"), h("td", {}, badge(m.role)),
    h("td", {}, m.reachable ? h("span", { class: "ok" }, "reachable") : h("span", { class: "down" }, "unreachable")),
    h("td", {}, m.raft_addr), h("td", {}, m.http_addr || "—"), h("td", { class: "num" }, m.lag ?? "—")));
  return [
    h("h1", {}, "Cluster"),
    h("dl", { class: "facts" },
      h("dt", {}, "Leader"), h("dd", {}, c.leader ? c.leader.node_id || c.leader.raft_addr : "none (election)"),
      h("dt", {}, "Term"), h("dd", {}, c.term),
      h("dt", {}, "Commit index"), h("dd", {}, c.commit_index),
      h("dt", {}, "Applied index"), h("dd", {}, c.applied_index),
      h("dt", {}, "Quorum"), h("dd", {}, c.has_quorum ? "yes" : "no"),
      h("dt", {}, "Answered by"), h("dd", {}, c.node_id)),
    ...(hist ? [h("h2", {}, `The last ${Math.round(hist.span_s / 60)} minutes, as ${hist.node_id} saw them`),
      h("div", { class: "trends" },
        trendChart(hist.items, "commit_index", "commit index", String),
        trendChart(hist.items, "apply_lag", "apply lag (entries)", String),
        trendChart(hist.items, "runs_ended_per_s", "runs ended", perSecond))] : []),
    table(["Node", "Role", "Health", "Raft address", "API address", "Lag"], rows, "Members"),
  ];
}

// ---- the jobs list: one request per page, filters in the URL ------------------------------

const JOB_FILTERS = ["q", "label", "status", "last", "sort", "cursor"];
const STATES = [["", "any state"], ["failing", "failing"], ["active", "active"], ["paused", "paused"],
  ["never_run", "never run"]];
const OUTCOMES = ["", "succeeded", "failed", "timed_out", "dead", "lost", "running", "retrying", "cancelled",
  "skipped", "missed"];
const SORTS = [["name", "name"], ["next_slot", "next slot"], ["last_failure", "last failure"],
  ["failures", "consecutive failures"]];

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  return q.toString();
}

function jobsHash(params) {
  const q = query(params);
  return "#/jobs" + (q ? "?" + q : "");
}

function select(name, label, options, value) {
  return h("label", {}, label, " ", h("select", { name, "data-filter": name },
    options.map(([v, text]) => h("option", { value: v, selected: v === (value || "") }, text))));
}

// The filter bar is built once per route: a live update replaces only the results, so typing
// in the search box is never interrupted.
function jobFilters(params) {
  const form = h("form", { class: "filters", role: "search", "aria-label": "Find jobs",
    onsubmit: (ev) => { ev.preventDefault(); applyFilters(form); } },
  h("label", {}, "Search ", h("input", { type: "search", name: "q", id: "search", value: params.q || "",
    placeholder: "name or description", autocomplete: "off", "data-filter": "q" })),
  h("label", {}, "Label ", h("input", { type: "text", name: "label", value: params.label || "",
    placeholder: "team=payments", autocomplete: "off", "data-filter": "label", size: 16 })),
  select("status", "State", STATES, params.status),
  select("last", "Last outcome", OUTCOMES.map((o) => [o, o ? o.replace("_", " ") : "any"]), params.last),
  select("sort", "Sort by", SORTS, params.sort || "name"));
  let typing = null;
  form.addEventListener("input", (ev) => {
    clearTimeout(typing);
    typing = setTimeout(() => applyFilters(form), ev.target.tagName === "SELECT" ? 0 : 250);
  });
  return form;
}

function applyFilters(form) {
  const params = {};
  for (const el of form.querySelectorAll("[data-filter]")) params[el.name] = el.value.trim();
  if (params.sort === "name") delete params.sort;
  if (params.label && !params.label.includes("=")) {
    notice("a label filter looks like key=value", true);
    return;
  }
  const next = jobsHash(params);
  if (location.hash !== next) history.replaceState(null, "", next); // no hashchange: the form stays, focus too
  refresh(false);
}

function jobsRequest(params, extra) {
  return "/v1/jobs?" + query({ ...params, ...extra, include: "recent_runs", limit: PAGE });
}

async function jobsResults(params, isDefault) {
  let body = await api(jobsRequest(params, isDefault ? { status: "failing" } : {}));
  let title = "Jobs";
  if (isDefault && body.failing > 0) title = "Failing now";
  else if (isDefault) body = await api(jobsRequest(params, {}));
  else if (params.status === "failing") title = "Failing jobs";
  const jobs = body.items;
  const rows = jobs.map((j) => {
    const runs = j.recent_runs || [];
    const last = runs.find((r) => r.status !== "claimed") || j.status.last_run; // the outcome, not a slot claimed ahead
    return h("tr", { "data-job": j.name },
      h("th", { scope: "row" }, h("a", { href: `#/jobs/${encodeURIComponent(j.name)}` }, j.name)),
      h("td", {}, h("code", {}, j.spec.schedule)),
      h("td", {}, j.status.paused ? badge("paused") : badge("active")),
      h("td", {}, j.status.next_slots[0] ? when(j.status.next_slots[0]) : "—"),
      h("td", {}, last ? badge(last.status) : "—"),
      h("td", { class: "num" }, j.status.consecutive_failures || "—"),
      h("td", {}, strip(runs)));
  });
  const filtered = Object.keys(params).some((k) => k !== "sort" && k !== "cursor" && params[k]);
  const n = (x) => x.toLocaleString("en");
  const count = isDefault && title === "Failing now" ? `${n(body.failing)} of ${n(body.total)}`
    : filtered ? `${jobs.length}${body.next_cursor ? "+" : ""} shown of ${n(body.total)}` : n(body.total);
  const pager = h("p", { class: "pager" },
    params.cursor ? h("a", { href: jobsHash({ ...params, cursor: "" }) }, "← first page") : null,
    body.next_cursor ? h("a", { href: jobsHash({ ...params, cursor: body.next_cursor }), rel: "next" }, "next page →") : null);
  const empty = filtered ? "No job matches these filters." : null;
  return [
    h("h1", {}, `${title} (${count})`,
      isDefault && title === "Failing now" ? h("a", { class: "sub", href: "#/jobs" }, "all jobs") : null),
    jobs.length ? table(["Job", "Schedule", "Status", "Next slot", "Last outcome", "Failures",
      `Last ${STRIP} runs (oldest first)`], rows)
      : h("p", {}, empty || ["No jobs yet: create one with ", h("code", {}, "raftcron apply -f jobs.yaml"), "."]),
    pager,
    legend(),
  ];
}

function viewJobs(params, isDefault) {
  return { head: [jobFilters(params)], body: () => jobsResults(params, isDefault) };
}

// ---- runs across jobs --------------------------------------------------------------------

const SINCE = [["", "any time"], ["15m", "last 15 min"], ["1h", "last hour"], ["6h", "last 6 hours"],
  ["24h", "last day"]];
const RUN_STATES = ["", "failed", "timed_out", "dead", "lost", "running", "claimed", "retrying", "succeeded",
  "cancelled", "skipped", "missed"];

function runsHash(params) {
  const q = query(params);
  return "#/runs" + (q ? "?" + q : "");
}

function runFilters(params) {
  const form = h("form", { class: "filters", role: "search", "aria-label": "Find runs",
    onsubmit: (ev) => ev.preventDefault() },
  select("status", "Status", RUN_STATES.map((s) => [s, s ? s.replace("_", " ") : "any"]), params.status),
  select("since", "Slot", SINCE, params.since),
  h("label", {}, "Job ", h("input", { type: "search", name: "job", id: "search", value: params.job || "",
    autocomplete: "off", "data-filter": "job", size: 18 })),
  h("label", {}, "Node ", h("input", { type: "text", name: "node", value: params.node || "", autocomplete: "off",
    "data-filter": "node", size: 6 })));
  for (const el of form.querySelectorAll("select")) el.dataset.filter = el.name;
  let typing = null;
  form.addEventListener("input", (ev) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      const next = {};
      for (const el of form.querySelectorAll("[data-filter]")) next[el.name] = el.value.trim();
      history.replaceState(null, "", runsHash(next));
      refresh(false);
    }, ev.target.tagName === "SELECT" ? 0 : 250);
  });
  return form;
}

async function runsResults(params) {
  const since = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400 }[params.since];
  const req = { status: params.status, job: params.job, node: params.node, cursor: params.cursor, limit: PAGE };
  if (since) req.since = new Date(Date.now() - since * 1000).toISOString();
  const body = await api("/v1/runs?" + query(req));
  const rows = body.items.map((r) => h("tr", { "data-job": r.job },
    h("th", { scope: "row" }, h("a", { href: `#/jobs/${encodeURIComponent(r.job)}/runs/${encodeURIComponent(r.id)}` },
      r.job)),
    h("td", {}, when(r.slot)), h("td", {}, badge(r.status)), h("td", {}, r.trigger), h("td", { class: "num" }, r.attempt),
    h("td", {}, r.node || "—"), h("td", { class: "num" }, dur(r.duration_ms)), h("td", {}, r.error || "—")));
  const pager = h("p", { class: "pager" },
    params.cursor ? h("a", { href: runsHash({ ...params, cursor: "" }) }, "← newest") : null,
    body.next_cursor ? h("a", { href: runsHash({ ...params, cursor: body.next_cursor }), rel: "next" }, "older →") : null);
  return [
    h("h1", {}, `Runs (${body.items.length}${body.next_cursor ? "+" : ""})`),
    body.items.length ? table(["Job", "Slot", "Status", "Trigger", "Attempt", "Node", "Duration", "Error"], rows,
      "Newest first, across all jobs") : h("p", {}, "No run matches these filters."),
    pager,
  ];
}

function viewRuns(params) {
  return { head: [runFilters(params)], body: () => runsResults(params) };
}

function legend() {
  const all = ["succeeded", "running", "claimed", "retrying", "failed", "timed_out", "lost", "dead", "cancelled",
    "skipped", "missed"];
  return h("p", { class: "legend", "aria-label": "Colour legend" },
    all.map((s) => h("span", {}, h("span", { class: `box s-${s}`, "aria-hidden": "true" }), " ", s.replace("_", " "))));
}

async function viewJob(name) {
  const q = encodeURIComponent(name);
  const [job, runs, explain] = await Promise.all([
    api(`/v1/jobs/${q}`), api(`/v1/jobs/${q}/runs?limit=${CHART_RUNS}`), api(`/v1/jobs/${q}/explain`)]);
  const st = job.status;
  const rows = runs.items.slice(0, PAGE).map((r) => h("tr", {
    class: r.id === selectedRun ? "selected" : null, tabindex: "0", "data-run": r.id,
    onclick: () => openRun(name, r.id), onkeydown: (ev) => { if (ev.key === "Enter") openRun(name, r.id); },
  }, h("td", {}, when(r.slot)), h("td", {}, badge(r.status)), h("td", {}, r.trigger), h("td", { class: "num" }, r.attempt),
    h("td", {}, r.node || "—"), h("td", { class: "num" }, dur(r.duration_ms)), h("td", {}, h("code", {}, r.id))));
  return [
    h("p", {}, h("a", { href: "#/jobs" }, "← all jobs")),
    h("h1", {}, name, " ", st.paused ? badge("paused") : badge("active")),
    h("div", { class: "actions" },
      st.paused ? h("button", { onclick: () => act(`/v1/jobs/${q}/resume`, `resumed ${name}`) }, "Resume")
        : h("button", { onclick: () => act(`/v1/jobs/${q}/pause`, `paused ${name}`) }, "Pause"),
      h("button", { onclick: () => act(`/v1/jobs/${q}/run`, `asked to run ${name} now`) }, "Run now")),
    h("dl", { class: "facts" },
      h("dt", {}, "Schedule"), h("dd", {}, h("code", {}, job.spec.schedule), job.spec.timezone ? ` (${job.spec.timezone})` : ""),
      h("dt", {}, "Executor"), h("dd", {}, job.spec.executor),
      h("dt", {}, "Next slots"), h("dd", {}, st.next_slots.length ? st.next_slots.slice(0, 3).map(when).join(" · ") : "—"),
      h("dt", {}, "Consecutive failures"), h("dd", {}, st.consecutive_failures),
      st.pause_note ? [h("dt", {}, "Pause note"), h("dd", {}, st.pause_note)] : null),
    h("h2", {}, `The last ${runs.items.length} runs`),
    chart(runs.items),
    h("div", { id: "run-detail" }),
    table(["Slot", "Status", "Trigger", "Attempt", "Node", "Duration", "Run"], rows,
      "Runs, newest first — select one to see its output"),
    h("h2", {}, "Explain"),
    h("ol", { class: "explain" }, explain.items.slice(0, 50).map((e) =>
      h("li", {}, h("span", { class: "when" }, e.slot || e.at || ""), " ", badge(e.status), " ", e.reason))),
  ];
}

// ---- charts: inline SVG, drawn from the data the view fetched -------------------------------

const NS = "http://www.w3.org/2000/svg";

function svgEl(parent, tag, attrs, title) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, v);
  if (title) { const t = document.createElementNS(NS, "title"); t.textContent = title; el.append(t); }
  if (parent) parent.append(el);
  return el;
}

function svgText(parent, x, y, text, anchor, cls = "tick") {
  svgEl(parent, "text", { x, y, "text-anchor": anchor, class: cls }).textContent = text;
}

// A job's last runs by slot: start lateness (started minus slot) above, duration below, each
// mark coloured by the run's status and carrying its id (data-run).
function chart(runs) {
  const W = 800, PANEL = 100, L = 60, R = 10, TOP = 18, GAP = 30, H = TOP + PANEL + GAP + PANEL + 24;
  const pts = runs.map((r) => ({ r, t: Date.parse(r.slot), started: Date.parse(r.started_at) }))
    .filter((p) => !isNaN(p.t));
  if (!pts.length) return h("p", { class: "muted" }, "no runs yet");
  const svg = svgEl(null, "svg", { viewBox: `0 0 ${W} ${H}`, class: "chart runs-chart", role: "img",
    "aria-label": `Start lateness and duration of the last ${pts.length} runs by slot, coloured by status` });
  const t0 = Math.min(...pts.map((p) => p.t)), t1 = Math.max(...pts.map((p) => p.t));
  const x = (t) => (t1 === t0 ? L + (W - L - R) / 2 : L + ((t - t0) / (t1 - t0)) * (W - L - R));
  const late = (p) => (isNaN(p.started) ? null : Math.max(0, p.started - p.t));
  const lmax = Math.max(1, ...pts.map((p) => late(p) ?? 0));
  const dmax = Math.max(1, ...pts.map((p) => p.r.duration_ms || 0));
  const lateBase = TOP + PANEL, durBase = TOP + PANEL + GAP + PANEL;
  for (const [base, label, max] of [[lateBase, "start lateness", lmax], [durBase, "duration", dmax]]) {
    svgEl(svg, "line", { x1: L, y1: base, x2: W - R, y2: base, class: "axis" });
    svgEl(svg, "line", { x1: L, y1: base - PANEL, x2: L, y2: base, class: "axis" });
    svgText(svg, L - 4, base - PANEL + 10, dur(max), "end");
    svgText(svg, L - 4, base, "0", "end");
    svgText(svg, L + 4, base - PANEL - 4, label, "start", "tick label");
  }
  svgText(svg, L, H - 4, new Date(t0).toLocaleString(), "start");
  svgText(svg, W - R, H - 4, new Date(t1).toLocaleString(), "end");
  const bw = Math.max(1.5, Math.min(10, (W - L - R) / pts.length - 1));
  for (const p of pts) {
    const cx = x(p.t);
    const l = late(p);
    if (l !== null) {
      svgEl(svg, "circle", { cx: cx.toFixed(1), cy: (lateBase - (l / lmax) * (PANEL - 4)).toFixed(1), r: 3,
        class: `dot s-${p.r.status}`, "data-run": p.r.id, "data-lateness-ms": l }, `${runTip(p.r)} · started ${dur(l)} after its slot`);
    }
    const hgt = Math.max(2, ((p.r.duration_ms || 0) / dmax) * (PANEL - 4));
    svgEl(svg, "rect", { x: (cx - bw / 2).toFixed(1), y: (durBase - hgt).toFixed(1), width: bw.toFixed(1),
      height: hgt.toFixed(1), class: `bar s-${p.r.status}`, "data-run": p.r.id }, runTip(p.r));
  }
  return svg;
}

// One measure of the cluster over the node's last ten minutes (GET /v1/cluster/history).
function trendChart(items, key, label, fmt) {
  const W = 280, H = 110, L = 8, R = 8, TOP = 30, B = 18;
  const pts = items.map((s) => ({ at: s.at, t: Date.parse(s.at), v: s[key] })).filter((p) => p.v !== null && !isNaN(p.t));
  const svg = svgEl(null, "svg", { viewBox: `0 0 ${W} ${H}`, class: "chart trend", role: "img", "data-key": key,
    "aria-label": `${label} over the last ${items.length} samples` });
  svgText(svg, L, 13, label, "start", "tick label");
  if (!pts.length) { svgText(svg, W / 2, H / 2, "no samples yet", "middle"); return svg; }
  const last = pts[pts.length - 1].v;
  svgText(svg, W - R, 13, fmt(last), "end", "tick value");
  const t0 = pts[0].t, t1 = pts[pts.length - 1].t;
  const lo = Math.min(0, ...pts.map((p) => p.v)), hi = Math.max(...pts.map((p) => p.v));
  const span = hi - lo || 1;
  const x = (t) => (t1 === t0 ? W - R : L + ((t - t0) / (t1 - t0)) * (W - L - R));
  const y = (v) => TOP + (1 - (v - lo) / span) * (H - TOP - B);
  svgEl(svg, "line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" });
  svgText(svg, L, H - 4, new Date(t0).toLocaleTimeString(), "start");
  svgText(svg, W - R, H - 4, new Date(t1).toLocaleTimeString(), "end");
  svgEl(svg, "polyline", { points: pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" "), class: "line" });
  for (const p of pts) {
    svgEl(svg, "circle", { cx: x(p.t).toFixed(1), cy: y(p.v).toFixed(1), r: 2, class: "point", "data-at": p.at, "data-value": p.v },
      `${new Date(p.t).toLocaleTimeString()}: ${fmt(p.v)}`);
  }
  return svg;
}

function openRun(job, id) {
  location.hash = `#/jobs/${encodeURIComponent(job)}` + (id ? `/runs/${encodeURIComponent(id)}` : "");
}

async function showRun(id) {
  const box = $("#run-detail");
  if (!box) return;
  try {
    const r = await api(`/v1/runs/${encodeURIComponent(id)}`);
    box.replaceChildren(runDetail(r));
  } catch (err) {
    box.replaceChildren(h("p", { class: "bad" }, `run ${id}: ${err.message}`));
  }
  for (const tr of document.querySelectorAll("tr[data-run]")) tr.classList.toggle("selected", tr.dataset.run === id);
}

function runDetail(r) {
  return h("section", { class: "detail", "aria-label": `Run ${r.id}` },
    h("h2", {}, "Run ", h("code", {}, r.id), " ", badge(r.status),
      h("button", { class: "close", onclick: () => openRun(r.job, null) }, "Close")),
    h("dl", { class: "facts" },
      h("dt", {}, "Slot"), h("dd", {}, r.slot), h("dt", {}, "Attempt"), h("dd", {}, `${r.attempt} (${r.trigger})`),
      h("dt", {}, "Node"), h("dd", {}, r.node || "—"), h("dt", {}, "Started"), h("dd", {}, r.started_at || "—"),
      h("dt", {}, "Duration"), h("dd", {}, dur(r.duration_ms)),
      h("dt", {}, "Result"), h("dd", {}, r.http_status !== null ? `HTTP ${r.http_status}` : r.exit_code !== null ? `exit ${r.exit_code}` : "—")),
    r.error ? [h("h3", {}, "Error"), h("pre", { class: "err" }, r.error)] : null,
    h("h3", {}, "Output"), h("pre", {}, r.output || "(none)"));
}

async function viewDead() {
  const dead = (await api("/v1/dead-letters?limit=1000")).items;
  const rows = dead.map((r) => h("tr", {},
    h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(r.job)}` }, r.job)), h("td", {}, when(r.slot)),
    h("td", { class: "num" }, r.attempt), h("td", {}, r.node || "—"), h("td", {}, r.error || "—"),
    h("td", {}, h("button", { "aria-label": `Replay ${r.job} slot ${r.slot}`,
      onclick: () => act(`/v1/dead-letters/${encodeURIComponent(r.id)}/replay`, `replaying ${r.id}`) }, "Replay"))));
  return [h("h1", {}, `Dead letters (${dead.length})`),
    dead.length ? table(["Job", "Slot", "Attempts", "Node", "Error", ""], rows) : h("p", {}, "No dead letters.")];
}

// ---- routing, rendering and the live updates ---------------------------------------------

function hashParts() {
  const [path, q] = location.hash.replace(/^#\/?/, "").split("?");
  return { path: path || "", q: new URLSearchParams(q || "") };
}

function pick(q, names) {
  const out = {};
  for (const n of names) if (q.get(n)) out[n] = q.get(n);
  return out;
}

// A route: the nav entry it marks, a key (same key: a live update keeps the filter bar), the
// parts built once (head) and the part each update replaces (body).
function route() {
  const { path, q } = hashParts();
  const parts = path.split("/");
  if (parts[0] === "jobs" && parts[1]) {
    const run = parts[2] === "runs" && parts[3] ? decodeURIComponent(parts[3]) : null;
    return { view: "jobs", key: "job:" + parts[1], run, head: [], body: () => viewJob(decodeURIComponent(parts[1])) };
  }
  if (parts[0] === "cluster") return { view: "cluster", key: "cluster", head: [], body: viewCluster };
  if (parts[0] === "dead") return { view: "dead", key: "dead", head: [], body: viewDead };
  if (parts[0] === "runs") return { view: "runs", key: "runs", ...viewRuns(pick(q, ["status", "since", "job", "node", "cursor"])) };
  const params = pick(q, JOB_FILTERS);
  const isDefault = parts[0] !== "jobs"; // the page as opened: failing jobs first, when any fail
  const view = !isDefault && params.status === "failing" ? "failing" : "jobs";
  return { view, key: "jobs", ...viewJobs(params, isDefault) };
}

function showSummary(c) {
  const reach = c.members.filter((m) => m.reachable).length;
  $("#summary").textContent = `leader ${c.leader ? c.leader.node_id || c.leader.raft_addr : "none"} · term ${c.term}` +
    ` · commit ${c.commit_index} · ${reach}/${c.members.length} reachable · via ${c.node_id}`;
}

function focusKey(el) {
  if (!el || !$("#main").contains(el)) return null;
  if (el.dataset.run) return "run:" + el.dataset.run;
  return ["A", "BUTTON"].includes(el.tagName) ? `${el.tagName}:${el.textContent}:${el.getAttribute("href")}` : null;
}

let renders = 0; // a render that a newer one overtook drops its result

// Render the current route; ``rebuild``: a navigation, so the filter bar is built anew too.
async function show(rebuild) {
  const seq = ++renders;
  lastRender = Date.now();
  const r = route();
  selectedRun = r.run || null;
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.view === r.view) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  if (rebuild || routeKey !== r.key || !$("#results")) {
    $("#main").replaceChildren(...r.head, h("div", { id: "results" }, h("p", {}, "Loading…")));
    routeKey = r.key;
  }
  try {
    const nodes = await r.body();
    if (seq !== renders) return;
    const detail = $("#run-detail");
    const keep = detail ? detail.firstChild : null; // a run's output stays open across updates
    const focused = focusKey(document.activeElement);
    const current = document.querySelector("#results tr.current");
    const currentKey = current ? current.dataset.job || current.dataset.run : null;
    $("#results").replaceChildren(...nodes);
    if (focused) { // a keyboard user keeps their place through an update
      const again = [...$("#results").querySelectorAll("a, button, tr[data-run]")].find((el) => focusKey(el) === focused);
      if (again) again.focus();
    }
    if (currentKey) {
      const row = [...rows()].find((tr) => (tr.dataset.job || tr.dataset.run) === currentKey);
      if (row) row.classList.add("current");
    }
    if (loadFailed) notice("");
    loadFailed = false;
    if (keep && selectedRun && keep.getAttribute("aria-label") === `Run ${selectedRun}`) {
      $("#run-detail").replaceChildren(keep); // no flicker while it reloads
    }
    if (selectedRun) showRun(selectedRun); // its status may have moved on since
  } catch (err) {
    if (seq !== renders) return;
    if (err instanceof ApiError && err.status === 401) {
      $("#results").replaceChildren(h("p", {}, "Enter the cluster's API token above to see its data."));
    } else {
      notice(`cannot load: ${err.message}`, true);
      loadFailed = true;
    }
  } finally {
    lastRender = Date.now();
  }
}

function refresh(rebuild) {
  return show(!!rebuild);
}

const sleep = (ms) => new Promise((resolve) => { timer = setTimeout(resolve, ms); });

// Live: wait on the node (GET /v1/watch) until it applies something new, then render again,
// at most once a second. No polling while nothing changes.
async function live() {
  for (;;) {
    try {
      const c = await api(`/v1/watch?after=${applied}&timeout=${WATCH_S}`);
      showSummary(c);
      if (c.applied_index !== applied) {
        applied = c.applied_index;
        const wait = MIN_RENDER_MS - (Date.now() - lastRender);
        if (wait > 0) await sleep(wait);
        await show(false);
      }
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 401)) $("#summary").textContent = `not connected: ${err.message}`;
      await sleep(RETRY_MS);
    }
  }
}

// ---- the keyboard: / to search, j and k to move through the rows, Enter to open ------------

function rows() {
  return document.querySelectorAll("#results tbody tr");
}

document.addEventListener("keydown", (ev) => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.target.matches("input, select, textarea")) {
    if (ev.key === "Escape") ev.target.blur();
    return;
  }
  if (ev.key === "/") {
    const search = $("#search");
    if (search) {
      ev.preventDefault();
      search.focus();
      search.select();
    }
  } else if (ev.key === "j" || ev.key === "k") {
    const all = [...rows()];
    if (!all.length) return;
    const at = all.findIndex((tr) => tr.classList.contains("current"));
    const next = at < 0 ? 0 : Math.max(0, Math.min(all.length - 1, at + (ev.key === "j" ? 1 : -1)));
    for (const tr of all) tr.classList.remove("current");
    const row = all[next];
    row.classList.add("current");
    const target = row.querySelector("a") || (row.tabIndex >= 0 ? row : null);
    if (target) target.focus();
    row.scrollIntoView({ block: "nearest" });
  }
});

window.addEventListener("hashchange", () => refresh(true));
refresh(true);
live();
