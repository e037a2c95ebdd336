"""A generation's choices as the engine's deltas build them: each choice's text, tool calls
and log probabilities, as partial events while they stream and as the job's output at the
end.

A partial event is `{"index": i, "text": …}` where `i` counts the choice's deltas, plus
`choice` (when not 0), `tool_calls` (OpenAI's call deltas) and `logprobs` (the engine's)
where the delta has them. The output keeps choice 0 at its top level (`text`,
`finish_reason`, `tool_calls`, `logprobs`), as one-choice clients read it, and lists every
choice under `choices` when there are several.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeGuard

from jobs.outputs import (
    ChoiceOutput,
    IndexedChoice,
    LlmChoices,
    LlmDelta,
    Logprobs,
    PartialData,
    ToolCall,
    ToolCallDelta,
)
from pipelines.llm.engine_client import Delta, Finish


@dataclass
class Choice:
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    logprobs: Logprobs | None = None
    deltas: int = 0

    def add(self, delta: Delta) -> None:
        self.deltas += 1
        if delta.text:
            self.text.append(delta.text)
        for call in delta.tool_calls or []:
            merge_call(self.calls, call)
        if delta.logprobs is not None:
            self.logprobs = join_logprobs(self.logprobs, delta.logprobs)

    def output(self, reason: str | None) -> LlmChoices:
        """The choice's output, as the top level of a one-choice job's output."""
        out: LlmChoices = {"text": "".join(self.text), "finish_reason": reason}
        if self.calls:
            out["tool_calls"] = self.calls
        if isinstance(self.logprobs, list):  # chat's entries go under `content`
            out["logprobs"] = {"content": self.logprobs}
        elif self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out


class Choices:
    """Every choice of one generation."""

    def __init__(self, n: int) -> None:
        self.choices = [Choice() for _ in range(n)]

    def add(self, delta: Delta) -> LlmDelta:
        """Take one delta; returns its partial event's data."""
        choice = self.choices[delta.choice]
        data: LlmDelta = {"index": choice.deltas, "text": delta.text}
        if delta.choice:
            data["choice"] = delta.choice
        if delta.tool_calls:
            data["tool_calls"] = delta.tool_calls
        if delta.logprobs is not None:
            data["logprobs"] = delta.logprobs
        choice.add(delta)
        return data

    @property
    def deltas(self) -> int:
        return sum(c.deltas for c in self.choices)

    def output(self, finish: Finish) -> LlmChoices:
        outs = [c.output(finish.reasons.get(i)) for i, c in enumerate(self.choices)]
        first = outs[0].copy()
        if len(outs) > 1:
            first["choices"] = [_indexed(i, out) for i, out in enumerate(outs)]
        return first


def _indexed(index: int, out: ChoiceOutput) -> IndexedChoice:
    return {"index": index, **out}


def is_delta(data: PartialData) -> TypeGuard[LlmDelta]:
    """Whether a partial is an LLM delta (`Choices.add`'s)."""
    return "index" in data and "text" in data


def merge_partials(first: LlmDelta, then: LlmDelta) -> LlmDelta | None:
    """Two deltas of the same choice that waited for a write, as one (the first one's
    index); None where they must stay apart (another choice, a tool call)."""
    if first.get("choice") != then.get("choice") or "tool_calls" in first or "tool_calls" in then:
        return None
    merged: LlmDelta = {**first, "text": first["text"] + then["text"]}
    if "logprobs" in first or "logprobs" in then:
        logprobs = join_logprobs(first.get("logprobs"), then.get("logprobs"))
        if logprobs is not None:
            merged["logprobs"] = logprobs
    return merged


def merge_call(calls: list[ToolCall], delta: ToolCallDelta) -> None:
    """Fold one streamed tool call delta into the calls so far: the first delta of a call
    (by `index`) brings its id, type and name; later ones add to its arguments."""
    index = int(delta.get("index", len(calls)))
    function = delta.get("function") or {}
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    call["id"] = delta.get("id") or call["id"]
    call["type"] = delta.get("type") or call["type"]
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def join_logprobs(so_far: Logprobs | None, more: Logprobs | None) -> Logprobs | None:
    """Log probabilities of consecutive deltas as one: lists (chat's entries) joined, and
    dicts of lists (the completions API's `tokens`, `token_logprobs`, …) joined per key."""
    if so_far is None:
        return more
    if more is None:
        return so_far
    if isinstance(so_far, list) and isinstance(more, list):
        return so_far + more
    if isinstance(so_far, dict) and isinstance(more, dict):
        keys = dict.fromkeys([*so_far, *more])
        return {k: list(so_far.get(k) or []) + list(more.get(k) or []) for k in keys}
    raise ValueError("the engine's log probabilities changed shape within one choice")
