"""Embeddings end to end: `POST /v1/embeddings` with the official client, an `embed`
worker on the model that a pip package ships (all-MiniLM-L6-v2), real Redis; requests'
texts batched together by the worker, each answer the same as alone; refusals by name.
The same deployment serves `rerank` (`/v1/rerank`, `/v2/rerank`) on a random-weight
cross-encoder (no package ships one), loaded from its directory as a user's would be: its
tests check orders, batching and shapes, not relevance."""

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
from transformers import AutoTokenizer

from harness.api_client import Api, new_owner
from harness.models.reranker import cached_tiny_reranker
from jobs.settings import PipelineConfig
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
RERANK_PIPELINE = """
[pipelines.rerank]
kind = "rerank"
impl = "pipelines.rerank:RerankPipeline"
model = "{model}"
aliases = ["rerank-english"]
max_batch = 16
max_wait_ms = 100
concurrency = 32

[pipelines.rerank-cut]
kind = "rerank"
impl = "pipelines.rerank:RerankPipeline"
model = "{model}"

[pipelines.rerank-cut.options]
truncate_input = true
"""
DIMENSIONS = 384
CAT, KITTEN, MARKETS = "A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell."


@pytest.fixture(scope="module")
def embed_dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    dep = Deployment(
        redis_url, tmp_path_factory.mktemp("embed"), env_overrides={"HF_HUB_OFFLINE": "1"}
    )
    rerank = RERANK_PIPELINE.format(model=cached_tiny_reranker(tmp_path_factory))
    dep.config_path.write_text(dep.config_path.read_text() + EMBED_PIPELINE + rerank)
    with serving(dep):
        dep.start(["embed", "embed-short", "rerank", "rerank-cut"])
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


# -- rerank -------------------------------------------------------------------------------

DOCS = [CAT, KITTEN, MARKETS, "Rain is due tomorrow.", "The cat chased a mouse.", "Bread rises."]
QUERY = "Where is the cat?"


def _rerank(api: Api, path: str = "/v1/rerank", **body: Any) -> httpx.Response:
    body = {"model": "rerank", "query": QUERY, "documents": DOCS, **body}
    return api.http.post(path, json=body, timeout=60)


def _ranked(r: httpx.Response) -> list[tuple[int, float]]:
    assert r.status_code == 200, r.text
    return [(one["index"], one["relevance_score"]) for one in r.json()["results"]]


def test_rerank_answers_every_document_once_from_the_highest_score(api: Api) -> None:
    documents: list[Any] = [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]
    r = _rerank(api, model="rerank-english", documents=documents)
    ranked = _ranked(r)
    answer = r.json()
    assert sorted(i for i, _ in ranked) == list(range(len(DOCS)))
    scores = [score for _, score in ranked]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    assert all(0.0 <= score <= 1.0 for score in scores)  # one label through a sigmoid
    assert [one["document"]["text"] for one in answer["results"]] == [DOCS[i] for i, _ in ranked]
    assert answer["id"] == f"rerank-{r.headers['X-Job-Id']}"
    assert answer["model"] == "rerank-english"
    assert answer["usage"]["total_tokens"] > len(DOCS) * 6  # each pair reads the query


def test_top_n_and_return_documents_and_v2_answer_the_same_order(api: Api) -> None:
    full = _ranked(_rerank(api))
    r = _rerank(api, "/v2/rerank", top_n=2, return_documents=False)
    assert np.allclose(_ranked(r), full[:2], atol=1e-6)
    assert all("document" not in one for one in r.json()["results"])
    assert len(_ranked(_rerank(api, top_n=100))) == len(DOCS)


def test_concurrent_reranks_share_batches_and_each_gets_its_own_scores(api: Api) -> None:
    queries = [f"Question {i} about {topic}?" for i, topic in
               enumerate(["cats", "ships", "rain", "music", "bread", "chess"] * 3)]  # fmt: skip
    alone = {q: _ranked(_rerank(api, query=q)) for q in queries[:3]}

    def one(query: str) -> tuple[str, list[tuple[int, float]], str]:
        r = _rerank(api, query=query)
        return query, _ranked(r), r.headers["X-Job-Id"]

    with ThreadPoolExecutor(len(queries)) as pool:
        done = list(pool.map(one, queries))
    for query, ranked, _ in done:
        if query in alone:  # the same order and scores as alone, whatever its batch mates
            assert [i for i, _ in ranked] == [i for i, _ in alone[query]]
            assert np.allclose(ranked, alone[query], atol=1e-5)
    sizes = [api.get(job_id)["batch"]["size"] for _, _, job_id in done]
    assert max(sizes) > 1  # batched across requests


