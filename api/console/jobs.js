// Jobs: a filterable list, and one job followed live (timeline, input, output, events,
// webhook deliveries, cancel and retry).
import { html, useEffect, useRef, useState } from "./vendor/preact-htm.mjs";
import { api, followJob, ms, TERMINAL, when } from "./lib.js";
import { Output } from "./output.js";

const STATUSES = ["", "queued", "running", "succeeded", "failed", "canceled", "expired"];
const KIND_NAMES = ["", "asr", "tts", "image", "llm", "embed", "rerank", "noop"];

export function StatusBadge({ status }) {
  return html`<span class=${`badge ${status}`}>${status}</span>`;
}

// `batch`: the jobs of that batch's lines only (its page shows them).
export function JobList({ me, batch = "" }) {
  const [filters, setFilters] = useState({ status: "", kind: "", pipeline: "", since: "" });
  const [page, setPage] = useState({ rows: [], next: null, error: null, loading: true });
  const [tick, setTick] = useState(0);
  const base = me.admin ? "/v1/admin/jobs" : "/v1/jobs";
  const query = (cursor) => {
    const q = new URLSearchParams({ limit: "50" });
    for (const [k, v] of Object.entries(filters)) {
      if (!v) continue;
      if (k === "since") q.set("since", String(Date.now() / 1000 - Number(v) * 60));
      else q.set(k, v);
    }
    if (batch) q.set("batch", batch);
    if (cursor) q.set("cursor", cursor);
    return `${base}?${q}`;
  };
  useEffect(() => {
    let live = true;
    api(query(null))
      .then((r) => live && setPage({ rows: r.data, next: r.next_cursor, error: null }))
      .catch((error) => live && setPage({ rows: [], next: null, error }));
    return () => {
      live = false;
    };
  }, [filters, tick, batch]);
  useEffect(() => {
    const timer = setInterval(() => setTick((n) => n + 1), 3000);
    return () => clearInterval(timer);
  }, []);
  const more = async () => {
    const r = await api(query(page.next));
    setPage({ rows: [...page.rows, ...r.data], next: r.next_cursor, error: null });
  };
  const set = (name) => (e) => setFilters({ ...filters, [name]: e.target.value });
  const select = (name, values, label) => html`<label>${label}
    <select value=${filters[name]} onChange=${set(name)}>
      ${values.map((v) => html`<option value=${v}>${v || "any"}</option>`)}
    </select></label>`;
  return html`<section aria-labelledby="jobs-title">
    ${batch ? html`<h2 id="jobs-title">The jobs of its lines</h2>`
      : html`<h1 id="jobs-title">Jobs ${me.admin ? "(every owner)" : ""}</h1>`}
    <form class="filters" onSubmit=${(e) => e.preventDefault()}>
      ${select("status", STATUSES, "Status")} ${select("kind", KIND_NAMES, "Kind")}
      <label>Pipeline <input value=${filters.pipeline} onChange=${set("pipeline")} size="10" /></label>
      ${select("since", ["", "5", "60", "1440"], "Last minutes")}
    </form>
    ${page.error && html`<p class="error" role="alert">${page.error.message}</p>`}
    <table class="jobs">
      <thead><tr><th>Job</th><th>Kind</th><th>Pipeline</th><th>Status</th>
        ${me.admin && html`<th>Owner</th>`}<th>Created</th><th>Queue wait</th><th>Total</th></tr></thead>
      <tbody>
        ${page.rows.map((job) => html`<tr>
          <td><a href=${`#/jobs/${job.id}`}>${job.id}</a></td><td>${job.kind}</td><td>${job.model}</td>
          <td><${StatusBadge} status=${job.status} /></td>${me.admin && html`<td>${job.owner}</td>`}
          <td>${new Date(job.created_at).toLocaleTimeString()}</td>
          <td>${ms(job.timings.queue_wait_ms)}</td><td>${ms(job.timings.total_ms)}</td></tr>`)}
      </tbody>
    </table>
    ${!page.rows.length && !page.error && html`<p class="muted">No jobs match.</p>`}
    ${page.next && html`<button onClick=${more}>More</button>`}
  </section>`;
}

function summary(event) {
  const d = event.data || {};
  if (event.type === "status") return d.status + (d.worker ? ` on ${d.worker}` : "") + (d.loading ? ` (loading ${d.loading})` : "");
  if (event.type === "progress") return `step ${d.step} of ${d.total}${d.text ? `: ${d.text}` : ""}`;
  if (event.type === "partial") {
    if (d.segment) return `segment: ${d.segment.text}`;
    if (d.audio !== undefined) return `sentence ${d.sentence ?? d.seq}: ${d.text || ""} (${(d.samples / d.sample_rate).toFixed(1)} s)`;
    if (d.text !== undefined) return `text: ${d.text}`;
  }
  if (event.type === "error") return d.message || JSON.stringify(d);
  const text = JSON.stringify(d);
  return text.length > 160 ? `${text.slice(0, 160)}…` : text;
}

