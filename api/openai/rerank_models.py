"""The request of `POST /v1/rerank` and `/v2/rerank` (Jina's and Cohere's shape, as vLLM
serves it), the `rerank` job input it becomes, and its answer."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from api.openai.protocol import OpenAIBaseModel, OpenAIRequest, OpenAIResponse, omitted
from jobs.models import Job
from jobs.schemas.base import COUNT_MAX
from jobs.schemas.rerank import Text

PARAMS: dict[str, str] = {}
"""Job input fields under another name in the request (none)."""


class RerankDocumentIn(OpenAIBaseModel):
    """A document as an object (Jina's, and Cohere's v1): its `text`."""

    text: str


class RerankRequest(OpenAIRequest):
    not_carried = {
        "max_tokens_per_doc": "not carried: a document that does not fit the model's window "
        "with the query is refused (422 naming it), or cut where the pipeline's "
        "options.truncate_input is on",
        "rank_fields": "not carried: send each document's text",
        "max_chunks_per_doc": "not carried: a document is not split",
    }

    model: str | None = Field(default=None, min_length=1, max_length=256)
    """A rerank pipeline, its model or one of its aliases (`GET /v1/models` lists them);
    default: the deployment's first rerank pipeline."""
    query: Text
    """What the documents are ranked against: at most `limits.rerank_max_chars` characters."""
    documents: Annotated[
        list[RerankDocumentIn], Field(min_length=1, json_schema_extra={"minItems": 1})
    ]
    """The texts to rank, as strings or `{"text": ...}` objects: at most
    `limits.rerank_max_documents` (413 over) of `limits.rerank_max_chars` characters each."""
    top_n: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    """Only the `top_n` most relevant documents; default: all of them."""
    return_documents: bool = True
    """Each result carries its `document` (`{"text": ...}`), as Jina and vLLM answer."""

    @field_validator(
        "documents", mode="before", json_schema_input_type=list[str | RerankDocumentIn]
    )
    @classmethod
    def _strings_are_texts(cls, value: Any) -> Any:
        # One model for both forms, so that an error names `documents.N.text`, not the
        # union's branch (`documents.N.str`).
        if isinstance(value, list):
            return [{"text": doc} if isinstance(doc, str) else doc for doc in value]
        return value

    def job_input(self) -> dict[str, object]:
        """The `rerank` job input of this request."""
        texts = [doc.text for doc in self.documents]
        inp: dict[str, object] = {
            "query": self.query,
            "documents": texts,
            "return_documents": self.return_documents,
        }
        if self.model is not None:
            inp["model"] = self.model
        if self.top_n is not None:
            inp["top_n"] = self.top_n
        return inp


class RerankDocument(OpenAIResponse):
    text: str


class RerankResult(OpenAIResponse):
    index: int
    """The place of its document in the request's `documents`."""
    relevance_score: float
    """The model's score of the pair (0 to 1 for a one-label cross-encoder): higher is more
    relevant."""
    document: RerankDocument | None = omitted()
    """Where the request's `return_documents` is on (the default)."""


class RerankUsage(OpenAIResponse):
    prompt_tokens: int
    total_tokens: int
    """Tokens of every query-document pair the model read."""


class RerankResponse(OpenAIResponse):
    id: str
    """`rerank-` and the job's id."""
    model: str
    """The model as the request named it (its pipeline where it named none)."""
    results: list[RerankResult]
    """From the most relevant document to the least, the `top_n` first."""
    usage: RerankUsage


def rerank_response(job: Job, model: str | None) -> RerankResponse:
    """A succeeded `rerank` job as the route's answer."""
    output = job.output or {}
    return RerankResponse(
        id=f"rerank-{job.id}",
        model=model or job.pipeline or "",
        results=output["results"],
        usage=output["usage"],
    )
