// Playgrounds: each sends an ordinary job (it shows in the jobs list) and follows it live.
import { html, useEffect, useRef, useState } from "./vendor/preact-htm.mjs";
import { api, followJob, submit, TERMINAL, upload } from "./lib.js";
import { Output } from "./output.js";
import { StatusBadge } from "./jobs.js";

export const KINDS = [
  { kind: "asr", title: "Transcribe" },
  { kind: "tts", title: "Speak" },
  { kind: "image", title: "Draw" },
  { kind: "llm", title: "Chat" },
  { kind: "embed", title: "Embed" },
];

// An error as the API words it: its message names the field already, else the field first.
function named(error) {
  const { param, message } = error;
  return param && !message.startsWith(`${param}: `) ? `${param}: ${message}` : message;
}

// Submit a job and follow its events: {job, events, status, error, run(kind, input)}.
function useJobRun() {
  const [state, setState] = useState({ job: null, events: [], status: null, output: null, error: null });
  const abort = useRef(null);
  useEffect(() => () => abort.current && abort.current.abort(), []);
  const run = async (kind, input, makeInput) => {
    if (abort.current) abort.current.abort();
    abort.current = new AbortController();
    const signal = abort.current.signal;
    setState({ job: null, events: [], status: "submitting", output: null, error: null });
    try {
      const job = await submit(kind, makeInput ? await makeInput() : input);
      setState((s) => ({ ...s, job, status: job.status }));
      await followJob(
        job.id,
        (event) => {
          setState((s) => ({
            ...s,
            events: [...s.events, event],
            status: event.type === "status" ? event.data.status : s.status,
            error: event.type === "error" ? event.data : s.error,
          }));
          if (event.type === "status" && TERMINAL.has(event.data.status))
            api(`/v1/jobs/${job.id}`).then((done) => setState((s) => ({ ...s, output: done.output, error: done.error || s.error })));
        },
        signal,
      );
    } catch (error) {
      if (!signal.aborted) setState((s) => ({ ...s, status: "error", error }));
    }
  };
  return [state, run];
}

function RunView({ kind, state, autoplay }) {
  if (!state.status) return null;
  return html`<div class="run">
    <p role="status">${state.job ? html`<a href=${`#/jobs/${state.job.id}`}>${state.job.id}</a> ` : ""}
      <${StatusBadge} status=${state.status} /></p>
    ${state.error && html`<p class="error" role="alert">${named(state.error)}</p>`}
    <${Output} kind=${kind} output=${state.output} events=${state.events} autoplay=${autoplay} />
  </div>`;
}

function Recorder({ onAudio }) {
  const [recording, setRecording] = useState(null);
  const [error, setError] = useState(null);
  const start = async () => {
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      const recorder = new MediaRecorder(stream);
      const parts = [];
      recorder.ondataavailable = (e) => parts.push(e.data);
      recorder.onstop = () => {
        stream.getTracks().forEach((t) => t.stop());
        const type = recorder.mimeType || "audio/webm";
        onAudio(new File(parts, `microphone.${type.includes("ogg") ? "ogg" : "webm"}`, { type }));
      };
      recorder.start();
      setRecording(recorder);
    } catch (e) {
      setError(e.message);
    }
  };
  const stop = () => {
    recording.stop();
    setRecording(null);
  };
  return html`<span>${recording
    ? html`<button type="button" onClick=${stop}>Stop and transcribe</button>`
    : html`<button type="button" onClick=${start}>Record from the microphone</button>`}
    ${error && html` <span class="error">${error}</span>`}</span>`;
}

function Asr() {
  const [state, run] = useJobRun();
  const [file, setFile] = useState(null);
  const go = (audio) => run("asr", null, async () => ({ audio: (await upload(audio)).key }));
  return html`<form onSubmit=${(e) => { e.preventDefault(); if (file) go(file); }}>
      <label>Audio file <input type="file" accept="audio/*,video/*" name="audio"
        onChange=${(e) => setFile(e.target.files[0])} /></label>
      <button type="submit" disabled=${!file}>Transcribe</button> <${Recorder} onAudio=${go} />
    </form>
    <${RunView} kind="asr" state=${state} />`;
}

