"""What today's OpenAI clients send, and what mmq answers, per engine: the requests of the
OpenAI-parity issue (chat completions) and of the Responses API's (`/v1/responses`: a
function tool, a stream, `text.format`, background mode), sent with the official `openai`
client.

    python -m bench.openai_parity [--out bench/results/openai_parity.json]

It builds the test models (no hub), starts a private deployment with five `llm`
pipelines and sends each request to each:

- `chat`: the tiny Llama on `transformers serve` (a chat template without tools, no
  vision tower): what a plain text model answers;
- `tools`: a tiny Qwen2 on `transformers serve` that always calls `get_weather`
  (`harness.models.tool_caller`);
- `vision`: a tiny LLaVA on `transformers serve` (`harness.models.vision`);
- `vllm-chat` and `vllm-tools`: the same two models on the real vLLM (its CPU build, from
  the environment `make install` builds; `hermes` parses the tool caller's calls).
  tests/test_llm_wire.py keeps the synthetic engine's check that every field reaches an
  engine exactly as sent.

Each cell is the HTTP status and what came back (tool calls, choices, log probabilities,
or the error's `param` and message). It prints the table and writes JSON.
The rerank routes' rows (`/v1/rerank`, `/v2/rerank`), whose pipeline is no LLM engine, are
`bench.parity_rerank`'s.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
from PIL import Image
from rich.console import Console
from rich.table import Table

from bench.common import run_meta
from harness.api_client import new_owner
from harness.kinds import llm_toml
from harness.models.llm import build_tiny_llm
from harness.models.tool_caller import build_tool_caller
from harness.models.vision import build_tiny_vlm
from tuning.deployment import private_deployment, wait_until

console = Console(width=160)
DEFAULT_OUT = Path("bench/results/openai_parity.json")
PIPELINES = ("chat", "tools", "vision", "vllm-chat", "vllm-tools")
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL: Any = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
SCHEMA: Any = {
    "type": "json_schema",
    "json_schema": {
        "name": "place",
        "strict": True,
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (48, 36), (200, 30, 30)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def requests() -> dict[str, Callable[[openai.OpenAI, str], str]]:
    """The issue's requests, each as a call that returns what came back, in words."""
    image: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is it?"},
                {"type": "image_url", "image_url": {"url": _png()}},
            ],
        }
    ]
    turns: Any = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]

    def chat(**kw: Any) -> Callable[[openai.OpenAI, str], str]:
        def send(client: openai.OpenAI, model: str) -> str:
            body = {"messages": ASK, "max_tokens": 8, **kw}
            if body.get("stream"):
                chunks = list(client.chat.completions.create(model=model, **body))
                calls = [
                    tc.function.name
                    for c in chunks
                    if c.choices
                    for tc in c.choices[0].delta.tool_calls or []
                    if tc.function is not None
                ]
                finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
                return f"200, {len(chunks)} chunks, tool_calls deltas {calls}, finish {finish}"
            answer = client.chat.completions.create(model=model, **body)
            return _describe(answer)

        return send

    def respond(**kw: Any) -> Callable[[openai.OpenAI, str], str]:
        def send(client: openai.OpenAI, model: str) -> str:
            body = {"input": ASK[0]["content"], "max_output_tokens": 8, **kw}
            if body.get("stream"):
                events = list(client.responses.create(model=model, **body))
                return f"200, {len(events)} events, {events[0].type} .. {events[-1].type}"
            answer = client.responses.create(model=model, **body)
            for _ in range(600):  # a background one: polled until it ends
                if answer.status not in ("queued", "in_progress"):
                    break
                time.sleep(0.1)
                answer = client.responses.retrieve(answer.id)
            return _describe_response(answer)

        return send

    flat = {"type": "function", "name": "get_weather"} | {
        "parameters": WEATHER["function"]["parameters"]
    }
    text_format = {"format": {"type": "json_schema", "name": "place", "strict": True,
                              "schema": SCHEMA["json_schema"]["schema"]}}  # fmt: skip
    return {
        'tools, tool_choice="required"': chat(tools=[WEATHER], tool_choice="required"),
        "tools (auto), streamed": chat(tools=[WEATHER], stream=True),
        "assistant tool_calls + tool turn": chat(messages=turns, tools=[WEATHER]),
        "response_format json_schema (strict)": chat(response_format=SCHEMA),
        "response_format json_object": chat(response_format={"type": "json_object"}),
        "logprobs=True, top_logprobs=2": chat(logprobs=True, top_logprobs=2),
        "image_url part (data URL)": chat(messages=image),
        "n=2": chat(n=2),
        "responses: function tool": respond(tools=[flat]),
        "responses: streamed": respond(stream=True),
        "responses: text.format json_schema": respond(text=text_format),
        "responses: background, polled": respond(background=True),
    }


