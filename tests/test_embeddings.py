"""Embeddings end to end: `POST /v1/embeddings` with the official client, an `embed`
worker on the model that a pip package ships (all-MiniLM-L6-v2), real Redis; requests'
texts batched together by the worker, each answer the same as alone; refusals by name."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from harness.api_client import Api, new_owner
from tuning.deployment import Deployment, flush, serving

EMBED_PIPELINE = """
[pipelines.embed]
kind = "embed"
impl = "pipelines.embed:EmbedPipeline"
aliases = ["text-embedding-3-small"]
max_batch = 16
max_wait_ms = 100
concurrency = 32

[pipelines.embed-short]
kind = "embed"
impl = "pipelines.embed:EmbedPipeline"
max_batch = 1

[pipelines.embed-short.options]
truncate_input = true
truncate_dimensions = true
"""
DIMENSIONS = 384
CAT, KITTEN, MARKETS = "A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell."


@pytest.fixture(scope="module")
def embed_dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    dep = Deployment(
        redis_url, tmp_path_factory.mktemp("embed"), env_overrides={"HF_HUB_OFFLINE": "1"}
    )
    dep.config_path.write_text(dep.config_path.read_text() + EMBED_PIPELINE)
    with serving(dep):
        dep.start_api()
        dep.start_reaper()
        dep.start_scheduler()
        dep.start_worker("embed")
        dep.start_worker("embed-short")
        yield dep


@pytest.fixture
def api(embed_dep: Deployment) -> Api:
    return new_owner(embed_dep.redis_url, embed_dep.base_url, f"embed{time.monotonic_ns()}")


@pytest.fixture
def oai(embed_dep: Deployment, api: Api) -> openai.OpenAI:
    key = api.http.headers["Authorization"].removeprefix("Bearer ")
    return openai.OpenAI(base_url=f"{embed_dep.base_url}/v1", api_key=key, max_retries=0)


def _post(api: Api, **body: Any) -> httpx.Response:
    return api.http.post("/v1/embeddings", json={"model": "embed", **body}, timeout=60)


def _vectors(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_the_official_client_gets_unit_vectors_that_know_what_is_alike(oai: openai.OpenAI) -> None:
    done = oai.embeddings.create(model="text-embedding-3-small", input=[CAT, KITTEN, MARKETS])
    assert [d.index for d in done.data] == [0, 1, 2]
    cat, kitten, markets = (np.array(d.embedding) for d in done.data)
    assert cat.shape == (DIMENSIONS,)
    assert np.allclose([np.linalg.norm(v) for v in (cat, kitten, markets)], 1.0, atol=1e-5)
    assert cat @ kitten > 0.5 > 0.2 > cat @ markets  # a real model, not noise
    assert done.usage.prompt_tokens == done.usage.total_tokens > 3
    assert done.model == "text-embedding-3-small"


def test_float_and_base64_are_the_same_vector(api: Api) -> None:
    floats = _vectors(_post(api, input=CAT))
    r = _post(api, input=CAT, encoding_format="base64")
    assert r.status_code == 200
    packed = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(floats[0], packed)


def test_concurrent_requests_share_batches_and_each_gets_its_own_answer(api: Api) -> None:
    texts = [f"Sentence number {i} is about {topic}." for i, topic in
             enumerate(["cats", "ships", "rain", "music", "bread", "chess"] * 3)]  # fmt: skip
    alone = {t: _vectors(_post(api, input=t))[0] for t in texts[:3]}

    def one(text: str) -> tuple[str, np.ndarray, str]:
        r = _post(api, input=[text, CAT])
        return text, _vectors(r), r.headers["X-Job-Id"]

    with ThreadPoolExecutor(len(texts)) as pool:
        done = list(pool.map(one, texts))
    for text, vectors, _ in done:
        if text in alone:  # the same numbers as alone, whatever its batch mates
            assert np.allclose(vectors[0], alone[text], atol=1e-5)
        assert np.allclose(vectors[1], done[0][1][1], atol=1e-5)
    sizes = [api.get(job_id)["batch"]["size"] for _, _, job_id in done]
    assert max(sizes) > 1  # batched across requests


@pytest.mark.parametrize(
    ("body", "param", "why"),
    [
        ({"input": [1, 2, 3]}, "input", "token arrays"),
        ({"input": ""}, "input.0", "empty"),
        ({"input": ["x"] * 257}, "input", "over the limit"),
        ({"input": "x", "dimensions": 64}, "dimensions", "one length"),
        ({"input": "x", "user": "u1"}, "user", "not carried"),
        ({"input": "word " * 400}, "input.0", "over the model's window of 256"),
    ],
)
def test_what_cannot_be_served_is_refused_by_name(
    api: Api, body: dict[str, Any], param: str, why: str
) -> None:
    r = _post(api, **body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param and why in error["message"]


def test_a_pipeline_may_allow_shorter_vectors_and_cut_long_texts(api: Api) -> None:
    r = api.http.post(
        "/v1/embeddings",
        json={"model": "embed-short", "input": ["word " * 400, CAT], "dimensions": 64},
        timeout=60,
    )
    vectors = _vectors(r)
    assert vectors.shape == (2, 64)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert r.json()["usage"]["prompt_tokens"] <= 256 + 16  # the long text counts its window
    full = _vectors(_post(api, input=CAT))[0]
    assert np.allclose(vectors[1], full[:64] / np.linalg.norm(full[:64]), atol=1e-5)


def test_an_embed_job_on_the_jobs_api_holds_base64_vectors(api: Api) -> None:
    job = api.submit("embed", model="embed", input=[CAT, KITTEN])
    done = api.wait(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    output = done["output"]
    assert output["dimensions"] == DIMENSIONS and len(output["embeddings"]) == 2
    first = np.frombuffer(base64.b64decode(output["embeddings"][0]), dtype="<f4")
    assert np.allclose(first, _vectors(_post(api, input=CAT))[0], atol=1e-5)


def test_a_workers_log_carries_no_progress_bars(embed_dep: Deployment, api: Api) -> None:
    """sentence-transformers draws a bar for each batch (and transformers one for each
    load) at log level INFO; a worker's log is for events, so it draws none."""
    _post(api, input=[CAT, KITTEN, MARKETS])
    worker = next(p for p in embed_dep.procs if p.name.startswith("worker-embed-"))
    bars = [line for line in worker.log().splitlines() if "it/s]" in line or "Batches:" in line]
    assert bars == []
