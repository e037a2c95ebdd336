"""Text to speech: Piper and Coqui TTS voices behind one pipeline (`pipelines.tts:TtsPipeline`).

`text` splits sentences, `engines` is the interface (`piper`, `coqui` implement it),
`encode` does speed, sample rate and formats with PyAV, `pipeline` streams the chunks.
"""

from pipelines.tts.pipeline import TtsPipeline

__all__ = ["TtsPipeline"]
