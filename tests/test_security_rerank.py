"""Issue 65: a rerank request's lengths are checked once, before the model: the query is
tokenized once (not once per document), a query that fills the window is refused naming
`query` before its documents are read, and each pair's count is still exact (a real worker
on the tiny cross-encoder, window 128)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from transformers import AutoTokenizer

from harness.api_client import Api, new_owner
from harness.models.reranker import cached_tiny_reranker
from tuning.deployment import Deployment, flush, serving

pytestmark = pytest.mark.timeout(240)

RERANK = """
[pipelines.rerank]
kind = "rerank"
impl = "pipelines.rerank:RerankPipeline"
model = "{model}"
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(cached_tiny_reranker(tmp_path_factory))


@pytest.fixture(scope="module")
def dep(
    redis_url: str, model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    flush(redis_url)
    deployment = Deployment(
        redis_url,
        tmp_path_factory.mktemp("rerank"),
        env_overrides={"HF_HUB_OFFLINE": "1"},
        config=RERANK.format(model=model),
    )
    with serving(deployment):
        deployment.start(["rerank"])
        yield deployment


@pytest.fixture
def api(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"rr{time.monotonic_ns()}")


def test_a_query_that_fills_the_window_is_refused_by_name(api: Api) -> None:
    documents = ["a short document " * 8] * 1000
    r = api.http.post(
        "/v1/rerank",
        json={"model": "rerank", "query": "word " * 6000, "documents": documents},
        timeout=60,
    )
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "query" and "window of 128" in error["message"], error


def test_each_pairs_tokens_are_counted_as_the_pair_reads(api: Api, model: str) -> None:
    query, documents = "where does the cat sit", ["A cat sits on the mat.", "Stock markets fell."]
    r = api.http.post(
        "/v1/rerank", json={"model": "rerank", "query": query, "documents": documents}, timeout=60
    )
    assert r.status_code == 200, r.text
    tokenizer = AutoTokenizer.from_pretrained(model)
    pairs = tokenizer([query] * len(documents), documents)["input_ids"]
    assert r.json()["usage"]["total_tokens"] == sum(len(ids) for ids in pairs)
    over = api.http.post(
        "/v1/rerank",
        json={"model": "rerank", "query": query, "documents": [documents[0], "word " * 200]},
        timeout=60,
    )
    assert over.status_code == 422 and over.json()["error"]["param"] == "documents.1", over.text
