// Weir's web UI: reads the job's REST API once a second and draws the job graph, the
// checkpoint timeline, history, details and configuration; its buttons trigger a checkpoint or
// a savepoint (asynchronous operations, polled to their end) and cancel the job. Text from the
// job (names, paths, errors) is always set as text, never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 1000;
// The timeline keeps every checkpoint the page has seen (the REST history holds the last few).
const TIMELINE_KEEP = 500;
const state = { jobId: null, readOnly: false, selected: null, ended: false, seen: new Map() };

// ---- small helpers -------------------------------------------------------------------------

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "onclick") e.onclick = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function bytes(n) {
  if (n === null || n === undefined || n < 0) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function millis(n) {
  if (n === null || n === undefined || n < 0) return "–";
  if (n < 1000) return n + " ms";
  if (n < 60000) return (n / 1000).toFixed(1) + " s";
  const s = Math.floor(n / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return (h ? h + "h " : "") + m + "m " + (s % 60) + "s";
}

function rate(n) {
  if (!n) return "0/s";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + "M/s";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + "k/s";
  return n.toFixed(0) + "/s";
}

function time(ms) { return ms > 0 ? new Date(ms).toLocaleTimeString() : "–"; }

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (!r.ok) {
    const why = json && json.errors ? json.errors.join("; ") : r.status + " " + r.statusText;
    throw new Error(why);
  }
  return json;
}

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

function barClass(c) {
  if (c.status === "FAILED") return "failed";
  if (c.status === "IN_PROGRESS") return "in_progress";
  return c.is_savepoint ? "savepoint" : "completed";
}

// ---- the job header and graph --------------------------------------------------------------

function renderJob(job) {
  $("job-name").textContent = job.name;
  $("job-id").textContent = job.jid;
  const st = $("job-state");
  st.textContent = job.state;
  st.className = "state " + job.state;
  $("job-uptime").textContent = millis(job.duration);
  state.ended = job.state !== "RUNNING";
  for (const id of ["trigger-checkpoint", "trigger-savepoint", "cancel-job"]) {
    $(id).disabled = state.ended || state.readOnly;
  }
  renderGraph(job);
}

// Columns by depth from the sources; rows in plan order within a column.
function layout(nodes) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const depth = new Map();
  const visit = (n, seen) => {
    if (depth.has(n.id)) return depth.get(n.id);
    if (seen.has(n.id)) return 0;
    seen.add(n.id);
    let d = 0;
    for (const i of n.inputs) if (byId.has(i.id)) d = Math.max(d, visit(byId.get(i.id), seen) + 1);
    depth.set(n.id, d);
    return d;
  };
  nodes.forEach((n) => visit(n, new Set()));
  const columns = [];
  for (const n of nodes) (columns[depth.get(n.id)] = columns[depth.get(n.id)] || []).push(n.id);
  return { depth, columns };
}

