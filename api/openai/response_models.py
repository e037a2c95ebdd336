"""The request of `POST /v1/responses` (OpenAI's Responses API) as its clients send it,
and the chat turns of the `llm` job it becomes.

A response is a chat completion underneath, on every engine mmq runs: its `input` items
become chat turns (a `function_call` an assistant turn's tool call, a
`function_call_output` a tool turn), `instructions` the system turn before them, flat
function tools the chat API's, and `text.format` the chat API's `response_format`. What
mmq does not serve is refused by name (built-in tools, `reasoning`, `include` values,
input files), as every OpenAI route does (`api.openai.protocol.OpenAIBaseModel`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from api.openai.protocol import OpenAIBaseModel, OpenAIRequest
from jobs.errors import InputError
from jobs.models import MetadataKey, MetadataValue, WebhookSpec
from jobs.schemas.base import COUNT_MAX
from jobs.schemas.chat import FunctionDef, JsonSchema

NOT_YET = "mmq does not carry it to its LLM engines yet"
BUILT_IN = "a built-in tool of OpenAI's that mmq does not serve (function tools are served)"
NOT_CARRIED: dict[str, str] = {
    "conversation": "the Conversations API is not served: continue with previous_response_id",
    "prompt": "stored prompts are not served: send instructions and input",
    "reasoning": f"reasoning options: {NOT_YET}",
    "max_tool_calls": NOT_YET,
    "top_logprobs": f"log probabilities: {NOT_YET} on this route (chat completions carry them)",
    "prompt_cache_key": NOT_YET,
    "prompt_cache_retention": NOT_YET,
    "prompt_cache_options": NOT_YET,
    "safety_identifier": NOT_YET,
    "user": NOT_YET,
    "context_management": NOT_YET,
    "background_options": NOT_YET,
    "moderation": "moderation is not served",
    "access_programs": "not served",
    "image": "image generation in a response is not served (POST /v1/images/generations)",
    "verbosity": NOT_YET,
}
"""OpenAI request fields that mmq does not carry, with why."""

PARAMS = {
    "max_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
    "temperature": "temperature",
}
"""Job input fields under another name in the Responses request."""

SERVICE_TIERS = {"auto": "normal", "default": "normal", "flex": "low", "priority": "high"}
"""`service_tier` as the job's priority."""


class InputPart(OpenAIBaseModel):
    """A part of an input message's content."""

    not_carried = NOT_CARRIED

    type: str
    text: str | None = None
    """`input_text` (and `output_text`, an earlier answer sent back)."""
    image_url: str | None = None
    """`input_image`: a data URL, a stored file key, an s3:// or an http(s) URL."""
    file_id: str | None = None
    """`input_image`: a stored file's id, instead of `image_url`."""
    detail: Literal["auto", "low", "high", "original"] | None = None
    annotations: list[Any] | None = None
    """An `output_text` part's, as OpenAI returned them (read, not used)."""
    logprobs: list[Any] | None = None
    """An `output_text` part's, as OpenAI returned them (read, not used)."""

    def refuse_values(self, where: str) -> None:
        if self.type in ("input_text", "output_text"):
            if self.text is None:
                raise InputError(f"{where}text", f"an {self.type} part needs its text")
        elif self.type == "input_image":
            if (self.image_url is None) == (self.file_id is None):
                raise InputError(f"{where}image_url", "give image_url or file_id, one of them")
        else:
            why = f"{self.type} parts are not served by mmq's LLM pipelines (text and images)"
            raise InputError(f"{where}type", why)

    def as_chat(self) -> dict[str, object]:
        if self.type == "input_image":
            url: dict[str, object] = {"url": self.image_url or self.file_id}
            if self.detail in ("low", "high", "auto"):
                url["detail"] = self.detail
            return {"type": "image_url", "image_url": url}
        return {"type": "text", "text": self.text}


ItemType = Literal["message", "function_call", "function_call_output"]


class InputItem(OpenAIBaseModel):
    """An item of `input`: a message (`type` may be left out), a function call an earlier
    answer made, or a call's output."""

    not_carried = NOT_CARRIED

    type: str = "message"
    id: str | None = Field(default=None, max_length=256)
    """The item's id, as an earlier response gave it (read, not used)."""
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = Field(default=None, min_length=1, max_length=256)
    arguments: str | None = Field(default=None, max_length=1_000_000)
    output: str | list[InputPart] | None = Field(default=None)

    def refuse_values(self, where: str) -> None:
        needs: dict[str, tuple[str, ...]] = {
            "message": ("role", "content"),
            "function_call": ("call_id", "name", "arguments"),
            "function_call_output": ("call_id", "output"),
        }
        if self.type not in needs:
            why = f"{self.type} items are not served (messages and function calls are)"
            if self.type == "item_reference":
                why = "item references are not served: send the item itself"
            raise InputError(f"{where}type", why)
        for name in needs[self.type]:
            if getattr(self, name) is None:
                raise InputError(f"{where}{name}", f"a {self.type} item needs its {name}")

    def text(self) -> str:
        """A message's or an output's text (its parts' texts joined)."""
        content = self.content if self.type == "message" else self.output
        if isinstance(content, list):
            return "".join(part.text or "" for part in content)
        return content or ""


