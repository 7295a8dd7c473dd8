// The cdcflow status page: polls /api/v2/status/overview and draws it. Plain DOM and SVG, no library.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#2f6fd6", "#d6452f", "#2f9e55", "#a05cc7", "#c98a12", "#1c9aa8", "#6b6f78"];
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function seconds(value) {
  if (value >= 3600) return (value / 3600).toFixed(1) + " h";
  if (value >= 60) return (value / 60).toFixed(1) + " min";
  return value.toFixed(1) + " s";
}

function rate(value) {
  return value.toLocaleString("en-US", { maximumFractionDigits: value < 10 ? 1 : 0 });
}

function colorOf(ids, id) {
  return COLORS[ids.indexOf(id) % COLORS.length];
}

// The initial snapshot's cell of a changefeed: null (it takes none), or what the bar shows:
// parts done of the total (value/max), rows done of the estimate, rate and ETA, or "done".
function snapshotSummary(cf) {
  if (!cf.initial_snapshot) return null;
  const p = cf.snapshot_progress;
  const count = (n) => Number(n).toLocaleString("en-US");
  if ((p && p.phase === "done") || (!p && cf.snapshot_done)) {
    const text = p ? `done · ${count(p.rows_done)} rows in ${seconds(p.elapsed_seconds)}` : "done";
    return { state: "done", value: 1, max: 1, text };
  }
  if (!p) return { state: "planning", value: 0, max: 1, text: "planning…" };
  const percent = p.parts_total ? Math.floor((100 * p.parts_done) / p.parts_total) : 0;
  const eta = p.eta_seconds === null || p.eta_seconds === undefined ? "unknown" : seconds(p.eta_seconds);
  const phase = p.phase === "deliver" ? "delivering · " : "";
  const text = `${phase}${p.parts_done}/${p.parts_total} ${p.unit}s (${percent}%) · ` +
    `${count(p.rows_done)}/~${count(Math.max(p.rows_done, p.rows_estimate))} rows · ` +
    `${rate(p.rows_per_second)} rows/s · ETA ${eta}`;
  return { state: p.phase, value: p.parts_done, max: Math.max(1, p.parts_total), text };
}

function renderSnapshot(cf) {
  const s = snapshotSummary(cf);
  if (!s) return el("td", { class: "muted" }, "—");
  return el("td", { class: "snapshot", "data-snapshot": s.state },
    el("progress", { value: s.value, max: s.max }), " ", el("span", {}, s.text));
}

function renderChangefeeds(doc) {
  const body = document.querySelector("#changefeeds tbody");
  body.replaceChildren();
  for (const cf of doc.changefeeds) {
    const error = cf.error ? `${cf.error.code_name || "error"}: ${cf.error.message || ""}` : "";
    const row = el("tr", { "data-changefeed": cf.id },
      el("td", { class: "mono" }, cf.id),
      el("td", {}, el("span", { class: `state state-${cf.state}`, "data-state": cf.state }, cf.state)),
      el("td", { class: "mono", title: `TSO ${cf.checkpoint_tso}` }, `${cf.checkpoint_time} UTC`),
      el("td", { class: "num" }, seconds(cf.checkpoint_lag)),
      el("td", { class: "num" }, seconds(cf.resolved_lag)),
      el("td", { class: "num", title: `${cf.rows_flushed.toLocaleString("en-US")} rows flushed` }, rate(cf.rows_per_second)),
      renderSnapshot(cf),
      el("td", { class: "error" }, error));
    body.append(row);
  }
  document.getElementById("no-changefeeds").hidden = doc.changefeeds.length > 0;
}

