"""When each stage of a voice turn delivered, from the end of speech to the first audio: what
`bench.voice` splits the turn's latency by, what the session's stored events keep
(`mmq.turn`, never sent to the client), and what `/metrics` observes per stage."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from pydantic import JsonValue

STAGES = ("vad_tail", "transcript", "llm_first_token", "first_sentence", "tts_first_chunk")
"""Each stage's share of the turn, in order: a stage's time runs from the end of the one
before it (the first from the moment the last speech frame arrived)."""


@dataclass
class TurnTimes:
    """Wall-clock seconds (`time.time()`) of a turn's marks; None until reached."""

    speech_end_arrived: float | None = None
    """When the audio at the end of speech (`audio_end_ms`) reached the session."""
    speech_stopped: float | None = None
    """When VAD said the turn had ended (`silence_duration_ms` later)."""
    transcript: float | None = None
    llm_first_token: float | None = None
    first_sentence: float | None = None
    tts_first_chunk: float | None = None

    def mark(self, name: str) -> None:
        """Set `name` to now unless it is set already."""
        if getattr(self, name) is None:
            setattr(self, name, time.time())

    def stages(self) -> dict[str, float]:
        """Each reached stage's seconds (see `STAGES`), and `total` once audio came."""
        marks = [
            self.speech_end_arrived,
            self.speech_stopped,
            self.transcript,
            self.llm_first_token,
            self.first_sentence,
            self.tts_first_chunk,
        ]
        out: dict[str, float] = {}
        for name, (start, end) in zip(STAGES, itertools.pairwise(marks), strict=True):
            if start is not None and end is not None:
                out[name] = max(0.0, end - start)
        if marks[0] is not None and marks[-1] is not None:
            out["total"] = max(0.0, marks[-1] - marks[0])
        return out

    def record(self, response_id: str) -> dict[str, JsonValue]:
        """The `mmq.turn` record of the session's stored events."""
        stages: dict[str, JsonValue] = {k: round(v, 4) for k, v in self.stages().items()}
        return {"type": "mmq.turn", "response_id": response_id, "seconds": stages}
