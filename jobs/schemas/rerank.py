"""Rerank job input (a query and the documents to order by relevance to it), and the
options of a rerank pipeline."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from jobs.errors import TooLarge
from jobs.schemas.base import COUNT_MAX, JobInput, over_limit
from jobs.settings import Limits
from jobs.tokens import count_tokens


class RerankOptions(BaseModel):
    """`options` of a rerank pipeline (`[pipelines.NAME.options]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    truncate_input: bool = False
    """Cut a query-document pair longer than the model's window to fit it; off: refuse it
    (422 naming `documents.N`) rather than score less than was sent without a word."""
    predict_batch: int = Field(default=64, ge=1)
    """Query-document pairs per forward pass: the pairs of a batch of requests are scored
    together in chunks of this."""


def _not_empty(text: str) -> str:
    if not text:
        raise PydanticCustomError("empty_text", "an empty text cannot be ranked")
    return text


Text = Annotated[str, AfterValidator(_not_empty), Field(json_schema_extra={"minLength": 1})]
"""A query or a document: an empty one is refused saying why."""


class RerankInput(JobInput):
    query: Text
    """What the documents are ranked against: at most `limits.rerank_max_chars` characters."""
    documents: Annotated[list[Text], Field(min_length=1)]
    """The texts to rank: at most `limits.rerank_max_documents` (413 over), of
    `limits.rerank_max_chars` characters each; each one with the query must fit the model's
    window (checked by the worker, 422 naming `documents.N`), unless the pipeline's
    `options.truncate_input`."""
    top_n: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    """Only the `top_n` most relevant documents; default: all of them."""
    return_documents: bool = True
    """Each result carries its document's `text` (as Jina and vLLM answer); false: only its
    `index` and `relevance_score`."""

    def cost(self) -> int:
        """Tokens of the query (once per document: each pair reads it) and the documents,
        estimated from their characters."""
        query = count_tokens([self.query], None)
        return sum(query + count_tokens([doc], None) for doc in self.documents)

    def check_limits(self, limits: Limits) -> None:
        if len(self.documents) > limits.rerank_max_documents:
            count, limit = len(self.documents), limits.rerank_max_documents
            raise TooLarge("documents", f"{count} documents is over the limit of {limit}")
        if len(self.query) > limits.rerank_max_chars:
            raise over_limit("query", len(self.query), limits.rerank_max_chars, "characters")
        for i, doc in enumerate(self.documents):
            if len(doc) > limits.rerank_max_chars:
                raise over_limit(f"documents.{i}", len(doc), limits.rerank_max_chars, "characters")