function Tts() {
  const [state, run] = useJobRun();
  const [text, setText] = useState("Hello from mmq. Each sentence plays as soon as it is ready. This is the third one.");
  const [voice, setVoice] = useState("");
  const [voices, setVoices] = useState([]);
  useEffect(() => { api("/v1/audio/voices").then((list) => setVoices(list.data)).catch(() => {}); }, []);
  const input = () => {  // voice: "PIPELINE/NAME", or "" for the first pipeline's default
    const cut = voice.indexOf("/");
    return { text, ...(voice ? { model: voice.slice(0, cut), voice: voice.slice(cut + 1) } : {}) };
  };
  const named = (v) => (v.aliases.length ? `${v.id} (${v.aliases.join(", ")})` : v.id);
  return html`<form onSubmit=${(e) => { e.preventDefault(); run("tts", input()); }}>
      <label>Text <textarea name="text" rows="4" value=${text} onInput=${(e) => setText(e.target.value)} /></label>
      <label>Voice <select name="voice" value=${voice} onChange=${(e) => setVoice(e.target.value)}>
        <option value="">the default${voices.filter((v) => v.default).map((v) => `: ${v.id}`).join("")}</option>
        ${voices.map((v) => html`<option value=${`${v.pipeline}/${v.id}`}>${named(v)}</option>`)}
      </select></label>
      <button type="submit">Speak</button>
    </form>
    <${RunView} kind="tts" state=${state} autoplay=${true} />`;
}

function Image() {
  const [state, run] = useJobRun();
  const [form, setForm] = useState({ prompt: "a lighthouse on a cliff at dusk", steps: 20, width: 512, height: 512, seed: 7, guidance_scale: 7.5 });
  const field = (name, type = "number", extra = {}) => html`<label>${name.replace("_", " ")} <input name=${name} type=${type}
    value=${form[name]} ...${extra}
    onInput=${(e) => setForm({ ...form, [name]: type === "number" ? Number(e.target.value) : e.target.value })} /></label>`;
  return html`<form onSubmit=${(e) => { e.preventDefault(); run("image", form); }}>
      ${field("prompt", "text", { size: 50 })} ${field("steps", "number", { min: 1 })}
      ${field("width", "number", { min: 8, step: 8 })} ${field("height", "number", { min: 8, step: 8 })}
      ${field("seed", "number", { min: 0 })} ${field("guidance_scale", "number", { min: 0, step: "any" })}
      <button type="submit">Draw</button>
    </form>
    <${RunView} kind="image" state=${state} />`;
}

function Chat() {
  const [state, run] = useJobRun();
  const [messages, setMessages] = useState([]);
  const [draft, setDraft] = useState("");
  const [maxTokens, setMaxTokens] = useState(128);
  useEffect(() => {
    if (state.output && state.output.text !== undefined)
      setMessages((m) => (m.at(-1)?.role === "assistant" ? m : [...m, { role: "assistant", content: state.output.text }]));
  }, [state.output]);
  const send = (e) => {
    e.preventDefault();
    if (!draft.trim()) return;
    const next = [...messages, { role: "user", content: draft }];
    setMessages(next);
    setDraft("");
    run("llm", { messages: next, max_tokens: maxTokens });
  };
  const streaming = state.status && !state.output;
  return html`<div class="chat">
      ${messages.map((m) => html`<p class=${`msg ${m.role}`}><strong>${m.role}</strong> ${m.content}</p>`)}
      ${streaming && html`<div class="msg assistant streaming"><strong>assistant</strong>
        <${RunView} kind="llm" state=${state} /></div>`}
    </div>
    <form onSubmit=${send}>
      <label>Message <textarea name="message" rows="2" value=${draft} onInput=${(e) => setDraft(e.target.value)} /></label>
      <label>Max tokens <input type="number" name="max_tokens" value=${maxTokens} onInput=${(e) => setMaxTokens(Number(e.target.value))} /></label>
      <button type="submit">Send</button>
    </form>`;
}

function Embed() {
  const [state, run] = useJobRun();
  const [text, setText] = useState("The cat sat on the mat.\nA kitten rests on a rug.\nStock prices fell sharply today.");
  const texts = () => text.split("\n").map((t) => t.trim()).filter(Boolean);
  return html`<form onSubmit=${(e) => { e.preventDefault(); run("embed", { input: texts() }); }}>
      <label>Texts, one a line <textarea name="input" rows="4" value=${text} onInput=${(e) => setText(e.target.value)} /></label>
      <button type="submit">Embed</button>
    </form>
    <${RunView} kind="embed" state=${state} />`;
}

const PAGES = { asr: Asr, tts: Tts, image: Image, llm: Chat, embed: Embed };

export function Playground({ kind, served }) {
  const Page = PAGES[kind];
  const title = KINDS.find((k) => k.kind === kind);
  if (!Page) return html`<p class="error" role="alert">No playground for ${kind}.</p>`;
  if (served && !served.has(kind)) {
    return html`<p class="error" role="alert">No pipeline serves kind ${kind} here: enable one in the config (see docs/configuration/index.md).</p>`;
  }
  return html`<section aria-labelledby="play-title" class="play">
    <h1 id="play-title">${title.title} (${kind})</h1><${Page} /></section>`;
}
