"""A synthetic OpenAI-compatible engine that costs almost nothing per token, for measuring
what sits in front of an engine (mmq's token path), not the engine.

    python -m bench.synthetic_engine --port 8100 --step-ms 20

It behaves like a continuous-batching server: one step every `--step-ms`, and each
running sequence gets one token per step, written at once as one SSE chunk in a chunked
HTTP response, the way vLLM writes them. A request joins at the next step and runs for
`max_tokens` steps (its prompt is not read), then gets a chunk with its finish reason,
a usage chunk (with `stream_options.include_usage`), `data: [DONE]` and the end of the
response. A client that closes its connection aborts its sequence. Non-streamed requests
get the whole answer after the same steps. `GET /health` and `GET /v1/models` answer too,
and `GET /stats` counts sequences running, finished and aborted, tokens, and the most
sequences that ran in one step (`peak`).

It writes vLLM's wire format for `n` (a chunk per choice, each with its `index`) and
`logprobs` (a made-up log probability on each token, in the chat or the completions API's
shape), and `GET /requests` answers the bodies (and W3C `traceparent` headers) of the last
256 generation requests as it received them: a test sees that a field reached the engine.
It does nothing else with any field (no tools, no JSON): it measures, and shows what it
was sent; it stands in for
no engine's behaviour.

It also takes `vllm serve`'s command line (`serve MODEL --port N ...`, other flags
ignored) and vLLM's sleep mode as vLLM serves it: with `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`, `POST /sleep?level=1`, `POST /wake_up` and `GET /is_sleeping`;
a generation asked of a sleeping engine gets a 503. `/stats` counts the sleeps and wakes
and gives the process id: an on-demand pipeline's engine can be run where vLLM cannot
(no GPU), to see that mmq puts it to sleep and wakes it instead of starting another.

`--stream-interval N` gathers a sequence's tokens as vLLM's flag of that name does: its
first token goes at once, then one chunk every N steps holding the N tokens' text (and the
last chunk whatever is left), so a relay's cost per chunk can be told from its cost per
token.

Raw asyncio (a Protocol per connection, pre-encoded frames: each sequence's token chunk is
encoded once and written again each step), so a token costs about 10 µs of CPU here: a
load that mmq cannot carry shows up as mmq's, not the engine's. `--cpu-report` prints the
engine's own CPU per token at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

TOKEN_TEXT = " tok"
MODEL = "synthetic"


@dataclass(eq=False)
class Sequence:
    conn: EngineConnection
    frame: bytes
    """One token's SSE chunk, encoded once (chunked transfer framing included)."""
    frames: dict[int, bytes]
    """The chunk of k tokens (`--stream-interval`), by k, made once each."""
    make_frame: Callable[[int], bytes]
    remaining: int
    choices: int
    tail: bytes
    """What follows the last token: finish chunk, usage chunk, [DONE], the response's end."""
    stream: bool
    body_done: bytes = b""
    """A non-streamed request's whole response."""
    unsent: int = 0
    """Tokens made but not written yet (`--stream-interval`)."""
    sent: bool = False

    def frame_of(self, tokens: int) -> bytes:
        if tokens == 1:
            return self.frame
        if tokens not in self.frames:
            self.frames[tokens] = self.make_frame(tokens)
        return self.frames[tokens]


@dataclass
class Engine:
    step_s: float
    stream_interval: int = 1
    running: list[Sequence] = field(default_factory=list)
    joining: list[Sequence] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    aborted: int = 0
    """Sequences whose client went away before their last token."""
    peak: int = 0
    """The most sequences that ran in one step."""
    sleep_mode: bool = False
    """Started with `--enable-sleep-mode` in vLLM's development mode: `/sleep` answers."""
    asleep: bool = False
    sleeps: int = 0
    wakes: int = 0
    received: deque[dict[str, object]] = field(default_factory=lambda: deque(maxlen=256))
    """The last requests' paths and bodies (`GET /requests`)."""

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.step_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self.step()

    def step(self) -> None:
        if self.joining:
            self.running.extend(self.joining)
            self.joining.clear()
            self.peak = max(self.peak, len(self.running))
        still = []
        for seq in self.running:
            if seq.conn.closed:
                self.aborted += 1
                continue
            seq.remaining -= 1
            self.tokens += seq.choices
            seq.unsent += 1
            due = seq.unsent >= self.stream_interval or not seq.sent or seq.remaining <= 0
            if seq.stream and due:
                seq.conn.write(seq.frame_of(seq.unsent))
                seq.unsent, seq.sent = 0, True
            if seq.remaining > 0:
                still.append(seq)
            else:
                seq.conn.write(seq.tail if seq.stream else seq.body_done)
                self.requests += 1
        self.running = still


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


