"""A session's conversation: its items in order (OpenAI's `realtime.item`s), and what the LLM
reads of them (chat messages: a turn's transcript as the user's words, an answer as the
assistant's, function calls and their outputs as tool calls and tool messages)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from jobs.errors import InputError
from jobs.schemas import validation_error_field
from realtime.server_events import Item, new_id

Message = dict[str, JsonValue]
"""A chat message of the `llm` job's input (`jobs.schemas.chat.ChatMessage`)."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(pattern=r"^(input_text|text|output_text|input_audio)$")
    text: str | None = Field(default=None, max_length=100_000)
    transcript: str | None = Field(default=None, max_length=100_000)
    audio: None = None
    """Audio inside an item is not served: send it through the input audio buffer."""


class NewItem(BaseModel):
    """An item a client adds (`conversation.item.create`): a message of text, or a
    function call's output."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, min_length=1, max_length=64)
    object: str | None = None
    type: str = Field(pattern=r"^(message|function_call_output|function_call)$")
    role: str | None = Field(default=None, pattern=r"^(user|system|assistant)$")
    status: str | None = None
    content: list[_Part] | None = Field(default=None, max_length=32)
    call_id: str | None = Field(default=None, min_length=1, max_length=256)
    output: str | None = Field(default=None, max_length=1_000_000)
    name: str | None = Field(default=None, max_length=64)
    arguments: str | None = Field(default=None, max_length=1_000_000)


def parse_item(raw: JsonValue) -> Item:
    """A client's item as the conversation keeps it; InputError naming the field."""
    try:
        item = NewItem.model_validate(raw)
    except ValidationError as exc:
        raise validation_error_field(exc, "item") from None
    out: Item = {"id": item.id or new_id("item"), "object": "realtime.item", "type": item.type}
    out["status"] = "completed"
    if item.type == "message":
        if item.role is None or not item.content:
            raise InputError("item.content", "a message needs a role and its content")
        out["role"] = item.role
        out["content"] = [part.model_dump(exclude_none=True) for part in item.content]
    elif item.type == "function_call_output":
        if item.call_id is None or item.output is None:
            raise InputError("item.call_id", "a function call's output needs call_id and output")
        out.update(call_id=item.call_id, output=item.output)
    else:
        if item.call_id is None or item.name is None:
            raise InputError("item.call_id", "a function call needs call_id and name")
        out.update(call_id=item.call_id, name=item.name, arguments=item.arguments or "{}")
    return out


class Conversation:
    def __init__(self) -> None:
        self.items: list[Item] = []

    def last_id(self) -> str | None:
        return str(self.items[-1]["id"]) if self.items else None

    def add(self, item: Item) -> str | None:
        """Append `item`; returns the id of the item before it."""
        before = self.last_id()
        self.items.append(item)
        return before

    def find(self, item_id: str) -> Item | None:
        return next((item for item in self.items if item["id"] == item_id), None)

    def delete(self, item_id: str) -> bool:
        item = self.find(item_id)
        if item is None:
            return False
        self.items.remove(item)
        return True

    def messages(self, instructions: str) -> list[Message]:
        """The chat the LLM answers: the instructions, then each item that says something."""
        out: list[Message] = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.items:
            kind = item["type"]
            if kind == "message":
                text = _text(item)
                if text:
                    out.append({"role": str(item["role"]), "content": text})
            elif kind == "function_call":
                call: Message = {
                    "id": str(item["call_id"]),
                    "type": "function",
                    "function": {"name": str(item["name"]), "arguments": str(item["arguments"])},
                }
                last = out[-1] if out else None
                calls = last.get("tool_calls") if last and last["role"] == "assistant" else None
                if isinstance(calls, list):
                    calls.append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(item["call_id"]),
                        "content": str(item["output"]),
                    }
                )
        return out


def _text(item: Item) -> str:
    parts = item.get("content")
    if not isinstance(parts, list):
        return ""
    texts = []
    for part in parts:
        if isinstance(part, dict):
            value = part.get("text") or part.get("transcript")
            if isinstance(value, str):
                texts.append(value)
    return " ".join(t.strip() for t in texts if t.strip())
