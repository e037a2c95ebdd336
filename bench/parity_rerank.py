"""What rerank clients send, and what mmq answers: the `POST /v1/rerank` and `/v2/rerank`
rows of the OpenAI-parity bench (`bench.openai_parity`, whose columns are LLM engines).

    python -m bench.parity_rerank [--out bench/results/openai_parity_rerank.json]

It builds the tiny random-weight cross-encoder (`harness.models.reranker`; no package
ships one), starts a private deployment with one `rerank` pipeline on it, and sends the
request shapes of Jina's and vLLM's rerank (`/v1/rerank`) and Cohere's (`/v2/rerank`),
with the fields each documents. Each cell is the HTTP status and what came back (the
results' indices, whether each carries its document, the tokens) or the error's `param`
and message. The scores of a random model mean nothing; the bench reads none.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from bench.common import run_meta
from bench.openai_parity import console
from harness.api_client import new_owner
from harness.models.reranker import build_reranker
from tuning.deployment import private_deployment

DEFAULT_OUT = Path("bench/results/openai_parity_rerank.json")
DOCS = ["Stock markets fell.", "A cat sits on the mat.", "Rain is due tomorrow."]
QUERY = "Where is the cat?"
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "Jina: documents, top_n, return_documents": (
        "/v1/rerank",
        {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True},
    ),
    "Jina: documents as {text} objects": (
        "/v1/rerank",
        {"query": QUERY, "documents": [{"text": d} for d in DOCS]},
    ),
    "vLLM: no top_n (every document)": ("/v1/rerank", {"query": QUERY, "documents": DOCS}),
    "vLLM: truncate_prompt_tokens": (
        "/v1/rerank",
        {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 64},
    ),
    "Cohere v2: documents, top_n": ("/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1}),
    "Cohere v2: max_tokens_per_doc": (
        "/v2/rerank",
        {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 512},
    ),
    "Cohere v1: return_documents=false": (
        "/v2/rerank",
        {"query": QUERY, "documents": DOCS, "return_documents": False},
    ),
    "Cohere v1: rank_fields": (
        "/v2/rerank",
        {"query": QUERY, "documents": [{"text": d} for d in DOCS], "rank_fields": ["text"]},
    ),
}
"""Each client's request: (path, body without `model`)."""


def describe(r: httpx.Response) -> str:
    body = r.json()
    if r.status_code != 200:
        error = body.get("error", {})
        param, message = error.get("param"), str(error.get("message"))
        return f"{r.status_code} {param}: {message.removeprefix(f'{param}: ')}"
    results = body["results"]
    documents = sum("document" in one for one in results)
    scores = [one["relevance_score"] for one in results]
    order = "sorted" if scores == sorted(scores, reverse=True) else "NOT sorted"
    return (
        f"200, indices {[one['index'] for one in results]} ({order}), "
        f"{documents} with document, {body['usage']['total_tokens']} tokens"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.parity_rerank", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-parity-")))
        model = build_reranker(tmp / "reranker")
        config = (
            '[pipelines.rerank]\nkind = "rerank"\nimpl = "pipelines.rerank:RerankPipeline"\n'
            f"model = {json.dumps(str(model))}\n"
        )
        dep = stack.enter_context(private_deployment(config, {"HF_HUB_OFFLINE": "1"}, ["rerank"]))
        api = new_owner(dep.redis_url, dep.base_url, f"parity{time.monotonic_ns()}")
        rows = {
            name: describe(api.http.post(path, json={"model": "rerank", **body}, timeout=60))
            for name, (path, body) in REQUESTS.items()
        }
    table = Table(title="What mmq answers to rerank clients", show_lines=True)
    table.add_column("request")
    table.add_column("rerank (a CrossEncoder)")
    for name, cell in rows.items():
        table.add_row(name, cell)
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": run_meta(), "rows": rows}, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
