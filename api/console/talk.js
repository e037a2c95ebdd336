// Talk: a spoken conversation over the Realtime API (`/v1/realtime`, OpenAI's GA events).
// The microphone streams to the server as pcm16 at 24 kHz; the server's VAD ends each
// turn, ASR -> LLM -> TTS answer it, and the answer's audio plays as it streams, cut
// short when the user talks over it. The key never goes into the websocket: the page
// trades it for a short-lived client secret (POST /v1/realtime/client_secrets) and offers
// that as a subprotocol, as OpenAI's browser clients do.
import { html, useEffect, useRef, useState } from "./vendor/preact-htm.mjs";
import { api } from "./lib.js";

export const TALK_KINDS = ["asr", "llm", "tts"];
const RATE = 24000;
const CHUNK_MS = 40;
const LEAD_S = 0.05; // the first chunk of an answer starts this far ahead: no click

function toBase64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function pcm16ToFloat(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const samples = new Float32Array(bytes.length >> 1);
  for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(i * 2, true) / 0x8000;
  return samples;
}

// The answer's audio, gap-free: each chunk is queued right after the one before it.
class Player {
  constructor(context, onPlayed) {
    Object.assign(this, { context, onPlayed, nextTime: 0, sources: new Set() });
  }

  play(base64) {
    const samples = pcm16ToFloat(base64);
    if (!samples.length) return;
    const buffer = this.context.createBuffer(1, samples.length, RATE);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const startAt = Math.max(this.nextTime, this.context.currentTime + LEAD_S);
    source.onended = () => {
      this.sources.delete(source);
      this.onPlayed(Math.min(buffer.duration, Math.max(0, this.context.currentTime - startAt)));
    };
    source.start(startAt);
    this.nextTime = startAt + buffer.duration;
    this.sources.add(source);
  }

  // Everything scheduled stops now; returns whether anything was playing or queued.
  stop() {
    const cut = this.sources.size > 0;
    for (const source of this.sources) source.stop();
    this.sources.clear();
    this.nextTime = 0;
    return cut;
  }
}

// The microphone, as pcm16 chunks of CHUNK_MS (the context runs at RATE: it resamples).
async function openMicrophone(context, onChunk) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  await context.audioWorklet.addModule(new URL("./talk-worklet.js", import.meta.url));
  const tap = new AudioWorkletNode(context, "pcm16-chunks", {
    processorOptions: { samples: (RATE * CHUNK_MS) / 1000 },
  });
  tap.port.onmessage = (e) => onChunk(new Uint8Array(e.data));
  const microphone = context.createMediaStreamSource(stream);
  microphone.connect(tap);
  tap.connect(context.destination); // it outputs silence; connected, the graph pulls it
  return () => {
    stream.getTracks().forEach((t) => t.stop());
    microphone.disconnect();
    tap.disconnect();
  };
}

function sessionConfig({ instructions, voice, maxTokens }) {
  const pcm = { type: "audio/pcm", rate: RATE };
  return {
    type: "realtime",
    instructions,
    ...(maxTokens ? { max_output_tokens: Number(maxTokens) } : {}),
    audio: {
      input: { format: pcm, turn_detection: { type: "server_vad" }, transcription: { model: "whisper-1" } },
      output: { format: pcm, ...(voice ? { voice } : {}) },
    },
  };
}

