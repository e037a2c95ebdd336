"""One deployment with a worker of every built-in kind on its tiny model (Piper voice,
tiny.en, a tiny Llama on the transformers engine, a tiny Stable Diffusion), plus the
echo and sleep test pipelines, on a Redis server of its own: the session's tests of the
command line and of the web console share it (starting it takes about half a minute)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

from pydantic import JsonValue

from host.redis_server import RedisServer
from tuning.deployment import Deployment, serving

PIPELINES = {
    "tts": """
[pipelines.tts]
kind = "tts"
impl = "pipelines.tts:TtsPipeline"
{extra}
[pipelines.tts.options]
default_voice = "joe"

[pipelines.tts.options.voices.joe]
engine = "piper"
""",
    "asr": """
[pipelines.asr]
kind = "asr"
impl = "pipelines.asr:AsrPipeline"
{extra}
""",
    "llm": """
[pipelines.llm]
kind = "llm"
impl = "pipelines.llm:LlmPipeline"
model = {llm}
{extra}
[pipelines.llm.options]
engine = "transformers"
startup_timeout_s = 180
""",
    "image": """
[pipelines.image]
kind = "image"
impl = "pipelines.image:ImagePipeline"
model = {sd}
{extra}
""",
}
"""Each built-in kind's pipeline on its tiny model (`pipeline_toml`)."""
KIND_NAMES = ("llm", "image", "asr", "tts")

VLLM_CACHE = Path(__file__).resolve().parents[1] / "build" / "vllm-cache"
"""vLLM's cache root (`VLLM_CACHE_ROOT`) for every engine the tests start, kept across
engine starts and test runs (`make clean` removes `build/`), as a host keeps its own across
restarts. What vLLM keeps there here is its inspection of the model's class, keyed by a
hash of its source; where it is missing (a fresh data directory: every deployment of the
tests) vLLM runs that inspection in a process of its own, importing vLLM and torch once
more, about 14 CPU-s of every start on two cores."""
VLLM_TEST_OPTIONS: dict[str, JsonValue] = {
    "engine": "vllm",
    "extra_args": ["--enforce-eager"],
    "cache_root": str(VLLM_CACHE),
}
"""The real vLLM (its CPU build) as the tests run it: `--enforce-eager` skips the
torch.compile warm-up, most of a start on two cores; its cache in `VLLM_CACHE`."""
VLLM_TEST_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""With it vLLM runs its model worker inside its engine core process instead of a third
process: 25 s to a first answer here instead of 36 (one interpreter and its imports
fewer), for the dozen engine starts of the suite. Its server and engine core stay apart."""


def llm_toml(name: str, model: str, options: dict[str, JsonValue], **pipeline: JsonValue) -> str:
    """A `[pipelines.NAME]` table of the `llm` kind on `model`, with `pipeline`'s keys and
    its `options` (values written as JSON, which TOML reads the same for strings, numbers,
    booleans and lists; tables inline)."""
    lines = [f"[pipelines.{name}]", 'kind = "llm"', 'impl = "pipelines.llm:LlmPipeline"']
    lines += [f"{key} = {_toml(value)}" for key, value in {"model": model, **pipeline}.items()]
    lines += ["", f"[pipelines.{name}.options]"]
    lines += [f"{key} = {_toml(value)}" for key, value in options.items()]
    return "\n" + "\n".join(lines) + "\n"


def _toml(value: JsonValue) -> str:
    """A value as TOML: JSON's spelling, but a table inline (`{"k" = v}`)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def pipeline_toml(kind: str, models: dict[str, Path], extra: str = "") -> str:
    """The `[pipelines.KIND]` table of a built-in kind on its tiny model, with `extra`
    lines in it (`models`: the `llm` and `sd` directories where the kind needs one)."""
    paths = {name: json.dumps(str(path)) for name, path in models.items()}
    return PIPELINES[kind].format(extra=extra, **{"llm": "", "sd": ""} | paths)


@contextlib.contextmanager
def kinds_deployment(
    tmp: Path, models: dict[str, Path], env: dict[str, str], also: str = ""
) -> Iterator[Deployment]:
    """Its own Redis, the API, the reaper, echo and sleep workers, and a worker of each
    built-in kind (`models`: `llm` and `sd` directories), all started before it yields.
    `also`: more `[pipelines.NAME]` tables, each given a worker too."""
    server = RedisServer(tmp / "redis", persist=False)
    server.start()
    try:
        (tmp / "deploy").mkdir()
        dep = Deployment(server.url, tmp / "deploy", env_overrides={"HF_HUB_OFFLINE": "1", **env})
        extra = "".join(pipeline_toml(kind, models) for kind in KIND_NAMES)
        previews = "\n[pipelines.image.options]\npreview_every_steps = 1\n"
        dep.config_path.write_text(dep.config_path.read_text() + extra + previews + also)
        names = [*KIND_NAMES, *re.findall(r"^\[pipelines\.([\w-]+)\]$", also, re.MULTILINE)]
        with serving(dep):
            workers = [dep.spawn(f"worker-{n}", "worker", "--pipeline", n) for n in names]
            tests = dep.start(["echo", "sleep"], timeout_s=240)  # all started, then waited for
            dep.wait_started([*workers, *tests], timeout_s=240)
            try:
                yield dep
            finally:
                for worker in workers:  # all at once: each takes seconds to unload
                    worker.kill(signal.SIGTERM)
    finally:
        server.stop()
