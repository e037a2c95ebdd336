"""LLM jobs: an engine server that batches continuously, fed and streamed by the worker."""

from pipelines.llm.pipeline import LlmPipeline

__all__ = ["LlmPipeline"]
