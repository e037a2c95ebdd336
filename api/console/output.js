// A job's output for its kind, from its events while it runs and its output once it ends:
// ASR text growing segment by segment, TTS audio playing from the first sentence, image
// step previews then the images, LLM text as it streams.
import { html, useEffect, useMemo, useRef } from "./vendor/preact-htm.mjs";
import { wavBlob } from "./lib.js";

function partials(events) {
  return events.filter((e) => e.type === "partial").map((e) => e.data);
}

function Transcript({ output, events }) {
  const segments = output ? output.segments || [] : partials(events).map((d) => d.segment).filter(Boolean);
  return html`<div class="transcript" aria-live="polite">
    ${segments.map((s) => html`<p><time>${s.start.toFixed(1)}–${s.end.toFixed(1)} s</time> ${s.text}</p>`)}
    ${output && html`<p class="final"><strong>Transcript:</strong> ${output.text}</p>`}
  </div>`;
}

// One <audio> per sentence, each played when the one before ends: the first sentence
// plays while the rest are synthesized.
function Speech({ output, events, autoplay }) {
  const chunks = partials(events).filter((d) => d.audio && d.samples > 0);
  const urls = useMemo(() => new Map(), []);
  const url = (d) => {
    if (!urls.has(d.seq)) urls.set(d.seq, URL.createObjectURL(wavBlob(d.audio, d.sample_rate)));
    return urls.get(d.seq);
  };
  const list = useRef(null);
  const next = useRef(0);
  const playing = useRef(false);
  const playNext = () => {
    const players = list.current ? list.current.querySelectorAll("audio.sentence") : [];
    if (playing.current || next.current >= players.length) return;
    playing.current = true;
    const player = players[next.current++];
    player.onended = () => {
      playing.current = false;
      playNext();
    };
    player.play().catch(() => {
      playing.current = false;
    });
  };
  useEffect(() => {
    if (autoplay) playNext();
  }, [chunks.length]);
  useEffect(() => () => urls.forEach((u) => URL.revokeObjectURL(u)), []);
  return html`<div class="speech">
    <ol ref=${list} class="sentences">
      ${chunks.map((d) => html`<li><audio class="sentence" controls preload="auto" src=${url(d)}></audio>
        <span>${d.text || `sentence ${d.sentence ?? d.seq}`} (${(d.samples / d.sample_rate).toFixed(1)} s)</span></li>`)}
    </ol>
    ${output && output.audio && html`<p>Whole file: <audio class="whole" controls src=${output.audio.url}></audio>
      <a href=${output.audio.url} download>download</a></p>`}
  </div>`;
}

function Images({ output, events }) {
  const steps = events.filter((e) => e.type === "progress").map((e) => e.data);
  const last = steps[steps.length - 1];
  const previews = steps.filter((d) => d.preview);
  const preview = previews[previews.length - 1];
  return html`<div class="images">
    ${last && html`<p><label>Step ${last.step} of ${last.total}
      <progress class="steps" max=${last.total} value=${last.step}></progress></label></p>`}
    ${!output && preview && html`<img class="preview" alt=${`preview at step ${preview.step}`} src=${preview.preview} />`}
    ${output && (output.images || []).map((image, i) => html`<figure>
      <img class="result" alt=${`image ${i + 1}, seed ${image.seed}`}
        src=${image.url || `data:image/${output.format || "png"};base64,${image.b64_json}`} />
      <figcaption>seed ${image.seed}</figcaption></figure>`)}
  </div>`;
}

function Text({ output, events }) {
  const text = output ? output.text : partials(events).map((d) => d.text || "").join("");
  return html`<div class="llm-text" aria-live="polite">${text}${!output && html`<span class="cursor">▍</span>`}</div>`;
}

// Each text's vector (base64 of little-endian float32): its first values, and how alike
// the texts are (cosine similarity), which shows at a glance that the model reads them.
function vector(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new Float32Array(bytes.buffer);
}

function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return dot / (Math.sqrt(na * nb) || 1);
}

function Vectors({ output }) {
  if (!output) return null;
  const vectors = output.embeddings.map(vector);
  const head = (v) => Array.from(v.slice(0, 4), (x) => x.toFixed(3)).join(", ");
  return html`<div class="vectors">
    <p>${vectors.length} vectors of ${output.dimensions} dimensions</p>
    <table class="similarity"><caption>Cosine similarity</caption>
      <thead><tr><th></th>${vectors.map((_, j) => html`<th class="num">${j + 1}</th>`)}</tr></thead>
      <tbody>${vectors.map((a, i) => html`<tr><th>${i + 1} <span class="muted">[${head(a)}, …]</span></th>
        ${vectors.map((b) => html`<td class="num">${cosine(a, b).toFixed(2)}</td>`)}</tr>`)}</tbody>
    </table>
  </div>`;
}

const VIEWS = { asr: Transcript, tts: Speech, image: Images, llm: Text, embed: Vectors };

export function Output({ kind, output, events, autoplay = false }) {
  const View = VIEWS[kind];
  if (!View) return output ? html`<pre class="json">${JSON.stringify(output, null, 2)}</pre>` : null;
  return html`<${View} output=${output} events=${events} autoplay=${autoplay} />`;
}
