"""An ASR job's output in the shapes OpenAI's transcription API answers with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastapi.responses import PlainTextResponse, Response

from api.openai.protocol import json_answer
from api.openai.transcription_models import (
    ResponseFormat,
    Transcription,
    TranscriptionSegment,
    TranscriptionUsage,
    TranscriptionVerbose,
    TranscriptionWord,
)

Segments = Sequence[Mapping[str, Any]]
"""An `asr` job output's segments, as its worker wrote them."""


def transcript_response(
    output: Mapping[str, Any],
    fmt: ResponseFormat,
    task: Literal["transcribe", "translate"],
    words: bool,
    headers: dict[str, str],
) -> Response:
    """The answer to a transcription (or translation) whose job succeeded."""
    text = str(output.get("text", ""))
    segments: Segments = output.get("segments") or []
    if fmt == "text":
        return PlainTextResponse(text + "\n", headers=headers)
    if fmt == "srt":
        return PlainTextResponse(srt(segments), headers=headers)
    if fmt == "vtt":
        return PlainTextResponse(vtt(segments), media_type="text/vtt", headers=headers)
    usage = TranscriptionUsage(seconds=output.get("duration", 0.0))
    if fmt == "json":
        return json_answer(Transcription(text=text, usage=usage), headers)
    return json_answer(verbose(output, task, words, usage), headers)


def verbose(
    output: Mapping[str, Any],
    task: Literal["transcribe", "translate"],
    words: bool,
    usage: TranscriptionUsage,
) -> TranscriptionVerbose:
    segments: Segments = output.get("segments") or []
    return TranscriptionVerbose(
        task=task,
        language=output.get("language") or "",
        duration=output.get("duration", 0.0),
        text=output.get("text", ""),
        segments=[TranscriptionSegment.model_validate(s) for s in segments],
        words=_words(segments) if words else None,
        usage=usage,
    )


def _words(segments: Segments) -> list[TranscriptionWord]:
    return [
        TranscriptionWord(word=w["word"].strip(), start=w["start"], end=w["end"])
        for s in segments
        for w in s.get("words") or []
    ]


def srt(segments: Segments) -> str:
    blocks = [
        f"{i}\n{_stamp(s['start'], ',')} --> {_stamp(s['end'], ',')}\n{s['text'].strip()}\n"
        for i, s in enumerate(segments, start=1)
    ]
    return "\n".join(blocks)


def vtt(segments: Segments) -> str:
    blocks = [
        f"{_stamp(s['start'], '.')} --> {_stamp(s['end'], '.')}\n{s['text'].strip()}\n"
        for s in segments
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


def _stamp(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"