function renderGraph(job) {
  const W = 260, H = 78, GX = 70, GY = 24, PAD = 10;
  const nodes = job.plan.nodes;
  const vertices = new Map(job.vertices.map((v) => [v.id, v]));
  const { columns } = layout(nodes);
  const pos = new Map();
  columns.forEach((ids, c) => ids.forEach((id, r) => {
    pos.set(id, { x: PAD + c * (W + GX), y: PAD + r * (H + GY) });
  }));
  const rows = Math.max(1, ...columns.map((c) => c.length));
  const width = PAD * 2 + columns.length * W + (columns.length - 1) * GX;
  const height = PAD * 2 + rows * H + (rows - 1) * GY;
  const s = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "job-graph-svg" });
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }));
  defs.append(marker);
  s.append(defs);
  for (const n of nodes) {
    for (const i of n.inputs) {
      const a = pos.get(i.id), b = pos.get(n.id);
      if (!a || !b) continue;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
      const mx = (x1 + x2) / 2;
      s.append(svg("path", { class: "edge", "marker-end": "url(#arrow)",
        d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}` }));
      s.append(svg("text", { class: "edge-label", x: mx, y: (y1 + y2) / 2 - 4,
        "text-anchor": "middle" }, i.ship_strategy));
    }
  }
  for (const n of nodes) {
    const p = pos.get(n.id), v = vertices.get(n.id) || { metrics: {} };
    const m = v.metrics || {};
    const level = m["backpressure-level"] || "ok";
    const g = svg("g", { class: "vertex bp-" + level, transform: `translate(${p.x},${p.y})`,
      "data-vertex-id": n.id, "data-backpressure": level });
    g.append(svg("title", {}, n.description));
    g.append(svg("rect", { width: W, height: H }));
    const name = n.description.length > 33 ? n.description.slice(0, 32) + "…" : n.description;
    g.append(svg("text", { class: "name", x: 10, y: 20 }, name));
    g.append(svg("text", { class: "fact", x: 10, y: 38 }, "parallelism " + n.parallelism));
    const perSecond = m.numRecordsOutPerSecond !== undefined
      ? m.numRecordsOutPerSecond : m.numRecordsInPerSecond;
    const count = m["write-records"] !== undefined ? m["write-records"] : m["read-records"];
    g.append(svg("text", { class: "fact records-rate", x: 10, y: 54 },
      `${rate(perSecond)} · ${(count || 0).toLocaleString()} records`));
    const bp = Math.round((m.backPressuredTimeMsPerSecond || 0) / 10);
    g.append(svg("text", { class: "fact backpressure", x: 10, y: 70 },
      `backpressure ${level} (${bp}%)`));
    s.append(g);
  }
  $("job-graph").replaceChildren(s);
}

// ---- checkpoints ---------------------------------------------------------------------------

function renderCounts(counts) {
  const dl = $("checkpoint-counts");
  dl.replaceChildren(...["total", "completed", "failed", "in_progress", "restored"].map((k) =>
    el("div", { "data-count": k }, el("dt", {}, k.replace("_", " ")), el("dd", {}, counts[k]))));
}

// Merges the REST history into the checkpoints seen so far; all of them, newest first.
function remember(history) {
  for (const c of history) state.seen.set(c.id, c);
  const oldest = history.length ? Math.min(...history.map((c) => c.id)) : 0;
  for (const [id, c] of state.seen) {
    // One that left the history unfinished will not be heard of again.
    if (c.status === "IN_PROGRESS" && id < oldest) state.seen.delete(id);
  }
  const ids = [...state.seen.keys()].sort((a, b) => b - a);
  for (const id of ids.slice(TIMELINE_KEEP)) state.seen.delete(id);
  return ids.slice(0, TIMELINE_KEEP).map((id) => state.seen.get(id));
}

function renderTimeline(all) {
  const list = all.slice().reverse(); // oldest first
  const W = Math.max(480, Math.min(1100, list.length * 26 + 60)), H1 = 120, H2 = 70, L = 56;
  const height = H1 + H2 + 40;
  const s = svg("svg", { width: W, height, viewBox: `0 0 ${W} ${height}`, id: "timeline-svg" });
  const maxDuration = Math.max(1, ...list.map((c) => c.end_to_end_duration));
  const maxSize = Math.max(1, ...list.map((c) => c.checkpointed_size));
  const step = list.length ? (W - L - 10) / list.length : 0;
  const bar = Math.max(3, Math.min(20, step - 4));
  s.append(svg("text", { class: "axis", x: 2, y: 12 }, millis(maxDuration)));
  s.append(svg("text", { class: "axis", x: 2, y: H1 + 20 }, bytes(maxSize)));
  s.append(svg("line", { class: "axis-line", x1: L, x2: W, y1: H1 + 2, y2: H1 + 2 }));
  list.forEach((c, i) => {
    const x = L + i * step + (step - bar) / 2;
    const cls = barClass(c);
    const selected = state.selected === c.id ? " selected" : "";
    const d = Math.max(2, (Math.max(0, c.end_to_end_duration) / maxDuration) * (H1 - 10));
    const r1 = svg("rect", { class: "cp-bar duration " + cls + selected, x, y: H1 - d + 2,
      width: bar, height: d, "data-checkpoint-id": c.id, "data-status": c.status,
      "data-kind": c.checkpoint_type });
    r1.append(svg("title", {}, `#${c.id} ${c.status} ${c.checkpoint_type}: ` +
      `${millis(c.end_to_end_duration)}, ${bytes(c.checkpointed_size)}`));
    const z = Math.max(1, (c.checkpointed_size / maxSize) * (H2 - 6));
    const r2 = svg("rect", { class: "cp-bar size " + cls + selected, x, y: H1 + 6,
      width: bar, height: z, "data-checkpoint-id": c.id });
    r2.append(svg("title", {}, `#${c.id}: ${bytes(c.checkpointed_size)} written, ` +
      `${bytes(c.state_size)} full`));
    for (const r of [r1, r2]) r.addEventListener("click", () => selectCheckpoint(c.id));
    s.append(r1, r2);
    if (list.length <= 40 || i % Math.ceil(list.length / 40) === 0) {
      s.append(svg("text", { class: "axis", x: x + bar / 2, y: H1 + H2 + 24,
        "text-anchor": "middle" }, c.id));
    }
  });
  $("checkpoint-timeline").replaceChildren(s);
}

