"""One traced job of each kind, and its trace as a tree of spans.

    python -m bench.trace_tree [--out bench/results/trace-tree.json]

It starts a deployment with a worker of every built-in kind on its tiny model
(`harness.kinds`: the Piper voice, tiny.en, a tiny Llama on `transformers serve`, a tiny
Stable Diffusion; embeddings on all-MiniLM-L6-v2), with `[tracing]` on and every span sent
to a real OTLP endpoint in this process (`harness.otlp_receiver`). It submits one job of
each kind with a client's `traceparent`, and prints each job's trace: the spans, their
process, their parent, and how long each took. The spans are also written as JSON.
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import run_meta
from harness.api_client import new_owner
from harness.audio import spoken
from harness.kinds import kinds_deployment
from harness.models.llm import build_tiny_llm
from harness.models.sd import build_tiny_sd
from harness.otlp_receiver import ReceivedSpan, receiving_spans
from tuning.deployment import wait_until

DEFAULT_OUT = Path("bench/results/trace-tree.json")
EMBED = '\n[pipelines.embed]\nkind = "embed"\nimpl = "pipelines.embed:EmbedPipeline"\n'


def jobs(wav_key: str) -> dict[str, dict[str, Any]]:
    """A small job of each kind."""
    return {
        "llm": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        "tts": {"text": "Hello there."},
        "asr": {"audio": wav_key},
        "image": {"prompt": "a red cube", "width": 64, "height": 64, "steps": 2},
        "embed": {"input": ["a cat sits on the mat"]},
    }


def tree(spans: list[ReceivedSpan]) -> list[str]:
    """The spans of one trace as indented lines, children under their parents in start
    order."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {s.span_id for s in spans}
    for span in sorted(spans, key=lambda s: s.start_s):
        by_parent.setdefault(span.parent_id if span.parent_id in ids else "", []).append(span)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in by_parent.get(parent, []):
            attempt = span.attributes.get("mmq.attempt")
            extra = f" attempt={attempt}" if attempt is not None else ""
            size = span.attributes.get("mmq.batch_size")
            extra += f" batch={size}" if size is not None else ""
            ms = (span.end_s - span.start_s) * 1000
            lines.append(f"{'  ' * depth}{span.name}{extra}  [{span.service}] {ms:.1f} ms")
            walk(span.span_id, depth + 1)

    walk("", 0)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace_tree", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mmq-trace-tree-") as tmp, receiving_spans() as otlp:
        root = Path(tmp)
        models = {"llm": build_tiny_llm(root / "llm"), "sd": build_tiny_sd(root / "sd")}
        env = {
            "MMQ_TRACING__ENABLED": "true",
            "MMQ_TRACING__ENDPOINT": otlp.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        with kinds_deployment(root / "kinds", models, env, also=EMBED) as dep:
            api = new_owner(dep.redis_url, dep.base_url, f"trees{time.monotonic_ns()}")
            wav = spoken()
            upload = api.http.post("/v1/files", files={"file": ("said.wav", wav, "audio/wav")})
            wav_key = upload.json()["key"]
            for kind, inp in jobs(wav_key).items():
                trace_id = secrets.token_hex(16)
                headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
                r = api.http.post("/v1/jobs", json={"kind": kind, "input": inp}, headers=headers)
                job = api.wait(r.json()["id"], 300)

                def spans(trace_id: str = trace_id) -> list[ReceivedSpan]:
                    return [s for s in otlp.spans() if s.trace_id == trace_id]

                wait_until(lambda: {"mmq.admit", "mmq.finish"} <= {s.name for s in spans()},
                           timeout_s=60)  # fmt: skip
                time.sleep(0.3)  # the last spans of the batch
                lines = tree(spans())
                print(f"\n{kind} ({job['status']}, job {job['id']}):")
                print("\n".join(lines))
                results[kind] = {"status": job["status"], "tree": lines,
                                 "spans": [s.__dict__ for s in spans()]}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": run_meta(), "jobs": results}, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
