"""A byte-level BPE tokenizer of any vocabulary size, made up rather than trained.

Random-weight models of a real size need a tokenizer with the real vocabulary (the
embedding and output layers are a large share of the compute), and none can be
downloaded. This one is the byte-level alphabet (256 symbols, so any text encodes),
then every pair and then every triple of the printable ASCII symbols (space included)
as merged tokens, up to the size asked for. Everything it decodes from merged tokens is
plain ASCII, so a model that generates only those streams whole characters.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

ASCII_BYTES = [0x20, *range(0x21, 0x7F)]
"""Space and the printable ASCII bytes."""


def byte_symbols() -> tuple[list[str], list[str]]:
    """The byte-level alphabet (256 symbols, in byte order) and its printable ASCII ones."""
    table = _bytes_to_unicode()
    return [table[b] for b in range(256)], [table[b] for b in ASCII_BYTES]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-symbol table, the one `ByteLevel` uses: printable bytes map to
    themselves, the others to code points from 256 up."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merged(printable: list[str]) -> Iterator[tuple[str, str]]:
    """(left, right) of each merged token: all pairs, then all triples."""
    for a in printable:
        for b in printable:
            yield a, b
    for a in printable:
        for b in printable:
            for c in printable:
                yield a + b, c


def make_bpe(base_size: int, special_tokens: list[str]) -> Any:
    """A `tokenizers.Tokenizer` whose first `base_size` ids are the alphabet and merged
    tokens and whose next ids are `special_tokens`, in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet, printable = byte_symbols()
    if base_size < len(alphabet):
        raise ValueError(f"a byte-level vocabulary needs at least {len(alphabet)} tokens")
    merges = list(islice(_merged(printable), base_size - len(alphabet)))
    tokens = alphabet + [a + b for a, b in merges]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(special_tokens)
    return tokenizer


def non_ascii_ids() -> list[int]:
    """Ids of the alphabet symbols that are not printable ASCII: a generated one may be
    half of a UTF-8 character."""
    alphabet, printable = byte_symbols()
    keep = set(printable)
    return [i for i, s in enumerate(alphabet) if s not in keep]
