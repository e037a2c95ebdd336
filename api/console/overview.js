// The overview, live: the API pushes a snapshot every 2 s (GET /v1/admin/overview/stream);
// the page keeps the last 5 minutes of them for the small charts.
import { html, useEffect, useRef, useState } from "./vendor/preact-htm.mjs";
import { ago, api, ms, useStream } from "./lib.js";

const HISTORY = 150; // snapshots: 5 minutes at one every 2 s

function Spark({ series, second, label }) {
  const values = [...series, ...(second || [])].filter((v) => v != null);
  // Two snapshots make a line (4 s after the page opens); a latency needs a job that ended
  // in the window, which an idle deployment, or one just restarted, has not had.
  if (series.length < 2) return html`<p class="muted">${label}: the chart starts in a few seconds</p>`;
  if (!values.length) return html`<p class="muted">${label}: no job ended in the last minutes</p>`;
  const top = Math.max(...values) || 1;
  const line = (data) =>
    data.map((v, i) => `${(i / (HISTORY - 1)) * 100},${36 - ((v ?? 0) / top) * 34}`).join(" ");
  return html`<svg class="spark" viewBox="0 0 100 36" preserveAspectRatio="none" role="img" aria-label=${label}>
    <polyline points=${line(series)} vector-effect="non-scaling-stroke" />
    ${second && html`<polyline class="second" points=${line(second)} vector-effect="non-scaling-stroke" />`}
  </svg>`;
}

function PipelineCard({ p, history }) {
  const pick = (f) => history.map((snap) => {
    const mine = snap.pipelines.find((q) => q.pipeline === p.pipeline);
    return mine ? f(mine) : null;
  });
  return html`<article class="card pipeline" data-pipeline=${p.pipeline} aria-label=${`pipeline ${p.pipeline}`}>
    <h3>${p.pipeline} <span class="muted">(${p.kind})</span></h3>
    <dl>
      <dt>queued</dt><dd class="queued">${p.queued_total}${" "}
        <span class="muted">(high ${p.queued.high || 0}, normal ${p.queued.normal || 0}, low ${p.queued.low || 0}, batch ${p.queued.batch || 0})</span></dd>
      <dt>running</dt><dd class="running">${p.running}</dd>
      <dt>workers</dt><dd>${p.workers}</dd>
      <dt>jobs/s</dt><dd class="rate">${p.jobs_per_s.toFixed(2)}</dd>
      <dt>end to end</dt><dd>p50 ${ms(p.end_to_end.p50_ms)} · p95 ${ms(p.end_to_end.p95_ms)}</dd>
      <dt>queue wait</dt><dd>p50 ${ms(p.queue_wait.p50_ms)} · p95 ${ms(p.queue_wait.p95_ms)}</dd>
      <dt>ended</dt><dd class="ended">${Object.entries(p.ended).map(([s, n]) => `${s} ${n}`).join(", ") || "none"}</dd>
      <dt>429s</dt><dd>${p.rejected}</dd>
    </dl>
    <${Spark} label="jobs per second" series=${pick((q) => q.jobs_per_s)} />
    <${Spark} label="end to end p50 and p95" series=${pick((q) => q.end_to_end.p50_ms)} second=${pick((q) => q.end_to_end.p95_ms)} />
  </article>`;
}

function Workers({ workers }) {
  if (!workers.length) return html`<p class="muted">No workers have a heartbeat.</p>`;
  return html`<table class="workers"><thead><tr><th>Worker</th><th>Host</th><th>Device</th><th>Pipeline</th>
    <th class="num">Instance</th><th class="num">Heartbeat</th><th class="num">In flight</th><th class="num">Batch</th></tr></thead>
    <tbody>${workers.map((w) => html`<tr class=${w.up ? "up" : "down"}>
      <td><code>${w.name}</code>${w.up ? "" : html` <span class="badge failed">silent</span>`}</td>
      <td>${w.host}</td><td>${w.device}</td><td>${w.pipeline}</td><td class="num">${w.instance ?? ""}</td>
      <td class="num">${ago(w.heartbeat_age_s)} ago</td><td class="num">${w.in_flight}</td><td class="num batch">${w.batch_size}</td>
    </tr>`)}</tbody></table>`;
}

