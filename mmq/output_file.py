"""`mmq submit --output FILE`: a succeeded job's result as the bytes of a file.

Per kind (`RESULTS`): TTS writes its stored audio (in the format the job asked for), image
its first image (inline `b64_json`, else the stored file), ASR and LLM their text; any
kind writes its whole output as JSON when FILE ends in `.json`, and a kind without an
entry writes its `text`, else its output as JSON. Stored files come through the API
(`GET /v1/files/KEY`) with the client's API key, whichever storage backend keeps them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from jobs.outputs import ImageOutput, StoredFile, TtsOutput
from jobs.wire import Job
from mmq.client import Client

if TYPE_CHECKING:
    from pydantic import JsonValue


def _downloaded(client: Client, ref: StoredFile) -> bytes:
    return client.download(ref["key"])


def _json(output: dict[str, JsonValue]) -> bytes:
    return (json.dumps(output, indent=2, ensure_ascii=False) + "\n").encode()


def _text(client: Client, output: dict[str, JsonValue]) -> bytes:
    if "text" not in output or output.get("tool_calls") or output.get("choices"):
        return _json(output)  # tool calls and several choices are not plain text
    return (str(output["text"]).rstrip("\n") + "\n").encode()


def _audio(client: Client, output: dict[str, JsonValue]) -> bytes:
    return _downloaded(client, cast(TtsOutput, output)["audio"])


def _first_image(client: Client, output: dict[str, JsonValue]) -> bytes:
    """Inline (`b64_json`) where the job carries it, else downloaded."""
    image = cast(ImageOutput, output)["images"][0]
    if image.get("b64_json"):
        return base64.b64decode(image["b64_json"])
    return _downloaded(client, image)


RESULTS: dict[str, Callable[[Client, dict[str, JsonValue]], bytes]] = {
    "tts": _audio,
    "image": _first_image,
    "asr": _text,
    "llm": _text,
}


def result_bytes(client: Client, job: Job, path: Path) -> bytes:
    """What `--output path` holds for the succeeded `job`."""
    output = job.get("output") or {}
    if path.suffix.lower() == ".json":
        return _json(output)
    return RESULTS.get(str(job.get("kind")), _text)(client, output)


def write_result(client: Client, job: Job, path: Path) -> int:
    """Write the job's result to `path`; returns the bytes written."""
    data = result_bytes(client, job, path)
    path.write_bytes(data)
    return len(data)
