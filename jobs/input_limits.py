"""`[limits]`: the limits on a job's input (a request over one gets 422 naming the field,
or 413 where it is a size)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Limits(BaseModel):
    """Limits on job input; a request over one gets 422 naming the field."""

    text_max_chars: int = 5000
    """TTS input text."""
    audio_max_bytes: int = 50 * 1024 * 1024
    """ASR audio upload."""
    audio_max_seconds: float = 3600.0
    """ASR audio duration."""
    chat_max_audio_parts: int = Field(default=4, ge=1)
    """`input_audio` parts in one chat completion request (each is an ASR job; 422 over)."""
    chat_max_audio_seconds: float = Field(default=600.0, gt=0)
    """Seconds of audio in one chat completion request, all parts together (413 over), as
    their headers tell it: WAV and MP3 (other formats are bounded by their bytes and by
    `audio_max_seconds` in the worker)."""
    image_max_side: int = 1024
    """Image width and height."""
    image_max_steps: int = 100
    """Image denoising steps."""
    image_max_n: int = 4
    """Images per request."""
    image_max_bytes: int = Field(default=50 * 1024 * 1024, ge=1)
    """An image or a mask uploaded to `/v1/images/edits` (413 above)."""
    image_max_pixels: int = Field(default=25_000_000, ge=64 * 64)
    """Pixels of an image or mask to edit (about a 6000x4000 photo), read from its header
    at submit (413 above) and checked again before the worker decodes it: a small file
    can declare a huge canvas (a decompression bomb)."""
    llm_max_tokens: int = 4096
    """LLM `max_tokens`."""
    llm_max_prompt_chars: int = 200_000
    """LLM prompt size (all messages)."""
    llm_max_images: int = 8
    """Image parts in one LLM request."""
    llm_max_image_bytes: int = 8 * 1024 * 1024
    """One image an LLM worker fetches (by file key or URL), and all of a request's data
    URLs together (413 over)."""
    llm_image_urls: bool = True
    """Image parts may be http(s) URLs, fetched by the worker behind the network guard
    (`net`); false: refused (422)."""
    embed_max_inputs: int = 256
    """Texts in one embedding request."""
    embed_max_chars: int = 32_000
    """One text of an embedding request (the model's window is checked by the worker)."""
    rerank_max_documents: int = Field(default=1000, ge=1)
    """Documents in one rerank request (413 over)."""
    rerank_max_chars: int = Field(default=32_000, ge=1)
    """A rerank request's query, and each of its documents (the model's window is checked
    by the worker)."""