@pytest.mark.parametrize(
    ("body", "status", "param", "why"),
    [
        ({"documents": ["a"] * 1001}, 413, "documents", "over the limit of 1000"),
        ({"documents": [CAT, "word " * 200]}, 422, "documents.1", "over the model's window of 128"),
        ({"documents": [CAT, ""]}, 422, "documents.1", "empty"),
        ({"documents": []}, 422, "documents", "at least 1"),
        ({"query": ""}, 422, "query", "empty"),
        ({"top_n": 0}, 422, "top_n", "greater than or equal to 1"),
        ({"max_tokens_per_doc": 64}, 422, "max_tokens_per_doc", "not carried"),
        ({"documents": [{"text": CAT, "title": "t"}]}, 422, "documents.0.title", "not a field"),
    ],
)
def test_what_rerank_cannot_serve_is_refused_by_name(
    api: Api, body: dict[str, Any], status: int, param: str, why: str
) -> None:
    r = _rerank(api, **body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and why in error["message"], error


def test_a_rerank_pipeline_may_cut_long_pairs_to_its_window(api: Api) -> None:
    r = _rerank(api, model="rerank-cut", documents=["word " * 200, CAT])
    assert sorted(i for i, _ in _ranked(r)) == [0, 1]
    assert r.json()["usage"]["total_tokens"] <= 128 + 16  # the long pair counts its window
    cat = dict(_ranked(_rerank(api, documents=[CAT])))[0]
    assert np.isclose(dict(_ranked(r))[1], cat, atol=1e-5)


def test_a_rerank_job_on_the_jobs_api_holds_its_results(api: Api) -> None:
    job = api.submit("rerank", model="rerank", query=QUERY, documents=DOCS[:3], top_n=2)
    done = api.wait(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    results = [(one["index"], one["relevance_score"]) for one in done["output"]["results"]]
    assert np.allclose(results, _ranked(_rerank(api, documents=DOCS[:3], top_n=2)), atol=1e-6)
    assert done["output"]["results"][0]["document"]["text"] == DOCS[results[0][0]]


def test_a_rerank_pipeline_with_no_model_is_off() -> None:
    config = PipelineConfig(kind="rerank", impl="pipelines.rerank:RerankPipeline")
    assert config.enabled is False
    with pytest.raises(ValueError, match="needs a model"):
        PipelineConfig(kind="rerank", impl="pipelines.rerank:RerankPipeline", enabled=True)


# -- issue 65: a rerank request's lengths are checked once, before the model ----------------


def test_a_query_that_fills_the_window_is_refused_by_name(api: Api) -> None:
    """The query is tokenized once (not once per document): one that fills the model's
    window (128) is refused naming `query` before its 1,000 documents are read."""
    r = _rerank(api, query="word " * 6000, documents=["a short document " * 8] * 1000)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "query" and "window of 128" in error["message"], error


def test_each_pairs_tokens_are_counted_as_the_pair_reads(
    api: Api, tmp_path_factory: pytest.TempPathFactory
) -> None:
    query, documents = "where does the cat sit", [CAT, MARKETS]
    r = _rerank(api, query=query, documents=documents)
    assert r.status_code == 200, r.text
    tokenizer = AutoTokenizer.from_pretrained(cached_tiny_reranker(tmp_path_factory))
    pairs = tokenizer([query] * len(documents), documents)["input_ids"]
    assert r.json()["usage"]["total_tokens"] == sum(len(ids) for ids in pairs)
    over = _rerank(api, query=query, documents=[CAT, "word " * 200])
    assert over.status_code == 422 and over.json()["error"]["param"] == "documents.1", over.text