function renderSummary(summary) {
  const rows = [["end-to-end duration", summary.end_to_end_duration, millis],
    ["checkpointed size", summary.checkpointed_size, bytes],
    ["full state size", summary.state_size, bytes],
    ["alignment duration", summary.alignment_duration, millis],
    ["persisted in-flight data", summary.persisted_data, bytes],
    ["processed during alignment", summary.processed_data, bytes]];
  const cols = ["min", "avg", "p50", "p90", "p95", "p99", "max"];
  $("checkpoint-summary").replaceChildren(
    el("tr", {}, el("th", {}, ""), ...cols.map((c) => el("th", { class: "num" }, c))),
    ...rows.map(([name, s, f]) => el("tr", {}, el("th", {}, name),
      ...cols.map((c) => el("td", { class: "num" }, f(Math.round(s[c]))))))
  );
}

function renderHistory(history) {
  const head = el("tr", {}, ...["id", "status", "type", "triggered", "end to end",
    "checkpointed", "full size", "acknowledged"].map((h) => el("th", {}, h)));
  const rows = history.map((c) => {
    const tr = el("tr", { class: "clickable" + (state.selected === c.id ? " selected" : ""),
      "data-checkpoint-id": c.id, onclick: () => selectCheckpoint(c.id) },
      el("td", {}, c.id), el("td", {}, c.status), el("td", {}, c.checkpoint_type),
      el("td", {}, time(c.trigger_timestamp)), el("td", { class: "num" },
        millis(c.end_to_end_duration)),
      el("td", { class: "num" }, bytes(c.checkpointed_size)),
      el("td", { class: "num" }, bytes(c.state_size)),
      el("td", { class: "num" }, `${c.num_acknowledged_subtasks}/${c.num_subtasks}`));
    if (c.failure_message) tr.title = c.failure_message;
    return tr;
  });
  $("checkpoint-history").replaceChildren(head, ...rows);
}

function renderRestored(restored) {
  $("checkpoint-restored").textContent = restored
    ? `#${restored.id} from ${restored.external_path} at ${time(restored.restore_timestamp)}` +
      (restored.is_savepoint ? " (savepoint)" : "")
    : "none";
}

async function selectCheckpoint(id) {
  state.selected = id;
  try {
    await renderDetails();
  } catch (e) {
    // Older checkpoints leave the job's history: say so where the details would be.
    $("details-id").textContent = `#${id}`;
    $("checkpoint-details").replaceChildren(el("p", { class: "hint" }, e.message));
  }
}

async function renderDetails() {
  const id = state.selected;
  if (id === null || !state.jobId) return;
  const base = `/jobs/${state.jobId}/checkpoints/details/${id}`;
  const details = await api("GET", base);
  $("details-id").textContent = `#${id} (${details.status}, ${details.checkpoint_type})`;
  const blocks = [];
  for (const [vertex, task] of Object.entries(details.tasks)) {
    const sub = await api("GET", `${base}/subtasks/${vertex}`);
    const name = state.vertexNames.get(vertex) || vertex;
    const head = el("tr", {}, ...["subtask", "status", "sync", "async", "alignment",
      "processed", "start delay", "end to end", "state size"].map((h) => el("th", {}, h)));
    const rows = sub.subtasks.map((s) => s.status === "completed"
      ? el("tr", { "data-subtask": s.index }, el("td", {}, s.index), el("td", {}, s.status),
        el("td", { class: "num" }, millis(s.checkpoint.sync)),
        el("td", { class: "num" }, millis(s.checkpoint.async)),
        el("td", { class: "num" }, millis(s.alignment.duration)),
        el("td", { class: "num" }, bytes(s.alignment.processed)),
        el("td", { class: "num" }, millis(s.start_delay)),
        el("td", { class: "num" }, millis(s.end_to_end_duration)),
        el("td", { class: "num" }, bytes(s.state_size)))
      : el("tr", { "data-subtask": s.index }, el("td", {}, s.index),
        el("td", { colspan: 8 }, "not acknowledged")));
    blocks.push(el("h3", {}, `${name}: ${task.num_acknowledged_subtasks}/${task.num_subtasks} ` +
      `acknowledged, ${bytes(task.state_size)}`), el("table", { "data-vertex-id": vertex },
      head, ...rows));
  }
  $("checkpoint-details").replaceChildren(...blocks);
}