// Opens a conversation; returns its stop(). `on`: event(server event), played(seconds),
// cut() (the user spoke over the answer: it stopped), close(CloseEvent).
async function converse({ model, ...settings }, on) {
  const session = { ...sessionConfig(settings), model };
  const secret = await api("/v1/realtime/client_secrets", { method: "POST", body: { session } });
  const context = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
  const player = new Player(context, on.played);
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/v1/realtime?model=${encodeURIComponent(model)}`;
  const socket = new WebSocket(url, ["realtime", `openai-insecure-api-key.${secret.value}`]);
  let closeMicrophone = () => {};
  const stop = () => {
    closeMicrophone();
    player.stop();
    if (socket.readyState <= WebSocket.OPEN) socket.close(1000);
    if (context.state !== "closed") context.close();
  };
  socket.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "response.output_audio.delta") {
      player.play(event.delta);
      console.debug(`realtime audio: ${event.response_id} ${event.delta.length} base64 characters`);
    } else console.debug(`realtime event: ${JSON.stringify(event).slice(0, 400)}`);
    if (event.type === "input_audio_buffer.speech_started" && player.stop()) on.cut(); // barge-in
    on.event(event);
  };
  socket.onclose = (e) => {
    stop();
    console.debug(`realtime closed: ${e.code} ${e.reason}`);
    on.close(e);
  };
  try {
    await new Promise((opened, failed) => {
      socket.onopen = opened;
      socket.onerror = () => failed(new Error("The realtime websocket did not open."));
    });
    socket.send(JSON.stringify({ type: "session.update", session: sessionConfig(settings) }));
    const append = (pcm) => {
      if (socket.readyState === WebSocket.OPEN)
        socket.send(JSON.stringify({ type: "input_audio_buffer.append", audio: toBase64(pcm) }));
    };
    closeMicrophone = await openMicrophone(context, append);
  } catch (error) {
    stop();
    throw error;
  }
  return stop;
}

// -- what the page shows: a reducer over the server's events --------------------------

const IDLE = { status: "idle", turns: [], errors: [], audioChunks: 0, playedSeconds: 0, cuts: 0 };

function withTurn(turns, key, role, update) {
  const i = turns.findIndex((t) => t.key === key);
  const turn = update(i < 0 ? { key, role, text: "", done: false } : turns[i]);
  return i < 0 ? [...turns, turn] : turns.map((t, j) => (j === i ? turn : t));
}

function reduce(s, e) {
  const user = (update) => ({ ...s, turns: withTurn(s.turns, `user:${e.item_id}`, "user", update) });
  const answer = (id, update) => ({ ...s, turns: withTurn(s.turns, `assistant:${id}`, "assistant", update) });
  switch (e.type) {
    case "session.created":
    case "session.updated":
      return s.status === "connecting" ? { ...s, status: "listening" } : s;
    case "input_audio_buffer.speech_started":
      return { ...user((t) => t), status: "speaking detected" };
    case "input_audio_buffer.speech_stopped":
      return { ...s, status: "answering" };
    case "conversation.item.input_audio_transcription.delta":
      return user((t) => ({ ...t, text: t.text + (e.delta || "") }));
    case "conversation.item.input_audio_transcription.completed":
      return user((t) => ({ ...t, text: e.transcript, done: true }));
    case "conversation.item.input_audio_transcription.failed": {
      const failed = user((t) => ({ ...t, done: true, text: t.text || "(not transcribed)" }));
      return { ...failed, status: "listening", errors: [...s.errors, `Transcription failed: ${e.error.message}`] };
    }
    case "response.created":
      return { ...answer(e.response.id, (t) => t), status: "answering" };
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      return answer(e.response_id, (t) => ({ ...t, text: t.text + e.delta, deltas: (t.deltas || 0) + 1 }));
    case "response.output_audio.delta":
      return { ...s, audioChunks: s.audioChunks + 1 };
    case "response.done": {
      const { id, status, status_details: details } = e.response;
      const next = { ...answer(id, (t) => ({ ...t, done: true, cut: status === "cancelled" })), status: "listening" };
      return status === "failed" ? { ...next, errors: [...s.errors, `The answer failed: ${details?.error?.message || status}`] } : next;
    }
    case "error":
      return { ...s, errors: [...s.errors, e.error.message] };
    default:
      return s;
  }
}

function Turn({ turn }) {
  const who = turn.role === "user" ? "you" : "assistant";
  return html`<li class=${`msg ${turn.role}${turn.done ? "" : " streaming"}`} data-testid="talk-turn"
      data-role=${turn.role} data-key=${turn.key} data-deltas=${turn.deltas || 0}>
    <strong>${who}${turn.cut ? " (interrupted)" : ""}</strong>
    <span class="text" data-testid="talk-text">${turn.text}</span>${!turn.done && html`<span class="cursor">▍</span>`}
  </li>`;
}

function useList(path, keep) {
  const [items, setItems] = useState([]);
  useEffect(() => {
    api(path).then((list) => setItems(list.data.filter(keep))).catch(() => {});
  }, []);
  return items;
}

const closedCleanly = (e) => e.code === 1000 || e.code === 1005;

// One conversation at a time: [state, start(options), stop()].
function useConversation() {
  const [state, setState] = useState(IDLE);
  const stopRef = useRef(null);
  useEffect(() => () => stopRef.current && stopRef.current(), []);
  const failed = (message) => setState((s) => ({ ...s, status: "closed", errors: [...s.errors, message] }));
  const on = {
    event: (e) => setState((s) => reduce(s, e)),
    played: (seconds) => setState((s) => ({ ...s, playedSeconds: s.playedSeconds + seconds })),
    cut: () => setState((s) => ({ ...s, cuts: s.cuts + 1 })),
    close: (e) => {
      stopRef.current = null;
      if (closedCleanly(e)) setState((s) => ({ ...s, status: "closed" }));
      else failed(`The connection closed: ${e.code} ${e.reason}`.trim());
    },
  };
  const start = async (options) => {
    setState({ ...IDLE, status: "connecting" });
    try {
      stopRef.current = await converse(options, on);
      setState((s) => (s.status === "connecting" ? { ...s, status: "listening" } : s));
    } catch (error) {
      failed(error.message);
    }
  };
  return [state, start, () => stopRef.current && stopRef.current()];
}

function Settings({ form, setForm, disabled }) {
  // One choice per LLM pipeline, named by its model (its aliases and adapters aside).
  const models = useList("/v1/models", (m) => m.kind === "llm" && m.id === m.pipeline);
  const voices = useList("/v1/audio/voices", () => true);
  useEffect(() => {
    if (!form.model && models.length) setForm((f) => ({ ...f, model: models[0].id }));
  }, [models]);
  const field = (name) => (e) => setForm((f) => ({ ...f, [name]: e.target.value }));
  return html`<label>Model <select name="model" value=${form.model} onChange=${field("model")} disabled=${disabled}>
      ${models.map((m) => html`<option value=${m.id}>${m.model ? `${m.model} (${m.id})` : m.id}</option>`)}
    </select></label>
    <label>Voice <select name="voice" value=${form.voice} onChange=${field("voice")} disabled=${disabled}>
      <option value="">the default${voices.filter((v) => v.default).map((v) => `: ${v.id}`).join("")}</option>
      ${voices.map((v) => html`<option value=${v.id}>${v.id}</option>`)}
    </select></label>
    <label>Max output tokens <input type="number" name="max_output_tokens" min="1" placeholder="the server's"
      value=${form.maxTokens} onInput=${field("maxTokens")} disabled=${disabled} /></label>
    <label>Instructions <textarea name="instructions" rows="2" value=${form.instructions}
      onInput=${field("instructions")} disabled=${disabled} /></label>`;
}

function Played({ state }) {
  const cuts = state.cuts ? `; you spoke over it ${state.cuts} times, and it stopped` : "";
  return html`<p class="muted" data-testid="talk-played" data-chunks=${state.audioChunks}
      data-seconds=${state.playedSeconds.toFixed(2)}>
    Answer audio: ${state.audioChunks} chunks received, ${state.playedSeconds.toFixed(1)} s played${cuts}.</p>`;
}

export function Talk({ served }) {
  const [form, setForm] = useState({ model: "", voice: "", maxTokens: "", instructions: "You are a helpful voice assistant. Answer in one or two short sentences." });
  const [state, start, stop] = useConversation();
  const missing = TALK_KINDS.filter((kind) => served && !served.has(kind));
  if (missing.length) {
    return html`<p class="error" role="alert">Talk needs the kinds asr, llm and tts; no pipeline serves ${missing.join(", ")} here: enable one in the config (see docs/configuration/index.md).</p>`;
  }
  const live = !["idle", "closed"].includes(state.status);
  const toggle = (e) => {
    e.preventDefault();
    if (live) stop();
    else start(form);
  };
  return html`<section aria-labelledby="talk-title" class="talk">
    <h1 id="talk-title">Talk</h1>
    <form onSubmit=${toggle}>
      <${Settings} form=${form} setForm=${setForm} disabled=${live} />
      <div class="actions"><button type="submit" data-testid="talk-toggle" disabled=${state.status === "connecting"}>${live ? "Stop" : "Start"}</button></div>
    </form>
    <p role="status" data-testid="talk-status">${state.status}</p>
    ${state.errors.map((message) => html`<p class="error" role="alert" data-testid="talk-error">${message}</p>`)}
    <ol class="chat talk-turns" data-testid="talk-turns">${state.turns.map((turn) => html`<${Turn} key=${turn.key} turn=${turn} />`)}</ol>
    <${Played} state=${state} />
  </section>`;
}
