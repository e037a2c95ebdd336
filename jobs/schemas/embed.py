"""Embedding job input, and the options of an embedding pipeline."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from jobs.errors import InputError
from jobs.schemas.base import COUNT_MAX, JobInput, over_limit
from jobs.settings import Limits, PipelineConfig
from jobs.tokens import count_tokens


class EmbedOptions(BaseModel):
    """`options` of an embedding pipeline (`[pipelines.NAME.options]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    normalize: bool = True
    """Unit-length vectors (cosine similarity is then a dot product), as OpenAI's are."""
    truncate_dimensions: bool = False
    """The model was trained to give useful shorter vectors (Matryoshka): a request's
    `dimensions` keeps that many of each vector's first values (normalized again). Off: a
    request that asks for `dimensions` is refused."""
    truncate_input: bool = False
    """Cut a text longer than the model's window to fit it; off: refuse it (422), as
    OpenAI does, rather than embed less than was sent without a word."""
    encode_batch: int = Field(default=64, ge=1)
    """Texts per forward pass: a batch of requests is encoded together in chunks of this."""


def _not_empty(text: str) -> str:
    if not text:
        raise PydanticCustomError("empty_text", "an empty text has no embedding")
    return text


Text = Annotated[str, AfterValidator(_not_empty), Field(json_schema_extra={"minLength": 1})]
"""A text to embed: an empty one has no embedding (published as `minLength`, refused
saying why)."""
Texts = Annotated[list[Text], Field(min_length=1)]
OneOrMoreTexts = Text | Texts
"""What `input` takes: one text, or a list of them."""


class EmbedInput(JobInput):
    input: Texts
    """The texts to embed (a single string is one text); a vector for each, in order. At
    most `limits.embed_max_inputs` texts of `limits.embed_max_chars` characters each (the
    deployment's settings)."""
    dimensions: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    """Fewer dimensions per vector, where the pipeline's model allows it
    (`options.truncate_dimensions`)."""

    @field_validator("input", mode="before", json_schema_input_type=OneOrMoreTexts)
    @classmethod
    def _one_text(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def cost(self) -> int:
        """Tokens of the texts, estimated from their characters."""
        return sum(count_tokens([text], None) for text in self.input)

    def check_limits(self, limits: Limits) -> None:
        if len(self.input) > limits.embed_max_inputs:
            raise over_limit("input", len(self.input), limits.embed_max_inputs, "texts")
        for i, text in enumerate(self.input):
            if len(text) > limits.embed_max_chars:
                raise over_limit(f"input.{i}", len(text), limits.embed_max_chars, "characters")

    def check_pipeline(self, config: PipelineConfig) -> None:
        options = config.options_as(EmbedOptions)
        if self.dimensions is not None and not options.truncate_dimensions:
            raise InputError(
                "dimensions",
                "this pipeline's model gives vectors of one length only "
                "(options.truncate_dimensions is off)",
            )