function renderConfig(config) {
  const durations = ["interval", "timeout", "min_pause", "aligned_checkpoint_timeout"];
  const shown = (k, v) => {
    if (typeof v === "object") return JSON.stringify(v);
    if (durations.includes(k)) return v >= 9007199254740991 ? "off" : millis(v);
    return v;
  };
  const rows = Object.entries(config).map(([k, v]) =>
    el("tr", { "data-key": k }, el("th", {}, k), el("td", {}, shown(k, v))));
  $("checkpoint-config").replaceChildren(...rows);
}

// ---- buttons -------------------------------------------------------------------------------

function status(text, cls) {
  const s = $("operation-status");
  s.textContent = text;
  s.className = cls || "";
}

async function runOperation(what, path, body, resultPath) {
  try {
    status(`${what}: triggered…`);
    const started = await api("POST", path, body);
    const id = started["request-id"];
    for (;;) {
      await new Promise((r) => setTimeout(r, 300));
      const r = await api("GET", `${resultPath}/${id}`);
      if (r.status.id !== "COMPLETED") continue;
      const op = r.operation || {};
      if (op["failure-cause"]) {
        status(`${what} failed: ${op["failure-cause"]["stack-trace"]}`, "failed");
      } else {
        status(`${what} completed: ${op.location}`, "done");
        const s = $("operation-status");
        s.dataset.location = op.location;
        s.dataset.operation = what;
      }
      return;
    }
  } catch (e) {
    status(`${what} failed: ${e.message}`, "failed");
  }
}

function wireButtons() {
  $("trigger-checkpoint").onclick = () => runOperation("checkpoint",
    `/jobs/${state.jobId}/checkpoints`, {}, `/jobs/${state.jobId}/checkpoints`);
  $("trigger-savepoint").onclick = () => {
    const dir = $("savepoint-dir").value.trim();
    runOperation("savepoint", `/jobs/${state.jobId}/savepoints`,
      dir ? { "target-directory": dir, "cancel-job": false } : { "cancel-job": false },
      `/jobs/${state.jobId}/savepoints`);
  };
  $("cancel-job").onclick = async () => {
    if (!window.confirm("Cancel the job?")) return;
    try {
      await api("PATCH", `/jobs/${state.jobId}?mode=cancel`);
      status("cancel requested", "done");
    } catch (e) { status(`cancel failed: ${e.message}`, "failed"); }
  };
}

// ---- the refresh loop ----------------------------------------------------------------------

async function refresh() {
  // The server's own job comes first; another job's server may take this address later (a
  // standing cluster's next job manager): the page then shows that job from scratch.
  const jobs = await api("GET", "/jobs");
  if (!jobs.jobs.length) return;
  if (state.jobId !== jobs.jobs[0].id) {
    state.jobId = jobs.jobs[0].id;
    state.seen = new Map();
    state.selected = null;
    $("checkpoint-details").replaceChildren();
    $("details-id").textContent = "–";
    status("");
    const config = await api("GET", "/config");
    state.readOnly = !config.features["web-cancel"];
  }
  const [job, checkpoints, config] = await Promise.all([
    api("GET", `/jobs/${state.jobId}`),
    api("GET", `/jobs/${state.jobId}/checkpoints`),
    api("GET", `/jobs/${state.jobId}/checkpoints/config`),
  ]);
  state.vertexNames = new Map(job.vertices.map((v) => [v.id, v.name]));
  renderJob(job);
  renderCounts(checkpoints.counts);
  renderTimeline(remember(checkpoints.history));
  renderSummary(checkpoints.summary);
  renderHistory(checkpoints.history);
  renderRestored(checkpoints.latest.restored);
  renderConfig(config);
  if (state.selected === null) {
    const latest = checkpoints.latest.completed || checkpoints.history[0];
    if (latest) await selectCheckpoint(latest.id);
  }
  document.body.dataset.refreshed = String(Date.now());
}

async function loop() {
  try {
    await refresh();
    showError(null);
  } catch (e) {
    showError(state.ended ? null : e);
  }
  setTimeout(loop, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  wireButtons();
  loop();
});
