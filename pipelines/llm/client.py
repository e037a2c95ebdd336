"""The adapter over an OpenAI-compatible engine server: one streamed request at a time.

`stream` posts a chat or completion request with `stream: true` and yields the text of
each chunk as it arrives, then the finish reason and usage. Closing the iterator closes
the HTTP stream, which vLLM (and `transformers serve`) take as an abort: a canceled job
stops taking a slot in the engine's batch.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import httpx

from common.sse import parse_lines
from jobs.errors import InputError
from jobs.schemas.llm import LlmInput


class EngineLost(RuntimeError):
    """The engine could not be reached or dropped the stream (it died or restarts)."""


class EngineRefused(RuntimeError):
    """The engine answered the request with an error that is not the request's fault."""


@dataclass
class Delta:
    text: str


@dataclass
class Finish:
    reason: str | None
    usage: dict[str, int] = field(default_factory=dict)


def request_body(inp: LlmInput, model: str) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the engine request for `inp`."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": inp.max_tokens,
        "temperature": inp.temperature,
        "top_p": inp.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if inp.presence_penalty:
        body["presence_penalty"] = inp.presence_penalty
    if inp.frequency_penalty:
        body["frequency_penalty"] = inp.frequency_penalty
    if inp.stop:
        body["stop"] = inp.stop
    if inp.seed is not None:
        body["seed"] = inp.seed
    if inp.messages is not None:
        body["messages"] = [m.model_dump() for m in inp.messages]
        return "/v1/chat/completions", body
    body["prompt"] = inp.prompt
    return "/v1/completions", body


class EngineClient:
    def __init__(self, base_url: str, read_timeout_s: float, connections: int) -> None:
        timeout = httpx.Timeout(connect=5.0, read=read_timeout_s, write=30.0, pool=30.0)
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.http = httpx.Client(base_url=base_url, timeout=timeout, limits=limits)

    def close(self) -> None:
        self.http.close()

    def stream(self, path: str, body: dict[str, Any]) -> Generator[Delta | Finish, None, None]:
        """The chunks of one streamed generation; raises EngineLost when the engine goes
        away, InputError when it refuses the request (a prompt over its context)."""
        reason: str | None = None
        usage: dict[str, int] = {}
        try:
            with self.http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    text = response.read().decode(errors="replace")
                    _raise_for(response.status_code, text, _prompt_field(path))
                for message in parse_lines(response.iter_lines()):
                    if message.data == "[DONE]":
                        break
                    chunk = json.loads(message.data)
                    if chunk.get("usage"):
                        usage = {k: int(v) for k, v in chunk["usage"].items() if _count(v)}
                    for choice in chunk.get("choices") or []:
                        text = _text_of(choice)
                        if text:
                            yield Delta(text)
                        reason = choice.get("finish_reason") or reason
        except (httpx.TransportError, httpx.DecodingError) as exc:
            raise EngineLost(f"the engine stream broke: {type(exc).__name__}: {exc}") from exc
        if reason is None:
            raise EngineLost("the engine stream ended without a finish reason")
        yield Finish(reason, usage)


def _prompt_field(path: str) -> str:
    return "messages" if path.endswith("/chat/completions") else "prompt"


def _text_of(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return str((choice["delta"] or {}).get("content") or "")
    return str(choice.get("text") or "")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _raise_for(status: int, text: str, field: str) -> None:
    message = _message(text)
    if status in (400, 413, 422):
        # vLLM answers 400 for a prompt longer than max_model_len, and for bad parameters.
        raise InputError(field, f"the engine refused the request: {message}")
    raise EngineRefused(f"the engine answered {status}: {message}")


def _message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))[:500]
    if isinstance(data, dict) and "message" in data:
        return str(data["message"])[:500]
    return text[:500]
