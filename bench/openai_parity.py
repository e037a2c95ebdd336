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

A second table sends the image routes (`images.generate`, `images.edit` with and without a
mask, and what they refuse) to a tiny random-weight Stable Diffusion on diffusers
(`harness.models.sd`); `--images-only` runs that table alone, with no LLM engine.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import tempfile
import time
from collections.abc import Callable, Sequence
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
from harness.models.sd import build_tiny_sd
from harness.models.tool_caller import build_tool_caller
from harness.models.vision import build_tiny_vlm
from tuning.deployment import private_deployment, wait_until

console = Console(width=160)
DEFAULT_OUT = Path("bench/results/openai_parity.json")
PIPELINES = ("chat", "tools", "vision", "vllm-chat", "vllm-tools")
IMAGE_PIPELINE = "tiny-sd"
IMAGE_TOML = """
[pipelines.tiny-sd]
kind = "image"
impl = "pipelines.image:ImagePipeline"
model = {model}
"""
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


def _picture(mode: str, size: tuple[int, int], colour: tuple[int, ...]) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, colour).save(out, "PNG")
    return out.getvalue()


def image_requests() -> dict[str, Callable[[openai.OpenAI, str], str]]:
    """The image routes' requests, each as a call that returns what came back, in words."""
    start = ("start.png", _picture("RGB", (64, 64), (30, 90, 200)), "image/png")
    mask = ("mask.png", _picture("RGBA", (64, 64), (0, 0, 0, 0)), "image/png")
    other = ("mask.png", _picture("RGBA", (32, 32), (0, 0, 0, 0)), "image/png")
    quick: Any = {"steps": 2}

    def edit(**kw: Any) -> Callable[[openai.OpenAI, str], str]:
        def send(client: openai.OpenAI, model: str) -> str:
            body = {"image": start, "prompt": "a round window", "extra_body": quick, **kw}
            return _images(client.images.edit(model=model, **body))

        return send

    def generate(client: openai.OpenAI, model: str) -> str:
        return _images(
            client.images.generate(
                model=model, prompt="a lighthouse", size="64x64", extra_body=quick
            )
        )

    return {
        "images.generate": generate,
        "images.edit with a mask (inpainting)": edit(mask=mask),
        "images.edit without a mask (image-to-image)": edit(),
        "images.edit n=2, b64_json, webp": edit(
            n=2, response_format="b64_json", output_format="webp"
        ),
        "images.edit, a mask of another size": edit(mask=other),
        "images.edit, two images": edit(image=[start, start]),
        "images.edit, background=transparent": edit(background="transparent"),
    }


def _images(answer: Any) -> str:
    kinds = sorted({"b64_json" if d.b64_json else "url" for d in answer.data or []})
    return f"200, {len(answer.data or [])} x {answer.size} {answer.output_format} as {kinds}"


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
    parser.add_argument("--images-only", action="store_true", help="only the image routes")
    args = parser.parse_args(argv)
    llms = () if args.images_only else PIPELINES
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-parity-")))
        models = (
            {}
            if args.images_only
            else {
                "chat": build_tiny_llm(tmp / "chat"),
                "tools": build_tool_caller(tmp / "tools"),
                "vision": build_tiny_vlm(tmp / "vision"),
            }
        )
        sd = json.dumps(str(build_tiny_sd(tmp / "sd")))
        env = {"HF_HUB_OFFLINE": "1"}
        toml = (config(models) if models else "") + IMAGE_TOML.format(model=sd)
        dep = stack.enter_context(private_deployment(toml, env, []))
        names = [*llms, IMAGE_PIPELINE]
        workers = [dep.spawn(f"worker-{name}", "worker", "--pipeline", name) for name in names]
        for worker in workers:  # an engine may take minutes to start on a busy machine
            wait_until(lambda w=worker: "ready." in w.log(), worker, timeout_s=600)
        api = new_owner(dep.redis_url, dep.base_url, f"parity{time.monotonic_ns()}")
        client = openai.OpenAI(base_url=f"{dep.base_url}/v1", api_key=api.key, max_retries=0)
        rows = (
            {name: {p: ask(send, client, p) for p in llms} for name, send in requests().items()}
            if llms
            else {}
        )
        images = {
            name: {IMAGE_PIPELINE: ask(send, client, IMAGE_PIPELINE)}
            for name, send in image_requests().items()
        }
    if rows:
        _print("What mmq answers, by pipeline (engine)", llms, rows)
    _print("The image routes, on diffusers", [IMAGE_PIPELINE], images)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"meta": run_meta(), "rows": rows, "images": images}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


def _print(title: str, columns: Sequence[str], rows: dict[str, dict[str, str]]) -> None:
    table = Table(title=title, show_lines=True)
    table.add_column("request")
    for name in columns:
        table.add_column(name)
    for name, cells in rows.items():
        table.add_row(name, *cells.values())
    console.print(table)


if __name__ == "__main__":
    raise SystemExit(main())
