// Batches: the key's batches with their counts, and one batch with its files and the
// jobs of its lines (the jobs list, filtered by the batch).
import { html, useEffect, useState } from "./vendor/preact-htm.mjs";
import { api, download } from "./lib.js";
import { JobList } from "./jobs.js";

const ENDED = new Set(["completed", "failed", "cancelled", "expired"]);

function Progress({ counts }) {
  const done = counts.completed + counts.failed;
  const pct = counts.total ? Math.round((100 * done) / counts.total) : 0;
  return html`<span class="bar" role="progressbar" aria-valuenow=${pct} aria-valuemin="0"
    aria-valuemax="100" title=${`${done} of ${counts.total}`}><span style=${`width:${pct}%`} /></span>`;
}

function usePolled(path, everyMs) {
  const [state, setState] = useState({ data: null, error: null });
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    api(path)
      .then((data) => live && setState({ data, error: null }))
      .catch((error) => live && setState({ data: null, error }));
    return () => {
      live = false;
    };
  }, [path, tick]);
  useEffect(() => {
    const timer = setInterval(() => setTick((n) => n + 1), everyMs);
    return () => clearInterval(timer);
  }, [path]);
  return state;
}

export function BatchList({ me }) {
  const { data, error } = usePolled("/v1/batches?limit=100", 3000);
  const owners = me && me.admin; // an admin's list holds every owner's batches
  return html`<section aria-labelledby="batches-title">
    <h1 id="batches-title">Batches</h1>
    ${error && html`<p class="error" role="alert">${error.message}</p>`}
    <table class="jobs">
      <thead><tr><th>Batch</th>${owners && html`<th>Owner</th>`}<th>Endpoint</th><th>Status</th><th>Lines</th>
        <th>Completed</th><th>Failed</th><th>Progress</th><th>Created</th></tr></thead>
      <tbody>
        ${(data?.data || []).map((b) => html`<tr>
          <td><a href=${`#/batches/${b.id}`}>${b.id}</a></td>${owners && html`<td>${b.owner}</td>`}<td>${b.endpoint}</td>
          <td><span class=${`badge ${b.status}`}>${b.status}</span></td>
          <td>${b.request_counts.total}</td><td>${b.request_counts.completed}</td>
          <td>${b.request_counts.failed}</td><td><${Progress} counts=${b.request_counts} /></td>
          <td>${new Date(b.created_at * 1000).toLocaleString()}</td></tr>`)}
      </tbody>
    </table>
    ${data && !data.data.length && html`<p class="muted">No batches yet: create one with <code>client.batches.create</code> (see docs/api/batches.md).</p>`}
  </section>`;
}

export function BatchPage({ me, batchId }) {
  const { data: b, error } = usePolled(`/v1/batches/${encodeURIComponent(batchId)}`, 2000);
  const [cancelError, setCancelError] = useState(null);
  if (error) return html`<p class="error" role="alert">${error.message}</p>`;
  if (!b) return html`<p class="muted">Loading…</p>`;
  const cancel = () => api(`/v1/batches/${b.id}/cancel`, { method: "POST" }).catch(setCancelError);
  const file = (id, label) =>
    id && html`<button onClick=${() => download(`/v1/files/${id}/content`, `${b.id}-${label}.jsonl`)}>
      ${label} file</button>`;
  return html`<section aria-labelledby="batch-title">
    <h1 id="batch-title">Batch ${b.id}</h1>
    <dl class="facts">
      <dt>Status</dt><dd><span class=${`badge ${b.status}`}>${b.status}</span></dd>
      <dt>Endpoint</dt><dd>${b.endpoint}</dd>
      <dt>Lines</dt><dd>${`${b.request_counts.total}: ${b.request_counts.completed} completed, ${b.request_counts.failed} failed`}
        <${Progress} counts=${b.request_counts} /></dd>
      <dt>Window</dt><dd>${b.completion_window}, ends ${new Date(b.expires_at * 1000).toLocaleString()}</dd>
      ${b.errors && html`<dt>Errors</dt><dd>${b.errors.data.map((e) => e.message).join("; ")}</dd>`}
    </dl>
    <p>${file(b.output_file_id, "output")} ${file(b.error_file_id, "error")}
      ${!ENDED.has(b.status) && b.status !== "cancelling" &&
        html`<button onClick=${cancel}>Cancel batch</button>`}</p>
    ${cancelError && html`<p class="error" role="alert">${cancelError.message}</p>`}
    <${JobList} me=${me} batch=${b.id} />
  </section>`;
}
