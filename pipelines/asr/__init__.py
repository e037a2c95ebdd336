"""Speech recognition with faster-whisper: `AsrPipeline` (see `pipelines.asr.pipeline`)."""

from pipelines.asr.pipeline import AsrPipeline

__all__ = ["AsrPipeline"]
