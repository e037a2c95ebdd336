"""What a pipeline hands its worker: each built-in kind's partial outputs and final output,
as the job's events and record carry them (JSON objects; TypedDicts, so that they are the
plain dicts the store serializes).

A pipeline of another package (the test harness's, or one a deployment names by `impl`)
makes JSON objects of its own: `PartialData` and `JobOutput` take any JSON object too,
and the worker stores what it is given without looking inside.
"""

from __future__ import annotations

from typing import Any, NotRequired

# typing_extensions' TypedDict: the one pydantic reads before Python 3.12, should a model
# hold one of these.
from typing_extensions import TypedDict


class StoredFile(TypedDict):
    """An output file in storage, as the job's output names it (`Files.put_output`)."""

    key: str
    url: str
    """A signed URL that reads it, for `storage.url_ttl_s`."""
    bytes: int
    content_type: str
    sha256: str | None


# -- asr --------------------------------------------------------------------------------


class Word(TypedDict):
    word: str
    start: float
    end: float
    probability: float


class Segment(TypedDict):
    """A transcript segment (Whisper's, as OpenAI's verbose_json shows it)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: NotRequired[list[Word]]
    """With `word_timestamps`."""


class AsrPartial(TypedDict):
    segment: Segment


class AsrOutput(TypedDict):
    text: str
    language: str | None
    language_probability: float
    duration: float
    """Seconds of audio (what the job costs)."""
    segments: list[Segment]
    batch_size: int


# -- tts --------------------------------------------------------------------------------


class TtsChunk(TypedDict):
    """One chunk of synthesized audio (`pipelines.tts.pipeline`)."""

    seq: int
    sentence: int
    text: str
    sample_rate: int
    samples: int
    audio: str
    """Base64 of little-endian PCM16 mono."""
    stream: NotRequired[str]
    """Base64 of the next bytes of the requested format's stream (flac, mp3, opus)."""


class TtsSummary(TypedDict):
    format: str
    sample_rate: int
    duration_s: float
    voice: str
    engine: str
    sentences: int
    chunks: int
    worker_pid: int


class TtsOutput(TtsSummary):
    audio: StoredFile


# -- image ------------------------------------------------------------------------------


class ImageFile(StoredFile):
    seed: int
    nsfw: bool
    b64_json: NotRequired[str]
    """With `response_format` b64_json: the image itself."""


class BatchSizes(TypedDict):
    """The diffusers call a request ran in: its requests and their images."""

    requests: int
    images: int


class ImageOutput(TypedDict):
    images: list[ImageFile]
    seeds: list[int]
    width: int
    height: int
    steps: int
    guidance_scale: float
    scheduler: str | None
    """None: the model's own."""
    format: str
    batch: BatchSizes


# -- llm --------------------------------------------------------------------------------


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    """One output token's entry in a chat answer's log probabilities."""

    top_logprobs: list[TopLogprob]


CompletionLogprobs = dict[str, list[str | int | float | dict[str, float] | None]]
"""The completions API's log probabilities: parallel lists by name (`tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`)."""

Logprobs = list[TokenLogprob] | CompletionLogprobs
"""A delta's log probabilities as the engine sent them: a chat answer's entries, or the
completions API's lists."""


class ChatLogprobs(TypedDict):
    content: list[TokenLogprob]


class FunctionDelta(TypedDict, total=False):
    name: str
    arguments: str


class ToolCallDelta(TypedDict, total=False):
    """A streamed piece of a tool call (OpenAI's): the first of a call brings its id,
    type and name; later ones add to its arguments."""

    index: int
    id: str
    type: str
    function: FunctionDelta


class FunctionCall(TypedDict):
    name: str
    arguments: str
    """JSON text, as the model wrote it."""


class ToolCall(TypedDict):
    id: str
    type: str
    function: FunctionCall


class LlmDelta(TypedDict):
    """A partial output of an LLM job (`pipelines.llm.choices`)."""

    index: int
    """Counts the choice's deltas."""
    text: str
    choice: NotRequired[int]
    """The choice's index, where not 0."""
    tool_calls: NotRequired[list[ToolCallDelta]]
    logprobs: NotRequired[Logprobs]


class ChoiceOutput(TypedDict):
    text: str
    finish_reason: str | None
    tool_calls: NotRequired[list[ToolCall]]
    logprobs: NotRequired[ChatLogprobs | CompletionLogprobs]


class IndexedChoice(ChoiceOutput):
    index: int


class LlmChoices(ChoiceOutput):
    """Choice 0 at the top level, as one-choice clients read it; every choice under
    `choices` when there are several."""

    choices: NotRequired[list[IndexedChoice]]


class Usage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class LlmUsage(Usage):
    completion_tokens: int


class LlmOutput(LlmChoices):
    usage: LlmUsage
    model: str
    """The model (or adapter) that answered."""
    cached: bool
    """Answered from the response cache."""


# -- embed ------------------------------------------------------------------------------


class EmbedOutput(TypedDict):
    embeddings: list[str]
    """Each text's vector, base64 of little-endian float32."""
    dimensions: int
    usage: Usage


# -- rerank -----------------------------------------------------------------------------


class RerankDocument(TypedDict):
    text: str


class RerankResult(TypedDict):
    index: int
    """The place of its document in the request's `documents`."""
    relevance_score: float
    document: NotRequired[RerankDocument]
    """Where the request's `return_documents` asked for it."""


class RerankOutput(TypedDict):
    results: list[RerankResult]
    """The documents from the most relevant to the least (the `top_n` first)."""
    usage: Usage
    """Tokens of every query-document pair the model read."""


# -- any kind ---------------------------------------------------------------------------


class Loading(TypedDict):
    """The status event of a job waiting for its pipeline's model to load (on demand)."""

    status: str
    loading: str
    """The pipeline."""


PartialData = AsrPartial | TtsChunk | LlmDelta | dict[str, Any]
"""A partial output: a built-in kind's, or another pipeline's own JSON object."""

JobOutput = (
    AsrOutput | TtsOutput | ImageOutput | LlmOutput | EmbedOutput | RerankOutput | dict[str, Any]
)
"""A job's output: a built-in kind's, or another pipeline's own JSON object."""

EventData = PartialData | Loading
"""The data of an event a worker writes while its job runs: a partial output, a progress
event's (`step`, `total` and whatever else its pipeline adds), or the status `Loading`."""