function Devices({ devices }) {
  if (!devices.length) return html`<p class="muted">No GPU reported (CPU workers, or no NVML).</p>`;
  return html`<div class="cards">${devices.map((d) => html`<article class="card">
    <h3>${d.name} <span class="muted">${d.host} ${d.device}</span></h3>
    <dl><dt>busy</dt><dd>${d.utilization == null ? "n/a (MIG)" : `${Math.round(d.utilization * 100)} %`}</dd>
      <dt>memory</dt><dd>${(d.memory_used_bytes / 2 ** 30).toFixed(1)} / ${(d.memory_total_bytes / 2 ** 30).toFixed(1)} GiB</dd></dl>
    <div class="bar" aria-hidden="true"><span style=${`width:${(100 * d.memory_used_bytes) / (d.memory_total_bytes || 1)}%`}></span></div>
  </article>`)}</div>`;
}

function Models({ models }) {
  if (!models.length) return html`<p class="muted">No worker has reported a model yet.</p>`;
  const gib = (b) => (b ? `${(b / 2 ** 30).toFixed(1)} GiB` : "unknown");
  const state = (m) => (m.resident ? "resident" : m.idle_since ? `on demand, idle since ${new Date(m.idle_since * 1000).toLocaleTimeString()}` : "on demand, in use");
  return html`<table class="models"><thead><tr><th>Device</th><th>Pipeline</th><th class="num">Memory (estimate)</th>
    <th>Loaded</th><th>State</th></tr></thead>
    <tbody>${models.map((m) => html`<tr><td>${m.host} ${m.device}</td><td>${m.pipeline}</td>
      <td class="num">${gib(m.bytes)}</td><td>${new Date(m.loaded_at * 1000).toLocaleTimeString()}</td>
      <td>${state(m)}</td></tr>`)}</tbody></table>`;
}

function Keys({ keys }) {
  if (!keys.length) return html`<p class="muted">No key has submitted a job yet.</p>`;
  const limit = (n) => (n ? n : "none");
  const costs = (k) => Object.entries(k.costs).map(([kind, c]) =>
    `${kind}: ${c.used}${c.limit ? ` of ${c.limit}` : ""} ${c.unit.replace("_", " ")}`).join("; ") || "none";
  return html`<table class="keys"><thead><tr><th>Key (owner)</th><th class="num">Queued</th>
    <th class="num">Queued limit</th><th class="num">Running</th><th class="num">Running limit</th>
    <th class="num">Requests this window</th><th class="num">Requests limit</th><th>Cost this window</th></tr></thead>
    <tbody>${keys.map((k) => html`<tr><td>${k.owner}</td><td class="num">${k.queued}</td>
      <td class="num">${limit(k.max_queued)}</td><td class="num">${k.running}</td>
      <td class="num">${limit(k.max_running)}</td><td class="num">${k.requests_used}</td>
      <td class="num">${k.requests ? `${k.requests} / ${k.window_s} s` : "none"}</td>
      <td>${costs(k)}</td></tr>`)}</tbody></table>`;
}

export function Overview() {
  const [now, setNow] = useState(null);
  const history = useRef([]);
  useEffect(() => {  // a snapshot at once; the stream's frames follow every 2 s
    let live = true;
    api("/v1/admin/overview").then((first) => live && setNow((n) => n || first)).catch(() => {});
    return () => {
      live = false;
    };
  }, []);
  const error = useStream("/v1/admin/overview/stream", (message) => {
    if (message.event !== "overview") return;
    history.current = [...history.current.slice(-(HISTORY - 1)), message.data];
    setNow(message.data);
  }, []);
  if (error) return html`<p class="error" role="alert">${error.message}</p>`;
  if (!now) return html`<p class="muted">Waiting for the first overview…</p>`;
  return html`<section aria-labelledby="overview-title">
    <h1 id="overview-title">Overview</h1>
    <p class="facts" role="status">${new Date(now.at).toLocaleTimeString()} · ${now.running_total} running ·
      rates and percentiles over the last ${Math.round(now.window_s / 60)} min</p>
    <h2>Pipelines</h2>
    <div class="cards">${now.pipelines.map((p) => html`<${PipelineCard} key=${p.pipeline} p=${p} history=${history.current} />`)}</div>
    <h2>Queues</h2>
    <table class="kinds"><thead><tr><th>Kind</th><th class="num">Queued</th><th class="num">429 above</th></tr></thead>
      <tbody>${now.kinds.map((k) => html`<tr><td>${k.kind}</td><td class="num">${k.queued}</td><td class="num">${k.max_queued}</td></tr>`)}</tbody></table>
    <h2>Workers</h2>
    <${Workers} workers=${now.workers} />
    <h2>GPUs</h2>
    <${Devices} devices=${now.devices} />
    <h2>Models</h2>
    <${Models} models=${now.models || []} />
    <h2>Keys</h2>
    <${Keys} keys=${now.keys || []} />
  </section>`;
}
