"""A Whisper of a real shape with random weights, converted to CTranslate2 for faster-whisper.

`build_whisper(path, "large-v3")` writes what `WhisperModel(path)` loads: `model.bin`,
`config.json`, `vocabulary.json`, `tokenizer.json` and `preprocessor_config.json` (128 mel
bins). Its compute and memory are large-v3's; what it says is not speech. `tiny` is a toy
of the same layout and vocabulary, for tests.

Random weights alone would distort the work: a random decoder rarely ends a window, so
every window would run to the 448-token limit, its low log-probabilities would send each
window through all six temperatures of the fallback, and random timestamps would move
the next window by random amounts. So the decoder's output is designed, not learned:
every block's output projections are zero (the blocks still run: the compute is the
same), which leaves the last hidden state at the embedding of the last token, and the
(untied) output layer maps each designed token to its successor. Whatever the audio and
the prompt, each window decodes as `<|0.00|>`, `TEXT_TOKENS` distinct two-letter tokens
(about what a real model writes for 30 s of speech), `<|29.98|>`, end: confident (no
fallback), one segment, and the next window starts a full window later, as with real
speech. A short window (the last one, or mmq's early first window) costs as much as a
full one, which real speech would not. CTranslate2 4.8 takes the model for an English-only
one (its prompt is `<|startoftranscript|>` alone): the work per token is the same.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.models.bpe import make_bpe

BASE_VOCAB = 50257
"""Multilingual Whisper's ordinary tokens; the special ones follow from this id."""
TIMESTAMPS = 1501
TEXT_TOKENS = 100
"""Text tokens of every window: a 30 s window of English speech is about 100."""
SUCCESSOR_LOGIT = 30.0
"""The successor's logit (the others' are 0): probability 1 - 5e-9 over 51866 tokens."""


@dataclass(frozen=True)
class WhisperShape:
    d_model: int
    layers: int
    heads: int
    ffn: int
    mels: int


SHAPES = {
    "tiny": WhisperShape(d_model=128, layers=2, heads=2, ffn=256, mels=80),
    "large-v3": WhisperShape(d_model=1280, layers=32, heads=20, ffn=5120, mels=128),
}


def languages() -> list[str]:
    """large-v3's 100 language tokens, in token order."""
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    return [f"<|{code}|>" for code in _LANGUAGE_CODES]


def special_tokens() -> list[str]:
    tail = ["translate", "transcribe", "startoflm", "startofprev", "nospeech", "notimestamps"]
    return ["<|endoftext|>", "<|startoftranscript|>", *languages(), *(f"<|{t}|>" for t in tail)]


def build_whisper(path: Path, size: str = "tiny", seed: int = 0, device: str = "cpu") -> Path:
    """Write a CTranslate2 Whisper of shape `size` (`tiny`, `large-v3`) to `path`; the
    transformers model it is converted from is built on `device` (a GPU is much faster
    for large-v3) in a folder beside it and removed."""
    import shutil

    from ctranslate2.converters import TransformersConverter

    source = path.with_name(path.name + "-hf")
    _build_hf(source, SHAPES[size], seed, device)
    converter = TransformersConverter(
        str(source),
        copy_files=["tokenizer.json", "preprocessor_config.json"],
        load_as_float16=True,
        low_cpu_mem_usage=True,
    )
    converter.convert(str(path), quantization="float16", force=True)
    shutil.rmtree(source)
    return path


def _build_hf(path: Path, shape: WhisperShape, seed: int, device: str) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, WhisperConfig, WhisperForConditionalGeneration

    specials = special_tokens()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=make_bpe(BASE_VOCAB, specials),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=448,
    )
    ids = {token: _token_id(tokenizer, token) for token in specials}
    eot, space = ids["<|endoftext|>"], _token_id(tokenizer, "Ġ")
    config = WhisperConfig(
        vocab_size=BASE_VOCAB + len(specials) + TIMESTAMPS,
        num_mel_bins=shape.mels,
        d_model=shape.d_model,
        encoder_layers=shape.layers,
        decoder_layers=shape.layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn,
        decoder_ffn_dim=shape.ffn,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        begin_suppress_tokens=[space, eot],
        suppress_tokens=[],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model: Any = WhisperForConditionalGeneration(config)
    _design_decoder(model, tokenizer, ids, config.vocab_size)
    model.generation_config.suppress_tokens = []
    model.generation_config.begin_suppress_tokens = [space, eot]
    model.to(torch.float16).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps(_preprocessor(shape.mels)))


def _design_decoder(model: Any, tokenizer: Any, ids: dict[str, int], vocab: int) -> None:
    """Zero the decoder blocks' outputs; make the output layer map each designed token
    to its successor (`_successors`)."""
    import torch

    decoder = model.model.decoder
    chain = _successors(tokenizer, ids, vocab)
    with torch.no_grad():
        for layer in decoder.layers:
            for linear in (layer.self_attn.out_proj, layer.encoder_attn.out_proj, layer.fc2):
                linear.weight.zero_()
                linear.bias.zero_()
        decoder.layer_norm.weight.fill_(1.0)
        decoder.layer_norm.bias.zero_()
        decoder.embed_positions.weight.zero_()
        tokens, output = decoder.embed_tokens.weight, model.proj_out.weight
        output.zero_()
        # The final layer norm turns a one-hot state into sqrt(d - 1) on its axis.
        gain = SUCCESSOR_LOGIT / (tokens.shape[1] - 1) ** 0.5
        for axis, (token, successor) in enumerate(chain.items()):
            tokens[token].zero_()
            tokens[token, axis] = 1.0  # one axis of the hidden state per designed token
            output[successor, axis] = gain


def _successors(tokenizer: Any, ids: dict[str, int], vocab: int) -> dict[int, int]:
    """token -> the token that follows it: the prompt's last token -> `<|0.00|>` (or the
    first text token after `<|notimestamps|>`) -> text tokens -> `<|29.98|>` -> end."""
    letters = string.ascii_lowercase
    pairs = [a + b for a in letters for b in letters][:TEXT_TOKENS]
    text = [int(tokenizer.convert_tokens_to_ids(p)) for p in pairs]
    first_ts, last_ts = vocab - TIMESTAMPS, vocab - 2
    chain = {ids[t]: first_ts for t in ("<|startoftranscript|>", "<|transcribe|>", "<|translate|>")}
    chain |= {ids["<|notimestamps|>"]: text[0], first_ts: text[0]}
    chain |= dict(zip(text, [*text[1:], last_ts], strict=True))
    chain[last_ts] = ids["<|endoftext|>"]
    return chain


def _preprocessor(mels: int) -> dict[str, str | int | float | bool]:
    """The `preprocessor_config.json` of a Whisper with `mels` mel bins."""
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": mels,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 30,
        "n_fft": 400,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }


def _token_id(tokenizer: Any, token: str) -> int:
    """One token's id (the tokenizer's call is typed for lists too)."""
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int), token
    return found