class FunctionTool(OpenAIBaseModel):
    """A tool of the request: a function (flat, as the Responses API gives it); a built-in
    tool is refused by name."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def refuse_values(self, where: str) -> None:
        if self.type != "function":
            raise InputError(f"{where}type", f"{self.type} is {BUILT_IN}")
        if self.name is None:
            raise InputError(f"{where}name", "a function tool needs its name")
        if self.model_extra:  # a built-in tool's own fields: named as any other
            return
        try:
            FunctionDef.model_validate(self.function())
        except ValidationError as exc:  # its rules, named below `where`
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"])
            raise InputError(f"{where}{field}", error["msg"]) from None

    def function(self) -> dict[str, Any]:
        values = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.strict,
        }
        return {k: v for k, v in values.items() if v is not None}

    def as_chat(self) -> dict[str, Any]:
        return {"type": "function", "function": self.function()}


class FunctionChoice(OpenAIBaseModel):
    """`tool_choice` that forces one function."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)


class TextFormat(OpenAIBaseModel):
    """`text.format`: plain text, any JSON object, or JSON that a schema describes."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def refuse_values(self, where: str) -> None:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise InputError(f"{where}schema", "a json_schema format needs its name and schema")

    def as_chat(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        schema = JsonSchema(
            name=self.name or "", description=self.description, schema=self.schema_,
            strict=self.strict,
        )  # fmt: skip
        return {"type": "json_schema", "json_schema": schema.model_dump(by_alias=True)}


class TextConfig(OpenAIBaseModel):
    not_carried = NOT_CARRIED

    format: TextFormat | None = None


class StreamOptions(OpenAIBaseModel):
    include_obfuscation: bool = True
    """Taken, and has no effect: mmq's events carry no obfuscation padding."""


class ResponseRequest(OpenAIRequest):
    """OpenAI's `responses.create`, with mmq's `webhook` (a job's, signed)."""

    not_carried = NOT_CARRIED

    model: str = Field(min_length=1, max_length=256)
    input: str | list[InputItem] = Field(min_length=1)
    instructions: str | None = Field(default=None, max_length=1_000_000)
    """A system turn before the conversation: this response's own (an earlier response's
    instructions are not carried on by `previous_response_id`)."""
    previous_response_id: str | None = Field(default=None, max_length=256)
    """Continue a stored response's conversation: its turns are read from the store."""
    max_output_tokens: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=16)
    store: bool = True
    """Keep the response, to be read, continued and listed (OpenAI's default)."""
    background: bool = False
    """Answer at once with the response `queued`: it runs as a job, to be polled, streamed
    from where it is (`starting_after`) and canceled."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    include: list[str] | None = None
    """None of OpenAI's `include` values is served: an empty list is taken."""
    truncation: Literal["disabled", "auto"] | None = None
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    """The job's priority: `priority` high, `flex` low, else normal."""
    webhook: WebhookSpec | None = None
    """mmq's: a signed webhook of the job's end, as `POST /v1/jobs` takes it."""

    def refuse_values(self, where: str) -> None:
        for value in self.include or []:
            raise InputError("include", f"{value} is not served (none of include's values is)")
        if self.truncation == "auto":
            raise InputError("truncation", "auto truncation is not served: a long input is a 422")
        if self.background and not self.store:
            raise InputError("background", "a background response is stored: store must be true")

    def items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [InputItem(type="message", role="user", content=self.input)]
        return self.input

    def job_options(self) -> dict[str, object]:
        """The job input's fields beside its messages."""
        values: dict[str, object] = {
            "model": self.model,
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        if self.tools:
            values["tools"] = [tool.as_chat() for tool in self.tools]
        if isinstance(self.tool_choice, FunctionChoice):
            values["tool_choice"] = {
                "type": "function",
                "function": {"name": self.tool_choice.name},
            }
        else:
            values["tool_choice"] = self.tool_choice
        if self.text is not None and self.text.format is not None:
            values["response_format"] = self.text.format.as_chat()
        return {k: v for k, v in values.items() if v is not None}

    def priority(self) -> str:
        return SERVICE_TIERS[self.service_tier or "auto"]


def chat_turns(items: list[InputItem]) -> list[dict[str, Any]]:
    """Input items as chat turns: consecutive function calls are one assistant turn's
    tool calls (after its text, where the answer wrote some)."""
    turns: list[dict[str, Any]] = []
    for item in items:
        if item.type == "function_call":
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = turns[-1] if turns else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.type == "function_call_output":
            turns.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        else:
            turns.append(_message(item))
    return turns


def _message(item: InputItem) -> dict[str, Any]:
    role = "system" if item.role == "developer" else item.role
    content = item.content
    if isinstance(content, list) and any(part.type == "input_image" for part in content):
        return {"role": role, "content": [part.as_chat() for part in content]}
    return {"role": role, "content": item.text()}