function renderCaptures(doc) {
  const body = document.querySelector("#captures tbody");
  body.replaceChildren();
  for (const c of doc.captures) {
    const spans = el("ul", { class: "spans" });
    for (const s of c.spans) {
      const role = s.role === "secondary" ? " (secondary, catching up)" : "";
      spans.append(el("li", { "data-span": `${s.changefeed_id}/${s.table_id}` },
        `${s.changefeed_id}: table ${s.table_id} [${s.start || "…"}, ${s.end || "…"}) ${s.state}${role}`));
    }
    if (!c.spans.length) spans.append(el("li", { class: "muted" }, "no spans"));
    body.append(el("tr", { "data-capture": c.id },
      el("td", { class: "mono" }, c.id + (c.is_owner ? " (owner)" : "")),
      el("td", { class: "mono" }, c.address),
      el("td", {}, c.version),
      el("td", {}, spans)));
  }
}

// One line per changefeed over the history's samples; x is time over the last hour.
function renderChart(id, doc, field, format) {
  const chart = document.getElementById(id);
  const W = 600, H = 220, L = 58, R = 12, T = 10, B = 34;
  const samples = doc.history.samples;
  const horizon = doc.history.horizon_seconds;
  const end = doc.now, start = end - horizon;
  const ids = doc.changefeeds.map((c) => c.id);
  let max = 0;
  for (const s of samples) for (const v of Object.values(s.changefeeds)) max = Math.max(max, v[field]);
  max = max > 0 ? max * 1.1 : 1;
  const x = (t) => L + ((t - start) / horizon) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  chart.replaceChildren();
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    chart.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    chart.append(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, format(v)));
  }
  for (let m = 0; m <= 60; m += 15) {
    const t = start + m * 60;
    chart.append(svg("text", { x: x(t), y: H - 12, "text-anchor": "middle" }, m === 60 ? "now" : `-${60 - m} min`));
  }
  const legend = [];
  for (const cf of ids) {
    const points = samples.filter((s) => cf in s.changefeeds && s.t >= start)
      .map((s) => `${x(s.t).toFixed(1)},${y(s.changefeeds[cf][field]).toFixed(1)}`);
    if (!points.length) continue;
    const attrs = { class: "series", stroke: colorOf(ids, cf), "data-changefeed": cf, points: points.join(" ") };
    chart.append(svg("polyline", attrs));
    if (points.length === 1) {
      const [px, py] = points[0].split(",");
      chart.append(svg("circle", { cx: px, cy: py, r: 3, fill: colorOf(ids, cf) }));
    }
    legend.push(cf);
  }
  legend.forEach((cf, i) => {
    chart.append(svg("rect", { x: L + 8, y: T + 6 + i * 15, width: 10, height: 10, fill: colorOf(ids, cf) }));
    chart.append(svg("text", { x: L + 22, y: T + 15 + i * 15 }, cf));
  });
  chart.setAttribute("data-points", String(samples.length));
}

function render(doc) {
  document.getElementById("cluster").textContent =
    `v${doc.version} · served by ${doc.served_by} · owner ${doc.owner || "none"}`;
  document.getElementById("updated").textContent = "updated " + new Date(doc.now * 1000).toLocaleTimeString();
  renderChangefeeds(doc);
  renderCaptures(doc);
  renderChart("chart-lag", doc, "checkpoint_lag", (v) => seconds(v));
  renderChart("chart-rows", doc, "rows_per_second", (v) => rate(v));
  document.body.setAttribute("data-loaded", "true");
}

async function poll() {
  const problem = document.getElementById("problem");
  try {
    const resp = await fetch("/api/v2/status/overview", { credentials: "same-origin", cache: "no-store" });
    if (resp.status === 401) {
      window.location.assign("/login");
      return;
    }
    const doc = await resp.json();
    if (!resp.ok) throw new Error(`${doc.error_code || resp.status}: ${doc.error_msg || resp.statusText}`);
    render(doc);
    problem.hidden = true;
  } catch (err) {
    problem.textContent = `Cannot refresh: ${err.message}`;
    problem.hidden = false;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

if (typeof module !== "undefined" && module.exports) {
  module.exports = { snapshotSummary, seconds, rate }; // for tests run with Node.js, without a browser
} else {
  document.addEventListener("DOMContentLoaded", poll);
}
