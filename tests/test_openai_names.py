"""OpenAI's model and voice names in the configs mmq ships (the repository's, the Docker
image's, the Kubernetes base's): a client written for OpenAI names `gpt-4o-mini` or
`nova` and gets the shipped LLM or voice, never "unknown model"."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from broker.queues import pipeline_for
from jobs.settings import load_settings

REPO = Path(__file__).resolve().parents[1]
SHIPPED = [REPO / "mmq.toml", REPO / "docker" / "mmq.toml", REPO / "deploy/k8s/base/mmq.toml"]
OPENAI_VOICES = {
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer",
    "verse",
}  # fmt: skip
"""The voices of OpenAI's `audio.speech.create`."""
OPENAI_CHAT_MODELS = {"gpt-4o-mini", "gpt-4o", "gpt-4.1", "gpt-4.1-mini", "gpt-5", "gpt-3.5-turbo"}
"""The chat model names clients send most."""


@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_each_shipped_config_takes_openais_voice_and_chat_model_names(config: Path) -> None:
    pipelines = tomllib.loads(config.read_text())["pipelines"]
    tts = pipelines["tts"]["options"]["voices"]
    (default,) = [v for v in tts.values() if set(v.get("aliases", [])) >= OPENAI_VOICES]
    assert default["engine"] == "piper"
    if "llm" in pipelines:
        assert set(pipelines["llm"]["aliases"]) >= OPENAI_CHAT_MODELS, config


def test_the_repositorys_config_routes_openais_chat_names_to_its_llm() -> None:
    settings = load_settings(REPO / "mmq.toml")
    for name in OPENAI_CHAT_MODELS:
        assert pipeline_for(settings, "llm", name) == "llm"