def new_sequence(conn: EngineConnection, path: str, body: dict[str, object], n: int) -> Sequence:
    chat = path.endswith("/chat/completions")
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{n}"
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    raw_max = body.get("max_tokens") or body.get("max_completion_tokens") or 16
    max_tokens = max(1, int(raw_max)) if isinstance(raw_max, int | str) else 16
    raw_n = body.get("n") or 1
    n = max(1, int(raw_n)) if isinstance(raw_n, int) else 1
    made = n * max_tokens
    usage = {"prompt_tokens": 8, "completion_tokens": made, "total_tokens": 8 + made}
    logprobs = _logprobs(body, chat)

    def choice(i: int, text: str | None, finish: str | None) -> dict[str, object]:
        lp = logprobs if text else None
        if chat:
            delta = {"content": text} if text is not None else {}
            return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {"index": i, "text": text or "", "logprobs": lp, "finish_reason": finish}

    def event(choices: list[dict[str, object]], with_usage: bool = False) -> dict[str, object]:
        out: dict[str, object] = {
            "id": rid, "object": obj, "created": created, "model": MODEL, "choices": choices,
        }  # fmt: skip
        if with_usage:
            out["usage"] = usage
        return out

    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    tail = b"".join(_sse(event([choice(i, None if chat else "", "length")])) for i in range(n))
    if include_usage:
        tail += _sse(event([], with_usage=True))
    tail += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    text = TOKEN_TEXT * max_tokens
    whole_choices = [
        {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        if chat
        else {"index": i, "text": text, "finish_reason": "length"}
        for i in range(n)
    ]
    whole = {
        "id": rid, "object": "chat.completion" if chat else "text_completion",
        "created": created, "model": MODEL, "choices": whole_choices, "usage": usage,
    }  # fmt: skip

    def frame(tokens: int) -> bytes:
        return b"".join(_sse(event([choice(i, TOKEN_TEXT * tokens, None)])) for i in range(n))

    return Sequence(
        conn=conn,
        frame=frame(1),
        frames={},
        make_frame=frame,
        remaining=max_tokens,
        choices=n,
        tail=tail,
        stream=bool(body.get("stream")),
        body_done=_response("200 OK", "application/json", json.dumps(whole).encode()),
    )


def _logprobs(body: dict[str, object], chat: bool) -> object:
    """What vLLM puts in each token's chunk for `logprobs`, with a made-up value."""
    asked = body.get("top_logprobs") if chat else body.get("logprobs")
    if (chat and not body.get("logprobs")) or (not chat and asked is None):
        return None
    top = asked if isinstance(asked, int) else 0
    if chat:
        entry = {"token": TOKEN_TEXT, "logprob": -0.25, "bytes": list(TOKEN_TEXT.encode())}
        tops = [{**entry, "logprob": -0.25 - i} for i in range(top)]
        return {"content": [{**entry, "top_logprobs": tops}]}
    return {
        "tokens": [TOKEN_TEXT],
        "token_logprobs": [-0.25],
        "top_logprobs": [{TOKEN_TEXT: -0.25} if top else {}],
        "text_offset": [0],
    }


class EngineConnection(asyncio.Protocol):
    def __init__(self, engine: Engine, counter: list[int]) -> None:
        self.engine = engine
        self.counter = counter
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length, traceparent = 0, None
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
                elif name.strip().lower() == "traceparent":
                    traceparent = value.strip()
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self.handle(method, path, body, traceparent)

    def handle(self, method: str, target: str, raw: bytes, traceparent: str | None = None) -> None:
        path = target.partition("?")[0]
        if method == "GET" and path in ("/health", "/ping"):
            self.write(_response("200 OK", "text/plain", b""))
        elif method == "GET" and path == "/stats":
            engine = self.engine
            stats = {
                "running": len(engine.running) + len(engine.joining),
                "requests": engine.requests, "tokens": engine.tokens, "aborted": engine.aborted,
                "peak": engine.peak, "sleeps": engine.sleeps, "wakes": engine.wakes,
                "pid": os.getpid(),
            }  # fmt: skip
            self.write(_response("200 OK", "application/json", json.dumps(stats).encode()))
        elif method == "GET" and path == "/requests":
            received = json.dumps(list(self.engine.received)).encode()
            self.write(_response("200 OK", "application/json", received))
        elif method == "GET" and path == "/v1/models":
            models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            self.write(_response("200 OK", "application/json", json.dumps(models).encode()))
        elif path in ("/sleep", "/wake_up", "/is_sleeping") and self.engine.sleep_mode:
            self.sleep_mode(method, path)
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            if self.engine.asleep:
                error = b'{"error":{"message":"the engine is sleeping"}}'
                self.write(_response("503 Service Unavailable", "application/json", error))
                return
            self.counter[0] += 1
            body = json.loads(raw or b"{}")
            self.engine.received.append({"path": path, "body": body, "traceparent": traceparent})
            seq = new_sequence(self, path, body, self.counter[0])
            if seq.stream:
                self.write(STREAM_HEAD)
            self.engine.joining.append(seq)
        else:
            self.write(_response("404 Not Found", "application/json", b'{"error":"not found"}'))

    def sleep_mode(self, method: str, path: str) -> None:
        engine = self.engine
        if method == "POST" and path == "/sleep":
            engine.sleeps += not engine.asleep
            engine.asleep = True
        elif method == "POST" and path == "/wake_up":
            engine.wakes += engine.asleep
            engine.asleep = False
        elif method == "GET":
            state = json.dumps({"is_sleeping": engine.asleep}).encode()
            self.write(_response("200 OK", "application/json", state))
            return
        self.write(_response("200 OK", "text/plain", b""))


BACKLOG = 2048


async def serve(
    host: str, port: int, step_ms: float, cpu_report: bool, sleep: bool, stream_interval: int = 1
) -> None:
    engine = Engine(step_s=step_ms / 1000.0, stream_interval=stream_interval, sleep_mode=sleep)
    counter = [0]
    loop = asyncio.get_running_loop()
    # A listen backlog for a burst of clients (asyncio's default of 100 drops the SYNs of
    # 256 streams that connect at once, and each dropped one waits a second to retry).
    server = await loop.create_server(
        lambda: EngineConnection(engine, counter), host, port, backlog=BACKLOG
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    stepper = asyncio.create_task(engine.run())
    print(f"synthetic engine on http://{host}:{port} (a step every {step_ms} ms)", flush=True)
    await stop.wait()
    stepper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stepper
    server.close()
    if cpu_report and engine.tokens:
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        used = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        print(f"{engine.tokens} tokens, {engine.requests} requests, "
              f"{used / engine.tokens * 1e6:.1f} µs CPU per token", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.synthetic_engine", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--cpu-report", action="store_true")
    parser.add_argument("--enable-sleep-mode", action="store_true")
    parser.add_argument("--stream-interval", type=int, default=1)
    parser.add_argument("command", nargs="*", help="`serve MODEL`, as `vllm serve` takes it")
    args, _ = parser.parse_known_args(argv)  # vllm serve's other flags
    sleep = args.enable_sleep_mode and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
    server = serve(
        args.host, args.port, args.step_ms, args.cpu_report, sleep, max(1, args.stream_interval)
    )
    try:
        import uvloop
    except ImportError:
        asyncio.run(server)
    else:
        uvloop.run(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
