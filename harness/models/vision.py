"""A tiny LLaVA (a CLIP vision tower, a projector and the tiny Llama) with random weights,
its processor and a chat template that places each image, saved with `save_pretrained`
so that `transformers serve` loads it as a vision-language model.

An image of any size is resized to 32x32 and cut into 8x8 patches: it becomes
`IMAGE_TOKENS` tokens of the prompt, which is how a test sees that the engine read it
(`usage.prompt_tokens`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.built import built_once
from harness.models.llm import _tokenizer

if TYPE_CHECKING:
    import pytest

IMAGE = "<image>"
SIDE, PATCH = 32, 8
IMAGE_TOKENS = (SIDE // PATCH) ** 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def build_tiny_vlm(path: Path) -> Path:
    """Write the model and its processor to `path`; returns `path`."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    path.mkdir(parents=True, exist_ok=True)
    tokenizer: Any = _tokenizer(512, 4096)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE]})
    image_id = tokenizer.convert_tokens_to_ids(IMAGE)
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=SIDE,
        patch_size=PATCH,
        projection_dim=32,
    )
    text = LlamaConfig(  # the tiny Llama's shape (harness.models.llm): heads of 64
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_id,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = None  # decodes exactly max_tokens, as the LLM
    model.save_pretrained(path)
    size = {"shortest_edge": SIDE}
    crop = {"height": SIDE, "width": SIDE}
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size=size, crop_size=crop),
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE,
    )
    processor.save_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def cached_tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny vision-language model, built on first use."""
    return built_once(tmp_path_factory, "tiny-vlm", "model.safetensors", build_tiny_vlm)
