// The console's talk with the API: the key (this browser session only), JSON calls
// with the API's own error messages, and Server-Sent Events read with fetch (so the
// key goes in a header, as everywhere else).
import { useEffect, useState } from "./vendor/preact-htm.mjs";

const KEY = "mmq-console-key";

export const session = {
  key: () => sessionStorage.getItem(KEY) || "",
  setKey: (key) => (key ? sessionStorage.setItem(KEY, key) : sessionStorage.removeItem(KEY)),
};

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

function headers(extra = {}) {
  const key = session.key();
  return key ? { Authorization: `Bearer ${key}`, ...extra } : extra;
}

async function failure(response, quiet = false) {
  let message = `${response.status} ${response.statusText}`;
  let param = null;
  try {
    const body = await response.json();
    const error = body.error || body.detail || body;
    message = error.message || (typeof error === "string" ? error : JSON.stringify(error));
    param = error.param || null;
  } catch (_) {
    /* not JSON: keep the status line */
  }
  const error = new ApiError(response.status, message, param);
  if (response.status === 401 && !quiet) window.dispatchEvent(new CustomEvent("mmq-unauthorized", { detail: message }));
  return error;
}

// `quiet`: a 401 is this call's own business (the sign-in check), not a signal for the
// whole console to ask for a key again.
export async function api(path, { method = "GET", body, form, signal, quiet = false } = {}) {
  const init = { method, headers: headers(), signal };
  if (form) init.body = form;
  else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = headers({ "Content-Type": "application/json" });
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response, quiet);
  return response.status === 204 ? null : response.json();
}

// A file the API serves behind the key, saved by the browser as `name`.
export async function download(path, name) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await failure(response);
  const url = URL.createObjectURL(await response.blob());
  const link = Object.assign(document.createElement("a"), { href: url, download: name });
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// Each message of an SSE response: {id, event, data} (data parsed as JSON where it is).
export async function* sse(path, signal) {
  const response = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const message = { id: null, event: "message", data: [] };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "data") message.data.push(text);
        else if (field === "event") message.event = text;
        else if (field === "id") message.id = text;
      }
      if (!message.data.length) continue;
      const raw = message.data.join("\n");
      try {
        message.data = JSON.parse(raw);
      } catch (_) {
        message.data = raw;
      }
      yield message;
    }
  }
}

// Follows a stream while the component is mounted: onMessage for each message; returns
// the error that ended it, if one did.
export function useStream(path, onMessage, deps) {
  const [error, setError] = useState(null);
  useEffect(() => {
    if (!path) return undefined;
    const abort = new AbortController();
    setError(null);
    (async () => {
      try {
        for await (const message of sse(path, abort.signal)) onMessage(message);
      } catch (e) {
        if (!abort.signal.aborted) setError(e);
      }
    })();
    return () => abort.abort();
  }, deps);
  return error;
}

// A job's events, live: submit-and-follow for the playgrounds and the job page.
export function followJob(jobId, onEvent, signal) {
  return (async () => {
    for await (const message of sse(`/v1/jobs/${encodeURIComponent(jobId)}/events`, signal)) {
      if (message.data && typeof message.data === "object") onEvent(message.data);
    }
  })();
}

export async function submit(kind, input, extra = {}) {
  return api("/v1/jobs", { method: "POST", body: { kind, input, ...extra } });
}

export async function upload(file) {
  const form = new FormData();
  form.append("file", file, file.name || "upload.bin");
  return api("/v1/files", { method: "POST", form });
}

export const TERMINAL = new Set(["succeeded", "failed", "canceled", "expired"]);

export function ago(seconds) {
  if (seconds == null) return "";
  const s = Math.max(0, seconds);
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function ms(value) {
  if (value == null) return "–";
  return value < 1000 ? `${Math.round(value)} ms` : `${(value / 1000).toFixed(2)} s`;
}

export function when(ts) {
  return ts ? new Date(ts * 1000).toLocaleTimeString() : "";
}

// PCM16 little-endian mono (base64) -> a WAV Blob the <audio> element plays.
export function wavBlob(base64Pcm, sampleRate) {
  const pcm = Uint8Array.from(atob(base64Pcm), (c) => c.charCodeAt(0));
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, s) => [...s].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
  text(0, "RIFF");
  header.setUint32(4, 36 + pcm.length, true);
  text(8, "WAVE");
  text(12, "fmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true);
  header.setUint16(22, 1, true);
  header.setUint32(24, sampleRate, true);
  header.setUint32(28, sampleRate * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  text(36, "data");
  header.setUint32(40, pcm.length, true);
  return new Blob([header, pcm], { type: "audio/wav" });
}
