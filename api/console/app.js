// The console: a hash router over its pages, behind the API key (when the API asks
// for one). Every page talks to the public API only.
import { html, render, useEffect, useState } from "./vendor/preact-htm.mjs";
import { api, session } from "./lib.js";
import { Overview } from "./overview.js";
import { JobList, JobPage } from "./jobs.js";
import { BatchList, BatchPage } from "./batches.js";
import { Playground, KINDS } from "./play.js";
import { Talk, TALK_KINDS } from "./talk.js";

function useRoute() {
  const read = () => location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  const [route, setRoute] = useState(read());
  useEffect(() => {
    const on = () => setRoute(read());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return route;
}

// Who the key is: {owner, admin} from the API; an error (401) asks for a key again.
function useIdentity(attempt) {
  const [state, setState] = useState({ loading: true });
  useEffect(() => {
    let live = true;
    setState({ loading: true });
    api("/v1/whoami", { quiet: true })
      .then((me) => live && setState({ me }))
      .catch((error) => live && setState({ error }));
    return () => {
      live = false;
    };
  }, [attempt]);
  return state;
}

function KeyForm({ error, onKey }) {
  const [key, setKey] = useState("");
  const submit = (e) => {
    e.preventDefault();
    session.setKey(key.trim());
    onKey();
  };
  return html`<main class="login">
    <h1>mmq console</h1>
    <form onSubmit=${submit} aria-label="Sign in">
      <p>This API wants a key. It stays in this browser tab only.</p>
      <label>API key <input type="password" autocomplete="off" value=${key}
        onInput=${(e) => setKey(e.target.value)} autofocus required /></label>
      <button type="submit">Open</button>
      ${error && html`<p class="error" role="alert">${error.message}</p>`}
    </form>
  </main>`;
}

// The kinds some pipeline serves here (GET /v1/models): the playgrounds shown.
function useServedKinds(me) {
  const [kinds, setKinds] = useState(null);
  useEffect(() => {
    if (!me) return undefined;
    let live = true;
    api("/v1/models")
      .then((models) => live && setKinds(new Set(models.data.map((m) => m.kind))))
      .catch(() => live && setKinds(new Set()));
    return () => {
      live = false;
    };
  }, [me]);
  return kinds;
}

function Nav({ route, me, served, onSignOut }) {
  const here = route[0] || "overview";
  const link = (href, label, name) =>
    html`<a href=${href} aria-current=${here === name ? "page" : null}>${label}</a>`;
  return html`<header class="top">
    <strong class="brand">mmq</strong>
    <nav aria-label="Pages">
      ${me.admin && link("#/overview", "Overview", "overview")}
      ${link("#/jobs", "Jobs", "jobs")}
      ${link("#/batches", "Batches", "batches")}
      ${KINDS.filter((k) => served && served.has(k.kind)).map((k) => html`<a href=${`#/play/${k.kind}`}
        aria-current=${here === "play" && route[1] === k.kind ? "page" : null}>${k.title}</a>`)}
      ${served && TALK_KINDS.every((k) => served.has(k)) && link("#/talk", "Talk", "talk")}
    </nav>
    <span class="who">${me.owner}${me.admin ? " (admin)" : ""}
      ${session.key() && html` <button class="link" onClick=${onSignOut}>forget key</button>`}</span>
  </header>`;
}

function App() {
  const route = useRoute();
  const [attempt, setAttempt] = useState(0);
  const { loading, me, error } = useIdentity(attempt);
  const served = useServedKinds(me);
  useEffect(() => {
    const on = () => setAttempt((n) => n + 1);
    addEventListener("mmq-unauthorized", on);
    return () => removeEventListener("mmq-unauthorized", on);
  }, []);
  if (loading) return html`<main><p class="muted">Connecting…</p></main>`;
  if (error) {
    if (error.status === 401) return html`<${KeyForm} error=${session.key() ? error : null}
      onKey=${() => setAttempt((n) => n + 1)} />`;
    return html`<main><p class="error" role="alert">The API did not answer: ${error.message}</p></main>`;
  }
  const signOut = () => {
    session.setKey("");
    setAttempt((n) => n + 1);
  };
  let page;
  const [name, arg] = route;
  if (name === "jobs" && arg) page = html`<${JobPage} jobId=${decodeURIComponent(arg)} />`;
  else if (name === "jobs" || (!name && !me.admin)) page = html`<${JobList} me=${me} />`;
  else if (name === "batches" && arg) page = html`<${BatchPage} me=${me} batchId=${decodeURIComponent(arg)} />`;
  else if (name === "batches") page = html`<${BatchList} me=${me} />`;
  else if (name === "talk") page = html`<${Talk} served=${served} />`;
  else if (name === "play") page = html`<${Playground} kind=${arg || "tts"} served=${served} />`;
  else if (me.admin) page = html`<${Overview} />`;
  else page = html`<${JobList} me=${me} />`;
  return html`<${Nav} route=${route} me=${me} served=${served} onSignOut=${signOut} /><main>${page}</main>`;
}

render(html`<${App} />`, document.getElementById("app"));
