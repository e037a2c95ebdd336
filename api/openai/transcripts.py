"""An ASR job's output in the shapes OpenAI's transcription API answers with."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse, PlainTextResponse, Response

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
RESPONSE_FORMATS: tuple[str, ...] = ("json", "text", "srt", "vtt", "verbose_json")


def transcript_response(
    output: dict[str, Any], fmt: ResponseFormat, task: str, words: bool, headers: dict[str, str]
) -> Response:
    """The answer to a transcription (or translation) whose job succeeded."""
    text = str(output.get("text", ""))
    segments: list[dict[str, Any]] = output.get("segments") or []
    if fmt == "text":
        return PlainTextResponse(text + "\n", headers=headers)
    if fmt == "srt":
        return PlainTextResponse(srt(segments), headers=headers)
    if fmt == "vtt":
        return PlainTextResponse(vtt(segments), media_type="text/vtt", headers=headers)
    usage = {"type": "duration", "seconds": output.get("duration", 0.0)}
    if fmt == "json":
        return JSONResponse({"text": text, "usage": usage}, headers=headers)
    return JSONResponse(verbose(output, task, words) | {"usage": usage}, headers=headers)


def verbose(output: dict[str, Any], task: str, words: bool) -> dict[str, Any]:
    segments: list[dict[str, Any]] = output.get("segments") or []
    body: dict[str, Any] = {
        "task": task,
        "language": output.get("language") or "",
        "duration": output.get("duration", 0.0),
        "text": output.get("text", ""),
        "segments": [_segment(s) for s in segments],
    }
    if words:
        body["words"] = [
            {"word": w["word"].strip(), "start": w["start"], "end": w["end"]}
            for s in segments
            for w in s.get("words") or []
        ]
    return body


def _segment(segment: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "seek", "start", "end", "text", "tokens", "temperature")
    out = {k: segment[k] for k in keys if k in segment}
    for key in ("avg_logprob", "compression_ratio", "no_speech_prob"):
        out[key] = segment.get(key, 0.0)
    return out


def srt(segments: list[dict[str, Any]]) -> str:
    blocks = [
        f"{i}\n{_stamp(s['start'], ',')} --> {_stamp(s['end'], ',')}\n{s['text'].strip()}\n"
        for i, s in enumerate(segments, start=1)
    ]
    return "\n".join(blocks)


def vtt(segments: list[dict[str, Any]]) -> str:
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