function Timeline({ job, events }) {
  if (!events.length) return null;
  const start = events[0].ts;
  const firstOutput = events.find((e) => e.type === "partial" || e.type === "progress");
  return html`<ol class="timeline">
    ${events.map((e) => html`<li class=${e.type}>
      <time>+${ms((e.ts - start) * 1000)}</time> <span class="etype">${e.type}</span>
      ${e === firstOutput ? html` <em>first output</em>` : ""} ${summary(e)}</li>`)}
  </ol>`;
}

export function JobPage({ jobId }) {
  const [job, setJob] = useState(null);
  const [events, setEvents] = useState([]);
  const [deliveries, setDeliveries] = useState([]);
  const [error, setError] = useState(null);
  const [note, setNote] = useState(null);
  const seen = useRef(new Set());
  const load = () =>
    api(`/v1/jobs/${encodeURIComponent(jobId)}`)
      .then(setJob)
      .catch(setError);
  useEffect(() => {
    setJob(null);
    setEvents([]);
    setError(null);
    seen.current = new Set();
    load();
    const abort = new AbortController();
    followJob(
      jobId,
      (event) => {
        if (seen.current.has(event.id)) return;
        seen.current.add(event.id);
        setEvents((list) => [...list, event]);
        if (event.type === "status") load();
        if (event.type === "status" && TERMINAL.has(event.data.status))
          api(`/v1/jobs/${encodeURIComponent(jobId)}/deliveries`).then((d) => setDeliveries(d.data || d)).catch(() => {});
      },
      abort.signal,
    ).catch((e) => !abort.signal.aborted && setError(e));
    return () => abort.abort();
  }, [jobId]);
  if (error && !job) return html`<p class="error" role="alert">${error.message}</p>`;
  if (!job) return html`<p class="muted">Loading ${jobId}…</p>`;
  const ended = TERMINAL.has(job.status);
  const cancel = async () => {
    try {
      await api(`/v1/jobs/${encodeURIComponent(job.id)}/cancel`, { method: "POST" });
      setNote("cancel asked");
    } catch (e) {
      setNote(e.message);
    }
  };
  const retry = async () => {
    try {
      const again = await api(`/v1/jobs/${encodeURIComponent(job.id)}/retry`, { method: "POST" });
      location.hash = `#/jobs/${again.id}`;
    } catch (e) {
      setNote(e.message);
    }
  };
  const t = job.timings || {};
  return html`<section aria-labelledby="job-title">
    <h1 id="job-title">${job.id} <${StatusBadge} status=${job.status} /></h1>
    <p class="facts">${job.kind} / ${job.model} · owner ${job.owner} · attempt ${job.attempts}
      ${job.worker && html` · worker <code>${job.worker}</code>`}</p>
    ${job.batch && html`<p class="facts batch">ran in batch ${job.batch.id} of ${job.batch.size}:
      ${job.batch.job_ids.map((id) => html` <a href=${`#/jobs/${id}`}>${id === job.id ? "this job" : id}</a>`)}</p>`}
    <p class="actions">
      <button onClick=${cancel} disabled=${ended}>Cancel</button>
      <button onClick=${retry} disabled=${!ended}>Retry</button>
      ${note && html`<span role="status">${note}</span>`}
    </p>
    <dl class="timings">
      <dt>queue wait</dt><dd>${ms(t.queue_wait_ms)}</dd>
      <dt>first output</dt><dd>${ms(t.time_to_first_output_ms)}</dd>
      <dt>run</dt><dd>${ms(t.run_ms)}</dd><dt>total</dt><dd>${ms(t.total_ms)}</dd>
    </dl>
    ${job.error && html`<p class="error" role="alert">${job.error.type}: ${job.error.message}</p>`}
    <h2>Output</h2>
    <${Output} kind=${job.kind} output=${job.output} events=${events} />
    <h2>Timeline</h2>
    <${Timeline} job=${job} events=${events} />
    <h2>Input</h2>
    <pre class="json">${JSON.stringify(job.input, null, 2)}</pre>
    <h2>Webhook deliveries</h2>
    ${deliveries.length
      ? html`<table><thead><tr><th>Event</th><th>Attempt</th><th>Status</th><th>At</th></tr></thead><tbody>
        ${deliveries.map((d) => html`<tr><td>${d.event_type}</td><td>${d.attempt}</td>
          <td>${d.status_code ?? d.error ?? ""}</td><td>${when(d.ts)}</td></tr>`)}</tbody></table>`
      : html`<p class="muted">none</p>`}
  </section>`;
}
