"""A tiny Qwen2 that always calls one tool, so that tool calling runs end to end through a
real `transformers serve` (its chat template takes `tools`, and its Qwen2 response parser
turns `<tool_call>…</tool_call>` into OpenAI `tool_calls`), loaded like any model directory.

Random weights would never write a well-formed call, so the weights are set by hand to make
a bigram model: attention and the MLPs add nothing to the residual stream (their output
projections are zero), the embeddings are one-hot, and the output layer maps each token to
the one that follows it in `CALL`. Every prompt ends with the chat template's generation
prompt, so every answer is the same call, then the end token:

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>

The call's JSON is one added token, so no token repeats on the chain. The tokenizer is
byte-level (every text encodes), and the chat template renders tools, assistant turns
with `tool_calls` and `tool` turns the way Qwen2.5's does.

Its second choice after the generation prompt, half as likely, is `JSON_ANSWER`, one added
token, then the end: what it answers where an engine's structured output (vLLM's
`response_format`) rules the call out, so that a JSON answer parses and ends.

After a tool's result it answers in words: its chat template ends a generation prompt
that follows a `tool` turn with `ANSWERING`, an empty thinking block as Qwen 3.5's template
prefills one (one added token; `transformers serve`'s Qwen response parser reads the
prompt's tail after `<|im_start|>assistant\n` as the answer's start, and takes it for
empty reasoning), which the model follows with `FINAL_ANSWER` (one more), then the end. So
an agent calls the tool, sends the result back and gets its answer, as with a real model.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.built import built_once

if TYPE_CHECKING:
    import pytest

TOOL = "get_weather"
ARGUMENTS = {"city": "Paris"}
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": TOOL,
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
"""The tool it calls, as a request declares it."""
CALL_JSON = json.dumps({"name": TOOL, "arguments": ARGUMENTS})
IM_START, IM_END, END = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CHAIN = ["<tool_call>", CALL_JSON, "</tool_call>", IM_END]
"""What the model writes after the generation prompt's last token (a newline)."""
JSON_ANSWER = '{"ok": true}'
"""Its answer where the call is not allowed (a JSON object of the `JSON_SCHEMA`)."""
ANSWERING = "<think></think>"
"""The end of a generation prompt after a tool's result (`CHAT_TEMPLATE`)."""
FINAL_ANSWER = "It is clear and 21 degrees in Paris."
"""Its answer after a tool's result."""
JSON_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}"
    "\n</tool_response><|im_end|>\n"
    "{% elif m['role'] == 'assistant' and m.get('tool_calls') %}<|im_start|>assistant\n"
    "{% for call in m['tool_calls'] %}<tool_call>\n"
    '{"name": "{{ call["function"]["name"] }}", "arguments": '
    "{{ call['function']['arguments'] }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if messages[-1]['role'] == 'tool' %}<think></think>{% endif %}{% endif %}"
)


def build_tool_caller(path: Path) -> Path:
    """Write the model and its tokenizer to `path`; returns `path`."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(t, special=True) for t in (IM_START, IM_END, END)])
    plain = [*CHAIN[:3], JSON_ANSWER, ANSWERING, FINAL_ANSWER]
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    tokenizer: Any = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=IM_END, pad_token=END, model_max_length=4096
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)

    vocab = len(tokenizer)
    hidden = (vocab + 63) // 64 * 64
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(END),
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    ids = tokenizer.convert_tokens_to_ids
    newline = tokenizer.encode("\n")[-1]
    follows = {newline: ids(CHAIN[0])} | {ids(a): ids(b) for a, b in itertools.pairwise(CHAIN)}
    follows[ids(ANSWERING)] = ids(FINAL_ANSWER)  # then the end, as any other token
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(vocab, hidden)
        end = ids(IM_END)
        head[end, :vocab] = 1.0  # any other token: the end
        for token, then in follows.items():
            head[:, token] = 0.0
            head[then, token] = 1.0
        head[ids(JSON_ANSWER), newline] = 0.5  # second to the call
        model.lm_head.weight.copy_(head * 100.0)  # sampled at any temperature
    model.generation_config.eos_token_id = end
    model.save_pretrained(path)
    return path


def cached_tool_caller(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tool-calling model, built on first use."""
    return built_once(tmp_path_factory, "tool-caller", "model.safetensors", build_tool_caller)
