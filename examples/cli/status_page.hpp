// The status page decentrain-gpt serves at / (--status-port): plain HTML and JavaScript, nothing
// fetched from elsewhere. It reads /metrics every second and draws each peer's loss curve on a
// canvas and a table of the peers' figures. The canvas's data-points attribute and the page title
// say what was drawn, for a headless browser to check.
#pragma once

namespace cli {

inline constexpr const char* status_page_html = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>decentrain</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 4px; }
  #summary { color: #555; margin-bottom: 12px; }
  canvas { border: 1px solid #ccc; background: #fff; }
  table { border-collapse: collapse; margin-top: 16px; }
  th, td { padding: 4px 10px; text-align: right; border-bottom: 1px solid #eee; }
  th { background: #f5f5f5; }
  #error { color: #b00; }
</style>
</head>
<body>
<h1>decentrain training</h1>
<div id="summary">waiting for the first step...</div>
<div id="error"></div>
<div id="group"></div>
<canvas id="curve" width="900" height="360" data-points="0"></canvas>
<table id="peers">
  <thead><tr><th>peer</th><th>step</th><th>loss</th><th>val loss</th><th>tokens/s</th><th>MB sent</th>
  <th>MB received</th><th>net wait s</th><th>util %</th></tr></thead>
  <tbody></tbody>
</table>
<script>
"use strict";
const colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const fixed = (v, d) => (v === null || v === undefined) ? "-" : Number(v).toFixed(d);

function draw(m) {
  const canvas = document.getElementById("curve");
  const g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 50, bottom = 30, top = 10, right = 10;
  g.clearRect(0, 0, W, H);
  // The x axis spans the steps done so far (a little beyond), so a long run's start is not a sliver.
  let points = 0, maxStep = 10, lo = Infinity, hi = -Infinity;
  for (const p of m.peers) maxStep = Math.max(maxStep, Math.ceil(p.step * 1.05));
  maxStep = Math.min(maxStep, Math.max(1, m.total_steps));
  for (const p of m.peers) for (const [s, l] of p.curve) if (l !== null) { lo = Math.min(lo, l); hi = Math.max(hi, l); }
  if (!isFinite(lo)) { lo = 0; hi = 1; }
  if (hi - lo < 1e-9) { hi = lo + 1; }
  const x = s => left + (W - left - right) * s / maxStep;
  const y = l => top + (H - top - bottom) * (hi - l) / (hi - lo);
  g.strokeStyle = "#999"; g.fillStyle = "#555"; g.lineWidth = 1; g.font = "11px sans-serif";
  g.beginPath(); g.moveTo(left, top); g.lineTo(left, H - bottom); g.lineTo(W - right, H - bottom); g.stroke();
  for (let i = 0; i <= 4; ++i) {
    const l = lo + (hi - lo) * i / 4;
    g.fillText(l.toFixed(2), 4, y(l) + 4);
    const s = Math.round(maxStep * i / 4);
    g.fillText(String(s), Math.min(x(s) - 8, W - right - 40), H - bottom + 16);
  }
  m.peers.forEach((p, i) => {
    g.strokeStyle = colors[i % colors.length]; g.lineWidth = 1.2; g.beginPath();
    let started = false;
    for (const [s, l] of p.curve) {
      if (l === null) { started = false; continue; }
      if (started) g.lineTo(x(s), y(l)); else g.moveTo(x(s), y(l));
      started = true; ++points;
    }
    g.stroke();
    g.fillStyle = colors[i % colors.length];
    for (const [s, l] of p.evals) if (l !== null) { g.beginPath(); g.arc(x(s), y(l), 3, 0, 2 * Math.PI); g.fill(); }
  });
  canvas.setAttribute("data-points", String(points));
}

function table(m) {
  const body = document.querySelector("#peers tbody");
  body.innerHTML = "";
  for (const p of m.peers) {
    const last = p.evals.length ? p.evals[p.evals.length - 1][1] : null;
    const row = document.createElement("tr");
    row.className = "peer-row";
    row.dataset.rank = p.rank;
    for (const v of [p.rank, p.step, fixed(p.loss, 4), fixed(last, 4), fixed(p.tokens_per_s, 0), fixed(p.bytes_sent / 1e6, 2),
                     fixed(p.bytes_received / 1e6, 2), fixed(p.network_wait_s, 2), fixed(100 * p.utilisation, 1)]) {
      const cell = document.createElement("td");
      cell.textContent = String(v);
      row.appendChild(cell);
    }
    body.appendChild(row);
  }
}

async function refresh() {
  try {
    const r = await fetch("/metrics", {cache: "no-store"});
    const m = await r.json();
    const step = m.peers.length ? Math.max(...m.peers.map(p => p.step)) : 0;
    const comm = m.config.comm ? m.config.comm : "";
    document.getElementById("summary").textContent =
        `${m.peers.length} peer(s)${comm ? ", " + comm : ""}, step ${step} of ${m.total_steps}` +
        (m.members.length ? `; members ${m.members.join(", ")}` : "");
    document.title = `decentrain: step ${step}/${m.total_steps}`;
    document.getElementById("error").textContent = "";
    const group = document.getElementById("group");
    group.textContent = m.group.length ? "the other peers' pages: " : "";
    m.group.forEach((g, i) => {
      const a = document.createElement("a");
      a.href = g.page;
      a.textContent = "peer " + g.rank;
      a.className = "peer-page";
      if (i) group.appendChild(document.createTextNode(", "));
      group.appendChild(a);
    });
    draw(m);
    table(m);
  } catch (e) {
    document.getElementById("error").textContent = "cannot read /metrics (" + e + "): has the run ended?";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)html";

}  // namespace cli
