"""Prompt length in tokens, as the API estimates it to route long prompts.

With a tokenizer configured (a `tokenizer.json` file, or a model directory holding one)
the count is exact for the text; without one it is characters / 4, the usual rule of
thumb for English. Only the `tokenizers` package is used (no torch, no transformers).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
"""Chat-template overhead per message (role markers), a common approximation."""


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Any | None:
    """The `tokenizers.Tokenizer` at `path` (a file or a directory), None where there is
    none (the estimate falls back to characters / 4)."""
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        log.warning("no tokenizer.json at %s: estimating tokens as characters / 4", path)
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        log.warning("the tokenizers package is missing: estimating tokens as characters / 4")
        return None
    return Tokenizer.from_file(str(file))


def count_tokens(texts: Sequence[str], tokenizer: str | None) -> int:
    """Tokens of `texts` (a prompt, or the contents of chat messages)."""
    loaded = load_tokenizer(tokenizer) if tokenizer else None
    overhead = TOKENS_PER_MESSAGE * len(texts) if len(texts) > 1 else 0
    if loaded is None:
        return sum(-(-len(text) // CHARS_PER_TOKEN) for text in texts) + overhead
    encodings = loaded.encode_batch(list(texts), add_special_tokens=False)
    return sum(len(encoding.ids) for encoding in encodings) + overhead
