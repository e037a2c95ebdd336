"""`bench.voice`'s barge-in: a second question spoken during an answer, at its first audio
or as its second sentence is complete (so that a TTS job runs), timed from the moment its
speech starts being sent; the interrupted response's LLM and TTS jobs must end `canceled` (or
have ended before)."""

from __future__ import annotations

import datetime
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.voice_session import AUDIO_DELTA, TRAILING_S, Live, Utterance, ms, send_paced, show
from harness.api_client import new_owner
from harness.realtime import silence as silent
from realtime.sentences import Sentences
from tuning.deployment import Deployment

LONG_INSTRUCTIONS = "You are a voice assistant. Answer in five or six sentences."
BARGE_TOKENS = 200


@dataclass
class BargeIn:
    when: str
    """When the second question starts: at the answer's `first audio`, or as its `second
    sentence` is complete (and its TTS job starts)."""
    outcome: str = ""
    """`cancelled` (status cancelled, reason turn_detected), or what happened instead."""
    error: str = ""
    speech_started_ms: float = math.nan
    """From the second question's first speech sample sent to `speech_started`."""
    cancelled_done_ms: float = math.nan
    """... to the interrupted response's `response.done`."""
    last_audio_ms: float = math.nan
    """... to that response's last audio delta."""
    audio_after_started: int = 0
    """That response's audio deltas after `speech_started`."""
    audio_after_done: int = 0
    """... and after its `response.done` (should be none)."""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """The interrupted response's LLM and TTS jobs: kind, final status, ended before."""
    jobs_ok: bool = False
    next_answered: bool = False
    """The second question got a completed answer."""


def barge_in(dep: Deployment, first: Utterance, second: Utterance, when: str) -> BargeIn:
    out = BargeIn(when)
    key = new_owner(dep.redis_url, dep.base_url, f"voice-barge{time.monotonic_ns()}").key
    live = Live(dep.base_url, key)
    try:
        live.configure(LONG_INSTRUCTIONS, BARGE_TOKENS)
        with httpx.Client(
            base_url=dep.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as http:
            interrupt(live, http, first, second, out)
    except Exception as exc:  # recorded: the bench goes on
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        live.close()
    return out


def interrupt(
    live: Live, http: httpx.Client, first: Utterance, second: Utterance, out: BargeIn
) -> None:
    """Ask `first`; at `out.when` of its answer, speak `second` (from another thread)."""
    start = len(live.events)
    send_paced(live.session, first.pcm(0.8), ())
    found = live.event(live.wait(trigger(out.when), start))
    answer = found.get("response_id") or found["response"]["id"]
    mark = len(live.events)
    onset: list[float] = []
    speech = second.speech[second.onset :] + silent(TRAILING_S)
    sender = threading.Thread(target=lambda: onset.extend(send_paced(live.session, speech, [0])))
    sender.start()
    heard = live.wait("input_audio_buffer.speech_started", mark)
    ended = live.wait(lambda e: e["type"] == "response.done" and e["response"]["id"] == answer)
    stage_jobs = jobs_before(http, live.at(ended))
    sender.join()
    response = live.event(ended)["response"]
    reason = (response.get("status_details") or {}).get("reason")
    out.outcome = response["status"] if reason is None else f"{response['status']} ({reason})"
    if response["status"] != "cancelled":
        out.outcome += ": the answer ended before the barge-in"
    said = live.find(lambda e: e["type"] == AUDIO_DELTA and e["response_id"] == answer)
    out.speech_started_ms = (live.at(heard) - onset[0]) * 1000
    out.cancelled_done_ms = (live.at(ended) - onset[0]) * 1000
    out.last_audio_ms = (live.at(said[-1]) - onset[0]) * 1000 if said else math.nan
    out.audio_after_started = sum(i > heard for i in said)
    out.audio_after_done = sum(i > ended for i in said)
    next_done = live.wait(lambda e: e["type"] == "response.done" and e["response"]["id"] != answer)
    out.next_answered = live.event(next_done)["response"]["status"] == "completed"
    out.jobs = [final(http, job, live.at(heard)) for job in stage_jobs]
    out.jobs_ok = bool(out.jobs) and all(j["ok"] for j in out.jobs)


def trigger(when: str) -> Callable[[dict[str, Any]], bool]:
    """The answer's event to barge in at: its first audio, or the transcript delta that
    completes its second sentence (whose TTS job the server starts then)."""
    if when == "first audio":
        return lambda e: e["type"] == AUDIO_DELTA
    sentences = Sentences()
    complete = 0

    def second_sentence(event: dict[str, Any]) -> bool:
        nonlocal complete
        if event["type"] == "response.output_audio_transcript.delta":
            complete += len(sentences.push(event["delta"]))
        return complete >= 2 or event["type"] == "response.done"

    return second_sentence


def jobs_before(http: httpx.Client, before: float) -> list[dict[str, Any]]:
    """The key's LLM and TTS jobs created before `before` (epoch seconds)."""
    found: list[dict[str, Any]] = []
    for kind in ("llm", "tts"):
        page = http.get("/v1/jobs", params={"kind": kind, "limit": 100}).json()
        found += [j for j in page["data"] if epoch(j["created_at"]) <= before]
    return found


def final(http: httpx.Client, job: dict[str, Any], cancelled_at: float) -> dict[str, Any]:
    """A stage job once it has ended: `ok` if canceled, or ended before the barge-in."""
    deadline = time.monotonic() + 30
    while True:
        now = http.get(f"/v1/jobs/{job['id']}").json()
        if now["status"] not in ("queued", "running") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    ended = now.get("finished_at")
    before = ended is not None and epoch(ended) <= cancelled_at
    return {
        "kind": now["kind"],
        "status": now["status"],
        "ended_before_barge_in": before,
        "ok": now["status"] == "canceled" or (now["status"] == "succeeded" and before),
    }


def epoch(stamp: str | float) -> float:
    if isinstance(stamp, int | float):
        return float(stamp)
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def report_barge_ins(trials: list[BargeIn]) -> None:
    heads = (
        "at", "outcome", "speech_started", "response.done", "last audio delta",
        "deltas after started / done", "its LLM/TTS jobs", "next answered",
    )  # fmt: skip
    rows = [
        (
            t.when,
            t.outcome or t.error,
            ms(t.speech_started_ms),
            ms(t.cancelled_done_ms),
            ms(t.last_audio_ms),
            f"{t.audio_after_started} / {t.audio_after_done}",
            ("ok: " if t.jobs_ok else "NOT OK: ")
            + ", ".join(
                f"{j['kind']} {j['status']}{' (before)' if j['ended_before_barge_in'] else ''}"
                for j in t.jobs
            ),
            str(t.next_answered),
        )
        for t in trials
    ]
    show("4. barge-in: ms from the second question's first speech sample sent", heads, rows)