def _describe(answer: Any) -> str:
    parts = [f"200, finish {answer.choices[0].finish_reason}"]
    calls = answer.choices[0].message.tool_calls
    if calls:
        parts.append(
            "tool_calls " + ", ".join(f"{c.function.name}{c.function.arguments}" for c in calls)
        )
    if len(answer.choices) > 1:
        parts.append(f"{len(answer.choices)} choices")
    content = answer.choices[0].message.content or ""
    if content.startswith("{"):  # structured output: what came back, and whether it parses
        parts.append(f"content {content} ({'parses' if _parses(content) else 'not JSON'})")
    logprobs = answer.choices[0].logprobs
    if logprobs is not None and logprobs.content:
        parts.append(f"logprobs on {len(logprobs.content)} tokens")
    if answer.usage is not None:
        parts.append(f"prompt {answer.usage.prompt_tokens} tokens")
    return ", ".join(parts)


def _describe_response(answer: Any) -> str:
    """A `/v1/responses` answer in words: its status and each output item."""
    parts = [f"200, {answer.status}"]
    for item in answer.output:
        if item.type == "function_call":
            parts.append(f"function_call {item.name}{item.arguments}")
        else:
            text = answer.output_text
            parses = " (parses)" if text.startswith("{") and _parses(text) else ""
            parts.append(f"message {text[:40]!r}{parses}")
    return ", ".join(parts)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def ask(send: Callable[[openai.OpenAI, str], str], client: openai.OpenAI, model: str) -> str:
    try:
        return send(client, model)
    except openai.APIStatusError as exc:
        body: Any = exc.body if isinstance(exc.body, dict) else {}
        param, message = body.get("param"), str(body.get("message"))
        return f"{exc.status_code} {param}: {message.removeprefix(f'{param}: ')}"


def config(models: dict[str, Path]) -> str:
    transformers = {"engine": "transformers", "max_inflight": 2, "startup_timeout_s": 300}
    vllm = {"engine": "vllm", "max_inflight": 4, "startup_timeout_s": 600}
    tables = [
        llm_toml(name, str(models[name]), transformers) for name in ("chat", "tools", "vision")
    ]
    tables.append(llm_toml("vllm-chat", str(models["chat"]), vllm))
    tools = vllm | {"tool_call_parser": "hermes"}
    tables.append(llm_toml("vllm-tools", str(models["tools"]), tools))
    return "".join(tables)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.openai_parity", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-parity-")))
        models = {
            "chat": build_tiny_llm(tmp / "chat"),
            "tools": build_tool_caller(tmp / "tools"),
            "vision": build_tiny_vlm(tmp / "vision"),
        }
        env = {"HF_HUB_OFFLINE": "1"}
        dep = stack.enter_context(private_deployment(config(models), env, []))
        workers = [dep.spawn(f"worker-{name}", "worker", "--pipeline", name) for name in PIPELINES]
        for worker in workers:  # an engine may take minutes to start on a busy machine
            wait_until(lambda w=worker: "ready." in w.log(), worker, timeout_s=600)
        api = new_owner(dep.redis_url, dep.base_url, f"parity{time.monotonic_ns()}")
        client = openai.OpenAI(base_url=f"{dep.base_url}/v1", api_key=api.key, max_retries=0)
        rows = {
            name: {p: ask(send, client, p) for p in PIPELINES} for name, send in requests().items()
        }
    table = Table(title="What mmq answers, by pipeline (engine)", show_lines=True)
    table.add_column("request")
    for name in PIPELINES:
        table.add_column(name)
    for name, cells in rows.items():
        table.add_row(name, *cells.values())
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": run_meta(), "rows": rows}, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
