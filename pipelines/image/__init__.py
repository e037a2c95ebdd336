"""Image generation with diffusers: `impl = "pipelines.image:ImagePipeline"`."""

from pipelines.image.pipeline import ImagePipeline

__all__ = ["ImagePipeline"]
